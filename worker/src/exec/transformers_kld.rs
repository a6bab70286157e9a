//! `transformers/kld/SUBJECT/G`: transformers' logits of one chunk group, fed the base file's token ids as
//! llama-perplexity decodes them (`kld::chunk_input`), scored against llama.cpp's base logits of the GGUF BF16 by
//! llama-perplexity's procedure (`kld::score_rows`): the HF checkpoint across runtimes, and a vLLM rung as vLLM
//! computes it (W8A8 emulated, or weight-only). One chunk's logits at a time pass through a scratch file.

use quantfarm_eval::kld::base_file::BaseFile;
use quantfarm_proto::{self as pb, task_result, WorkerKind};

use super::helper_runs::{checked_base, score_chunks};
use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::task_dir;
use crate::transformers_run::{open_task, Opened, Request};

pub struct TransformersKld;

impl Executor for TransformersKld {
    type Task = pb::TransformersKldTask;
    const KIND: WorkerKind = WorkerKind::Transformers;

    async fn run(t: &pb::TransformersKldTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::Kld(kld(t, env).await?))
    }
}

async fn kld(t: &pb::TransformersKldTask, env: &Env) -> Result<pb::KldResult, Failure> {
    let dir = task_dir(env)?;
    let base_path = checked_base(&t.base, &t.base_sha256, dir.path(), env).await?;
    let request = Request { model: &t.model, adapter: &t.adapter, activations: &t.activations, dtype: &t.dtype };
    let (mut helper, run) = match open_task(request, dir.path(), env).await? {
        Opened::Ready(helper, run) => (helper, run),
        Opened::Refused(run) => return Ok(pb::KldResult { transformers: Some(run), ..Default::default() }),
    };
    let mut base = BaseFile::open(&base_path)?;
    let bos = (t.bos >= 0).then_some(t.bos);
    let rows_file = dir.path().join("logits.f32");
    let chunks = score_chunks(helper.helper(), &t.model, &mut base, bos, t.first_chunk, &rows_file).await?;
    helper.stop().await;
    drop(dir);
    Ok(pb::KldResult { chunks, transformers: Some(run), ..Default::default() })
}
