//! `transformers/greedy/SUBJECT/S`: greedy continuations in transformers of the prompts a reference run rendered, fed
//! as that run's token ids, each compared with the reference's continuation: the HF checkpoint against llama.cpp's
//! GGUF BF16 (across runtimes), a vLLM rung against transformers' HF checkpoint. Continuations are compared as ids
//! and as the text transformers' tokenizer decodes them to.

use quantfarm_proto::{self as pb, task_result, WorkerKind};

use super::helper_runs::continue_greedily;
use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::task_dir;
use crate::transformers_run::{open_task, Opened, Request};

pub struct TransformersGreedy;

impl Executor for TransformersGreedy {
    type Task = pb::TransformersGreedyTask;
    const KIND: WorkerKind = WorkerKind::Transformers;

    async fn run(t: &pb::TransformersGreedyTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::Greedy(greedy(t, env).await?))
    }
}

async fn greedy(t: &pb::TransformersGreedyTask, env: &Env) -> Result<pb::GreedyResult, Failure> {
    if t.max_tokens == 0 {
        return Err(Failure::input("transformers greedy: max_tokens is 0"));
    }
    let dir = task_dir(env)?;
    let request = Request { model: &t.model, adapter: &t.adapter, activations: &t.activations, dtype: &t.dtype };
    let (mut helper, run) = match open_task(request, dir.path(), env).await? {
        Opened::Ready(helper, run) => (helper, run),
        Opened::Refused(run) => return Ok(pb::GreedyResult { transformers: Some(run), ..Default::default() }),
    };
    let mut result =
        continue_greedily(helper.helper(), &t.model, &t.reference, t.max_tokens, t.keep_continuations).await?;
    helper.stop().await;
    drop(dir);
    result.transformers = Some(run);
    Ok(result)
}
