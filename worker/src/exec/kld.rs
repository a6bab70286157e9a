//! `kld/LEVEL/G`: scores one model on one chunk group against that group's base logits and returns the chunks'
//! sufficient statistics, which the coordinator merges (exactly, in chunk order) into llama-perplexity's figures.
//! llama.cpp maps the model's weights: that memory is outside the worker's tensor budget.

use quantfarm_eval::kld::base_file::BaseFile;
use quantfarm_eval::kld::{check_compatible, chunks_per_decode, score_against, session_for};
use quantfarm_proto::{self as pb, task_result, WorkerKind};
use quantfarm_store::Digest;

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{hash_object, local_file, local_model, location, task_dir};
use crate::llama::{blocking, load_prepared};

pub struct Kld;

impl Executor for Kld {
    type Task = pb::KldTask;
    const KIND: WorkerKind = WorkerKind::Kld;

    async fn run(t: &pb::KldTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::Kld(kld(t, env).await?))
    }
}

async fn kld(t: &pb::KldTask, env: &Env) -> Result<pb::KldResult, Failure> {
    let dir = task_dir(env)?;
    let Digest { sha256: sha, .. } = hash_object(&location(&t.base)?, env.budget).await?;
    if sha != t.base_sha256 {
        return Err(Failure::corrupt(&t.base, &sha, &t.base_sha256));
    }
    let base_path = local_file(&t.base, dir.path(), env).await?;
    let model_path = local_model(&t.model, dir.path(), env).await?;
    // A third party's file: what it is, as the report lists it.
    let described = if t.describe {
        let loc = location(&t.model)?;
        let Digest { sha256, bytes } = hash_object(&loc, env.budget).await?;
        let types = crate::outputs::type_mix(&loc).await?;
        Some(pb::Artifact { url: t.model.clone(), sha256, bytes, types })
    } else {
        None
    };
    let (first, batch, env) = (t.first_chunk, t.batch, env.clone());
    blocking(move || {
        let (model, note) = load_prepared(&model_path, None, dir.path(), &env)?;
        let mut base = BaseFile::open(&base_path)?;
        let name = base.name.clone();
        check_compatible(&base.header, &name, &model, None)?;
        let (n_ctx, n_chunk) = (base.header.n_ctx, base.header.n_chunk());
        let mut session = session_for(&model, n_ctx, batch)?;
        let chunks: Vec<usize> = (0..n_chunk).collect();
        let mut out = Vec::with_capacity(n_chunk);
        score_against(&mut session, &mut base, &chunks, chunks_per_decode(n_ctx, batch) as usize, |mut c| {
            c.chunk += first;
            out.push(pb::KldChunkStats::from(&c));
            Ok(())
        })?;
        drop(dir);
        Ok(pb::KldResult { chunks: out, note: note.unwrap_or_default(), model: described, ..Default::default() })
    })
    .await
}
