//! One executor per task kind, one file each. An executor names the task message it runs and declares the worker
//! kind it belongs to; [`executors!`]'s table below is the one place that maps the protocol's task kinds to
//! executors: an exhaustive match, so a new task message does not compile until it has one, and what the worker
//! advertises is what the table's executors declare ([`kinds`]).
//!
//! Executors are thin calls into `tensors`, `quant` and `eval`, and import only the worker's service modules below
//! them: [`crate::fetch`] (inputs), [`crate::outputs`] (content-addressed outputs), [`crate::writers`] (how each
//! deterministic output is made), [`crate::llama`] (the evaluation runtime), [`crate::mlx_run`] (mlx-lm, another
//! runtime), [`crate::transformers_run`] (transformers, a third), [`crate::failure`] and
//! [`crate::env`]. The lease loop (`lib.rs`) knows none of them: it calls [`run`].

mod choice;
mod gguf;
mod greedy;
mod helper_runs;
mod imatrix;
mod imatrix_merge;
mod kld;
mod kld_base;
mod kld_plan;
mod merge;
mod merge_check;
mod merge_plan;
mod mlx;
mod mlx_lm_greedy;
mod mlx_lm_kld;
mod mlx_lm_probe;
mod noop;
mod peer_kld;
mod plan;
mod probe;
mod quantize;
mod sensitivity;
mod transformers_greedy;
mod transformers_kld;
mod transformers_probe;
mod verify;
mod vllm;

use std::future::Future;

use quantfarm_proto::{self as pb, task, task_result, WorkerKind};

use crate::env::Env;
use crate::failure::Failure;

/// Runs one kind of task.
pub trait Executor {
    /// The task message it runs.
    type Task;
    /// The worker kind it belongs to: what a worker advertises so that the scheduler leases it such tasks.
    const KIND: WorkerKind;
    /// Runs the task within `env`; the result's shape is the one the protocol gives the task's kind.
    fn run(task: &Self::Task, env: &Env) -> impl Future<Output = Result<task_result::Kind, Failure>> + Send;
}

/// The table: each task kind of the protocol (a variant of `task::Kind`) and its executor.
macro_rules! executors {
    ($($variant:ident => $exec:ty,)*) => {
        async fn dispatch(kind: &task::Kind, env: &Env) -> Result<task_result::Kind, Failure> {
            match kind {
                $(task::Kind::$variant(t) => <$exec as Executor>::run(t, env).await,)*
            }
        }

        /// Each executor's declared kind, in table order.
        const DECLARED: &[WorkerKind] = &[$(<$exec as Executor>::KIND,)*];

        /// (declared, the protocol's) worker kind of every task kind.
        #[cfg(test)]
        fn declared_and_protocol() -> Vec<(&'static str, WorkerKind, WorkerKind)> {
            vec![$((
                stringify!($variant),
                <$exec as Executor>::KIND,
                task::Kind::$variant(Default::default()).worker_kind(),
            ),)*]
        }
    };
}

executors! {
    Plan => plan::Plan,
    Gguf => gguf::Gguf,
    Quantize => quantize::Quantize,
    Verify => verify::Verify,
    Noop => noop::Noop,
    MergePlan => merge_plan::MergePlan,
    Merge => merge::Merge,
    MergeCheck => merge_check::MergeCheck,
    Mlx => mlx::Mlx,
    Vllm => vllm::Vllm,
    KldPlan => kld_plan::KldPlan,
    KldBase => kld_base::KldBase,
    Kld => kld::Kld,
    Imatrix => imatrix::Imatrix,
    ImatrixMerge => imatrix_merge::ImatrixMerge,
    Greedy => greedy::Greedy,
    Probe => probe::Probe,
    Choice => choice::Choice,
    PeerKld => peer_kld::PeerKld,
    MlxLmGreedy => mlx_lm_greedy::MlxLmGreedy,
    MlxLmKld => mlx_lm_kld::MlxLmKld,
    MlxLmProbe => mlx_lm_probe::MlxLmProbe,
    TransformersGreedy => transformers_greedy::TransformersGreedy,
    TransformersKld => transformers_kld::TransformersKld,
    TransformersProbe => transformers_probe::TransformersProbe,
    SensitivityLookup => sensitivity::SensitivityLookup,
    SensitivityProbe => sensitivity::SensitivityProbe,
    SensitivityWrite => sensitivity::SensitivityWrite,
}

/// The worker kinds this build's executors declare, each once: what the worker advertises.
pub fn kinds() -> Vec<WorkerKind> {
    let mut kinds = DECLARED.to_vec();
    kinds.sort();
    kinds.dedup();
    kinds
}

/// Runs `t` with the executor of its kind, in an env of its own (`Env::for_task`).
pub async fn run(t: &pb::Task, env: &Env) -> Result<pb::TaskResult, Failure> {
    run_in(t, &env.for_task(t)).await
}

/// Runs `t` in `env`, made for it by `Env::for_task` (the caller reads what it counted, e.g. its fetching time).
pub async fn run_in(t: &pb::Task, env: &Env) -> Result<pb::TaskResult, Failure> {
    let kind = t.kind.as_ref().ok_or_else(|| Failure::input("the task has no kind"))?;
    Ok(pb::TaskResult { kind: Some(dispatch(kind, env).await?) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_executor_declares_the_kind_the_protocol_gives_its_task() {
        for (variant, declared, protocol) in declared_and_protocol() {
            assert_eq!(declared, protocol, "{variant}: the executor declares {declared}, the protocol says {protocol}");
        }
    }

    #[test]
    fn the_worker_advertises_every_kind() {
        assert_eq!(kinds(), WorkerKind::ALL.to_vec());
    }
}
