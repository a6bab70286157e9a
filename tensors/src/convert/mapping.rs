//! The architecture mappings (`mappings/*.yaml`): tensor renames, drops, permutations, forced-F32 rules and the
//! metadata keys to write, as data. They are embedded in the binary (so it works from any folder) and checked when
//! loaded: unknown fields, bad regexes and malformed entries are errors naming the file and line.

use std::collections::BTreeMap;

use indexmap::IndexMap;
use regex::Regex;
use serde::Deserialize;
use serde_json::Value as Json;

use crate::error::{Error, Result};

/// `(file name, text)` of every embedded architecture mapping.
const MAPPINGS: &[(&str, &str)] = &[
    ("llama.yaml", include_str!("../../../mappings/llama.yaml")),
    ("qwen2.yaml", include_str!("../../../mappings/qwen2.yaml")),
    ("qwen3.yaml", include_str!("../../../mappings/qwen3.yaml")),
    ("qwen3_moe.yaml", include_str!("../../../mappings/qwen3_moe.yaml")),
    ("gemma2.yaml", include_str!("../../../mappings/gemma2.yaml")),
    ("gemma3.yaml", include_str!("../../../mappings/gemma3.yaml")),
    ("qwen3_5.yaml", include_str!("../../../mappings/qwen3_5.yaml")),
    ("qwen3_5_moe.yaml", include_str!("../../../mappings/qwen3_5_moe.yaml")),
    ("phi3.yaml", include_str!("../../../mappings/phi3.yaml")),
    ("smollm3.yaml", include_str!("../../../mappings/smollm3.yaml")),
    ("granite.yaml", include_str!("../../../mappings/granite.yaml")),
    ("olmo2.yaml", include_str!("../../../mappings/olmo2.yaml")),
    ("gpt_oss.yaml", include_str!("../../../mappings/gpt_oss.yaml")),
    ("mistral3.yaml", include_str!("../../../mappings/mistral3.yaml")),
];

/// `(file name, text)` of the metadata groups a mapping's `metadata` may `include` (lists of entries shared by
/// several architectures, such as `TextModel.set_gguf_parameters`' keys).
const GROUPS: &[(&str, &str)] = &[("text-model.yaml", include_str!("../../../mappings/text-model.yaml"))];

pub(crate) const PRE_TOKENIZERS_FILE: &str = "pre-tokenizers.yaml";
const PRE_TOKENIZERS: &str = include_str!("../../../mappings/pre-tokenizers.yaml");

/// One architecture mapping, validated.
#[derive(Debug)]
pub struct Mapping {
    /// The file it came from, for messages.
    pub file: String,
    pub architecture: String,
    pub hf_architectures: Vec<String>,
    pub unsupported: Vec<Unsupported>,
    /// Wrapper prefixes (`language_model.` of multimodal and mlx-vlm checkpoints) removed from a name, the first
    /// that matches and once, before the tensor rules and drops see it.
    pub strip_prefixes: Vec<String>,
    /// Text removed wherever it stands in a name, before the rules see it (`ModelBase.filter_tensors` removes
    /// every `language_model.`, so `model.language_model.layers.0` is `model.layers.0`).
    pub erase: Vec<String>,
    /// The towers of a multimodal checkpoint that are not converted (`TextModel.filter_tensors`' skip list),
    /// matched on the name as stored: dropped, counted and said loudly, since only the text model is written.
    pub multimodal: Vec<AnchoredRegex>,
    pub tensors: Vec<TensorRule>,
    /// Per-expert weights stacked into one 3-D tensor per weight.
    pub experts: Vec<ExpertRule>,
    /// Fused tensors written as equal parts of their second-to-last axis, or interleaved parts of their last.
    pub fused: Vec<FusedRule>,
    /// MXFP4 expert weights (blocks and scales) repacked as GGUF MXFP4 tensors.
    pub mxfp4: Vec<Mxfp4Rule>,
    pub drop: Vec<AnchoredRegex>,
    pub f32: F32Rule,
    pub metadata: Vec<MetaEntry>,
    /// How config.json is rebuilt from GGUF metadata (GGUF → HF / MLX).
    pub hf_config: Option<HfConfig>,
    /// Multi-token-prediction (NextN) blocks: how the checkpoint's `mtp.*` tensors become trailing GGUF blocks,
    /// and the GGUF key counting them (those blocks are not written going back to HF or MLX: transformers' and
    /// mlx-lm's text models do not load them).
    pub nextn: Option<Nextn>,
    /// What mlx-lm does differently from the HF checkpoint (GGUF → MLX).
    pub mlx: Option<MlxSection>,
    /// Hybrids whose HF and mlx-lm models place full-attention layers by a period only.
    pub periodic_layers: Option<PeriodicLayers>,
    /// What the config class (AutoConfig) fills in and moves before the converter reads config.json.
    pub hparams: super::hparams::HparamsRule,
    /// Tensors the converter computes from the config rather than reads (`generate_extra_tensors`), written
    /// before the checkpoint's own.
    pub generate: Vec<GenerateRule>,
}

/// Per-expert weights (`mlp.experts.{e}.{w}.weight`) stacked along a new first axis, one tensor per weight, written
/// where the block's last expert weight is read (`Qwen2MoeModel.modify_tensors`, `torch.stack(dim=0)`).
#[derive(Debug, Deserialize)]
#[serde(try_from = "RawExpertRule")]
pub struct ExpertRule {
    /// Groups named `b` (block), `e` (expert) and `w` (which weight).
    pub hf: AnchoredRegex,
    /// Config fields holding the expert count, the first present (`find_hparam`).
    pub count: Vec<String>,
    /// `w` → GGUF name (`{b}` filled), in the order the stacked tensors are written.
    pub gguf: IndexMap<String, String>,
    /// The HF name with `{b}`, `{e}` and `{w}` to fill (the regex's groups), for the way back; `None` when the
    /// regex is not a plain name around its groups.
    pub hf_template: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExpertRule {
    hf: AnchoredRegex,
    count: Vec<String>,
    gguf: IndexMap<String, String>,
}

impl TryFrom<RawExpertRule> for ExpertRule {
    type Error = String;
    fn try_from(r: RawExpertRule) -> std::result::Result<Self, String> {
        let groups: Vec<&str> = r.hf.0.capture_names().flatten().collect();
        if !["b", "e", "w"].iter().all(|g| groups.contains(g)) {
            return Err(format!("experts rule {:?}: the regex needs groups named b, e and w", r.hf.0.as_str()));
        }
        if r.count.is_empty() || r.gguf.is_empty() {
            return Err(format!("experts rule {:?}: count and gguf list at least one entry", r.hf.0.as_str()));
        }
        let hf_template = plain_template(r.hf.0.as_str(), &["b", "e", "w"]);
        Ok(ExpertRule { hf: r.hf, count: r.count, gguf: r.gguf, hf_template })
    }
}

/// One fused HF tensor written as `gguf.len()` GGUF tensors, in order: the equal parts of its second-to-last axis
/// (transformers 5's `mlp.experts.gate_up_proj`, split at `shape[-2] // 2` into gate and up), or its last axis
/// dealt out element by element (gpt-oss's `gate_up_proj_bias`, gate = `[..., ::2]`, up = `[..., 1::2]`).
///
/// The way back (GGUF → HF) joins the GGUF tensors into the HF one again, named by `back` (with `{b}` to fill) or,
/// when the regex is a plain name around group `b`, by the regex itself.
#[derive(Debug, Deserialize)]
#[serde(try_from = "RawFusedRule")]
pub struct FusedRule {
    pub hf: AnchoredRegex,
    pub gguf: Vec<String>,
    pub parts: FusedParts,
    /// The HF name the way back writes (`{b}` to fill); `None` when neither `back` nor the regex gives one.
    pub hf_template: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFusedRule {
    hf: AnchoredRegex,
    gguf: Vec<String>,
    #[serde(default)]
    parts: FusedParts,
    #[serde(default)]
    back: Option<String>,
}

impl TryFrom<RawFusedRule> for FusedRule {
    type Error = String;
    fn try_from(r: RawFusedRule) -> std::result::Result<Self, String> {
        if r.gguf.is_empty() {
            return Err(format!("fused rule {:?}: gguf lists at least one tensor", r.hf.0.as_str()));
        }
        let hf_template = match r.back {
            Some(t) if !r.hf.is_match(&t.replace("{b}", "0")) => {
                return Err(format!("fused rule {:?}: back {t:?} is not a name the regex matches", r.hf.0.as_str()))
            }
            Some(t) => Some(t),
            None => plain_template(r.hf.0.as_str(), &["b"]),
        };
        Ok(FusedRule { hf: r.hf, gguf: r.gguf, parts: r.parts, hf_template })
    }
}

/// A GGUF tensor that is part `index` of the HF tensor a `fused` rule joins from `sources` (the way back).
#[derive(Debug, PartialEq)]
pub struct Unfused {
    /// The HF name; `None` when the rule gives no plain name.
    pub hf: Option<String>,
    /// Every part's GGUF name, in order.
    pub sources: Vec<String>,
    pub parts: FusedParts,
    pub index: usize,
}

/// How a fused tensor's parts lie in it.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FusedParts {
    /// Consecutive equal runs of the second-to-last axis.
    #[default]
    Halves,
    /// Interleaved along the last axis: part `k` of `n` is elements `k, k + n, k + 2n, …` of every row.
    InterleavedColumns,
    /// Stored `(…, in, out·n)`: the last two axes swapped, then the rows dealt out in turn (part `k` of `n` is
    /// rows `k, k + n, …` of the transpose): gpt-oss's dequantized `gate_up_proj` (`transpose(-1, -2)`, then gate
    /// = `[:, ::2, :]`), or with one part its `down_proj`.
    TransposedRows,
}

/// MXFP4 expert weights stored as two `uint8` tensors, `{hf}_blocks` `[experts, rows, n/32, 16]` (E2M1 codes, two
/// per byte, low nibble first) and `{hf}_scales` `[experts, rows, n/32]` (E8M0 exponents), repacked losslessly into
/// GGUF MXFP4 blocks as `GptOssModel.repack_mxfp4` (llama.cpp `conversion/gpt_oss.py`) does, and written before
/// every other checkpoint tensor (its `generate_extra_tensors` writes them while it is called). With several
/// `gguf` names the rows are dealt out in turn (gpt-oss's `gate_up_proj`: gate = rows `::2`, up = rows `1::2`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mxfp4Rule {
    /// The stem both tensors' names extend (group `b` is the block).
    pub hf: AnchoredRegex,
    pub gguf: Vec<String>,
}

/// Which of an MXFP4 pair a tensor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mxfp4Part {
    Blocks,
    Scales,
}

/// A tensor computed from the config by a named operator of [`super::generate`], when its conditions hold.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateRule {
    pub gguf: String,
    pub op: super::generate::GenerateOp,
    /// Only when every hparams field equals the given value.
    #[serde(default)]
    pub when: BTreeMap<String, Json>,
}

/// The GGUF's per-layer "recurrent" flags must be the period's pattern (layer `i` is full attention exactly when
/// `(i + 1) % interval == 0`), since that is all config.json can say.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeriodicLayers {
    /// A bool array key (absent: nothing to check).
    pub recurrent: String,
    pub interval: String,
}

/// Multi-token-prediction blocks as `_QwenMtpMixin` (llama.cpp `conversion/qwen.py`) converts them: the
/// checkpoint's `mtp.layers.K.X` (also under `model.`) become `model.layers.{L + K}.X` and its head tensors
/// `mtp.H.W` become `model.layers.{L}.{heads[H]}.W`, L being the model's layer count, before the tensor rules see
/// them; the GGUF's `block_count` then counts them too, and `key` says how many there are.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nextn {
    /// The GGUF key counting the blocks (`{arch}.nextn_predict_layers`).
    pub key: String,
    /// Config fields giving the block count, the first present; when none is, or it is 0, the blocks the
    /// checkpoint holds are counted (`opt_num_mtp_layers`).
    pub count: Vec<String>,
    /// Config fields giving L, the first present (`_original_block_count`).
    pub after: Vec<String>,
    /// The checkpoint's prefix of these tensors (`mtp.`).
    pub from: String,
    /// `mtp.H.W` → `model.layers.{L}.{heads[H]}.W`.
    pub heads: IndexMap<String, String>,
}

/// What [`Nextn::rename`] makes of a name.
#[derive(Debug, PartialEq, Eq)]
pub enum NextnName {
    /// Not a multi-token-prediction tensor.
    Model,
    /// One of them, under the name the converter gives it (an unknown one keeps its `mtp.` name, which no rule
    /// maps); `layer` is K of `mtp.layers.K.…`.
    Nextn { name: String, layer: Option<u64> },
}

impl Nextn {
    /// The name the converter gives tensor `name` when the model has `first` layers (L).
    pub fn rename(&self, name: &str, first: u64) -> NextnName {
        let from = self.from.as_str();
        let Some(rest) = name.strip_prefix(from).or_else(|| name.strip_prefix("model.")?.strip_prefix(from)) else {
            return NextnName::Model;
        };
        let parts: Vec<&str> = rest.splitn(3, '.').collect();
        let (name, layer) = match parts[..] {
            ["layers", k, x] if !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()) => match k.parse::<u64>() {
                Ok(k) => (format!("model.layers.{}.{x}", first + k), Some(k)),
                Err(_) => (format!("{from}{rest}"), None),
            },
            [h, w] if self.heads.contains_key(h) => (format!("model.layers.{first}.{}.{w}", self.heads[h]), None),
            _ => (format!("{from}{rest}"), None),
        };
        NextnName::Nextn { name, layer }
    }
}

/// config.json from a GGUF's metadata: each field from an expression over GGUF keys (skipped when a key is absent,
/// unless the field is `required`), then literal fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HfConfig {
    pub model_type: String,
    /// HF field → expression, in the order written.
    pub fields: IndexMap<String, ConfigExpr>,
    #[serde(default)]
    pub required: Vec<String>,
    #[serde(default)]
    pub literals: IndexMap<String, Json>,
    /// The rope scaling types (`{arch}.rope.scaling.type`) whose keys the fields write back (Qwen2.5's yarn as
    /// `rope_scaling`); a GGUF of another scaled type is refused by name.
    #[serde(default)]
    pub rope_scaling: Vec<String>,
    /// Stacked expert tensors go back as the per-expert weights the `experts` rule stacks (Qwen3-MoE, whose
    /// readers all take that layout); without it they have no way back to HF.
    #[serde(default)]
    pub per_expert: bool,
}

/// A config.json value made from GGUF keys (`{arch}` replaced in every key).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ConfigExpr {
    /// The key's value; a per-layer array (some Qwen3.5 files store head counts per layer, 0 on recurrent layers)
    /// gives its one nonzero value.
    Key(String),
    Op(ConfigOp),
}

#[derive(Debug, Deserialize)]
#[serde(try_from = "RawConfigOp")]
pub enum ConfigOp {
    /// A literal.
    Value(Json),
    /// `a - b`, with an absent `b` counting as 0.
    Sub([String; 2]),
    /// `a / b`, which must divide exactly.
    Div([String; 2]),
    /// `a / b` as a float.
    Ratio([String; 2]),
    /// `a * b / c` as a float (Phi-3's partial_rotary_factor: rotary dimensions × heads / embedding width).
    ScaledRatio([String; 3]),
    /// The first `n` items of an array key.
    First { n: usize, key: String },
    /// A nested object.
    Object(IndexMap<String, ConfigExpr>),
    /// `then` when GGUF key `key` equals `equals`, else `otherwise` (llama.cpp deciding by model size: Gemma 2
    /// 27B's query scale).
    If { key: String, equals: Json, then: Box<ConfigExpr>, otherwise: Box<ConfigExpr> },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfigOp {
    /// `value: null` is a value (Phi-4's sliding window), not an absent key.
    #[serde(default, deserialize_with = "present")]
    value: Option<Json>,
    sub: Option<[String; 2]>,
    div: Option<[String; 2]>,
    ratio: Option<[String; 2]>,
    scaled_ratio: Option<[String; 3]>,
    first: Option<First>,
    object: Option<IndexMap<String, ConfigExpr>>,
    #[serde(rename = "if")]
    cond: Option<If>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct First {
    n: usize,
    key: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct If {
    key: String,
    equals: Json,
    then: ConfigExpr,
    #[serde(rename = "else")]
    otherwise: ConfigExpr,
}

/// A key that is present, whatever its value (`null` included).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<Json>, D::Error> {
    Json::deserialize(d).map(Some)
}

impl TryFrom<RawConfigOp> for ConfigOp {
    type Error = String;
    fn try_from(r: RawConfigOp) -> std::result::Result<Self, String> {
        let mut ops = Vec::new();
        ops.extend(r.value.map(ConfigOp::Value));
        ops.extend(r.sub.map(ConfigOp::Sub));
        ops.extend(r.div.map(ConfigOp::Div));
        ops.extend(r.ratio.map(ConfigOp::Ratio));
        ops.extend(r.scaled_ratio.map(ConfigOp::ScaledRatio));
        ops.extend(r.first.map(|f| ConfigOp::First { n: f.n, key: f.key }));
        ops.extend(r.object.map(ConfigOp::Object));
        ops.extend(r.cond.map(|c| ConfigOp::If {
            key: c.key,
            equals: c.equals,
            then: Box::new(c.then),
            otherwise: Box::new(c.otherwise),
        }));
        match ops.len() {
            1 => Ok(ops.remove(0)),
            _ => {
                Err("a config expression is a GGUF key or exactly one of value, sub, div, ratio, scaled_ratio, first, \
                 object, if"
                    .into())
            }
        }
    }
}

/// mlx-lm's view of the model, where it differs from the HF checkpoint.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlxSection {
    /// mlx-lm's `model_type` (the module `mlx_lm.models.<model_type>`), when it is not the HF config's.
    #[serde(default)]
    pub model_type: Option<String>,
    /// The HF config moves under this key (Qwen3.5's `text_config`), `model_type` and `tie_word_embeddings` beside it.
    #[serde(default)]
    pub nest_config: Option<String>,
    /// Put before every tensor name (`language_model.` for mlx-lm's multimodal wrappers).
    #[serde(default)]
    pub prefix: String,
    /// What `Model.sanitize` does to an HF checkpoint's tensors (matched on names without the prefix).
    #[serde(default)]
    pub sanitize: Vec<Sanitize>,
    /// Modules (names without the prefix and `.weight`) whose 3-D weights are quantized (`SwitchLinear` experts,
    /// `(experts, out, in)`, quantized along the last axis); other 3-D tensors are not.
    #[serde(default)]
    pub quantize_3d: Vec<AnchoredRegex>,
    /// The model's `quant_predicate`: modules quantized with other parameters than the default, each written to
    /// config.json's `quantization` under its full path.
    #[serde(default)]
    pub quant_overrides: Vec<QuantOverride>,
    /// HF → MLX: the MLX name (`{b}` block, `{w}` weight) of the 3-D tensor mlx-lm's `sanitize` stacks the
    /// mapping's per-expert weights into (`mx.stack` along a new first axis, experts in order).
    #[serde(default)]
    pub stack_experts: Option<String>,
    /// HF → MLX: when config.json nests a `text_config` (a `…ForConditionalGeneration` checkpoint), mlx-lm's
    /// wrapper model holds the text model under this prefix (`language_model.`).
    #[serde(default)]
    pub wrapper_prefix: Option<String>,
    /// HF → MLX: tensors mlx-lm's model cannot load from an HF checkpoint, and why.
    #[serde(default)]
    pub unsupported: Vec<MlxUnsupported>,
    /// HF → MLX: tensors `mlx_lm.convert` keeps in their stored dtype when it casts the rest (the model's
    /// `cast_predicate`: Qwen3.5's `A_log`), names without the prefix.
    #[serde(default)]
    pub keep_dtype: Vec<AnchoredRegex>,
    /// HF → MLX: fused tensors the model's `sanitize` splits into its own parameters (gpt-oss's and Qwen3.5-MoE's
    /// experts), or renames (one part).
    #[serde(default)]
    pub split: Vec<MlxSplit>,
}

/// A fused HF tensor (names without the prefix; group `b` is the block) and the MLX tensors its parts become, in
/// order, laid out as `parts` says; one MLX name with `parts` left out is a rename.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlxSplit {
    pub hf: AnchoredRegex,
    pub mlx: Vec<String>,
    #[serde(default)]
    pub parts: FusedParts,
}

impl MlxSplit {
    /// The MLX names of HF tensor `text`'s parts, when this rule splits it.
    pub fn names(&self, text: &str) -> Option<Vec<String>> {
        let c = self.hf.0.captures(text)?;
        let b = c.name("b").map_or("", |m| m.as_str());
        Some(self.mlx.iter().map(|t| t.replace("{b}", b)).collect())
    }
}

impl MlxSection {
    /// Whether module `module` (a name without the prefix) of a weight shaped `shape` is quantized with its own
    /// parameters: a quantized module (2-D, or 3-D experts) whose rows divide into the rule's groups.
    pub fn quant_override(&self, module: &str, shape: &[u64]) -> Option<&QuantOverride> {
        let quantized = shape.len() == 2 || shape.len() == 3 && self.quantize_3d.iter().any(|r| r.is_match(module));
        let o = self.quant_overrides.iter().find(|o| o.modules.is_match(module))?;
        (quantized && shape.last().is_some_and(|c| c % o.group_size as u64 == 0)).then_some(o)
    }

    /// Puts config.json's per-module entries (full paths, `prefix` first) in the order mlx-lm's `quantize_model`
    /// visits the modules: block by block in numeric order, within a block by rule (the rules are listed in the
    /// model's attribute order), then by name; modules outside the blocks (`lm_head`) after them.
    pub fn sort_overrides(&self, overrides: &mut [(String, u32, usize)], prefix: &str) {
        let block = |m: &str| {
            let rest = m.split_once("layers.").map(|(_, r)| r)?;
            rest.split('.').next()?.parse::<u64>().ok()
        };
        let rule = |m: &str| {
            let local = m.strip_prefix(prefix).unwrap_or(m);
            self.quant_overrides.iter().position(|o| o.modules.is_match(local)).unwrap_or(usize::MAX)
        };
        overrides.sort_by_cached_key(|(m, _, _)| (block(m).unwrap_or(u64::MAX), rule(m), m.clone()));
    }
}

/// An HF tensor layout mlx-lm does not load (`mlx_lm.convert` fails on it), refused by name.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlxUnsupported {
    pub name: AnchoredRegex,
    pub why: String,
}

/// One step of mlx-lm's `sanitize` for the tensors `name` matches.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sanitize {
    pub name: AnchoredRegex,
    /// Added to every element (Qwen3.5's `v + 1.0` on RMSNorm weights of an HF checkpoint).
    #[serde(default)]
    pub add: Option<f32>,
    /// `moveaxis(from, to)`; only a size-1 axis may move, so it changes the shape, not the bytes.
    #[serde(default)]
    pub moveaxis: Option<[usize; 2]>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuantOverride {
    pub modules: AnchoredRegex,
    pub bits: u32,
    pub group_size: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMapping {
    architecture: String,
    hf_architectures: Vec<String>,
    #[serde(default)]
    unsupported: Vec<Unsupported>,
    #[serde(default)]
    strip_prefixes: Vec<String>,
    #[serde(default)]
    erase: Vec<String>,
    #[serde(default)]
    multimodal: Vec<AnchoredRegex>,
    tensors: Vec<TensorRule>,
    #[serde(default)]
    experts: Vec<ExpertRule>,
    #[serde(default)]
    fused: Vec<FusedRule>,
    #[serde(default)]
    mxfp4: Vec<Mxfp4Rule>,
    #[serde(default)]
    drop: Vec<AnchoredRegex>,
    f32: F32Rule,
    metadata: Vec<MetaEntry>,
    #[serde(default)]
    hf_config: Option<HfConfig>,
    #[serde(default)]
    nextn: Option<Nextn>,
    #[serde(default)]
    mlx: Option<MlxSection>,
    #[serde(default)]
    periodic_layers: Option<PeriodicLayers>,
    #[serde(default)]
    hparams: super::hparams::HparamsRule,
    #[serde(default)]
    generate: Vec<GenerateRule>,
}

/// A config value this mapping cannot convert exactly: present and not one of `allow` is an error.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unsupported {
    pub config: String,
    #[serde(default)]
    pub allow: Vec<Json>,
}

/// A regex that must match the whole name (so `lm_head\.weight` does not also match `x.lm_head.weight.scales`).
#[derive(Debug, Clone)]
pub struct AnchoredRegex(pub Regex);

impl<'de> Deserialize<'de> for AnchoredRegex {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Regex::new(&format!("^(?:{s})$")).map(AnchoredRegex).map_err(serde::de::Error::custom)
    }
}

impl AnchoredRegex {
    pub fn is_match(&self, s: &str) -> bool {
        self.0.is_match(s)
    }
}

/// One rename: HF name → GGUF name, `{b}` filled from the regex group named `b`.
#[derive(Debug, Deserialize)]
#[serde(try_from = "RawTensorRule")]
pub struct TensorRule {
    /// Absent for a tensor the HF checkpoint stores differently (Qwen3.5-MoE's fused experts): the rule then only
    /// converts to MLX, under `mlx`.
    pub hf: Option<AnchoredRegex>,
    /// The HF name as a template (`model.layers.{b}.mlp.up_proj.weight`), when the regex is a plain name with at
    /// most the block group: what GGUF → HF writes.
    pub hf_template: Option<String>,
    /// The GGUF name template as an anchored regex, for GGUF → HF.
    pub gguf_regex: AnchoredRegex,
    pub gguf: String,
    pub permute: Option<Permute>,
    /// Added to every element in f32 before the output conversion (Gemma's RMSNorm stores `weight` and multiplies
    /// by `1 + weight`; GGUF stores `1 + weight`).
    pub offset: Option<f32>,
    /// The MLX name template, where mlx-lm names the tensor differently from HF.
    pub mlx: Option<String>,
    /// `mlx` as an anchored regex: an MLX checkpoint's tensor of that name maps to `gguf` too (MLX → GGUF).
    pub mlx_regex: Option<AnchoredRegex>,
    pub reorder: Option<Reorder>,
    pub values: Option<ValueFn>,
    pub hf_shape: Option<ShapeRule>,
    /// The HF (and MLX) dtype whatever the output's (Qwen3.5's `A_log`, which mlx-lm never casts).
    pub dtype: Option<crate::dtype::Dtype>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTensorRule {
    #[serde(default)]
    hf: Option<AnchoredRegex>,
    gguf: String,
    #[serde(default)]
    permute: Option<Permute>,
    #[serde(default)]
    offset: Option<f32>,
    #[serde(default)]
    mlx: Option<String>,
    #[serde(default)]
    reorder: Option<Reorder>,
    #[serde(default)]
    values: Option<ValueFn>,
    #[serde(default)]
    hf_shape: Option<ShapeRule>,
    #[serde(default)]
    dtype: Option<KeptDtype>,
}

/// The grouped v-head reorder of linear-attention layers (convert_hf_to_gguf's `_LinearAttentionVReorderBase`):
/// along `axis`, after `skip` leading elements, `groups × per_group` heads of `block` elements are stored by HF
/// grouped (head `g·per_group + r`) and by GGUF tiled (head `r·groups + g`). Sizes are config fields, numbers, or
/// lists of either (their product).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reorder {
    /// numpy axis of the tensor: 0 (rows) or its last axis (columns).
    pub axis: usize,
    pub groups: Dim,
    /// Heads in all (`groups × per_group`).
    pub heads: Dim,
    pub block: Dim,
    #[serde(default)]
    pub skip: Option<Dim>,
}

/// A size: a number, a config field, or the product of a list of them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Dim {
    Number(u64),
    Field(String),
    Product(Vec<Dim>),
}

/// An elementwise function the converter applies going to GGUF (undone going back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueFn {
    /// GGUF stores `-exp(x)` (Qwen3.5's `ssm_a` from `A_log`); back is `log(-x)`.
    NegExp,
}

impl ValueFn {
    /// Going to GGUF: `-exp(x)` correctly rounded to f32 (computed in f64, rounded once). The converter's
    /// `-torch.exp(x)` in f32 is within 1 ulp of it but depends on the torch build (docs/notes/qwen3_5/README.md
    /// §3.5), so no bit-exact answer exists to copy.
    pub fn forward(self, x: f32) -> f32 {
        match self {
            ValueFn::NegExp => -(f64::from(x).exp() as f32),
        }
    }

    /// Going back: `ln(-v)`, computed in f64 and rounded once.
    pub fn inverse(self, v: f32) -> f32 {
        match self {
            ValueFn::NegExp => (-f64::from(v)).ln() as f32,
        }
    }
}

/// The HF shape from the GGUF's (numpy order), when they differ by size-1 axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawShapeRule")]
pub enum ShapeRule {
    /// A size-1 axis inserted at this position (HF's conv1d `(C, 1, K)` from GGUF's `(C, K)`).
    Insert(usize),
    /// Size-1 axes put in front up to this many dimensions (a `(1, hidden)` gate stored as `{hidden}`).
    Rank(usize),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShapeRule {
    insert: Option<usize>,
    rank: Option<usize>,
}

impl TryFrom<RawShapeRule> for ShapeRule {
    type Error = &'static str;
    fn try_from(r: RawShapeRule) -> std::result::Result<Self, &'static str> {
        match (r.insert, r.rank) {
            (Some(a), None) => Ok(ShapeRule::Insert(a)),
            (None, Some(n)) => Ok(ShapeRule::Rank(n)),
            _ => Err("hf_shape is {insert: axis} or {rank: n}"),
        }
    }
}

impl ShapeRule {
    /// The GGUF tensor's shape (numpy order) from the HF one, as the converter writes it: `insert`'s axis removed
    /// when it has size 1 (`torch.squeeze`), `rank` kept as it is (the converter writes a `(1, hidden)` gate
    /// `{hidden, 1}`). `None`: the HF tensor has no size-1 axis there.
    pub fn to_gguf(self, hf: &[u64]) -> Option<Vec<u64>> {
        match self {
            ShapeRule::Insert(axis) => {
                let mut s = hf.to_vec();
                (s.get(axis) == Some(&1)).then(|| {
                    s.remove(axis);
                    s
                })
            }
            ShapeRule::Rank(_) => Some(hf.to_vec()),
        }
    }

    pub fn apply(self, shape: &[u64]) -> Vec<u64> {
        let mut s = shape.to_vec();
        match self {
            ShapeRule::Insert(axis) => s.insert(axis.min(s.len()), 1),
            ShapeRule::Rank(n) => {
                while s.len() < n {
                    s.insert(0, 1);
                }
            }
        }
        s
    }
}

/// The dtypes a rule may pin.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum KeptDtype {
    F32,
}

impl TryFrom<RawTensorRule> for TensorRule {
    type Error = String;
    fn try_from(r: RawTensorRule) -> std::result::Result<Self, String> {
        if r.hf.is_none() && r.mlx.is_none() {
            return Err(format!("tensor rule {:?}: needs hf, or mlx for a tensor only MLX names", r.gguf));
        }
        if let Some(hf) = &r.hf {
            let has_group = hf.0.capture_names().flatten().any(|n| n == "b");
            if r.gguf.contains("{b}") != has_group {
                return Err(format!(
                    "tensor rule {:?} → {:?}: the GGUF name uses {{b}} exactly when the regex has a group named b",
                    hf.0.as_str(),
                    r.gguf
                ));
            }
        }
        if r.offset.is_some_and(|o| o == 0.0 || !o.is_finite()) {
            return Err(format!("tensor rule {:?}: offset must be finite and not 0", r.gguf));
        }
        let hf_template = r.hf.as_ref().and_then(|hf| plain_template(hf.0.as_str(), &["b"]));
        let template_regex = |t: &str| {
            Regex::new(&format!("^(?:{})$", regex::escape(t).replace(r"\{b\}", r"(?P<b>\d+)")))
                .map(AnchoredRegex)
                .map_err(|e| format!("tensor rule {:?}: {e}", r.gguf))
        };
        let gguf_regex = template_regex(&r.gguf)?;
        let mlx_regex = r.mlx.as_deref().map(template_regex).transpose()?;
        if r.mlx.as_ref().is_some_and(|m| m.contains("{b}") != r.gguf.contains("{b}")) {
            return Err(format!("tensor rule {:?}: the MLX name uses {{b}} exactly when the GGUF name does", r.gguf));
        }
        if r.reorder.as_ref().is_some_and(|o| o.axis > 2) {
            return Err(format!("tensor rule {:?}: reorder.axis is 0 (rows) or the last axis", r.gguf));
        }
        Ok(TensorRule {
            hf: r.hf,
            hf_template,
            gguf_regex,
            gguf: r.gguf,
            permute: r.permute,
            offset: r.offset,
            mlx: r.mlx,
            mlx_regex,
            reorder: r.reorder,
            values: r.values,
            hf_shape: r.hf_shape,
            dtype: r.dtype.map(|KeptDtype::F32| crate::dtype::Dtype::F32),
        })
    }
}

/// The name an anchored rule regex (`^(?:…)$`) matches when it is a plain name around the named `groups`: escaped
/// dots, and each group present (`(?P<b>\d+)`, an experts rule's `(?P<w>down_proj|gate_proj)`) as `{name}`.
fn plain_template(anchored: &str, groups: &[&str]) -> Option<String> {
    let mut t = anchored.strip_prefix("^(?:")?.strip_suffix(")$")?.to_string();
    for g in groups {
        if let Some(start) = t.find(&format!("(?P<{g}>")) {
            let end = start + t[start..].find(')')?;
            t.replace_range(start..=end, &format!("{{{g}}}"));
        }
    }
    let t = t.replace(r"\.", ".");
    let rest = groups.iter().fold(t.clone(), |rest, g| rest.replace(&format!("{{{g}}}"), ""));
    rest.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')).then_some(t)
}

/// The q/k rope permutation (convert_hf_to_gguf's `LlamaModel.permute`) with the head count from config field
/// `heads`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Permute {
    pub heads: String,
}

/// Which tensors are stored F32 whatever the output type (`ModelBase.prepare_tensors`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct F32Rule {
    /// Tensors with at most this many dimensions.
    pub max_dims: usize,
    /// GGUF names matching one of these.
    #[serde(default)]
    pub names: Vec<AnchoredRegex>,
    /// GGUF names not ending in one of these.
    #[serde(default)]
    pub unless_suffix: Vec<String>,
}

impl F32Rule {
    pub fn forces_f32(&self, gguf_name: &str, n_dims: usize) -> bool {
        n_dims <= self.max_dims
            || self.names.iter().any(|r| r.is_match(gguf_name))
            || (!self.unless_suffix.is_empty() && !self.unless_suffix.iter().any(|s| gguf_name.ends_with(s.as_str())))
    }
}

/// The GGUF value type of a metadata entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvType {
    String,
    U32,
    I32,
    F32,
    Bool,
    /// An array of i32 (gguf-py's `add_array` of Python ints).
    I32Array,
}

/// Values computed from the checkpoint rather than read from config (`gguf.Metadata` heuristics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Computed {
    /// The mapping's `architecture`.
    Architecture,
    /// `general.file_type` of the output type (`LlamaFileType`: 0 F32, 1 F16, 32 BF16).
    FileType,
    /// Phi-3's rotary dimensions, `int(partial_rotary_factor * hidden_size) // num_attention_heads` (u32).
    PartialRopeDimensions,
    /// Phi-3's longrope attention factor (f32), written only when `$rope.long_factor` is non-empty
    /// ([`super::generate::longrope_attn_factor`]).
    LongropeAttnFactor,
    /// The layers plus the multi-token-prediction blocks the conversion writes (the mapping's `nextn`;
    /// `_QwenMtpMixin.__init__`'s `block_count`), u32.
    BlockCount,
    /// How many multi-token-prediction blocks are written (u32); not written when there are none.
    NextnLayers,
    /// `Qwen3NextModel.set_gguf_parameters`' recurrent-layer flags: `layer_types[i] == "linear_attention"`, padded
    /// with false over the multi-token-prediction blocks (a bool array); only when the config has `layer_types`,
    /// which must have one entry per layer.
    RecurrentLayers,
    /// `Qwen3NextModel`'s rotary dimensions, `int(head_dim · $rope.partial_rotary_factor)` (default 0.25;
    /// head_dim defaults to `hidden_size // num_attention_heads`), u32.
    HeadRopeDimensions,
}

/// A vocabulary reader of convert_hf_to_gguf, tried in the mapping's order; the first whose files are present is
/// used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenizerKind {
    /// `_set_vocab_sentencepiece`: `tokenizer.model` (SentencePiece protobuf), tokenizer model `llama`.
    Sentencepiece,
    /// `_set_vocab_llama_hf`: a tokenizer.json BPE with `byte_fallback` (SentencePiece converted to a fast
    /// tokenizer). Recognised so it is refused by name rather than written as GPT-2 keys.
    LlamaHf,
    /// `_set_vocab_gpt2`: a byte-level BPE tokenizer.json, tokenizer model `gpt2`.
    Gpt2,
    /// `Phi3MiniModel.set_vocab` (`conversion/phi.py`): GPT-2 when tokenizer_config.json's `tokenizer_class` is
    /// `GPT2Tokenizer` (Phi-4), else its own SentencePiece reading (added tokens from added_tokens.json,
    /// `added_tokens_decoder` and tokenizer.json, kept as written, CONTROL only when marked special).
    Phi3,
}

/// Where a metadata entry's value comes from.
#[derive(Debug, Clone)]
pub enum MetaSource {
    Literal(Json),
    /// The first present field of the list (`find_hparam`) in `file` (config.json unless `from` names another
    /// JSON file of the checkpoint), else `a / b` of `else_div`.
    Config {
        file: ConfigFile,
        fields: Vec<String>,
        else_div: Option<[String; 2]>,
    },
    /// The product of two integer config fields (`hparams[a] * hparams[b]`); an error when either is absent.
    Product([String; 2]),
    Computed(Computed),
    /// The whole group of tokenizer keys, from the first reader of the list whose files are present.
    Tokenizer(Vec<TokenizerKind>),
    /// The whole group of authorship and sampling keys (`general.name`, `general.size_label`, the model card's,
    /// `general.sampling.*`) gguf-py's `Metadata` writes ([`super::authorship`]).
    Authorship,
    /// A group of entries from another file, spliced in place when the mapping is parsed.
    Include(String),
}

/// How the authorship group is computed: as gguf-py's `Metadata` does (the only way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum AuthorshipRule {
    #[serde(rename = "gguf-py")]
    GgufPy,
}

/// The JSON files of a checkpoint a `config` entry can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum ConfigFile {
    #[serde(rename = "config.json")]
    Config,
    #[serde(rename = "tokenizer_config.json")]
    TokenizerConfig,
}

/// One metadata entry, validated.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawMetaEntry")]
pub struct MetaEntry {
    pub key: String,
    pub ty: Option<KvType>,
    pub source: MetaSource,
    pub optional: bool,
    /// The value when none of the config fields is present (a `config.get(field, default)` in the converter).
    pub default: Option<Json>,
    /// Only written when every config field equals the given value.
    pub when: BTreeMap<String, Json>,
    /// Not written when every config field equals the given value (an absent field equals nothing).
    pub unless: BTreeMap<String, Json>,
    /// Only written when this file is in the checkpoint folder.
    pub when_file: Option<String>,
    /// Only written when every one of these config fields is present (not absent, not null).
    pub present: Vec<String>,
    /// Only written when none of these config fields is present (`if "f" not in hparams`).
    pub absent: Vec<String>,
    /// An array value padded with zeros to this length, then cut to it (`mrope_section` written as 4 sections).
    pub pad_to: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetaEntry {
    key: Option<String>,
    #[serde(rename = "type")]
    ty: Option<KvType>,
    value: Option<Json>,
    config: Option<Vec<String>>,
    from: Option<ConfigFile>,
    else_div: Option<[String; 2]>,
    mul: Option<[String; 2]>,
    computed: Option<Computed>,
    tokenizer: Option<Vec<TokenizerKind>>,
    include: Option<String>,
    /// `authorship: gguf-py`: the [`MetaSource::Authorship`] group.
    authorship: Option<AuthorshipRule>,
    #[serde(default)]
    optional: bool,
    default: Option<Json>,
    #[serde(default)]
    when: BTreeMap<String, Json>,
    #[serde(default)]
    unless: BTreeMap<String, Json>,
    when_file: Option<String>,
    #[serde(default)]
    present: Vec<String>,
    #[serde(default)]
    absent: Vec<String>,
    pad_to: Option<usize>,
}

impl TryFrom<RawMetaEntry> for MetaEntry {
    type Error = String;
    fn try_from(r: RawMetaEntry) -> std::result::Result<Self, String> {
        let sources = [
            r.value.is_some(),
            r.config.is_some(),
            r.mul.is_some(),
            r.computed.is_some(),
            r.tokenizer.is_some(),
            r.include.is_some(),
            r.authorship.is_some(),
        ];
        if sources.iter().filter(|s| **s).count() != 1 {
            return Err(
                "a metadata entry has exactly one of value, config, mul, computed, tokenizer, include, authorship"
                    .into(),
            );
        }
        let group = match (r.tokenizer, r.include, r.authorship) {
            (Some(kinds), _, _) if kinds.is_empty() => return Err("tokenizer lists no reader".into()),
            (Some(kinds), _, _) => Some(MetaSource::Tokenizer(kinds)),
            (_, Some(file), _) => Some(MetaSource::Include(file)),
            (_, _, Some(AuthorshipRule::GgufPy)) => Some(MetaSource::Authorship),
            _ => None,
        };
        if let Some(source) = group {
            if r.key.is_some()
                || r.ty.is_some()
                || r.optional
                || r.default.is_some()
                || r.from.is_some()
                || !r.when.is_empty()
                || !r.unless.is_empty()
            {
                return Err("tokenizer, include and authorship entries take no other field but when_file".into());
            }
            return Ok(MetaEntry {
                key: String::new(),
                ty: None,
                source,
                optional: false,
                default: None,
                when: r.when,
                unless: r.unless,
                when_file: r.when_file,
                present: r.present,
                absent: r.absent,
                pad_to: None,
            });
        }
        let key = r.key.ok_or("a metadata entry needs a key")?;
        if r.else_div.is_some() && r.config.is_none() {
            return Err(format!("{key}: else_div only goes with config"));
        }
        if r.from.is_some() && r.config.is_none() {
            return Err(format!("{key}: from only goes with config"));
        }
        if r.default.is_some() && (r.config.is_none() || r.optional || r.else_div.is_some()) {
            return Err(format!("{key}: default only goes with config, without optional or else_div"));
        }
        let source = match (r.value, r.config, r.computed, r.mul) {
            (_, _, _, Some(pair)) => MetaSource::Product(pair),
            (Some(v), _, _, _) => MetaSource::Literal(v),
            (_, Some(fields), _, _) => {
                if fields.is_empty() {
                    return Err(format!("{key}: config lists no field"));
                }
                MetaSource::Config { file: r.from.unwrap_or(ConfigFile::Config), fields, else_div: r.else_div }
            }
            (_, _, Some(c), _) => MetaSource::Computed(c),
            _ => unreachable!("exactly one source was checked above"),
        };
        if r.pad_to.is_some() && r.ty != Some(KvType::I32Array) {
            return Err(format!("{key}: pad_to only goes with an array type"));
        }
        let needs_type = !matches!(source, MetaSource::Computed(_));
        if needs_type != r.ty.is_some() {
            return Err(format!("{key}: a type is required for value and config entries, and not allowed otherwise"));
        }
        Ok(MetaEntry {
            key,
            ty: r.ty,
            source,
            optional: r.optional,
            default: r.default,
            when: r.when,
            unless: r.unless,
            when_file: r.when_file,
            present: r.present,
            absent: r.absent,
            pad_to: r.pad_to,
        })
    }
}

/// One row of the pre-tokenizer table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreTokenizer {
    pub sha256: String,
    pub pre: String,
    /// Whether the tokenizer adds a BOS token (its post-processor's single template starts with a special
    /// token), when that decides the name: convert_hf_to_gguf hashes the ids of its probe text BOS included, so
    /// Llama 3's pre-tokenizer is `llama-bpe` with its BOS and `smaug-bpe` without. Absent: either.
    #[serde(default)]
    pub bos: Option<bool>,
    /// Tokens the vocabulary must hold at these ids: the converter's hash covers the vocabulary, so one
    /// pre_tokenizer section over two vocabularies can carry two names (SmolLM2's `smollm`, StarCoder-style
    /// `refact`). Empty: any vocabulary.
    #[serde(default)]
    pub tokens: BTreeMap<u64, String>,
    #[serde(default)]
    pub example: Option<String>,
    /// tokenizer.json's `normalizer`, `pre_tokenizer` and `decoder`, for rebuilding a tokenizer from a GGUF.
    #[serde(default)]
    pub sections: Option<TokenizerSections>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerSections {
    pub normalizer: Json,
    pub pre_tokenizer: Json,
    pub decoder: Json,
}

fn parse_yaml<T: serde::de::DeserializeOwned>(file: &str, text: &str) -> Result<T> {
    serde_norway::from_str(text).map_err(|e| Error::Mapping { file: format!("mappings/{file}"), msg: e.to_string() })
}

/// A metadata group file: a list of entries, which may not include further groups.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    metadata: Vec<MetaEntry>,
}

/// Replaces each `include` entry with the entries of its group.
fn expand_includes(file: &str, entries: Vec<MetaEntry>) -> Result<Vec<MetaEntry>> {
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let MetaSource::Include(name) = &e.source else {
            out.push(e);
            continue;
        };
        let (gfile, text) = GROUPS.iter().find(|(f, _)| f == name).ok_or_else(|| Error::Mapping {
            file: format!("mappings/{file}"),
            msg: format!(
                "include {name:?}: no such metadata group (known: {:?})",
                GROUPS.iter().map(|g| g.0).collect::<Vec<_>>()
            ),
        })?;
        let g: RawGroup = parse_yaml(gfile, text)?;
        if g.metadata.iter().any(|x| matches!(x.source, MetaSource::Include(_))) {
            return Err(Error::Mapping {
                file: format!("mappings/{gfile}"),
                msg: "a group cannot include another".into(),
            });
        }
        out.extend(g.metadata);
    }
    Ok(out)
}

/// Parses and validates one mapping's text (`file` names it in errors).
pub fn parse_mapping(file: &str, text: &str) -> Result<Mapping> {
    let r: RawMapping = parse_yaml(file, text)?;
    let metadata = expand_includes(file, r.metadata)?;
    Ok(Mapping {
        file: file.to_string(),
        architecture: r.architecture,
        hf_architectures: r.hf_architectures,
        unsupported: r.unsupported,
        strip_prefixes: r.strip_prefixes,
        erase: r.erase,
        multimodal: r.multimodal,
        tensors: r.tensors,
        experts: r.experts,
        fused: r.fused,
        mxfp4: r.mxfp4,
        drop: r.drop,
        f32: r.f32,
        metadata,
        hf_config: r.hf_config,
        nextn: r.nextn,
        mlx: r.mlx,
        periodic_layers: r.periodic_layers,
        hparams: r.hparams,
        generate: r.generate,
    })
}

/// The embedded mapping that handles HF architecture `hf_arch` (config.json `architectures[0]`).
pub fn mapping_for(hf_arch: &str) -> Result<Mapping> {
    for (file, text) in MAPPINGS {
        let m = parse_mapping(file, text)?;
        if m.hf_architectures.iter().any(|a| a == hf_arch) {
            return Ok(m);
        }
    }
    let mut mapped = Vec::new();
    for (file, text) in MAPPINGS {
        mapped.extend(parse_mapping(file, text)?.hf_architectures);
    }
    Err(Error::Mapping {
        file: "mappings/*.yaml".into(),
        msg: format!(
            "config.json: architectures: no mapping handles {hf_arch:?} (HF → GGUF is mapped for {}); a GGUF made \
             by llama.cpp's convert_hf_to_gguf.py can be quantized, verified and measured as it is \
             (`quantfarm quantize`, `verify`, `kld`), or add the family (mappings/README.md)",
            mapped.join(", ")
        ),
    })
}

/// The embedded mapping for GGUF architecture `arch` (`general.architecture`).
pub fn mapping_for_gguf(arch: &str) -> Result<Mapping> {
    for (file, text) in MAPPINGS {
        let m = parse_mapping(file, text)?;
        if m.architecture == arch {
            return Ok(m);
        }
    }
    Err(Error::Mapping { file: "mappings/*.yaml".into(), msg: format!("no mapping for GGUF architecture {arch:?}") })
}

/// The embedded pre-tokenizer table.
pub fn pre_tokenizers() -> Result<Vec<PreTokenizer>> {
    parse_yaml(PRE_TOKENIZERS_FILE, PRE_TOKENIZERS)
}

/// What a mapping says about one GGUF tensor going back to HF (or MLX).
#[derive(Debug)]
pub struct Unmapped<'a> {
    /// The HF name; `None` when only MLX names the tensor (then `mlx` is set).
    pub hf: Option<String>,
    /// The MLX name where it differs from the HF name (without the MLX prefix).
    pub mlx: Option<String>,
    pub rule: &'a TensorRule,
}

/// What a mapping says about one HF tensor.
#[derive(Debug, PartialEq)]
pub enum Mapped<'a> {
    Drop,
    /// A tensor of a vision or audio tower (the mapping's `multimodal`): not converted.
    Multimodal,
    /// Expert `expert`'s weight `weight` of block `block`, stacked by the mapping's `experts[rule]`.
    Expert {
        rule: usize,
        block: String,
        expert: u64,
        weight: String,
    },
    /// A fused tensor written as these GGUF tensors (the mapping's `fused`).
    Fused {
        gguf: Vec<String>,
        parts: FusedParts,
    },
    /// One of an MXFP4 pair whose GGUF tensors are these (the mapping's `mxfp4`); `stem` names the pair.
    Mxfp4 {
        gguf: Vec<String>,
        stem: String,
        part: Mxfp4Part,
    },
    Rename {
        gguf: String,
        permute: Option<&'a Permute>,
        offset: Option<f32>,
        /// The grouped v-head reorder, applied going to GGUF.
        reorder: Option<&'a Reorder>,
        values: Option<ValueFn>,
        hf_shape: Option<ShapeRule>,
    },
}

/// The block number `{b}` stands for when `name` is `template` with it filled in (digits only); `None` when the
/// template has no `{b}` or `name` is not one of its names.
fn block_in<'a>(template: &str, name: &'a str) -> Option<&'a str> {
    let (head, tail) = template.split_once("{b}")?;
    let b = name.strip_prefix(head)?.strip_suffix(tail)?;
    (!b.is_empty() && b.bytes().all(|c| c.is_ascii_digit())).then_some(b)
}

impl Mapping {
    /// The per-expert HF name (`{e}` left to fill) of a GGUF tensor an `experts` rule stacks, e.g.
    /// `blk.3.ffn_up_exps.weight` → `model.layers.3.mlp.experts.{e}.up_proj.weight`.
    pub fn unstack_expert(&self, gguf: &str) -> Option<String> {
        for r in &self.experts {
            let Some(template) = &r.hf_template else { continue };
            for (w, g) in &r.gguf {
                if let Some(b) = block_in(g, gguf) {
                    return Some(template.replace("{b}", b).replace("{w}", w));
                }
            }
        }
        None
    }

    /// The `fused` rule that writes GGUF tensor `gguf` as one of its parts, for the way back.
    pub fn unfuse(&self, gguf: &str) -> Option<Unfused> {
        for r in &self.fused {
            for (index, g) in r.gguf.iter().enumerate() {
                let b = match block_in(g, gguf) {
                    Some(b) => Some(b),
                    None if g == gguf => None,
                    None => continue,
                };
                let fill = |t: &String| b.map_or_else(|| t.clone(), |b| t.replace("{b}", b));
                return Some(Unfused {
                    hf: r.hf_template.as_ref().map(fill),
                    sources: r.gguf.iter().map(fill).collect(),
                    parts: r.parts,
                    index,
                });
            }
        }
        None
    }

    /// Maps a GGUF tensor name back to its HF name (the first rule whose GGUF template matches).
    pub fn unmap_tensor(&self, gguf: &str) -> Result<Unmapped<'_>> {
        for rule in &self.tensors {
            if let Some(c) = rule.gguf_regex.0.captures(gguf) {
                let fill = |t: &String| match c.name("b") {
                    Some(b) => t.replace("{b}", b.as_str()),
                    None => t.clone(),
                };
                let hf = match (&rule.hf, &rule.hf_template) {
                    (None, _) => None,
                    (Some(_), Some(t)) => Some(fill(t)),
                    (Some(hf), None) => {
                        return Err(Error::Mapping {
                            file: self.file.clone(),
                            msg: format!("rule {:?} has no plain HF name to write {gguf:?} back to", hf.0.as_str()),
                        })
                    }
                };
                return Ok(Unmapped { hf, mlx: rule.mlx.as_ref().map(fill), rule });
            }
        }
        Err(Error::Unmapped { tensor: gguf.to_string(), mapping: self.file.clone() })
    }

    /// The name of HF tensor `hf` within the text model, as the rules see it (`erase`, then the first matching
    /// `strip_prefixes`), or `None` for a tensor of a vision or audio tower (`multimodal`).
    pub fn text_name(&self, hf: &str) -> Option<String> {
        if self.multimodal.iter().any(|r| r.is_match(hf)) {
            return None;
        }
        let mut erased = hf.to_string();
        for e in &self.erase {
            erased = erased.replace(e.as_str(), "");
        }
        Some(match self.strip_prefixes.iter().find_map(|p| erased.strip_prefix(p.as_str())) {
            Some(rest) => rest.to_string(),
            None => erased,
        })
    }

    /// Maps an HF tensor name: a rename (first matching rule), a drop, or an error naming the tensor.
    pub fn map_tensor<'a>(&'a self, hf: &str) -> Result<Mapped<'a>> {
        let Some(text) = self.text_name(hf) else {
            return Ok(Mapped::Multimodal);
        };
        let hf = text.as_str();
        let rename = |rule: &'a TensorRule, c: regex::Captures| Mapped::Rename {
            gguf: match c.name("b") {
                Some(b) => rule.gguf.replace("{b}", b.as_str()),
                None => rule.gguf.clone(),
            },
            permute: rule.permute.as_ref(),
            offset: rule.offset,
            reorder: rule.reorder.as_ref(),
            values: rule.values,
            hf_shape: rule.hf_shape,
        };
        if let Some((rule, c)) = self.tensors.iter().find_map(|r| Some((r, r.hf.as_ref()?.0.captures(hf)?))) {
            return Ok(rename(rule, c));
        }
        // An MLX checkpoint's own name for a tensor (mlx-lm's SwitchGLU experts): the rule's GGUF tensor.
        if let Some((rule, c)) = self.tensors.iter().find_map(|r| Some((r, r.mlx_regex.as_ref()?.0.captures(hf)?))) {
            return Ok(rename(rule, c));
        }
        for (rule, r) in self.experts.iter().enumerate() {
            if let Some(c) = r.hf.0.captures(hf) {
                let group = |g: &str| c.name(g).map(|m| m.as_str().to_string()).unwrap_or_default();
                let expert = group("e").parse().map_err(|_| Error::Unmapped {
                    tensor: hf.to_string(),
                    mapping: format!("{} (expert index is not a number)", self.file),
                })?;
                return Ok(Mapped::Expert { rule, block: group("b"), expert, weight: group("w") });
            }
        }
        for rule in &self.fused {
            if let Some(c) = rule.hf.0.captures(hf) {
                let fill = |t: &String| match c.name("b") {
                    Some(b) => t.replace("{b}", b.as_str()),
                    None => t.clone(),
                };
                return Ok(Mapped::Fused { gguf: rule.gguf.iter().map(fill).collect(), parts: rule.parts });
            }
        }
        let pair = [("_blocks", Mxfp4Part::Blocks), ("_scales", Mxfp4Part::Scales)];
        if let Some((stem, part)) = pair.iter().find_map(|(suffix, p)| Some((hf.strip_suffix(suffix)?, *p))) {
            for rule in &self.mxfp4 {
                if let Some(c) = rule.hf.0.captures(stem) {
                    let fill = |t: &String| match c.name("b") {
                        Some(b) => t.replace("{b}", b.as_str()),
                        None => t.clone(),
                    };
                    let gguf = rule.gguf.iter().map(fill).collect();
                    return Ok(Mapped::Mxfp4 { gguf, stem: stem.to_string(), part });
                }
            }
        }
        if self.drop.iter().any(|r| r.is_match(hf)) {
            return Ok(Mapped::Drop);
        }
        Err(Error::Unmapped { tensor: hf.to_string(), mapping: self.file.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_mappings_parse() {
        for (file, text) in MAPPINGS {
            parse_mapping(file, text).unwrap();
        }
        let table = pre_tokenizers().unwrap();
        assert!(!table.is_empty());
        for p in &table {
            if let Some(sec) = &p.sections {
                assert_eq!(super::super::tokenizer::pre_tokenizer_sha256(&sec.pre_tokenizer), p.sha256, "{}", p.pre);
            }
        }
    }

    #[test]
    fn wrapper_prefixes_are_stripped_once() {
        let m = mapping_for("LlamaForCausalLM").unwrap();
        let rename = |n: &str| match m.map_tensor(n) {
            Ok(Mapped::Rename { gguf, .. }) => Ok(gguf),
            Ok(Mapped::Drop) => Ok("(dropped)".into()),
            Ok(Mapped::Multimodal) => Ok("(multimodal)".into()),
            Ok(other) => Ok(format!("{other:?}")),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(rename("language_model.model.norm.weight").unwrap(), "output_norm.weight");
        assert_eq!(rename("language_model.model.layers.2.mlp.up_proj.weight").unwrap(), "blk.2.ffn_up.weight");
        assert_eq!(rename("language_model.lm_head.weight").unwrap(), "output.weight");
        assert!(rename("language_model.language_model.model.norm.weight").is_err(), "stripped once only");
    }

    #[test]
    fn renames_drops_and_refuses() {
        let m = mapping_for("LlamaForCausalLM").unwrap();
        match m.map_tensor("model.layers.12.self_attn.k_proj.weight").unwrap() {
            Mapped::Rename { gguf, permute, .. } => {
                assert_eq!(gguf, "blk.12.attn_k.weight");
                assert_eq!(permute.unwrap().heads, "num_key_value_heads");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(m.map_tensor("model.layers.0.self_attn.rotary_emb.inv_freq").unwrap(), Mapped::Drop);
        let e = m.map_tensor("lm_head.biases").unwrap_err().to_string();
        assert_eq!(e, "cannot map tensor 'lm_head.biases' (mapping llama.yaml)");
    }

    #[test]
    fn groups_expand_and_bad_entries_are_refused() {
        let m = mapping_for("Gemma3ForCausalLM").unwrap();
        assert!(m.metadata.iter().all(|e| !matches!(e.source, MetaSource::Include(_))));
        assert!(matches!(m.metadata[0].source, MetaSource::Computed(Computed::Architecture)));
        match m.map_tensor("model.layers.3.post_feedforward_layernorm.weight").unwrap() {
            Mapped::Rename { gguf, offset, .. } => {
                assert_eq!((gguf.as_str(), offset), ("blk.3.post_ffw_norm.weight", Some(1.0)))
            }
            other => panic!("{other:?}"),
        }
        let head = "architecture: x\nhf_architectures: [X]\ntensors: []\nf32: {max_dims: 1}\nmetadata:\n";
        for (entry, want) in [
            ("  - {include: nope.yaml}\n", "no such metadata group"),
            ("  - {key: a, type: u32, value: 1, default: 2}\n", "default only goes with config"),
            ("  - {key: a, type: u32, value: 1, from: tokenizer_config.json}\n", "from only goes with config"),
            ("  - {tokenizer: []}\n", "lists no reader"),
            ("  - {tokenizer: [gpt2], key: a}\n", "take no other field"),
            ("  - {tokenizer: [wordpiece]}\n", "unknown variant"),
        ] {
            let e = parse_mapping("bad.yaml", &format!("{head}{entry}")).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("mappings/bad.yaml"), "{entry}: {e}");
        }
        let bad_offset = "architecture: x\nhf_architectures: [X]\ntensors:\n  - {hf: a, gguf: b, offset: 0.0}\nf32: {max_dims: 1}\nmetadata: []\n";
        assert!(parse_mapping("bad.yaml", bad_offset).unwrap_err().to_string().contains("offset must be"));
    }

    #[test]
    fn qwen3_5_nextn_names_and_shapes_gain_size_1_axes() {
        let m = mapping_for("Qwen3_5MoeForConditionalGeneration").unwrap();
        let n = m.nextn.as_ref().unwrap();
        let nextn = |name: &str, layer: Option<u64>| NextnName::Nextn { name: name.to_string(), layer };
        assert_eq!(
            n.rename("mtp.layers.0.self_attn.q_proj.weight", 40),
            nextn("model.layers.40.self_attn.q_proj.weight", Some(0))
        );
        assert_eq!(
            n.rename("model.mtp.layers.2.mlp.gate.weight", 40),
            nextn("model.layers.42.mlp.gate.weight", Some(2))
        );
        assert_eq!(n.rename("mtp.fc.weight", 40), nextn("model.layers.40.eh_proj.weight", None));
        assert_eq!(n.rename("mtp.norm.weight", 40), nextn("model.layers.40.shared_head.norm.weight", None));
        // Unknown head tensors keep their name, which no rule maps (an error naming it, never a silent drop).
        assert_eq!(n.rename("mtp.other.weight", 40), nextn("mtp.other.weight", None));
        assert_eq!(n.rename("model.layers.3.mlp.gate.weight", 40), NextnName::Model);
        assert!(matches!(m.map_tensor("model.visual.blocks.0.attn.qkv.weight").unwrap(), Mapped::Multimodal));
        match m.map_tensor("model.language_model.layers.40.shared_head.norm.weight").unwrap() {
            Mapped::Rename { gguf, offset, .. } => {
                assert_eq!((gguf.as_str(), offset), ("blk.40.nextn.shared_head_norm.weight", Some(1.0)))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(ShapeRule::Insert(1).to_gguf(&[256, 1, 4]), Some(vec![256, 4]));
        assert_eq!(ShapeRule::Insert(1).to_gguf(&[256, 4]), None);
        assert_eq!(ShapeRule::Rank(2).to_gguf(&[1, 64]), Some(vec![1, 64]));
        assert_eq!(ShapeRule::Rank(2).apply(&[64]), vec![1, 64]);
        assert_eq!(ShapeRule::Rank(2).apply(&[1, 64]), vec![1, 64]);
        assert_eq!(ShapeRule::Insert(1).apply(&[256, 4]), vec![256, 1, 4]);
        let m = mapping_for_gguf("qwen35moe").unwrap();
        let u = m.unmap_tensor("blk.7.ffn_gate_exps.weight").unwrap();
        assert_eq!((u.hf, u.mlx.as_deref()), (None, Some("model.layers.7.mlp.switch_mlp.gate_proj.weight")));
        let head = "architecture: x\nhf_architectures: [X]\nf32: {max_dims: 1}\nmetadata: []\ntensors:\n";
        for (rule, want) in [
            ("  - {gguf: a}\n", "needs hf, or mlx"),
            ("  - {hf: a, gguf: b, hf_shape: {insert: 1, rank: 2}}\n", "hf_shape is"),
            ("  - {hf: a, gguf: b, reorder: {axis: 3, groups: 1, heads: 1, block: 1}}\n", "reorder.axis"),
            ("  - {hf: a, gguf: b, values: exp}\n", "unknown variant"),
        ] {
            let e = parse_mapping("bad.yaml", &format!("{head}{rule}")).unwrap_err().to_string();
            assert!(e.contains(want), "{rule}: {e}");
        }
        let text = "architecture: x\nhf_architectures: [X]\nf32: {max_dims: 1}\nmetadata: []\ntensors: []\nhf_config:\n  model_type: x\n  fields:\n    a: {sub: [k1, k2], div: [k1, k2]}\n";
        let e = parse_mapping("bad.yaml", text).unwrap_err().to_string();
        assert!(e.contains("mappings/bad.yaml"), "{e}");
    }

    #[test]
    fn expert_and_fused_rules_map_and_refuse() {
        let m = mapping_for("Qwen3MoeForCausalLM").unwrap();
        match m.map_tensor("model.layers.3.mlp.experts.11.up_proj.weight").unwrap() {
            Mapped::Expert { rule: 0, block, expert: 11, weight } => {
                assert_eq!((block.as_str(), weight.as_str()), ("3", "up_proj"))
            }
            other => panic!("{other:?}"),
        }
        match m.map_tensor("model.layers.2.mlp.experts.gate_up_proj").unwrap() {
            Mapped::Fused { gguf, .. } => assert_eq!(gguf, ["blk.2.ffn_gate_exps.weight", "blk.2.ffn_up_exps.weight"]),
            other => panic!("{other:?}"),
        }
        let head = "architecture: x\nhf_architectures: [X]\ntensors: []\nf32: {max_dims: 1}\nmetadata: []\n";
        let bad = format!("{head}experts:\n  - {{hf: 'a(?P<b>\\d)', count: [n], gguf: {{w: x}}}}\n");
        let e = parse_mapping("bad.yaml", &bad).unwrap_err().to_string();
        assert!(e.contains("groups named b, e and w"), "{e}");
    }

    #[test]
    fn errors_name_file_and_line() {
        let text = "architecture: x\nhf_architectures: [X]\ntensors: []\nf32: {max_dims: 1}\nmetadata:\n  - {key: a, typo: 1}\n";
        let e = parse_mapping("bad.yaml", text).unwrap_err().to_string();
        assert!(e.contains("mappings/bad.yaml") && e.contains("line 6"), "{e}");
        let text = "architecture: x\nhf_architectures: [X]\ntensors:\n  - {hf: 'a(', gguf: b}\nf32: {max_dims: 1}\nmetadata: []\n";
        let e = parse_mapping("bad.yaml", text).unwrap_err().to_string();
        assert!(e.contains("line 4"), "{e}");
    }
}
