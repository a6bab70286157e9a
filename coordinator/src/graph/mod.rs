//! The task graph of a release: which tasks exist (before and after planning), what each depends on, how costly
//! it is (for critical-path priorities), and the concrete task message a worker receives once its dependencies
//! have results.
//!
//! Task ids are structured keys (`gguf/2`, `quantize/Q8_0/2`, `verify/quantize/Q8_0/2`, …), parsed back into
//! [`TaskKey`], so the journal stores only ids and results and the messages are rebuilt the same way after a
//! restart. Output locations are content-addressed: a folder named by the sha256 of everything the output
//! depends on, so a task run twice writes (or finds) the same object.
//!
//! By concern: [`keys`] (task ids), [`expand`] (which tasks a release starts with and what a finished task adds),
//! [`messages`] (the message a ready task is sent) and [`naming`] (where outputs live: the one function that names
//! an artifact), [`inputs`] (the farm-made files a task reads).

mod expand;
mod inputs;
mod keys;
mod messages;
mod naming;

pub use expand::{eval_targets, grows, initial, priorities, Growth};
pub use inputs::{input_urls, shard_file, stored_output};
pub use keys::{CheckPart, EvalTarget, MlxSubject, Subject, TaskKey, MLX_LM_RUNTIME};
pub use messages::build;
pub use naming::{output_url, synthetic_name, written_url};

use quantfarm_proto as pb;
use quantfarm_store::Location;

use crate::spec::ReleaseSpec;

/// A task as the scheduler needs it: identity, dependencies, and an estimated cost (bytes handled).
#[derive(Clone, Debug)]
pub struct TaskDef {
    pub key: TaskKey,
    pub deps: Vec<TaskKey>,
    pub cost: u64,
}

/// What the graph needs to know about its release.
pub struct Ctx<'a> {
    pub spec: &'a ReleaseSpec,
    /// The source, resolved against the submitter's folder.
    pub source: &'a str,
    /// The importance matrix, or its calibration text when the farm computes it, resolved likewise ("" for none).
    pub imatrix: &'a str,
    /// The adapter merged into the source, resolved likewise ("" for none).
    pub adapter: &'a str,
    /// The evaluation's inputs, resolved likewise.
    pub eval: &'a EvalInputs,
    pub store: &'a Location,
}

/// The evaluation's input files, resolved against the submitter's folder ("" for none).
#[derive(Clone, Debug, Default)]
pub struct EvalInputs {
    pub text: String,
    pub prompts: String,
    pub probes: String,
}

/// Looks up the results of finished tasks.
pub type Results<'a> = dyn Fn(&TaskKey) -> Option<&'a pb::TaskResult> + 'a;
