//! `report.json` as types: what [`super::build`] makes, what the gates' figures are read from and what the views
//! render. The JSON is these structs serialized, member for member; `docs/report.schema.json` describes the same
//! shape (a test checks a fully populated report against it).
//!
//! Conventions, kept so that a report signed before these types existed still parses and renders the same:
//! - a member the report always has but that may be unknown is an `Option` serialized as `null`;
//! - a member present only in some cases (a known worker's details, a level's comparison with the reference) is an
//!   `Option` left out when `None`;
//! - figures are `f64`; a non-finite figure is written as `null` (JSON has no NaN) and read back as NaN;
//! - each task's inputs and outputs stay JSON: they mirror the task's protocol message, which the report's readers
//!   show but never interpret.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// The report's `format` member.
pub const FORMAT: &str = "quantfarm-report/1";

/// `null` read as NaN: a non-finite figure was written as `null`.
fn nan_if_null<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// [`FORMAT`].
    pub format: String,
    pub quantfarm_version: String,
    pub release: ReleaseInfo,
    pub source: Source,
    pub links: Links,
    /// The adapter merged into the source; `null` without one.
    pub adapter: Option<Adapter>,
    /// Link 1, the merge check; `null` without an adapter.
    pub merge_check: Option<MergeCheck>,
    /// What the KL divergence was measured on; `null` without an `evaluation` section.
    pub evaluation: Option<Evaluation>,
    /// Link 2 across runtimes: the GGUF BF16 in llama.cpp against the same weights in mlx-lm, and each MLX rung in
    /// mlx-lm. Left out of a release with no MLX output or no evaluation (and of reports made before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_runtime: Option<CrossRuntime>,
    /// The HF bf16 checkpoint and each vLLM rung in Hugging Face transformers (W8A8 emulated and weight-only). Left
    /// out of a release with no vLLM output or no evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transformers: Option<TransformersFigures>,
    /// Each rung's mean KL divergence with its chunk-clustered interval, and each rung against the next larger one,
    /// token by token on the same tokens. Left out of a release with fewer than one rung measured in llama.cpp (and
    /// of reports made before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paired: Option<Paired>,
    /// `evaluation.peers`' GGUF files made elsewhere, each scored against the same base logits as the rungs and set
    /// beside the farm's rung of nearest size. Left out without them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub third_party: Vec<ThirdPartyRecord>,
    /// `evaluation.compare_with`: what changed since that release (`quantfarm report diff` of its report and this
    /// one), or why it could not be read. Left out without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comparison: Option<Comparison>,
    /// `evaluation.stop`: how many of the text's chunks each rung was measured on, why measuring it stopped, and its
    /// interval at the rule's confidence (`quantfarm_parity::sequential`). Left out without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequential: Option<Sequential>,
    /// Searched rungs (`{name, target_bpw}`): the sensitivities their recipes were chosen from, what each chose and
    /// the frontier of every GGUF rung measured (docs/search.md). Left out without a searched rung.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<Search>,
    /// In report order: the merged checkpoint, GGUF BF16, the GGUF quants in ladder order, the MLX checkpoints.
    pub artifacts: Vec<Artifact>,
    pub tasks: Vec<TaskRecord>,
    pub gates: Vec<GateRecord>,
    pub tools: Tools,
    pub timings: Timings,
    pub verdict: Verdict,
    /// Added last by [`crate::signing::sign_report`]; absent before signing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<Signature>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ReleaseInfo {
    pub id: String,
    pub name: String,
    pub spec_file: String,
    pub spec_sha256: String,
    /// The release's spec as the coordinator resolved it (the coordinator's `spec::Spec` serialized).
    pub spec: Value,
}

impl ReleaseInfo {
    /// A string member of the spec (`adapter`, `base_name`).
    pub fn spec_str(&self, key: &str) -> Option<&str> {
        self.spec.get(key).and_then(Value::as_str)
    }
}

/// The source checkpoint; all but its URL come from the plan task, `null` when it did not run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Source {
    pub url: String,
    pub format: Option<String>,
    pub architecture: Option<String>,
    pub identity: Option<String>,
    pub bytes: Option<u64>,
    pub tensors: Option<u64>,
}

/// What each link of the parity method did, in words.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Links {
    pub merge: String,
    pub conversion: String,
    pub quantization: String,
    pub probes: String,
}

/// A stored file: where, its content's sha256, its size.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileRef {
    pub url: String,
    pub sha256: String,
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Adapter {
    pub url: String,
    /// The rest comes from the merge plan, `null` when it did not run.
    pub format: Option<String>,
    pub files: Option<Vec<FileRef>>,
    pub changed_tensors: Option<u64>,
    pub untied_embeddings: Option<bool>,
}

/// Link 1: the merge's greedy agreement with the base plus the adapter at run time, or why it has none.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum MergeCheck {
    Measured(Box<MergeCheckFigures>),
    Unmeasured { error: String },
}

/// The merge check's inputs (the GGUF files llama.cpp compared, all F32) and its greedy agreement.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MergeCheckFigures {
    pub method: String,
    pub base: Option<FileRef>,
    pub lora: Option<FileRef>,
    pub merged: Option<FileRef>,
    pub greedy: GreedySummary,
}

impl MergeCheck {
    pub fn greedy(&self) -> Option<&GreedySummary> {
        match self {
            MergeCheck::Measured(m) => Some(&m.greedy),
            MergeCheck::Unmeasured { .. } => None,
        }
    }
}

/// The cross-runtime link's figures, or why there are none (`evaluation.mlx_lm: false`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum CrossRuntime {
    Measured(Box<CrossRuntimeFigures>),
    Unmeasured { error: String },
}

impl CrossRuntime {
    pub fn figures(&self) -> Option<&CrossRuntimeFigures> {
        match self {
            CrossRuntime::Measured(f) => Some(f),
            CrossRuntime::Unmeasured { .. } => None,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CrossRuntimeFigures {
    pub method: String,
    /// Every mlx-lm the workers ran (versions and device), as their helpers reported them.
    pub runtimes: Vec<MlxLmRuntime>,
    /// The HF checkpoint mlx-lm loaded as the bf16 weights (the source, or the merge).
    pub model: String,
    /// The bf16 weights in mlx-lm against the GGUF BF16 in llama.cpp.
    pub bf16: MlxLmSubject,
    /// Each measured MLX rung in mlx-lm: greedy against mlx-lm's bf16, KL divergence against llama.cpp's GGUF BF16.
    pub rungs: Vec<MlxLmSubject>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct MlxLmRuntime {
    pub mlx: String,
    pub mlx_lm: String,
    /// `cpu` or `gpu`.
    pub device: String,
    pub device_name: String,
}

/// One model in mlx-lm: how it was loaded and what was measured on it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MlxLmSubject {
    /// `BF16`, `MLX-{bits}bit` or an mlx-lm recipe's rung (`MLX-mixed_4_6`).
    pub file_type: String,
    /// The checkpoint is quantized; its floating parameters were made f32 (the CPU build), `null` when no task
    /// loaded it.
    pub quantized: Option<bool>,
    pub upcast: Option<bool>,
    /// Set when mlx-lm was given quantfarm's unquantized MLX conversion of the HF checkpoint, because its model
    /// cannot load that layout (gpt-oss's fused experts in bf16): what was converted and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub converted: Option<String>,
    /// mlx-lm's own message when it could not load the checkpoint.
    pub load_error: Option<String>,
    pub greedy: Option<GreedySummary>,
    pub kld: Option<Kld>,
    /// The probe suite on `mlx_lm.server`; a rung's beside mlx-lm's bf16 weights'.
    pub probes: Option<ProbeSummary>,
}

/// The models run in Hugging Face transformers, and what was measured on them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TransformersFigures {
    pub method: String,
    /// Every transformers the workers ran (versions and device), as their helpers reported them.
    pub runtimes: Vec<TransformersRuntime>,
    /// The HF checkpoint loaded as the bf16 weights (the source, or the merge).
    pub model: String,
    /// The bf16 checkpoint in transformers against the GGUF BF16 in llama.cpp.
    pub bf16: TransformersSubject,
    /// With a PEFT adapter, the merge check in transformers (link 1), both in f32 as llama.cpp's: the base with the
    /// adapter applied at run time by PEFT, unmerged (its greedy continuations shown against llama.cpp's GGUF BF16),
    /// and the merge, compared with it. `null` without an adapter, or for an mlx-lm one (PEFT does not load that
    /// format).
    #[serde(default)]
    pub adapter: Option<TransformersSubject>,
    #[serde(default)]
    pub merged_f32: Option<TransformersSubject>,
    /// Each measured vLLM rung: as saved (FP8_DYNAMIC's W8A8, emulated), and weight-only where that differs.
    pub rungs: Vec<TransformersSubject>,
}

impl TransformersFigures {
    /// Every model run, in the order the views list them, each with the run its greedy continuations were compared
    /// with: the bf16 checkpoint (with llama.cpp's GGUF BF16), the base with the adapter, then the rungs (each with
    /// transformers' bf16 checkpoint).
    pub fn subjects(&self) -> impl Iterator<Item = (&TransformersSubject, &'static str)> {
        std::iter::once((&self.bf16, "llama.cpp GGUF BF16"))
            .chain(self.adapter.iter().map(|a| (a, "llama.cpp GGUF BF16")))
            .chain(self.merged_f32.iter().map(|m| (m, "base + adapter in f32")))
            .chain(self.rungs.iter().map(|r| (r, "transformers BF16")))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct TransformersRuntime {
    pub torch: String,
    pub transformers: String,
    pub compressed_tensors: String,
    pub peft: String,
    pub device: String,
    pub device_name: String,
}

/// One model in transformers: how it was loaded and what was measured on it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TransformersSubject {
    /// `BF16`, `adapter`, `merged-f32`, `vLLM-FP8_DYNAMIC`, `vLLM-FP8_DYNAMIC-weight-only`.
    pub subject: String,
    /// The artifact it is: `BF16` (the merge in f32 too) or `vLLM-SCHEME`; `adapter` for the base with the adapter.
    pub file_type: String,
    /// `as-saved` or `weight-only`.
    pub activations: String,
    /// What it ran in: `bfloat16`, or `float32` for the merge check's pair.
    #[serde(default = "bfloat16")]
    pub dtype: String,
    /// The checkpoint's weights' scheme as transformers read it (`float8/channel`), `null` for the bf16 checkpoint or
    /// when no task loaded it.
    pub scheme: Option<String>,
    /// transformers' own message when it could not load the checkpoint.
    pub load_error: Option<String>,
    pub greedy: Option<GreedySummary>,
    pub kld: Option<Kld>,
    /// The probe suite in transformers (each chat rendered by the checkpoint's template); a rung's beside
    /// transformers' bf16 checkpoint's. `null` for the merge check's pair, or without probes.
    #[serde(default)]
    pub probes: Option<ProbeSummary>,
}

fn bfloat16() -> String {
    "bfloat16".into()
}

impl TransformersSubject {
    /// What the views call the model.
    pub fn label(&self) -> String {
        let name = if self.file_type == "adapter" { "base + adapter (PEFT, unmerged)" } else { &self.file_type };
        match self.dtype.as_str() {
            "float32" => format!("{name} in f32"),
            _ => name.to_string(),
        }
    }
}

/// A GGUF file of the same base made elsewhere, measured as a rung is.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ThirdPartyRecord {
    /// The file as the release names it (resolved).
    pub url: String,
    /// Its sha256 and size; `null` when its first task did not run.
    pub file: Option<FileRef>,
    pub type_mix: Vec<TypeCount>,
    /// Tensor bits per weight, as for the farm's artifacts; `null` without its description.
    pub bits_per_weight: Option<f64>,
    /// Its KL divergence against the GGUF BF16's base logits, by llama-perplexity's procedure.
    pub kld: Kld,
    /// The farm's rung nearest in size (bytes) among those measured in llama.cpp, and the mean of (this file's KLD −
    /// that rung's) per token on the same tokens, with its chunk-clustered interval at `evaluation.confidence`.
    pub nearest: Option<String>,
    pub paired: Option<Interval>,
    pub distinguishable: Option<bool>,
}

/// The diff with an earlier release, or why there is none.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Comparison {
    Diff(Box<crate::diff::ReleaseDiff>),
    Unavailable { with: String, error: String },
}

/// The rungs' KL divergence as intervals and paired differences (`quantfarm_parity::paired`; `docs/statistics.md`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Paired {
    pub method: String,
    /// The intervals' two-sided confidence (`evaluation.confidence`).
    pub confidence: f64,
    /// Every rung's per-token KL divergence (a safetensors file: one F32 tensor `kld/FILE_TYPE` per rung in chunk
    /// order, the chunks and their token counts in its metadata), from which every figure here is computed.
    pub values: FileRef,
    /// Each rung measured in llama.cpp, by size: its mean KL divergence and interval.
    pub means: Vec<RungInterval>,
    /// Each of those rungs against the next larger one: the mean of (this rung's KLD − the larger one's) over the same
    /// tokens.
    pub pairs: Vec<PairedComparison>,
}

/// The search of the searched rungs' recipes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Search {
    pub method: String,
    pub sensitivity: SearchSensitivity,
    pub rungs: Vec<SearchedRung>,
    /// Every GGUF rung measured in llama.cpp, smallest first: size against KL divergence, searched or not.
    pub frontier: Vec<FrontierPoint>,
}

/// The sensitivities: where they are stored, what they were measured on, and what measuring them cost.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SearchSensitivity {
    pub url: Option<String>,
    pub sha256: Option<String>,
    /// Found stored by an earlier release of the same reference and settings: nothing was measured again.
    pub reused: bool,
    pub text: String,
    pub tokens_sha256: Option<String>,
    pub ctx: u32,
    pub chunks: u32,
    pub precision: f64,
    pub layers: u32,
    pub candidates: Vec<String>,
    pub groups: u32,
    /// Probes (a group at a distinct type), with the task time and the bytes of the probe models they made, as
    /// measured (when reused: by the release that measured them; this release spent nothing on them).
    pub probes: u32,
    pub probe_seconds: f64,
    pub probe_model_bytes: u64,
}

/// What a searched rung chose.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SearchedRung {
    pub name: String,
    /// `4.5 bits per weight`, `Q4_K_M's bits per weight`.
    pub target: String,
    /// Tensor bytes allowed and taken, and the bits per weight taken (over every tensor's elements).
    pub budget_bytes: Option<u64>,
    pub bytes: Option<u64>,
    pub bits_per_weight: Option<f64>,
    /// The sum of the chosen types' measured costs: the search's prediction of the rung's mean KL divergence.
    pub predicted_kld: Option<f64>,
    /// Per tensor group, the type chosen.
    pub picks: Vec<SearchPick>,
    /// Why no recipe was chosen (the budget is below the smallest recipe, no candidate meets the KLD target, …).
    pub error: Option<String>,
    /// A `kld` rung's candidate recipes, smallest first, with the figure it is held to measured on the search text
    /// (the rung is the smallest within its `max`). Left out for a rung held to a size.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<SearchCandidate>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SearchCandidate {
    pub bytes: u64,
    pub bits_per_weight: f64,
    pub predicted_kld: f64,
    pub measured: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SearchPick {
    pub group: String,
    pub ggml_type: String,
}

/// One GGUF rung on the size/KL-divergence plane.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FrontierPoint {
    pub name: String,
    pub searched: bool,
    pub bytes: u64,
    pub bits_per_weight: f64,
    pub kld_mean: Option<f64>,
    pub kld_p99_9: Option<f64>,
}

/// Sequential measurement: the rule and each rung's stop (`quantfarm_parity::sequential`; `docs/statistics.md`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Sequential {
    pub method: String,
    /// The chance that a stopped rung's interval misses its full-text mean is at most `1 − confidence`.
    pub confidence: f64,
    /// The chunks of the first look, the floor under the spread, the precision that also stops (if any).
    pub min_chunks: u64,
    pub spread: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<f64>,
    /// The text's chunk groups (units of `chunks_per_group` chunks) in the order every rung measures them.
    pub chunks_per_group: u64,
    pub order: Vec<u32>,
    pub rungs: Vec<SequentialRung>,
}

/// One rung under the stop rule.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SequentialRung {
    pub file_type: String,
    /// Chunks measured, of the text's.
    pub chunks: u64,
    pub of_chunks: u64,
    /// `complete` (every chunk: exactly llama-perplexity's figures), `decided` (every threshold outside the
    /// interval) or `precise` (the interval as narrow as `precision` asks).
    pub stopped: String,
    #[serde(deserialize_with = "nan_if_null")]
    pub mean: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub low: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub high: f64,
    /// The values of `kld.mean` at which a gate's verdict changes.
    pub thresholds: Vec<f64>,
    /// Why the rule could not decide this rung early (a gate that reads a figure it does not bound), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A mean of per-token values and its chunk-clustered interval.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Interval {
    pub n_tokens: u64,
    pub n_chunks: u64,
    #[serde(deserialize_with = "nan_if_null")]
    pub mean: f64,
    /// The standard error as if every token were independent (llama-perplexity's ±).
    #[serde(deserialize_with = "nan_if_null")]
    pub se_tokens: f64,
    /// The chunk-clustered standard error the interval uses.
    #[serde(deserialize_with = "nan_if_null")]
    pub se_chunks: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub low: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub high: f64,
}

impl From<&quantfarm_parity::MeanInterval> for Interval {
    fn from(m: &quantfarm_parity::MeanInterval) -> Interval {
        Interval {
            n_tokens: m.n_tokens,
            n_chunks: m.n_chunks,
            mean: m.mean,
            se_tokens: m.se_tokens,
            se_chunks: m.se_chunks,
            low: m.low,
            high: m.high,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RungInterval {
    pub file_type: String,
    pub bytes: u64,
    pub kld: Interval,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PairedComparison {
    /// The smaller rung (by bytes) and the next larger one.
    pub smaller: String,
    pub larger: String,
    /// The smaller's KLD minus the larger's, token by token.
    pub diff: Interval,
    /// The standard error the two rungs' own ± would give their difference if they were independent,
    /// `sqrt(se_a² + se_b²)` (chunk-clustered): what reading two ± side by side suggests.
    #[serde(deserialize_with = "nan_if_null")]
    pub se_unpaired: f64,
    /// The interval leaves 0 out: the two rungs are told apart at the confidence.
    pub distinguishable: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Evaluation {
    pub text: String,
    pub text_sha256: Option<String>,
    pub tokens_sha256: Option<String>,
    pub ctx: u32,
    pub batch: u32,
    pub n_chunks: Option<u32>,
    pub chunks_per_task: Option<u32>,
    /// The GGUF BF16's first file, which the KL divergence is measured against.
    pub reference: Option<String>,
    pub runtime: String,
    pub prompts: String,
    pub n_prompts: u64,
    pub max_tokens: u32,
    pub probes: String,
    pub context: u32,
}

/// One published artifact: every file of one output, its identity and every figure measured on it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Artifact {
    /// `{prefix}-{file_type}`.
    pub name: String,
    pub container: Container,
    /// `merged`, `BF16`, a GGUF file type (`Q4_K_M`), `MLX-{bits}bit` or `MLX-mixed_4_6`.
    pub file_type: String,
    pub files: Vec<FileRef>,
    pub bytes: u64,
    /// Tensor bits per tensor element, as the files really hold them (4 decimals).
    pub bits_per_weight: f64,
    pub type_mix: Vec<TypeCount>,
    /// Every file was recomputed on another worker and compared byte for byte.
    pub verified: bool,
    /// The importance matrix a GGUF quant was made with; `null` for others or without one.
    pub imatrix: Option<Imatrix>,
    /// A named recipe's definition (its rung in `release.yaml`); left out for a plain file type and other outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipe: Option<RecipeDoc>,
    pub kld: Option<Kld>,
    pub greedy: Option<GreedySummary>,
    pub probes: Option<ProbeSummary>,
    /// `evaluation.choices`: its multiple-choice tasks scored on this artifact, beside the reference's choices. Left
    /// out without them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choices: Option<ChoiceSummary>,
    /// Peer tools' own figures, by tool.
    pub peers: Option<BTreeMap<String, PeerFigures>>,
}

impl Artifact {
    /// Where file `f` of this artifact lies in a published release folder (`quantfarm publish`, the model card's
    /// file table): a GGUF's files at the top, as GGUF repositories hold them; the merged HF checkpoint's files, and
    /// an MLX or vLLM checkpoint folder, under the artifact's name, which is what `mlx_lm.load` and `vllm serve` are
    /// given (a folder's path ends in `/`). `None` for a name or file name that is not one plain path component.
    pub fn published_path(&self, f: &FileRef) -> Option<String> {
        let plain = |s: &str| !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\\', '\0']);
        let file = f.url.trim_end_matches('/').rsplit('/').next().filter(|s| plain(s))?;
        let name = plain(&self.name).then_some(self.name.as_str());
        if self.is_folder(f) {
            return Some(format!("{}/", name?));
        }
        match self.container {
            Container::Gguf => Some(file.to_string()),
            Container::Hf | Container::Mlx | Container::Vllm => Some(format!("{}/{file}", name?)),
        }
    }

    /// Whether `f` is a folder whose `sha256` is a folder digest (`quantfarm_store::Digest::of_folder`): an MLX or
    /// vLLM checkpoint, or the merged HF checkpoint's side files (config.json, the tokenizer's), whose folder also
    /// holds the tensor files the artifact lists on their own, which its digest leaves out.
    pub fn is_folder(&self, f: &FileRef) -> bool {
        let inside = format!("{}/", f.url.trim_end_matches('/'));
        self.container.holds_folders() || self.files.iter().any(|g| g.url.starts_with(&inside))
    }

    /// The files of folder `f` its digest leaves out: the artifact's other files inside it (by name).
    pub fn listed_apart(&self, f: &FileRef) -> Vec<&str> {
        let inside = format!("{}/", f.url.trim_end_matches('/'));
        self.files.iter().filter_map(|g| g.url.strip_prefix(&inside)).collect()
    }

    /// The KL-divergence figures, when measured.
    pub fn kld_figures(&self) -> Option<&KldFigures> {
        match self.kld.as_ref()? {
            Kld::Measured(k) => Some(k),
            Kld::Unmeasured { .. } => None,
        }
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Container {
    /// Hugging Face safetensors (the merged checkpoint).
    Hf,
    Gguf,
    Mlx,
    /// A compressed-tensors checkpoint vLLM loads (safetensors with `quantization_config`).
    Vllm,
}

impl Container {
    /// Whether each of the artifact's [`FileRef`]s is a folder (an MLX or vLLM checkpoint), whose `sha256` is the
    /// folder digest: sha256 over its files' `sha256  name` lines sorted by name (`quantfarm_store::Digest::of_folder`).
    fn holds_folders(self) -> bool {
        match self {
            Container::Mlx | Container::Vllm => true,
            Container::Hf | Container::Gguf => false,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TypeCount {
    #[serde(rename = "type")]
    pub ggml_type: String,
    pub tensors: u64,
    pub elements: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum Imatrix {
    /// Given as a file (`imatrix: URL`).
    File { url: String, sha256: Option<String> },
    /// Computed by the farm from a calibration text.
    Computed {
        url: Option<String>,
        sha256: Option<String>,
        text: String,
        text_sha256: Option<String>,
        tokens_sha256: Option<String>,
        chunks: Option<u32>,
        ctx: u32,
        batch: u32,
        method: String,
        /// Every expert credited on every token (`imatrix.all_experts`), as llm-compressor's
        /// `calibrate_all_experts`; otherwise only the routed ones, as llama-imatrix.
        all_experts: bool,
        /// The mixture-of-experts weights and the experts the calibration text never reached (`null` until the
        /// matrix is merged).
        experts: Option<ExpertCoverage>,
    },
}

/// How much of a mixture-of-experts model the calibration text reached: llama-quantize gives an expert with no
/// token an importance of 1 for all its columns (no data), which low-bit types quantize worst.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ExpertCoverage {
    /// Weights with experts (`*_exps`); 0 for a dense model.
    pub weights: u32,
    /// Those with an expert no token reached, as llama-imatrix warns of them (`partial data (P%)`).
    pub partial: Vec<PartialExperts>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PartialExperts {
    pub weight: String,
    pub experts: u32,
    /// The experts (by index) with no token.
    pub unrouted: Vec<u32>,
    /// The share of experts with tokens, in percent (llama-imatrix's figure).
    pub percent: f64,
}

/// A named recipe as the report records it: the base file type and llama-quantize's flags on top of it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RecipeDoc {
    pub base: String,
    /// `--tensor-type` entries, `PATTERN=TYPE`, in order (the first match wins).
    pub tensor_types: Vec<String>,
    pub output_tensor_type: Option<String>,
    pub token_embedding_type: Option<String>,
    /// The llama-quantize command line's flags that make the same bytes (less files and `--imatrix`).
    pub llama_quantize_args: Vec<String>,
}

/// A level's KL divergence against the GGUF BF16, or why its chunk groups do not make one.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Kld {
    Measured(Box<KldFigures>),
    Unmeasured { error: String },
}

macro_rules! kld_figures {
    ($($(#[doc = $doc:literal])* $field:ident),* $(,)?) => {
        /// `llama-perplexity --kl-divergence`'s figures under its names (Δp and same-top-p in percent), with the
        /// percentiles quantfarm adds (`kld_p99`, `dp_p0_1` = the 0.1th); defined by
        /// `quantfarm_parity::KldSummary::to_json`.
        #[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
        pub struct KldFigures {
            pub n_tokens: u64,
            pub n_chunks: u64,
            $($(#[doc = $doc])* #[serde(deserialize_with = "nan_if_null")] pub $field: f64,)*
        }
    };
}

kld_figures!(
    mean_kld, mean_kld_unc, median_kld, min_kld, max_kld,
    kld_p0_1, kld_p1, kld_p5, kld_p10, kld_p90, kld_p95, kld_p99, kld_p99_9,
    mean_ppl_q, mean_ppl_q_unc, mean_ppl_base, mean_ppl_base_unc,
    /// Percent.
    cor_ln_ppl,
    mean_ln_ppl_ratio, mean_ln_ppl_ratio_unc, mean_ppl_ratio, mean_ppl_ratio_unc, mean_ppl_diff, mean_ppl_diff_unc,
    mean_dp, mean_dp_unc, median_dp, min_dp, max_dp, rms_dp, rms_dp_unc,
    dp_p0_1, dp_p1, dp_p5, dp_p10, dp_p25, dp_p75, dp_p90, dp_p95, dp_p99, dp_p99_9,
    same_top_p, same_top_p_unc,
);

/// Multiple-choice accuracy as `llama-perplexity --multiple-choice` scores it, and the answers that changed against
/// the reference's (the GGUF BF16's).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ChoiceSummary {
    /// The task file's sha256.
    pub tasks_sha256: String,
    pub n_tasks: u64,
    pub n_correct: u64,
    /// `n_correct / n_tasks`, and `sqrt(p(1 − p)/(n − 1))` as llama-perplexity gives it (fractions).
    #[serde(deserialize_with = "nan_if_null")]
    pub accuracy: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub accuracy_unc: f64,
    /// Random chance: tasks over answers.
    #[serde(deserialize_with = "nan_if_null")]
    pub chance: f64,
    /// The tasks (0-based) whose chosen answer differs from the reference's, those now wrong that the reference got
    /// right, and those now right that it got wrong; `null` for the reference itself, or when its run is missing.
    pub changed: Option<Vec<u32>>,
    pub now_wrong: Option<Vec<u32>>,
    pub now_right: Option<Vec<u32>>,
}

/// Greedy agreement with a reference, every share joined in prompt order.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GreedySummary {
    /// Prompts compared, and how many continuations are byte-identical.
    pub n: u64,
    pub identical: u64,
    #[serde(deserialize_with = "nan_if_null")]
    pub agree: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub mean_prefix_fraction: f64,
    /// Every reference continuation was compared.
    pub complete: bool,
    pub disagreements: Vec<Disagreement>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Disagreement {
    pub index: u32,
    pub first_difference: i32,
    /// The reference's top-2 logit margin where the continuations first differ.
    #[serde(deserialize_with = "nan_if_null")]
    pub reference_margin: f64,
    pub common_prefix: u32,
    pub reference_tokens: u32,
    pub model_tokens: u32,
    pub reference_text: String,
    pub model_text: String,
}

/// A subject's probe results; a level's carry the reference's for comparison.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ProbeSummary {
    pub suite: String,
    pub passed: u32,
    pub failed: u32,
    pub truncated: u32,
    #[serde(deserialize_with = "nan_if_null")]
    pub mean_score: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub score_spread: f64,
    /// Each repeat's pass rate; empty when no answer could be scored.
    pub pass_scores: Vec<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_mean_score: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_score_spread: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_vs_reference: Option<f64>,
}

impl ProbeSummary {
    /// The pass rate and spread, or `None` when no pass was scored: a pass whose every answer was cut off by its
    /// token cap has no score, and a suite with no scored pass says nothing (its rate is missing, not 0).
    pub fn scored(&self) -> Option<(f64, f64)> {
        (!self.pass_scores.is_empty()).then_some((self.mean_score, self.score_spread))
    }
}

/// A peer tool's figures as it printed them, and whether quantfarm's print the same to every digit it prints.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PeerFigures {
    pub version: String,
    pub command: String,
    pub figures: BTreeMap<String, f64>,
    pub same_as_quantfarm: BTreeMap<String, bool>,
}

/// One task: who ran it, how often, how long, and its inputs and outputs as the protocol gave them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TaskRecord {
    pub id: String,
    pub worker: Option<String>,
    pub attempts: u32,
    pub duration_ms: u64,
    pub inputs: Value,
    pub outputs: Value,
}

/// One gate's result on one level (or the release).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GateRecord {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
    pub check: String,
    /// `default`, `release` or `built-in`.
    pub source: String,
    /// Every figure the check read, by name.
    pub inputs: BTreeMap<String, GateInput>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    pub passed: bool,
    pub detail: String,
}

/// A figure a gate read: a number, a yes/no, a non-finite number in words (`inf`, `NaN`), or why it is missing.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum GateInput {
    Number(f64),
    Flag(bool),
    Text(String),
    Missing { missing: String },
}

/// What made the release.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Tools {
    pub quantfarm: String,
    /// Every worker that ran one of its tasks.
    pub workers: Vec<WorkerRecord>,
    /// Each peer tool's version as it reported it.
    pub peers: BTreeMap<String, String>,
}

/// A worker; a worker of an earlier coordinator run (before a restart) has its id only.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct WorkerRecord {
    pub id: String,
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub info: Option<WorkerDetails>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct WorkerDetails {
    pub name: String,
    pub version: String,
    pub os: String,
    pub arch: String,
    pub cores: u32,
    pub runtimes: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Timings {
    pub created_ms: i64,
    pub reported_ms: i64,
    pub wall_ms: i64,
    /// Time the tasks ran, in all and by kind (`quantize`, `kld`, ...).
    pub task_ms: u64,
    pub by_kind: BTreeMap<String, KindTiming>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct KindTiming {
    pub tasks: u64,
    pub total_ms: u64,
    pub max_ms: u64,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Released,
    GateFailed,
}

impl Verdict {
    /// As the views print it.
    pub fn words(self) -> &'static str {
        match self {
            Verdict::Released => "released",
            Verdict::GateFailed => "gate failed",
        }
    }
}

/// The signature block [`crate::signing::sign_report`] appends.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Signature {
    pub algorithm: String,
    pub canonicalization: String,
    pub public_key: String,
    pub fingerprint: String,
    pub value: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifact(name: &str, container: Container, urls: &[&str]) -> Artifact {
        let files = urls.iter().map(|u| FileRef { url: u.to_string(), sha256: "00".into(), bytes: 1 }).collect();
        Artifact {
            name: name.into(),
            container,
            file_type: "x".into(),
            files,
            bytes: 1,
            bits_per_weight: 0.0,
            type_mix: Vec::new(),
            verified: true,
            imatrix: None,
            recipe: None,
            kld: None,
            greedy: None,
            probes: None,
            choices: None,
            peers: None,
        }
    }

    /// GGUF files at the top; MLX and vLLM folders, and the merged checkpoint's files and side-file folder, under
    /// the artifact's name; a name that is not one path component has no place.
    #[test]
    fn where_published_files_go() {
        let paths = |a: &Artifact| a.files.iter().map(|f| a.published_path(f)).collect::<Vec<_>>();
        let g = artifact("m-Q4_K_M", Container::Gguf, &["s3://b/a1/m-Q4_K_M-00001-of-00002.gguf", "/d/x.gguf"]);
        assert_eq!(paths(&g), [Some("m-Q4_K_M-00001-of-00002.gguf".into()), Some("x.gguf".into())]);
        let m = artifact("m-MLX-4bit", Container::Mlx, &["s3://b/a2/m-MLX-4bit"]);
        assert_eq!(paths(&m), [Some("m-MLX-4bit/".into())]);
        let h = artifact("m-merged", Container::Hf, &["/d/merged/model.safetensors", "/d/merged"]);
        assert_eq!(paths(&h), [Some("m-merged/model.safetensors".into()), Some("m-merged/".into())]);
        assert_eq!(h.listed_apart(&h.files[1]), ["model.safetensors"]);
        assert!(!h.is_folder(&h.files[0]) && h.is_folder(&h.files[1]));
        let bad = artifact("../x", Container::Vllm, &["/d/v"]);
        assert_eq!(paths(&bad), [None]);
        let bad = artifact("ok", Container::Gguf, &["/d/.."]);
        assert_eq!(paths(&bad), [None]);
    }
}
