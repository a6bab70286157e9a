//! `mlx-lm/greedy/SUBJECT/S`: greedy continuations in mlx-lm of the prompts a reference run rendered, fed as that
//! run's token ids (both runtimes see the same prompt, whatever their tokenizers would make of the text), each
//! compared with the reference's continuation: link 2 for the bf16 weights (against llama.cpp's GGUF BF16), an MLX
//! rung's agreement in its own runtime (against mlx-lm's bf16). Continuations are compared as ids and as the text
//! mlx-lm's tokenizer decodes them to.

use quantfarm_proto::{self as pb, task_result, WorkerKind};

use super::helper_runs::continue_greedily;
use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{local_model, task_dir};
use crate::mlx_run::{checkpoint, open, Opened};

pub struct MlxLmGreedy;

impl Executor for MlxLmGreedy {
    type Task = pb::MlxLmGreedyTask;
    const KIND: WorkerKind = WorkerKind::MlxLm;

    async fn run(t: &pb::MlxLmGreedyTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::Greedy(greedy(t, env).await?))
    }
}

async fn greedy(t: &pb::MlxLmGreedyTask, env: &Env) -> Result<pb::GreedyResult, Failure> {
    if t.max_tokens == 0 {
        return Err(Failure::input("mlx-lm greedy: max_tokens is 0"));
    }
    let dir = task_dir(env)?;
    let model = checkpoint(&t.model, local_model(&t.model, dir.path(), env).await?, dir.path(), env).await?;
    let (mut helper, run) = match open(&model, &env.scratch).await? {
        Opened::Ready(helper, run) => (helper, run),
        Opened::Refused(run) => return Ok(pb::GreedyResult { mlx_lm: Some(run), ..Default::default() }),
    };
    let mut result =
        continue_greedily(helper.helper(), &t.model, &t.reference, t.max_tokens, t.keep_continuations).await?;
    helper.stop().await;
    drop(dir);
    result.mlx_lm = Some(run);
    Ok(result)
}
