//! `gguf`: converts one split file of the source to GGUF BF16.

use quantfarm_proto::{self as pb, task_result, WorkerKind};

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::outputs::produce;
use crate::writers::write_gguf;

pub struct Gguf;

impl Executor for Gguf {
    type Task = pb::GgufShardTask;
    const KIND: WorkerKind = WorkerKind::Gguf;

    async fn run(g: &pb::GgufShardTask, env: &Env) -> Result<task_result::Kind, Failure> {
        let made = produce(&g.output, env, |out| async move { write_gguf(g, &out, env).await }).await?;
        Ok(task_result::Kind::Artifact(made))
    }
}
