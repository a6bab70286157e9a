//! `imatrix/G`: the importance statistics of one chunk group of the calibration text (as llama-imatrix collects
//! them, `tools/imatrix/imatrix.cpp`), stored as an imatrix part.

use quantfarm_eval::imatrix::{collect as collect_imatrix, CollectOptions};
use quantfarm_proto::{self as pb, task_result, WorkerKind};
use quantfarm_store::Digest;
use quantfarm_store::Location;

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{local_model, read_text, task_dir};
use crate::llama::{blocking, eval_failure, load, settings, tokenize_as_planned};
use crate::outputs::produce;

pub struct Imatrix;

impl Executor for Imatrix {
    type Task = pb::ImatrixTask;
    const KIND: WorkerKind = WorkerKind::Imatrix;

    async fn run(t: &pb::ImatrixTask, env: &Env) -> Result<task_result::Kind, Failure> {
        let made = produce(&t.output, env, |out| async move { write_imatrix_part(t, &out, env).await }).await?;
        Ok(task_result::Kind::Artifact(made))
    }
}

async fn write_imatrix_part(t: &pb::ImatrixTask, out: &Location, env: &Env) -> Result<Digest, Failure> {
    let s = settings(&t.settings)?.clone();
    let dir = task_dir(env)?;
    let reference = local_model(&t.reference, dir.path(), env).await?;
    let (text, _) = read_text(&s.text).await?;
    let (first, count, expect) = (t.first_chunk as usize, t.n_chunks as usize, t.tokens_sha256.clone());
    let (env2, dataset, all_experts) = (env.clone(), t.dataset.clone(), t.all_experts);
    let part = blocking(move || {
        let model = load(&reference, None, &env2)?;
        let header = tokenize_as_planned(&model, &text, &s, &expect)?;
        let bos = model.add_bos().then(|| model.bos());
        drop(model);
        let opts = CollectOptions { threads: env2.threads, batch: s.batch, all_experts, ..CollectOptions::default() };
        let mut parts = collect_imatrix(&reference, &opts, &header, bos, first, count, &[dataset])
            .map_err(|e| eval_failure(e, &s))?;
        drop(dir);
        match parts.len() {
            1 => Ok(parts.remove(0)),
            n => Err(Failure::input(format!("chunks {first}..{}: {n} decode groups, a task takes one", first + count))),
        }
    })
    .await?;
    let done = part.write(out, true, false).await?;
    Ok(Digest::new(done.sha256, done.bytes))
}
