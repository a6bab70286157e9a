//! `quantize`: quantizes one split file to one level, with the release's importance matrix when it has one.

use quantfarm_proto::{self as pb, task_result, WorkerKind};

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::outputs::produce;
use crate::writers::write_quantized;

pub struct Quantize;

impl Executor for Quantize {
    type Task = pb::QuantizeTask;
    const KIND: WorkerKind = WorkerKind::Quantize;

    async fn run(q: &pb::QuantizeTask, env: &Env) -> Result<task_result::Kind, Failure> {
        let made = produce(&q.output, env, |out| async move { write_quantized(q, &out, env).await }).await?;
        Ok(task_result::Kind::Artifact(made))
    }
}
