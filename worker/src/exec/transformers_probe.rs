//! `transformers/probe/SUBJECT`: the release's probe suite in transformers, on the bf16 checkpoint or a vLLM rung
//! with its activations (FP8_DYNAMIC's W8A8 emulated, or weight-only): each chat rendered by the checkpoint's own
//! chat template with the probe's template kwargs, as vLLM's chat endpoint renders it, and answered by the helper
//! (`chat`); judged by the same rules as every runtime's probes (`quantfarm_eval::probe::run_suite`).
//!
//! The suite runner is synchronous (the built-in runtime and the HTTP endpoints are); the helper is driven from its
//! thread through the task's runtime handle. A helper error stops the suite and is the task's failure, with its own
//! kind (a chat the template cannot render is the input's, a dead helper transient).

use quantfarm_eval::probe::{run_suite, Completion, Finish, Probe, Responder, Suite};
use quantfarm_proto::{self as pb, task_result, WorkerKind};

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{read_text, task_dir};
use crate::helper::Error;
use crate::llama::blocking;
use crate::transformers::Transformers;
use crate::transformers_run::{open_task, Opened, Request};

pub struct TransformersProbe;

impl Executor for TransformersProbe {
    type Task = pb::TransformersProbeTask;
    const KIND: WorkerKind = WorkerKind::Transformers;

    async fn run(t: &pb::TransformersProbeTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::Probe(probe(t, env).await?))
    }
}

async fn probe(t: &pb::TransformersProbeTask, env: &Env) -> Result<pb::ProbeResult, Failure> {
    let dir = task_dir(env)?;
    let (text, _) = read_text(&t.suite).await?;
    let suite = Suite::parse(&t.suite, &text)?;
    let request = Request { model: &t.model, adapter: "", activations: &t.activations, dtype: &t.dtype };
    let (helper, run) = match open_task(request, dir.path(), env).await? {
        Opened::Ready(helper, run) => (helper, run),
        Opened::Refused(run) => return Ok(pb::ProbeResult { transformers: Some(run), ..Default::default() }),
    };
    let name = t.model.clone();
    let handle = tokio::runtime::Handle::current();
    let (report, helper) = blocking(move || {
        let mut responder = HelperResponder { helper, handle, name, error: None };
        let report = run_suite(&suite, &mut responder);
        let HelperResponder { helper, error, .. } = responder;
        let report = match (report, error) {
            (_, Some(e)) => Err(Failure::from(e)),
            (Err(e), None) => Err(Failure::from(e)),
            (Ok(r), None) => Ok(r),
        };
        Ok((report, helper))
    })
    .await?;
    helper.stop().await;
    drop(dir);
    let mut result = super::probe::result(&report?, "run in transformers".into(), None)?;
    result.transformers = Some(run);
    Ok(result)
}

/// The helper as a [`Responder`]: each completion one `chat` request, made from the suite's thread.
struct HelperResponder {
    helper: Box<Transformers>,
    handle: tokio::runtime::Handle,
    /// The model's URL, in the report's `runtime` and in errors.
    name: String,
    /// The helper's first error, kept with its kind (the suite runner sees only that it failed).
    error: Option<Error>,
}

impl Responder for HelperResponder {
    fn describe(&self) -> String {
        let v = &self.helper.versions;
        format!("transformers {} (torch {}) on {}, {}", v.transformers, v.torch, v.device, self.name)
    }

    fn complete(&mut self, probe: &Probe, repeat: usize) -> quantfarm_eval::Result<Completion> {
        match self.handle.block_on(self.helper.chat(probe, repeat)) {
            Ok(c) => Ok(Completion {
                content: c.content,
                reasoning: None,
                finish: if c.finish == "length" { Finish::Length } else { Finish::Stop },
                prompt_tokens: Some(c.prompt_tokens),
            }),
            Err(e) => {
                let msg = e.to_string();
                self.error.get_or_insert(e);
                Err(quantfarm_eval::Error::Runtime { model: self.name.clone(), msg })
            }
        }
    }
}
