//! What every task kind builds on (`crate::kinds` holds the kinds): the release as a task sees it ([`Ctx`]) and
//! where outputs live ([`naming`]: the one function that names an artifact). Output locations are content-addressed:
//! a folder named by the sha256 of everything the output depends on, so a task run twice writes (or finds) the same
//! object. (What a task message reads is the message's own: `task::Kind::reads` in the protocol crate.)

pub(crate) mod naming;

pub use naming::{output_url, synthetic_name, written_url};

use quantfarm_store::Location;

use crate::spec::ReleaseSpec;

/// What the graph needs to know about its release.
pub struct Ctx<'a> {
    pub spec: &'a ReleaseSpec,
    /// The source, resolved against the submitter's folder.
    pub source: &'a str,
    /// The importance matrix, or its calibration text when the farm computes it, resolved likewise.
    pub imatrix: Option<&'a str>,
    /// The adapter merged into the source, resolved likewise.
    pub adapter: Option<&'a str>,
    /// The evaluation's inputs, resolved likewise.
    pub eval: &'a EvalInputs,
    pub store: &'a Location,
}

/// The evaluation's input files, resolved against the submitter's folder.
#[derive(Clone, Debug, Default)]
pub struct EvalInputs {
    pub text: Option<String>,
    pub prompts: Option<String>,
    pub probes: Option<String>,
    pub choices: Option<String>,
    /// The third parties' GGUF files of `evaluation.peers`, in their order.
    pub third_party: Vec<String>,
    /// `outputs.gguf.search.text`, when given (else the search measures on the importance matrix's text).
    pub search_text: Option<String>,
}
