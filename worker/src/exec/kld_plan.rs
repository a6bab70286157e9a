//! `kld/plan` (and `imatrix/plan`, the same plan over the calibration text): tokenizes the text with the
//! reference's vocabulary and counts its chunks and decode groups, as llama-perplexity does
//! (`tools/perplexity/perplexity.cpp`).

use quantfarm_eval::kld::chunks_per_decode;
use quantfarm_proto::{self as pb, task_result, WorkerKind};

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{local_model, read_text, task_dir};
use crate::llama::{blocking, load, session, settings, tokenize, tokens_sha256};

pub struct KldPlan;

impl Executor for KldPlan {
    type Task = pb::KldPlanTask;
    const KIND: WorkerKind = WorkerKind::Kld;

    async fn run(t: &pb::KldPlanTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::KldPlan(kld_plan(t, env).await?))
    }
}

async fn kld_plan(t: &pb::KldPlanTask, env: &Env) -> Result<pb::KldPlanResult, Failure> {
    let s = settings(&t.settings)?.clone();
    let dir = task_dir(env)?;
    let reference = local_model(&t.reference, dir.path(), env).await?;
    let (text, text_sha256) = read_text(&s.text).await?;
    let env = env.clone();
    blocking(move || {
        let model = load(&reference, None, &env)?;
        let header = tokenize(&model, &text, &s)?;
        // Refuses a batch that is neither below nor a multiple of the context, as llama-perplexity does.
        session(&model, &s)?;
        drop(dir);
        Ok(pb::KldPlanResult {
            n_chunks: header.n_chunk() as u32,
            n_seq: chunks_per_decode(s.ctx, s.batch),
            n_vocab: header.n_vocab,
            text_sha256,
            tokens_sha256: tokens_sha256(&header.tokens),
            // What llama-perplexity writes first in each chunk, for the runtimes fed the same chunks (mlx-lm).
            bos: Some(if model.add_bos() { model.bos() } else { -1 }),
        })
    })
    .await
}
