//! `noop`: does nothing, after an optional sleep (the scheduler's benchmark and the farm's fault tests).

use std::time::Duration;

use quantfarm_proto::{self as pb, task_result, WorkerKind};

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;

pub struct Noop;

impl Executor for Noop {
    type Task = pb::NoopTask;
    const KIND: WorkerKind = WorkerKind::Noop;

    async fn run(n: &pb::NoopTask, _env: &Env) -> Result<task_result::Kind, Failure> {
        if n.sleep_ms > 0 {
            tokio::time::sleep(Duration::from_millis(n.sleep_ms as u64)).await;
        }
        Ok(task_result::Kind::Noop(pb::NoopResult {}))
    }
}
