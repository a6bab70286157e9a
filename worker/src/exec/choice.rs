//! `choice/MODEL`: the release's multiple-choice tasks on the built-in runtime, scored as
//! `llama-perplexity --multiple-choice` scores them (`quantfarm_eval::choice`).

use quantfarm_proto::{self as pb, task_result, WorkerKind};
use sha2::{Digest as _, Sha256};

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{local_model, location, task_dir};
use crate::llama::{blocking, load_prepared};

pub struct Choice;

impl Executor for Choice {
    type Task = pb::ChoiceTask;
    const KIND: WorkerKind = WorkerKind::Probe;

    async fn run(t: &pb::ChoiceTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::Choice(choice(t, env).await?))
    }
}

async fn choice(t: &pb::ChoiceTask, env: &Env) -> Result<pb::ChoiceResult, Failure> {
    use quantfarm_eval::choice::{read_any, score_tasks};
    let dir = task_dir(env)?;
    let model_path = local_model(&t.model, dir.path(), env).await?;
    let blob = quantfarm_store::Blob::open(&location(&t.tasks)?).await?;
    let bytes = blob.read_vec(0, blob.len()).await?;
    let tasks_sha256 = quantfarm_store::hex(&Sha256::digest(&bytes));
    let (t, env) = (t.clone(), env.clone());
    blocking(move || {
        let tasks = read_any(&bytes, &t.tasks)?;
        let (model, note) = load_prepared(&model_path, None, dir.path(), &env)?;
        // llama-perplexity's defaults beside -c: -b 2048, -np at least 4.
        let scores = score_tasks(&model, &tasks, t.ctx, 2048, 4)?;
        Ok(pb::ChoiceResult {
            tasks_sha256,
            chosen: scores.iter().map(|s| s.chosen as u32).collect(),
            correct: scores.iter().map(|s| s.correct).collect(),
            n_answers: scores.iter().map(|s| s.log_probs.len() as u32).collect(),
            note: note.unwrap_or_default(),
        })
    })
    .await
}
