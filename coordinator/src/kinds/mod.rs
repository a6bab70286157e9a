//! The coordinator's task kinds, one file per family, mirroring the worker's executors (`worker/src/exec/`).
//!
//! A family is the first segment of its tasks' ids (`quantize` in `quantize/Q8_0/2`). Its file holds:
//! - its keys: the id written and parsed back ([`Family::write_rest`], [`Family::parse`]);
//! - what runs them: the worker kind and runtime a worker must advertise;
//! - the progress stage they count towards;
//! - the message a worker receives once the task's dependencies have results ([`Family::message`]);
//! - what a finished task gives the report ([`Family::fold`] into [`Folded`]).
//!
//! [`kinds!`]'s table below is the one list of families. [`TaskKey`] is generated from it, and every dispatch over
//! keys is an exhaustive match the table writes: a new family does not compile until it is in the table and
//! implements [`Family`]. When a family's tasks enter a release's graph is its own [`Family::grow`], called at each
//! [`Stage`] in the table's order (the report last): `expand` holds the stages and what the families share.
//!
//! Shared by the families: [`subjects`] (what a measuring task runs) and `lookup` (the earlier results a message
//! reads).

mod expand;
mod folded;
mod lookup;
mod subjects;

mod choice;
mod gguf;
mod greedy;
mod imatrix;
mod kld;
mod kld_base;
mod merge;
mod merge_check;
mod mlx;
mod mlx_lm;
mod noop;
mod peer;
mod plan;
mod probe;
mod quantize;
mod report;
mod search;
mod sensitivity;
mod third_party;
mod transformers;
mod verify;
mod vllm;

use std::fmt;
use std::hash::{Hash, Hasher};

use quantfarm_proto::{self as pb, task};

pub use choice::Choice;
pub use expand::{
    eval_targets, eval_targets_of, grows, initial, peft_adapter, priorities, Grown, Growth, Inventory, Opens, Stage,
};
pub use folded::{Done, Folded, MlxLmAcc, RuntimeAcc, Slot, SlotAcc, ThirdPartyAcc, MERGE_CHECK};
pub use gguf::Gguf;
pub use greedy::Greedy;
pub use imatrix::Imatrix;
pub use kld::{Kld, Sequential};
pub use kld_base::KldBase;
pub use merge::Merge;
pub use merge_check::MergeCheck;
pub use mlx::Mlx;
pub use mlx_lm::MlxLm;
pub use noop::Noop;
pub use peer::PeerRun;
pub use plan::Plan;
pub use probe::Probe;
pub use quantize::Quantize;
pub use report::Report;
pub use search::{search_text, Search};
pub use sensitivity::{chosen, sensitivity, Chosen, Sensitivity};
pub use subjects::{CheckPart, EvalTarget, MlxSubject, Subject, TfSubject, MLX_LM_RUNTIME, TRANSFORMERS_RUNTIME};
pub use third_party::ThirdParty;
pub use transformers::Transformers;
pub use verify::Verify;
pub use vllm::Vllm;

use crate::graph::Ctx;

/// One family of tasks: its keys, what runs them, their messages and what they give the report.
pub trait Family: Sized + Clone + fmt::Debug + PartialEq + Eq + Hash {
    /// The first segment of its tasks' ids, and the label the metrics page groups run times by.
    const NAME: &'static str;

    /// Writes the id's segments after the family's name, each led by `/` (nothing for a one-task family).
    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;

    /// The key of the id whose segments after the family's name are `rest` (the inverse of [`Family::write_rest`]).
    fn parse(rest: &[&str]) -> Option<Self>;

    /// The worker kind that runs the task (what workers advertise), or `None` for the coordinator's own tasks.
    fn worker_kind(&self) -> Option<pb::WorkerKind>;

    /// The runtime a worker must advertise besides its kind (a peer tool, mlx-lm); most kinds need none.
    fn runtime(&self) -> Option<&'static str> {
        None
    }

    /// The progress stage the task counts towards.
    fn stage(&self) -> String;

    /// The message a worker gets for the task, built from the results of its dependencies (all present).
    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String>;

    /// What the finished task gives the report: its result added to `into`.
    fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>);

    /// The family's tasks that enter the graph at `stage` (what each waits for, its cost), added to `out`.
    fn grow(stage: Stage, ctx: &Ctx, results: &Results, out: &mut Grown);

    /// The stage the finished task's `result` opens, if any (the plans'), or why the result cannot be expanded.
    fn opens<'r>(&self, _result: &'r pb::TaskResult) -> Result<Opens<'r>, String> {
        Ok(Opens::Nothing)
    }
}

/// Looks up the results of finished tasks.
pub type Results<'a> = dyn Fn(&TaskKey) -> Option<&'a pb::TaskResult> + 'a;

/// A task as the scheduler needs it: identity, dependencies, and an estimated cost (bytes handled).
#[derive(Clone, Debug)]
pub struct TaskDef {
    pub key: TaskKey,
    pub deps: Vec<TaskKey>,
    pub cost: u64,
}

/// The table: each family's variant of [`TaskKey`] and its key type.
macro_rules! kinds {
    ($($variant:ident($ty:ty),)*) => {
        /// A task's identity: its family and its key within it. Printed as the task's id (`quantize/Q8_0/2`) and
        /// parsed back, so the journal stores only ids and results and the messages are rebuilt the same way after
        /// a restart.
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub enum TaskKey {
            $($variant($ty),)*
        }

        $(impl From<$ty> for TaskKey {
            fn from(k: $ty) -> TaskKey {
                TaskKey::$variant(k)
            }
        })*

        impl fmt::Display for TaskKey {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    $(TaskKey::$variant(k) => {
                        f.write_str(<$ty as Family>::NAME)?;
                        k.write_rest(f)
                    })*
                }
            }
        }

        impl TaskKey {
            /// The inverse of `Display`.
            pub fn parse(id: &str) -> Option<TaskKey> {
                let mut parts = id.split('/');
                let family = parts.next()?;
                let rest: Vec<&str> = parts.collect();
                $(if family == <$ty as Family>::NAME {
                    return <$ty as Family>::parse(&rest).map(TaskKey::$variant);
                })*
                None
            }

            /// The task's family: the first segment of its id (`quantize/Q8_0/0` → `quantize`), the label the
            /// metrics page groups run times by.
            pub fn family(&self) -> &'static str {
                match self {
                    $(TaskKey::$variant(_) => <$ty as Family>::NAME,)*
                }
            }

            /// The worker kind that runs the task (what workers advertise), or `None` for the coordinator's own
            /// tasks. A test checks it against the kind of the message [`TaskKey::message`] makes.
            pub fn worker_kind(&self) -> Option<pb::WorkerKind> {
                match self {
                    $(TaskKey::$variant(k) => k.worker_kind(),)*
                }
            }

            /// The runtime a worker must advertise to run the task (a peer tool, mlx-lm), besides its kind.
            pub fn runtime(&self) -> Option<&'static str> {
                match self {
                    $(TaskKey::$variant(k) => k.runtime(),)*
                }
            }

            /// The progress stage the task counts towards.
            pub fn stage(&self) -> String {
                match self {
                    $(TaskKey::$variant(k) => k.stage(),)*
                }
            }

            /// The task's sort: its family and its key's variant within it, so that two tasks of one sort do the
            /// same work on different data (the scheduler compares their run times).
            pub fn sort(&self) -> (&'static str, u64) {
                fn variant<T>(k: &T) -> u64 {
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    std::mem::discriminant(k).hash(&mut h);
                    h.finish()
                }
                match self {
                    $(TaskKey::$variant(k) => (<$ty as Family>::NAME, variant(k)),)*
                }
            }

            /// The message a worker gets for the task, built from the results of its dependencies (all present).
            pub fn message(&self, ctx: &Ctx, results: &Results) -> Result<pb::Task, String> {
                let kind = match self {
                    $(TaskKey::$variant(k) => k.message(ctx, results)?,)*
                };
                debug_assert_eq!(Some(kind.worker_kind()), self.worker_kind(), "{self}: the message's kind");
                Ok(pb::Task { kind: Some(kind), known_output_sha256: String::new(), inputs: Vec::new() })
            }

            /// Every family's tasks that enter the graph at `stage`, in the table's order.
            fn grow(stage: Stage, ctx: &Ctx, results: &Results, out: &mut Grown) {
                $(<$ty as Family>::grow(stage, ctx, results, out);)*
            }

            /// The stage the finished task's `result` opens, if any.
            pub fn opens<'r>(&self, result: &'r pb::TaskResult) -> Result<Opens<'r>, String> {
                match self {
                    $(TaskKey::$variant(k) => k.opens(result),)*
                }
            }

            /// Adds the finished task's result to what the report gathers.
            pub fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>) {
                match self {
                    $(TaskKey::$variant(k) => k.fold(done, into),)*
                }
            }
        }

        /// Every family's name, in table order.
        #[cfg(test)]
        const FAMILIES: &[&str] = &[$(<$ty as Family>::NAME,)*];
    };
}

kinds! {
    Merge(Merge),
    Plan(Plan),
    MergeCheck(MergeCheck),
    Mlx(Mlx),
    Vllm(Vllm),
    Gguf(Gguf),
    Imatrix(Imatrix),
    Search(Search),
    Quantize(Quantize),
    Verify(Verify),
    Kld(Kld),
    KldBase(KldBase),
    Greedy(Greedy),
    MlxLm(MlxLm),
    Transformers(Transformers),
    Peer(PeerRun),
    Probe(Probe),
    Choice(Choice),
    ThirdParty(ThirdParty),
    Noop(Noop),
    // Last: at the start and after the plan, the report waits for what the others made the report wait for.
    Report(Report),
}

impl TaskKey {
    /// The plan of the release's source (or of its merge).
    pub const PLAN: TaskKey = TaskKey::Plan(Plan);
    /// The coordinator's own last task: gathers every result, applies the gates and signs.
    pub const REPORT: TaskKey = TaskKey::Report(Report);
}

/// Parses one numeric segment of an id.
fn num(s: &str) -> Option<u32> {
    s.parse().ok()
}

#[cfg(test)]
mod tests;
