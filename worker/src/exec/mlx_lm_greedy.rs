//! `mlx-lm/greedy/SUBJECT/S`: greedy continuations in mlx-lm of the prompts a reference run rendered, fed as that
//! run's token ids (both runtimes see the same prompt, whatever their tokenizers would make of the text), each
//! compared with the reference's continuation: link 2 for the bf16 weights (against llama.cpp's GGUF BF16), an MLX
//! rung's agreement in its own runtime (against mlx-lm's bf16). Continuations are compared as ids and as the text
//! mlx-lm's tokenizer decodes them to.

use quantfarm_eval::greedy::agreement;
use quantfarm_proto::{self as pb, task_result, WorkerKind};

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{local_model, task_dir};
use crate::mlx_run::{checkpoint, failure, ids, open, Opened};

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
    let mut result = pb::GreedyResult::default();
    for r in &t.reference {
        let what = format!("{}: prompt {}", t.model, r.index);
        let prompt = ids(&r.prompt_tokens, &what)?;
        let reference = ids(&r.tokens, &what)?;
        let c = helper.greedy(&prompt, t.max_tokens, None).await.map_err(failure)?;
        let texts = helper.decode(&[&reference, &c.tokens]).await.map_err(failure)?;
        let tokens: Vec<i32> = c.tokens.iter().map(|&t| t as i32).collect();
        let a = agreement(
            r.index as usize,
            (&r.tokens, &r.margins, texts[0].clone().into_bytes()),
            (&tokens, texts[1].clone().into_bytes()),
        );
        result.agreements.push(super::greedy::agreement_proto(a));
        if t.keep_continuations {
            result.continuations.push(pb::GreedyContinuation {
                index: r.index,
                prompt_tokens: r.prompt_tokens.clone(),
                tokens,
                margins: c.margins,
            });
        }
    }
    helper.stop().await;
    drop(dir);
    result.mlx_lm = Some(run);
    Ok(result)
}
