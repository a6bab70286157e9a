//! `probe/MODEL`: the release's probe suite on the built-in runtime (link 4 of the parity method).

use quantfarm_proto::{self as pb, task_result, WorkerKind};

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{local_model, read_text, task_dir};
use crate::llama::{blocking, load_prepared};

pub struct Probe;

impl Executor for Probe {
    type Task = pb::ProbeTask;
    const KIND: WorkerKind = WorkerKind::Probe;

    async fn run(t: &pb::ProbeTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::Probe(probe(t, env).await?))
    }
}

async fn probe(t: &pb::ProbeTask, env: &Env) -> Result<pb::ProbeResult, Failure> {
    use quantfarm_eval::probe::{run_suite, Suite};
    use quantfarm_eval::responders::Builtin;
    let dir = task_dir(env)?;
    let model_path = local_model(&t.model, dir.path(), env).await?;
    let (text, _) = read_text(&t.suite).await?;
    let (t, env) = (t.clone(), env.clone());
    blocking(move || {
        let suite = Suite::parse(&t.suite, &text)?;
        let (model, note) = load_prepared(&model_path, None, dir.path(), &env)?;
        let mut responder = Builtin::new(&model, t.ctx)?;
        let report = run_suite(&suite, &mut responder)?;
        result(&report, note.unwrap_or_default(), None)
    })
    .await
}

/// A suite's report as the protocol's result (also the mlx-lm probe task's).
pub(super) fn result(
    report: &quantfarm_eval::probe::ProbeReport,
    note: String,
    mlx_lm: Option<pb::MlxLmRun>,
) -> Result<pb::ProbeResult, Failure> {
    Ok(pb::ProbeResult {
        suite: report.suite.clone(),
        passed: report.passed as u32,
        failed: report.failed as u32,
        truncated: report.truncated as u32,
        mean_score: report.mean_score,
        score_spread: report.score_spread,
        pass_scores: report.pass_scores.clone(),
        report_json: serde_json::to_string(report).map_err(|e| Failure::internal(format!("probe report: {e}")))?,
        note,
        mlx_lm,
        transformers: None,
    })
}
