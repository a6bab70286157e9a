//! What the report gathers from a release's finished tasks, each family adding its own ([`super::Family::fold`]):
//! the files of every published artifact and their verifications, chunk statistics, greedy agreements, probe
//! results, peer figures, mlx-lm and transformers runs. `report/build.rs` turns it into the report's sections.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use quantfarm_parity::ChunkStats;
use quantfarm_proto as pb;
use quantfarm_report::model::{MlxLmRuntime, TransformersRuntime};

use super::subjects::{EvalTarget, MlxSubject, Subject, TfSubject};
use crate::spec::Level;

/// A finished task as its family's fold sees it: the message it ran and its result (either may be missing).
#[derive(Clone, Copy, Debug)]
pub struct Done<'a> {
    pub task: Option<&'a pb::Task>,
    pub result: Option<&'a pb::TaskResult>,
}

/// A published artifact: the merged checkpoint, the GGUF BF16, or a measured rung (a quant level or an MLX
/// checkpoint).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Slot {
    Merged,
    Bf16,
    Rung(EvalTarget),
}

impl Slot {
    /// The artifact's `file_type` in the report.
    pub fn file_type(self) -> String {
        match self {
            Slot::Merged => "merged".into(),
            Slot::Bf16 => "BF16".into(),
            Slot::Rung(target) => target.to_string(),
        }
    }
}

/// One artifact's files (every split file of one GGUF), its tensor types and its verifications, as gathered.
#[derive(Debug, Default)]
pub struct SlotAcc {
    pub files: Vec<pb::Artifact>,
    /// Per ggml type: (tensors, elements, bytes).
    pub types: BTreeMap<String, (u64, u64, u64)>,
    /// Each verification's outcome: whether the recomputed bytes were identical.
    pub verified: Vec<bool>,
}

/// One mlx-lm subject's runs, as gathered.
#[derive(Debug, Default)]
pub struct MlxLmAcc<'a> {
    pub agreements: Vec<&'a pb::PromptAgreement>,
    pub continuations: usize,
    /// How mlx-lm loaded it; the run that met a load error where one did.
    pub run: Option<&'a pb::MlxLmRun>,
    pub ran_greedy: bool,
    pub probe: Option<&'a pb::ProbeResult>,
}

/// One transformers subject's runs, as gathered.
#[derive(Debug, Default)]
pub struct RuntimeAcc<'a> {
    pub agreements: Vec<&'a pb::PromptAgreement>,
    pub continuations: usize,
    /// How transformers loaded it; the run that met a load error where one did.
    pub run: Option<&'a pb::TransformersRun>,
    pub ran_greedy: bool,
    pub probe: Option<&'a pb::ProbeResult>,
}

/// Everything the report gathers from the finished tasks.
#[derive(Debug, Default)]
pub struct Folded<'a> {
    pub slots: HashMap<Slot, SlotAcc>,
    /// Per measured model (its `file_type`): its chunk groups' KL-divergence statistics.
    pub kld: BTreeMap<String, Vec<ChunkStats>>,
    /// Per model compared with a reference (its `file_type`, or the merge check's): its prompts' agreements.
    pub greedy: BTreeMap<String, (Subject, Vec<&'a pb::PromptAgreement>)>,
    /// Per reference subject (its name): how many continuations it gave.
    pub greedy_references: BTreeMap<String, usize>,
    /// Each probe run, in task order.
    pub probes: Vec<(Subject, &'a pb::ProbeResult)>,
    /// Each multiple-choice run, in task order.
    pub choices: Vec<(Subject, &'a pb::ChoiceResult)>,
    /// Each third-party GGUF file's chunk statistics and description, by its index among them.
    pub third_party: BTreeMap<u32, ThirdPartyAcc<'a>>,
    /// Each peer tool's run on a quant level, in task order.
    pub peers: Vec<(Level, &'a pb::PeerKldResult)>,
    /// Each peer tool's version, as it reported it.
    pub peer_versions: BTreeMap<String, String>,
    /// Per mlx-lm subject (its name): its chunk groups' statistics against llama.cpp's base logits.
    pub mlx_lm_kld: BTreeMap<String, Vec<ChunkStats>>,
    pub mlx_lm: BTreeMap<MlxSubject, MlxLmAcc<'a>>,
    /// The runtime of every mlx-lm run that loaded its model.
    pub mlx_lm_runtimes: BTreeSet<MlxLmRuntime>,
    /// What mlx-lm loaded for the bf16 weights (the first task that names it).
    pub mlx_lm_model: Option<String>,
    /// Per transformers subject: its chunk groups' statistics against llama.cpp's base logits.
    pub transformers_kld: BTreeMap<TfSubject, Vec<ChunkStats>>,
    pub transformers: BTreeMap<TfSubject, RuntimeAcc<'a>>,
    /// The runtime of every transformers run that loaded its model.
    pub transformers_runtimes: BTreeSet<TransformersRuntime>,
    /// What transformers loaded for the bf16 checkpoint (the first task that names it).
    pub transformers_model: Option<String>,
}

impl<'a> Folded<'a> {
    /// A task that made (part of) `slot`'s files.
    pub fn makes(&mut self, slot: Slot, done: Done<'a>) {
        let acc = self.slots.entry(slot).or_default();
        let Some(a) = done.result.and_then(pb::TaskResult::artifact) else { return };
        acc.files.push(a.clone());
        for tc in &a.types {
            let e = acc.types.entry(tc.ggml_type.clone()).or_default();
            e.0 += tc.tensors;
            e.1 += tc.elements;
            e.2 += tc.bytes;
        }
    }

    /// A task that recomputed (part of) `slot`'s files and compared them.
    pub fn verifies(&mut self, slot: Slot, done: Done<'a>) {
        let identical = done.result.and_then(pb::TaskResult::verify).is_some_and(|v| v.identical);
        self.slots.entry(slot).or_default().verified.push(identical);
    }
}

/// The key of the merge check's agreements in [`Folded::greedy`].
pub const MERGE_CHECK: &str = "merge-check";

/// A third party's file as its KL-divergence tasks found it.
#[derive(Debug, Default)]
pub struct ThirdPartyAcc<'a> {
    pub chunks: Vec<ChunkStats>,
    /// The file's sha256, size and tensor types (from its first group's task).
    pub file: Option<&'a pb::Artifact>,
}
