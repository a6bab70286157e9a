//! `mlx-lm/probe/SUBJECT`: the release's probe suite on the model served by `mlx_lm.server`, as MLX users serve it
//! (OpenAI-compatible; every request carries the suite's `chat_template_kwargs` and `"model": "default_model"`,
//! the server's name for the model it was started with). The model is first loaded by the helper, so a checkpoint
//! mlx-lm cannot load is answered with mlx-lm's message as for the other mlx-lm tasks, and the run records the
//! versions and device; then the server runs it (upcast on the CPU build as the helper does).

use std::time::Duration;

use quantfarm_eval::probe::{run_suite, Suite};
use quantfarm_eval::responders::Endpoint;
use quantfarm_proto::{self as pb, task_result, WorkerKind};

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{local_model, read_text, task_dir};
use crate::llama::blocking;
use crate::mlx_lm::{free_port, Server};
use crate::mlx_run::{checkpoint, failure, open, Opened};

/// How long the server may take to answer `/health` (it imports mlx and mlx-lm; the model loads on the first
/// request).
const READY: Duration = Duration::from_secs(300);

pub struct MlxLmProbe;

impl Executor for MlxLmProbe {
    type Task = pb::MlxLmProbeTask;
    const KIND: WorkerKind = WorkerKind::MlxLm;

    async fn run(t: &pb::MlxLmProbeTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::Probe(probe(t, env).await?))
    }
}

async fn probe(t: &pb::MlxLmProbeTask, env: &Env) -> Result<pb::ProbeResult, Failure> {
    let dir = task_dir(env)?;
    let model = checkpoint(&t.model, local_model(&t.model, dir.path(), env).await?, dir.path(), env).await?;
    let (text, _) = read_text(&t.suite).await?;
    let suite = Suite::parse(&t.suite, &text)?;
    let run = match open(&model, &env.scratch).await? {
        Opened::Ready(helper, run) => {
            helper.stop().await;
            run
        }
        Opened::Refused(run) => return Ok(pb::ProbeResult { mlx_lm: Some(run), ..Default::default() }),
    };
    let port = free_port().map_err(|e| Failure::transient("a loopback port for mlx_lm.server", e))?;
    let python = crate::runtimes::python();
    let server = Server::start(&python, &env.scratch, &model.path, port, run.upcast, READY).await.map_err(failure)?;
    let url = server.url.clone();
    let report = blocking(move || {
        let mut responder = Endpoint::new(&url, Some("default_model"))?;
        Ok(run_suite(&suite, &mut responder)?)
    })
    .await;
    let tail = server.log_tail();
    server.stop().await;
    drop(dir);
    let report = report.map_err(|e| Failure { message: format!("{} (mlx_lm.server: {tail})", e.message), ..e })?;
    super::probe::result(&report, "served by mlx_lm.server".into(), Some(run))
}
