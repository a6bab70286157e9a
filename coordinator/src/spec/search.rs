//! Rungs defined by a budget instead of a type: `{name: Q4_FIT, target_bpw: 4.5}` or `{name: Q4_FIT, target_bpw:
//! Q4_K_M}` (as many bits per weight as that rung of the ladder, as made), whose recipe the farm chooses from
//! measured costs (docs/search.md), and the search's settings (`outputs.gguf.search`).
//!
//! A search rung is a [`super::Rung`] like a file type or a named recipe: made, verified and measured the same way,
//! its recipe (llama-quantize's `--tensor-type` entries on a `Q8_0` base) decided once the sensitivities are known.

use std::fmt;

use quantfarm_ggml::{FileType, GgmlType};
use serde::{Deserialize, Serialize};

use super::evaluation::{default_batch, default_ctx};
use super::recipe::{Level, RecipeName};

/// What a searched rung is held to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    /// At most this many bits per weight (tensor bytes × 8 / elements, as llama-quantize prints BPW).
    Bpw(f64),
    /// At most the bits per weight of this rung of the ladder, as made.
    SizeOf(Level),
    /// The smallest of the search's candidate recipes whose KL-divergence figure, measured on the search text, is at
    /// most `max`.
    Kld { metric: KldMetric, max: f64 },
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Bpw(b) => write!(f, "{b} bits per weight"),
            Target::SizeOf(l) => write!(f, "{l}'s bits per weight"),
            Target::Kld { metric, max } => write!(f, "the smallest with {} <= {max}", metric.name()),
        }
    }
}

/// A KL-divergence figure a searched rung can be held to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KldMetric {
    Mean,
    P99,
    P99_9,
    Max,
}

impl KldMetric {
    pub const ALL: [KldMetric; 4] = [KldMetric::Mean, KldMetric::P99, KldMetric::P99_9, KldMetric::Max];

    /// The figure's name in gates (`kld.p99_9`).
    pub fn name(self) -> &'static str {
        match self {
            KldMetric::Mean => "kld.mean",
            KldMetric::P99 => "kld.p99",
            KldMetric::P99_9 => "kld.p99_9",
            KldMetric::Max => "kld.max",
        }
    }
}

/// `kld:` as written.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KldFields {
    metric: String,
    max: f64,
}

/// A rung whose recipe the search chooses.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchRung {
    pub name: RecipeName,
    pub target: Target,
}

impl SearchRung {
    /// The quantized base its recipes are written on (every quantizable tensor is named by a pattern, so the base
    /// decides nothing; llama-quantize reads `--tensor-type` only on a quantized one).
    pub const BASE: FileType = FileType::Q8_0;

    /// The rung's default limit of mean KL divergence (`default.kld.mean`): that of the rung it is sized like (a
    /// recipe's base), of llama-quantize's k-quant mixture of about its bits per weight, or the `max` of its KLD
    /// target (a mean is at most its upper percentiles).
    pub fn default_kld_mean(&self, spec: &super::ReleaseSpec) -> Result<f64, String> {
        let of = |t: FileType| {
            quantfarm_report::gates::default_kld_max(t.name()).ok_or_else(|| format!("no default limit for {t}"))
        };
        match self.target {
            Target::SizeOf(level) => of(spec.rung(level).map_or(FileType::Q8_0, super::Rung::base)),
            Target::Bpw(b) => of(match b {
                b if b >= 8.0 => FileType::Q8_0,
                b if b >= 6.5 => FileType::Q6_K,
                b if b >= 5.5 => FileType::Q5_K_M,
                b if b >= 4.5 => FileType::Q4_K_M,
                b if b >= 3.4 => FileType::Q3_K_M,
                _ => FileType::Q2_K,
            }),
            Target::Kld { max, .. } => Ok(max),
        }
    }
}

/// `target_bpw:` as written: a number, or a rung's name.
#[derive(Deserialize, Serialize)]
#[serde(untagged)]
pub(super) enum TargetField {
    Bpw(f64),
    Rung(String),
}

/// A search rung as written: a name and exactly one of `target_bpw` and `kld`.
#[derive(Serialize)]
pub(super) struct SearchFields {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    target_bpw: Option<TargetField>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kld: Option<KldFields>,
}

impl SearchFields {
    pub(super) fn new(name: String, target_bpw: Option<TargetField>, kld: Option<KldFields>) -> SearchFields {
        SearchFields { name, target_bpw, kld }
    }
}

impl TryFrom<SearchFields> for SearchRung {
    type Error = String;

    fn try_from(f: SearchFields) -> Result<SearchRung, String> {
        let name = RecipeName::new(&f.name)?;
        let target = match (f.target_bpw, f.kld) {
            (Some(TargetField::Bpw(b)), None) if b.is_finite() && (1.0..=32.0).contains(&b) => Target::Bpw(b),
            (Some(TargetField::Bpw(b)), None) => {
                return Err(format!("rung {name}: target_bpw {b}: expected 1 to 32 bits per weight"))
            }
            (Some(TargetField::Rung(r)), None) => Target::SizeOf(Level::parse(&r).ok_or_else(|| {
                format!("rung {name}: target_bpw {r:?}: expected a number or the name of a rung of the ladder")
            })?),
            (None, Some(k)) => {
                let metric = KldMetric::ALL.into_iter().find(|m| m.name() == k.metric).ok_or_else(|| {
                    let names: Vec<&str> = KldMetric::ALL.iter().map(|m| m.name()).collect();
                    format!("rung {name}: kld.metric {:?}: expected one of {}", k.metric, names.join(", "))
                })?;
                if !(k.max.is_finite() && k.max > 0.0) {
                    return Err(format!("rung {name}: kld.max {}: expected a positive number", k.max));
                }
                Target::Kld { metric, max: k.max }
            }
            (Some(_), Some(_)) => return Err(format!("rung {name}: either target_bpw or kld, not both")),
            (None, None) => return Err(format!("rung {name}: expected target_bpw or kld")),
        };
        Ok(SearchRung { name, target })
    }
}

impl From<&SearchRung> for SearchFields {
    fn from(r: &SearchRung) -> SearchFields {
        let (target_bpw, kld) = match r.target {
            Target::Bpw(b) => (Some(TargetField::Bpw(b)), None),
            Target::SizeOf(l) => (Some(TargetField::Rung(l.to_string())), None),
            Target::Kld { metric, max } => (None, Some(KldFields { metric: metric.name().to_string(), max })),
        };
        SearchFields { name: r.name.to_string(), target_bpw, kld }
    }
}

/// `outputs.gguf.search`: how the sensitivities are measured. Every field has a default; the section is needed only
/// to change one.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SearchSettings {
    /// The types a group may take (llama-quantize's names, in any case); default [`DEFAULT_CANDIDATES`].
    #[serde(default = "default_candidates", with = "type_names")]
    pub candidates: Vec<GgmlType>,
    /// Layer ranges per role: each role's layers cut into this many contiguous groups.
    #[serde(default = "default_layers")]
    pub layers: u32,
    /// The text the sensitivities are measured on (default: the importance matrix's calibration text): a path
    /// relative to this file, file:// or s3://. Not the evaluation text, so that the chosen rung is judged on text
    /// the choice never saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Tokens per chunk and per decode of the probes' text.
    #[serde(default = "default_ctx")]
    pub ctx: u32,
    #[serde(default = "default_batch")]
    pub batch: u32,
    /// At most this many chunks per probe.
    #[serde(default = "default_chunks")]
    pub chunks: u32,
    /// A probe stops once its mean KL divergence is known within ± this share (95 % interval over its chunks).
    #[serde(default = "default_precision")]
    pub precision: f64,
    /// Candidate recipes a `kld` rung measures (evenly spaced in size between the smallest and largest recipe).
    #[serde(default = "default_points")]
    pub points: u32,
}

fn default_points() -> u32 {
    6
}

/// llama-quantize's ladder: the k-quant types and Q8_0, the 32-block types rows of other widths fall back to, and
/// the i-quants made without an importance matrix (IQ4_XS, IQ3_S).
pub const DEFAULT_CANDIDATES: [GgmlType; 12] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::IQ3_S,
];

fn default_candidates() -> Vec<GgmlType> {
    DEFAULT_CANDIDATES.to_vec()
}
fn default_layers() -> u32 {
    3
}
fn default_chunks() -> u32 {
    8
}
fn default_precision() -> f64 {
    0.1
}

impl Default for SearchSettings {
    fn default() -> Self {
        SearchSettings {
            candidates: default_candidates(),
            layers: default_layers(),
            text: None,
            ctx: default_ctx(),
            batch: default_batch(),
            chunks: default_chunks(),
            precision: default_precision(),
            points: default_points(),
        }
    }
}

impl SearchSettings {
    /// The settings' errors, naming the key.
    pub fn check(&self) -> Result<(), String> {
        if self.candidates.is_empty() {
            return Err("outputs.gguf.search.candidates: is empty".into());
        }
        if let Some(t) = self.candidates.iter().find(|t| !t.llama_quantize_writes()) {
            return Err(format!("outputs.gguf.search.candidates: {t} is not a type llama-quantize writes"));
        }
        if !(1..=64).contains(&self.layers) {
            return Err(format!("outputs.gguf.search.layers: {} is not between 1 and 64", self.layers));
        }
        if self.ctx < 8 {
            return Err(format!("outputs.gguf.search.ctx: {}: expected at least 8 tokens", self.ctx));
        }
        if self.batch >= self.ctx && !self.batch.is_multiple_of(self.ctx) {
            return Err(format!(
                "outputs.gguf.search.batch: {} must be below or a multiple of ctx {}",
                self.batch, self.ctx
            ));
        }
        if self.chunks == 0 {
            return Err("outputs.gguf.search.chunks: 0: a probe measures at least one chunk".into());
        }
        if !(2..=32).contains(&self.points) {
            return Err(format!("outputs.gguf.search.points: {} is not between 2 and 32", self.points));
        }
        if !(self.precision > 0.0 && self.precision < 1.0) {
            return Err(format!("outputs.gguf.search.precision: {} is not between 0 and 1", self.precision));
        }
        Ok(())
    }
}

/// Candidate types by name, in any case, as llama-quantize reads them.
mod type_names {
    use quantfarm_ggml::GgmlType;
    use serde::{de, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[GgmlType], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|t| t.name()))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<GgmlType>, D::Error> {
        let names = Vec::<String>::deserialize(d)?;
        names
            .iter()
            .map(|n| {
                GgmlType::from_name(n).ok_or_else(|| {
                    de::Error::custom(format!("outputs.gguf.search.candidates: unknown tensor type {n:?}"))
                })
            })
            .collect()
    }
}
