//! GGUF → Hugging Face safetensors: the way back, driven by the same mappings. Each GGUF tensor is named back by
//! its rule (`blk.{b}.attn_q.weight` → `model.layers.{b}.self_attn.q_proj.weight`), dequantized row chunk by row
//! chunk within the memory budget (any type the reader knows), its q/k rope permutation undone and its offset
//! (Gemma's `1 + w`) taken off in f32, and stored in the output dtype. config.json comes from the mapping's
//! `hf_config` and the GGUF's keys; the tokenizer files are rebuilt from the GGUF's tokenizer keys
//! ([`super::hf_tokenizer`]).
//!
//! A bf16 GGUF made from a bf16 checkpoint comes back bit for bit (the permutation is a row order, the f32 norms
//! were exact widenings); from a quantized GGUF the weights are the dequantized values rounded to the output dtype.

use serde_json::{Map, Value as Json};

use super::hf_pieces::{HfBufs, HfCut};
use super::hf_tokenizer;
use super::mapping::{mapping_for_gguf, ConfigExpr, ConfigOp, Dim, Mapping, ValueFn};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::gguf::Value;
use crate::pipeline::{read_spans, Reads};
use crate::safetensors::{plan_shards, shard_file_name, write_index, StTensorDesc};
use crate::source::TensorSource;
use crate::write::{PieceWriter, SafetensorsWriter};
use quantfarm_store::Location;
use quantfarm_store::{Committed, StagedSink};

/// safetensors shards of at most this many bytes (`save_pretrained`'s default `max_shard_size` is 5 GB).
const MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// One output tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct HfTensor {
    /// HF name.
    pub name: String,
    /// GGUF name.
    pub source: String,
    /// numpy order (the GGUF `ne` reversed).
    pub shape: Vec<u64>,
    pub dtype: Dtype,
    /// Undo the q/k permutation within heads of `rows / heads` rows.
    pub unpermute_heads: Option<u64>,
    /// Subtracted in f32 (the mapping's offset, taken back).
    pub offset: Option<f32>,
    /// Undo the grouped v-head reorder.
    pub reorder: Option<HeadOrder>,
    /// Undo an elementwise function (applied in f32 before the offset).
    pub values: Option<ValueFn>,
    /// One part of a fused source tensor, taken out as mlx-lm's `sanitize` splits it (gpt-oss's and Qwen3.5-MoE's
    /// fused experts); `shape` is the part's.
    pub part: Option<PartOf>,
    /// One expert's matrix of a stacked 3-D source (GGUF `ffn_*_exps`, experts along the first axis): the way
    /// back to per-expert HF tensors; `shape` is the matrix's.
    pub expert: Option<ExpertOf>,
    /// Joined from several source tensors, `source` the first of them: the way back of a mapping's `fused` rule
    /// (Qwen3.5-MoE's `experts.gate_up_proj`, gpt-oss's dequantized experts and their biases).
    pub join: Option<JoinOf>,
}

/// The parts an HF tensor is joined from (each with the shape [`PartOf::shape`] gives), laid out as `layout`
/// says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinOf {
    pub layout: super::mapping::FusedParts,
    /// Every part's source name, in order.
    pub sources: Vec<String>,
}

impl JoinOf {
    /// The joined shape from one part's, the inverse of [`PartOf::shape`]; `None` when the part has too few axes.
    pub fn shape(&self, part: &[u64]) -> Option<Vec<u64>> {
        use super::mapping::FusedParts;
        let (n, of) = (part.len(), self.sources.len() as u64);
        let mut out = part.to_vec();
        match self.layout {
            FusedParts::Halves if n >= 2 => out[n - 2] *= of,
            FusedParts::InterleavedColumns if n >= 1 => out[n - 1] *= of,
            FusedParts::TransposedRows if n >= 2 => (out[n - 2], out[n - 1]) = (part[n - 1], part[n - 2] * of),
            _ => return None,
        }
        Some(out)
    }
}

/// Expert `expert` of the `of` stacked along a source's first axis: a run of its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertOf {
    pub expert: u64,
    pub of: u64,
}

/// Part `part` of the `of` parts of a fused tensor laid out as `layout` says (see
/// [`super::mapping::FusedParts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartOf {
    pub layout: super::mapping::FusedParts,
    pub of: u64,
    pub part: u64,
}

impl PartOf {
    /// The part's shape, from its fused source's `shape`; `None` when the source does not divide into the parts.
    pub fn shape(&self, shape: &[u64]) -> Option<Vec<u64>> {
        use super::mapping::FusedParts;
        let n = shape.len();
        if self.of == 0 || self.part >= self.of {
            return None;
        }
        let mut out = shape.to_vec();
        match self.layout {
            FusedParts::Halves if n >= 2 && shape[n - 2] % self.of == 0 => out[n - 2] /= self.of,
            FusedParts::InterleavedColumns if n >= 1 && shape[n - 1] % self.of == 0 => out[n - 1] /= self.of,
            FusedParts::TransposedRows if n >= 2 && shape[n - 1] % self.of == 0 => {
                (out[n - 2], out[n - 1]) = (shape[n - 1] / self.of, shape[n - 2]);
            }
            _ => return None,
        }
        Some(out)
    }
}

impl HfTensor {
    /// Tensor `source` of the source written as `dtype` under `name`, its values unchanged (no permutation,
    /// offset, reorder or value function).
    pub fn plain(name: &str, source: &str, shape: Vec<u64>, dtype: Dtype) -> HfTensor {
        HfTensor {
            name: name.to_string(),
            source: source.to_string(),
            shape,
            dtype,
            unpermute_heads: None,
            offset: None,
            reorder: None,
            values: None,
            part: None,
            expert: None,
            join: None,
        }
    }
}

/// The inverse of the grouped v-head reorder along rows or columns of the source (see
/// [`super::mapping::Reorder`]): output index `skip + (g·per_group + r)·block + d` comes from source index
/// `skip + (r·groups + g)·block + d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadOrder {
    /// Along rows (the source's first axis) rather than along each row's values.
    pub rows: bool,
    pub skip: u64,
    pub groups: u64,
    pub per_group: u64,
    pub block: u64,
}

impl HeadOrder {
    /// The source index of output index `i` along the reordered axis.
    pub fn source(&self, i: u64) -> u64 {
        if i < self.skip {
            return i;
        }
        let j = i - self.skip;
        let (head, d) = (j / self.block, j % self.block);
        let (g, r) = (head / self.per_group, head % self.per_group);
        if g >= self.groups {
            return i;
        }
        self.skip + (r * self.groups + g) * self.block + d
    }
}

/// Everything a GGUF → HF (or MLX → HF) conversion writes besides tensor bytes.
#[derive(Debug)]
pub struct HfPlan {
    pub config: Map<String, Json>,
    /// Sorted by name, as `save_pretrained` orders them.
    pub tensors: Vec<HfTensor>,
    /// Files rebuilt from the source (a GGUF's tokenizer.json and tokenizer_config.json), written as pretty JSON.
    pub json_files: Vec<(String, Json)>,
    /// Binary files rebuilt from the source (a SentencePiece vocabulary's tokenizer.model).
    pub binary_files: Vec<(String, Vec<u8>)>,
    /// Files of the source folder copied as they are (an MLX checkpoint's tokenizer and generation files).
    pub carried: Vec<String>,
    /// MLX only: modules (full paths) whose 3-D weights are quantized (mlx-lm's `SwitchLinear` experts).
    pub quantize_3d: Vec<String>,
    /// MLX only: modules (full paths) quantized with their own `(bits, group_size)` (the model's `quant_predicate`),
    /// each one the conversion quantizes.
    pub quant_overrides: Vec<(String, u32, usize)>,
}

/// A metadata value as JSON; an f32 becomes the shortest decimal that reads back as the same f32 (1e-05, not
/// 9.999999747378752e-06).
pub(crate) fn value_json(v: &Value) -> Option<Json> {
    match v {
        Value::Array(_) => None,
        Value::F32(x) => serde_json::Number::from_f64(format!("{x}").parse::<f64>().ok()?).map(Json::Number),
        Value::String(s) => s.as_str().map(Json::from),
        other => Some(other.to_json()),
    }
}

/// Plans the conversion of the GGUF model `src` to an HF checkpoint with weights in `dtype` (BF16, F16 or F32).
pub async fn plan_gguf_to_hf(src: &TensorSource, dtype: Dtype) -> Result<HfPlan> {
    plan_from_gguf(src, dtype, Target::Hf).await
}

/// Plans the conversion of the GGUF model `src` to an unquantized MLX checkpoint with weights in `dtype`: the HF
/// plan with mlx-lm's names (the mapping's `mlx` prefix and names) and its `sanitize` applied (an offset the HF
/// checkpoint takes off and sanitize adds back cancels exactly; size-1 axes move), plus which modules mlx-lm
/// quantizes otherwise. [`HfPlan::quantize_3d`] and [`HfPlan::quant_overrides`] say how to quantize it.
pub async fn plan_gguf_to_mlx(src: &TensorSource, dtype: Dtype) -> Result<HfPlan> {
    plan_from_gguf(src, dtype, Target::Mlx).await
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Hf,
    Mlx,
}

async fn plan_from_gguf(src: &TensorSource, dtype: Dtype, target: Target) -> Result<HfPlan> {
    let file = src.location().to_string();
    let model = src.gguf().ok_or_else(|| Error::format(&file, "format", "is not a GGUF model"))?;
    if !matches!(dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
        return Err(Error::format(&file, "dtype", format!("{dtype}: the output is BF16, F16 or F32")));
    }
    let kv = &model.header().metadata;
    let get = |k: &str| kv.iter().find(|(key, _)| key == k).map(|(_, v)| v);
    let arch = match get("general.architecture") {
        Some(Value::String(s)) => s.to_string_lossy(),
        _ => return Err(Error::format(&file, "general.architecture", "missing")),
    };
    let m = mapping_for_gguf(&arch)?;
    let hc = m.hf_config.as_ref().ok_or_else(|| Error::Mapping {
        file: m.file.clone(),
        msg: "has no hf_config: GGUF → HF is not mapped for this architecture".into(),
    })?;

    // Rope scaling goes back only where the mapping's hf_config writes its keys back (`hf_config.rope_scaling`);
    // another scaled GGUF is refused by name rather than written as an unscaled model. (Llama 3's and Phi-3's
    // generated factor tensors go back below.)
    let scaling = format!("{arch}.rope.scaling.type");
    if let Some(Value::String(t)) = get(&scaling) {
        let t = t.to_string_lossy();
        if t != "none" && !hc.rope_scaling.contains(&t) {
            let back = if hc.rope_scaling.is_empty() { "none".to_string() } else { hc.rope_scaling.join(", ") };
            return Err(Error::format(
                &file,
                &scaling,
                format!(
                    "{t}: GGUF → HF/MLX writes back to config.json only the rope scaling {} maps back ({back})",
                    m.file
                ),
            ));
        }
    }
    let mut config = Map::new();
    config.insert("architectures".into(), Json::Array(vec![m.hf_architectures[0].clone().into()]));
    config.insert("model_type".into(), hc.model_type.clone().into());
    let eval = Eval { file: &file, arch: &arch, kv };
    eval.object(&hc.fields, &hc.required, &mut config)?;
    // A required field within an object (`rope_parameters.mscale_all_dim`).
    for (path, (parents, last)) in hc.required.iter().filter_map(|r| Some((r, r.rsplit_once('.')?))) {
        let parent = parents.split('.').try_fold(&config, |o, k| o.get(k)?.as_object());
        if parent.and_then(|o| o.get(last)).is_none() {
            return Err(Error::format(
                &file,
                path,
                format!("missing: a {} config.json needs it (its GGUF key is absent)", hc.model_type),
            ));
        }
    }
    for (field, v) in &hc.literals {
        config.insert(field.clone(), v.clone());
    }
    // Tensors the converter generates from config.json (Llama 3's and Phi-3's rope factors) go back as the config
    // field they are made from, when one gives them back exactly; they are not HF tensors.
    let generated: Vec<&super::mapping::GenerateRule> =
        m.generate.iter().filter(|g| model.tensors().any(|t| t.info.name == g.gguf)).collect();
    for g in &generated {
        let values = read_f32(src, &g.gguf).await?;
        match g.op.recover(&values, &config, &file)? {
            // Parts of one object (Phi-3's long and short factors of one rope_scaling) are merged.
            Some((field, Json::Object(part))) if config.get(&field).is_some_and(Json::is_object) => {
                if let Some(Json::Object(whole)) = config.get_mut(&field) {
                    whole.extend(part);
                }
            }
            Some((field, value)) => {
                config.insert(field, value);
            }
            None => {
                return Err(Error::format(
                    &file,
                    &g.gguf,
                    format!(
                        "is generated by {} from config.json, and no config this mapping knows gives these values \
                         back exactly (for Llama 3: factor, low_freq_factor 1, high_freq_factor 4, \
                         original_max_position_embeddings 8192; for Phi-3: factors whose decimals read back as \
                         the same f32); convert from the HF checkpoint instead",
                        g.op.name()
                    ),
                ))
            }
        }
    }
    // Blocks from here on are NextN heads, not written.
    let first_nextn = match m.nextn.as_ref().map(|n| &n.key) {
        None => None,
        Some(key) => {
            let n = get(&key.replace("{arch}", &arch)).and_then(Value::as_u64).unwrap_or(0);
            let blocks = get(&format!("{arch}.block_count")).and_then(Value::as_u64).unwrap_or(0);
            Some(blocks.checked_sub(n).ok_or_else(|| {
                Error::format(&file, key.replace("{arch}", &arch), format!("{n} is more than the {blocks} blocks"))
            })?)
        }
    };
    if let Some(p) = &m.periodic_layers {
        check_periodic(&eval, p, first_nextn)?;
    }
    let mlx = m.mlx.as_ref().filter(|_| target == Target::Mlx);

    let mut tensors = Vec::new();
    let mut has_output = false;
    let (mut quantize_3d, mut quant_overrides) = (Vec::new(), Vec::new());
    for t in model.tensors() {
        let info = t.info;
        if let Some(first) = first_nextn {
            let block = info.name.strip_prefix("blk.").and_then(|r| r.split('.').next()?.parse::<u64>().ok());
            if block.is_some_and(|b| b >= first) {
                continue;
            }
        }
        if generated.iter().any(|g| g.gguf == info.name) {
            continue;
        }
        // Stacked experts go back to HF as the per-expert weights the mapping's `experts` rule stacks, where the
        // mapping says every reader takes that layout (`hf_config.per_expert`); MLX keeps them stacked.
        if target == Target::Hf && hc.per_expert {
            if let Some(template) = m.unstack_expert(&info.name) {
                let source_shape: Vec<u64> = info.dims.iter().rev().copied().collect();
                let [of, rows, cols] = source_shape[..] else {
                    return Err(Error::format(
                        &file,
                        &info.name,
                        format!("shape {source_shape:?} is not (experts, rows, columns)"),
                    ));
                };
                for e in 0..of {
                    tensors.push(HfTensor {
                        expert: Some(ExpertOf { expert: e, of }),
                        ..HfTensor::plain(&template.replace("{e}", &e.to_string()), &info.name, vec![rows, cols], dtype)
                    });
                }
                continue;
            }
        }
        // A part of a fused HF tensor goes back joined with its siblings, under the first part; MLX keeps them
        // apart (mlx-lm's sanitize splits them too).
        if let Some(j) = m.unfuse(&info.name).filter(|_| target == Target::Hf) {
            let bad = |msg: String| Error::format(&file, &info.name, msg);
            if j.index > 0 {
                if !model.tensors().any(|t| t.info.name == j.sources[0]) {
                    return Err(bad(format!(
                        "is part {} of a fused tensor whose part 0, {}, is missing",
                        j.index, j.sources[0]
                    )));
                }
                continue;
            }
            let hf = j.hf.ok_or_else(|| Error::Mapping {
                file: m.file.clone(),
                msg: format!(
                    "the fused rule writing {} has no plain HF name to write it back to (add `back:`)",
                    info.name
                ),
            })?;
            let join = JoinOf { layout: j.parts, sources: j.sources };
            let part_shape: Vec<u64> = info.dims.iter().rev().copied().collect();
            let shape =
                join.shape(&part_shape).ok_or_else(|| bad(format!("shape {part_shape:?} has too few axes to join")))?;
            tensors.push(HfTensor { join: Some(join), ..HfTensor::plain(&hf, &info.name, shape, dtype) });
            continue;
        }
        let u = m.unmap_tensor(&info.name)?;
        let rule = u.rule;
        has_output |= u.hf.as_deref() == Some("lm_head.weight");
        let base = match (target, &u.hf, &u.mlx) {
            (Target::Mlx, _, Some(mlx)) => mlx.clone(),
            (_, Some(hf), _) => hf.clone(),
            (_, None, _) => {
                return Err(Error::format(
                    &file,
                    &info.name,
                    format!("{} maps it to MLX only (the HF checkpoint stores it another way); convert to MLX", m.file),
                ))
            }
        };
        let source_shape: Vec<u64> = info.dims.iter().rev().copied().collect();
        let mut shape = rule.hf_shape.map_or_else(|| source_shape.clone(), |r| r.apply(&source_shape));
        let unpermute_heads = match &rule.permute {
            None => None,
            Some(p) => {
                let heads = config.get(&p.heads).and_then(Json::as_u64).filter(|h| *h > 0).ok_or_else(|| {
                    Error::format(
                        &file,
                        &info.name,
                        format!("config field {} is needed to undo its permutation", p.heads),
                    )
                })?;
                let rows = shape.first().copied().unwrap_or(0);
                if shape.len() != 2 || rows % heads != 0 || (rows / heads) % 2 != 0 {
                    return Err(Error::format(
                        &file,
                        &info.name,
                        format!("shape {shape:?} is not {heads} heads of even size"),
                    ));
                }
                Some(heads)
            }
        };
        let reorder = match &rule.reorder {
            None => None,
            Some(r) => head_order(r, &config, &m, &file, &info.name, &source_shape, Direction::Back)?,
        };
        let mut offset = rule.offset;
        let mut name = base.clone();
        if let Some(mx) = mlx {
            for s in mx.sanitize.iter().filter(|s| s.name.is_match(&base)) {
                if let Some(a) = s.add {
                    // HF takes the offset off, sanitize adds it back: compose them exactly rather than round twice.
                    offset = Some(offset.unwrap_or(0.0) - a).filter(|o| *o != 0.0);
                }
                if let Some([from, to]) = s.moveaxis {
                    let mut moved = shape.clone();
                    if from < moved.len() && to < moved.len() {
                        let d = moved.remove(from);
                        moved.insert(to, d);
                    }
                    let big = |s: &[u64]| s.iter().copied().filter(|d| *d != 1).collect::<Vec<_>>();
                    if from >= shape.len() || to >= shape.len() || big(&moved) != big(&shape) {
                        return Err(Error::Mapping {
                            file: m.file.clone(),
                            msg: format!(
                                "sanitize moveaxis({from}, {to}) of {base} {shape:?} would move data (only size-1 axes may move)"
                            ),
                        });
                    }
                    shape = moved;
                }
            }
            let module = base.strip_suffix(".weight");
            if let Some(module) = module {
                if shape.len() == 3 && mx.quantize_3d.iter().any(|r| r.is_match(module)) {
                    quantize_3d.push(format!("{}{module}", mx.prefix));
                }
                // Only a module that gets quantized at all (2-D, or experts; rows that divide into groups).
                if let Some(o) = mx.quant_override(module, &shape) {
                    quant_overrides.push((format!("{}{module}", mx.prefix), o.bits, o.group_size));
                }
            }
            name = format!("{}{base}", mx.prefix);
        }
        tensors.push(HfTensor {
            name,
            source: info.name.clone(),
            shape,
            dtype: rule.dtype.unwrap_or(dtype),
            unpermute_heads,
            offset,
            reorder,
            values: rule.values,
            part: None,
            expert: None,
            join: None,
        });
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = tensors.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(Error::format(&file, &w[0].source, format!("and {} both map to {}", w[1].source, w[0].name)));
    }

    let mut rebuilt = hf_tokenizer::rebuild(kv, &file)?;
    // The class a mapping's tokenizer reader decides by: Phi3MiniModel.set_vocab reads a byte-level BPE only when
    // tokenizer_config.json names GPT2Tokenizer (Phi-4), else it looks for tokenizer.model.
    let reads_class = m.metadata.iter().any(|e| match &e.source {
        super::mapping::MetaSource::Tokenizer(kinds) => kinds.contains(&super::mapping::TokenizerKind::Phi3),
        _ => false,
    });
    let byte_level = matches!(get("tokenizer.ggml.model"), Some(Value::String(s)) if s.to_string_lossy() == "gpt2");
    if let (true, true, Json::Object(tc)) = (reads_class, byte_level, &mut rebuilt.tokenizer_config) {
        tc.insert("tokenizer_class".into(), "GPT2Tokenizer".into());
    }
    let vocab = match get("tokenizer.ggml.tokens") {
        Some(Value::Array(a)) => Some(a.len() as u64),
        _ => None,
    };
    let embd_rows = tensors.iter().find(|t| t.source == "token_embd.weight").and_then(|t| t.shape.first().copied());
    let mut derived = vec![("tie_word_embeddings", Json::from(!has_output))];
    if let Some(v) = vocab.or(embd_rows) {
        derived.insert(0, ("vocab_size", v.into()));
    }
    for (k, v) in derived {
        config.insert(k.to_string(), v);
    }
    config.insert("torch_dtype".into(), dtype_name(dtype).into());
    if let Some(mx) = mlx {
        config = mlx_config_layout(config, mx);
    }
    let json_files = vec![
        ("tokenizer.json".to_string(), rebuilt.tokenizer_json),
        ("tokenizer_config.json".to_string(), rebuilt.tokenizer_config),
    ];
    let binary_files = rebuilt.sentencepiece.map(|b| ("tokenizer.model".to_string(), b)).into_iter().collect();
    if let Some(mx) = mlx {
        mx.sort_overrides(&mut quant_overrides, &mx.prefix);
    }
    Ok(HfPlan { config, tensors, json_files, binary_files, carried: Vec::new(), quantize_3d, quant_overrides })
}

/// The config.json mlx-lm reads: the HF config nested under `nest_config` (with `model_type` and
/// `tie_word_embeddings` mirrored at the top), mlx-lm's `model_type`.
pub(super) fn mlx_config_layout(config: Map<String, Json>, mx: &super::mapping::MlxSection) -> Map<String, Json> {
    let mut out = match &mx.nest_config {
        None => config,
        Some(key) => {
            let mut top = Map::new();
            for k in ["architectures", "tie_word_embeddings", "torch_dtype"] {
                if let Some(v) = config.get(k) {
                    top.insert(k.to_string(), v.clone());
                }
            }
            top.insert(key.clone(), Json::Object(config));
            top
        }
    };
    if let Some(t) = &mx.model_type {
        out.insert("model_type".into(), t.clone().into());
    }
    out
}

/// The values of GGUF tensor `name`, which must be F32.
async fn read_f32(src: &TensorSource, name: &str) -> Result<Vec<f32>> {
    let e = src.entry(name)?;
    if e.ty != crate::TensorType::Ggml(crate::GgmlType::F32) {
        return Err(Error::format(src.location().to_string(), name, format!("is {}, F32 expected", e.ty)));
    }
    let mut bytes = vec![0u8; e.bytes as usize];
    src.read_range(name, 0, &mut bytes).await?;
    Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

/// Which way a [`super::mapping::Reorder`] is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Direction {
    /// HF (grouped) → GGUF (tiled), as the converter's `_reorder_v_heads` does.
    ToGguf,
    /// GGUF → HF: its inverse.
    Back,
}

/// The head order that a mapping's `reorder` makes along its axis of a tensor of `shape` (numpy order, as read),
/// sizes from `config`; `None` where it is the identity (one group, or one head per group). Going to GGUF the
/// output's head `r·groups + g` is the source's `g·per_group + r`, which is the inverse with groups and
/// per-group counts exchanged.
pub(super) fn head_order(
    r: &super::mapping::Reorder,
    config: &Map<String, Json>,
    m: &Mapping,
    file: &str,
    tensor: &str,
    shape: &[u64],
    direction: Direction,
) -> Result<Option<HeadOrder>> {
    let dim = |d: &Dim| resolve_dim(d, config, m, tensor);
    let (groups, heads, block) = (dim(&r.groups)?, dim(&r.heads)?, dim(&r.block)?);
    let skip = r.skip.as_ref().map(dim).transpose()?.unwrap_or(0);
    let last = shape.len().saturating_sub(1);
    // Going to GGUF a 1-D tensor's elements are the rows of the writer's pieces; going back, one row's values.
    let rows = r.axis == 0 && (last > 0 || direction == Direction::ToGguf);
    if !(r.axis == 0 || r.axis == last) {
        return Err(Error::format(file, tensor, format!("cannot reorder axis {} of {shape:?}", r.axis)));
    }
    let len = shape.get(r.axis).copied().unwrap_or(1);
    if groups == 0 || heads % groups != 0 || skip + heads * block != len {
        return Err(Error::format(
            file,
            tensor,
            format!(
                "axis {} has {len} elements; {skip} + {heads} heads of {block} in {groups} groups expected",
                r.axis
            ),
        ));
    }
    let (groups, per_group) = match direction {
        Direction::Back => (groups, heads / groups),
        Direction::ToGguf => (heads / groups, groups),
    };
    Ok(Some(HeadOrder { rows, skip, groups, per_group, block }).filter(|o| o.groups > 1 && o.per_group > 1))
}

fn resolve_dim(d: &Dim, config: &Map<String, Json>, m: &Mapping, tensor: &str) -> Result<u64> {
    match d {
        Dim::Number(n) => Ok(*n),
        Dim::Field(f) => config.get(f).and_then(Json::as_u64).ok_or_else(|| Error::Mapping {
            file: m.file.clone(),
            msg: format!("{tensor}: config field {f} (a size of its reorder) is not in config.json"),
        }),
        Dim::Product(ds) => ds.iter().try_fold(1u64, |acc, d| Ok(acc * resolve_dim(d, config, m, tensor)?)),
    }
}

/// Refuses a layer pattern config.json cannot say (see [`super::mapping::PeriodicLayers`]); the NextN blocks from
/// `first_nextn` on are not layers of the model.
fn check_periodic(eval: &Eval, p: &super::mapping::PeriodicLayers, first_nextn: Option<u64>) -> Result<()> {
    let flags = match eval.get(&p.recurrent) {
        None => return Ok(()),
        Some(Value::Array(a)) => match a.to_json() {
            Json::Array(items) => items,
            _ => Vec::new(),
        },
        Some(_) => return Err(Error::format(eval.file, p.recurrent.replace("{arch}", eval.arch), "is not an array")),
    };
    let interval = eval.scalar(&p.interval)?.and_then(|j| j.as_u64()).filter(|i| *i > 0).ok_or_else(|| {
        Error::format(eval.file, p.interval.replace("{arch}", eval.arch), "missing: the layer pattern needs it")
    })?;
    let layers = first_nextn.map_or(flags.len(), |n| n as usize).min(flags.len());
    for (i, flag) in flags.iter().take(layers).enumerate() {
        let want = !(i as u64 + 1).is_multiple_of(interval);
        if flag.as_bool() != Some(want) {
            return Err(Error::format(
                eval.file,
                p.recurrent.replace("{arch}", eval.arch),
                format!(
                    "layer {i} is {} but a full-attention layer every {interval} makes it {}; config.json (and \
                     mlx-lm) can only say a period",
                    if flag.as_bool() == Some(true) { "recurrent" } else { "full attention" },
                    if want { "recurrent" } else { "full attention" }
                ),
            ));
        }
    }
    Ok(())
}

/// Evaluates `hf_config` expressions over a GGUF's keys.
struct Eval<'a> {
    file: &'a str,
    arch: &'a str,
    kv: &'a [(String, Value)],
}

impl Eval<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        let key = key.replace("{arch}", self.arch);
        self.kv.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// A scalar key as JSON; a per-layer array gives its single nonzero value.
    fn scalar(&self, key: &str) -> Result<Option<Json>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        if let Value::Array(a) = v {
            let items = match a.to_json() {
                Json::Array(items) => items,
                _ => Vec::new(),
            };
            let mut nonzero: Vec<u64> = items.iter().filter_map(Json::as_u64).filter(|x| *x != 0).collect();
            nonzero.sort_unstable();
            nonzero.dedup();
            return match nonzero.as_slice() {
                [one] => Ok(Some(Json::from(*one))),
                _ => Err(Error::format(
                    self.file,
                    key.replace("{arch}", self.arch),
                    "a per-layer array with other than one nonzero value",
                )),
            };
        }
        Ok(value_json(v))
    }

    fn number(&self, key: &str) -> Result<Option<f64>> {
        Ok(self.scalar(key)?.and_then(|j| j.as_f64()))
    }

    fn expr(&self, e: &ConfigExpr) -> Result<Option<Json>> {
        let op = match e {
            ConfigExpr::Key(k) => return self.scalar(k),
            ConfigExpr::Op(op) => op,
        };
        Ok(match op {
            ConfigOp::Value(v) => Some(v.clone()),
            ConfigOp::Sub([a, b]) => match self.number(a)? {
                None => None,
                Some(x) => Some(Json::from((x - self.number(b)?.unwrap_or(0.0)) as u64)),
            },
            ConfigOp::Div([a, b]) | ConfigOp::Ratio([a, b]) => match (self.number(a)?, self.number(b)?) {
                (Some(x), Some(y)) if y != 0.0 => {
                    if matches!(op, ConfigOp::Ratio(_)) {
                        serde_json::Number::from_f64(x / y).map(Json::Number)
                    } else if x % y == 0.0 {
                        Some(Json::from((x / y) as u64))
                    } else {
                        return Err(Error::format(
                            self.file,
                            a.replace("{arch}", self.arch),
                            format!("{x} is not a multiple of {b} = {y}"),
                        ));
                    }
                }
                _ => None,
            },
            ConfigOp::ScaledRatio([a, b, c]) => match (self.number(a)?, self.number(b)?, self.number(c)?) {
                (Some(x), Some(y), Some(z)) if z != 0.0 => serde_json::Number::from_f64(x * y / z).map(Json::Number),
                _ => None,
            },
            ConfigOp::First { n, key } => match self.get(key) {
                Some(Value::Array(a)) => match a.to_json() {
                    Json::Array(items) => Some(Json::Array(items.into_iter().take(*n).collect())),
                    _ => None,
                },
                _ => None,
            },
            // An object none of whose keys is present is absent (an unscaled model has no rope_scaling).
            ConfigOp::Object(fields) => {
                let mut obj = Map::new();
                self.object(fields, &[], &mut obj)?;
                (!obj.is_empty()).then_some(Json::Object(obj))
            }
            ConfigOp::If { key, equals, then, otherwise } => {
                let chosen = if self.scalar(key)?.as_ref() == Some(equals) { then } else { otherwise };
                self.expr(chosen)?
            }
        })
    }

    fn object(
        &self,
        fields: &indexmap::IndexMap<String, ConfigExpr>,
        required: &[String],
        out: &mut Map<String, Json>,
    ) -> Result<()> {
        for (name, e) in fields {
            match self.expr(e)? {
                Some(v) => {
                    out.insert(name.clone(), v);
                }
                None if required.iter().any(|r| r == name) => {
                    return Err(Error::format(
                        self.file,
                        name,
                        "missing: config.json needs it (its GGUF key is absent)",
                    ))
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// The wrapper prefixes an MLX checkpoint of a multimodal model puts before the text model's names.
const WRAPPER_PREFIXES: [&str; 1] = ["language_model."];

/// Plans the conversion of the MLX checkpoint `src` (quantized or not) to an HF checkpoint: each affine triple
/// becomes one weight of the scales' dtype, dequantized as `mx.dequantize` computes it (what `mlx_lm.convert
/// --dequantize` writes); other tensors keep their dtype; a wrapper prefix (`language_model.`) is stripped;
/// config.json loses its `quantization` blocks; the tokenizer and generation files are carried as they are.
pub fn plan_mlx_to_hf(src: &TensorSource) -> Result<HfPlan> {
    let file = src.location().to_string();
    let mlx = src.mlx().ok_or_else(|| Error::format(&file, "format", "is not an MLX checkpoint"))?;
    let mut tensors = Vec::new();
    for t in &mlx.tensors {
        let dtype = match t.ty {
            crate::dtype::TensorType::MlxAffine { scale_dtype, .. } => scale_dtype,
            // `mx.dequantize` of uint8 scales defaults to bfloat16, which holds every such value exactly.
            crate::dtype::TensorType::MlxFp { .. } => Dtype::BF16,
            crate::dtype::TensorType::Dtype(d) => d,
            crate::dtype::TensorType::Ggml(g) => {
                return Err(Error::format(&file, &t.name, format!("a {g} tensor in an MLX checkpoint")))
            }
        };
        let name = WRAPPER_PREFIXES.iter().find_map(|p| t.name.strip_prefix(p)).unwrap_or(&t.name);
        tensors.push(HfTensor::plain(name, &t.name, t.shape.clone(), dtype));
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = tensors.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(Error::format(&file, &w[0].source, format!("and {} both become {}", w[1].source, w[0].name)));
    }
    let mut config = mlx.config.clone();
    config.remove("quantization");
    config.remove("quantization_config");
    Ok(HfPlan {
        config,
        tensors,
        json_files: Vec::new(),
        binary_files: Vec::new(),
        carried: crate::mlx::CARRIED_FILES.map(String::from).to_vec(),
        quantize_3d: Vec::new(),
        quant_overrides: Vec::new(),
    })
}

fn dtype_name(d: Dtype) -> &'static str {
    match d {
        Dtype::BF16 => "bfloat16",
        Dtype::F16 => "float16",
        _ => "float32",
    }
}

/// The source row of output row `s` of an unpermuted tensor: the inverse of [`super::transform::permuted_source_row`].
pub fn unpermuted_source_row(s: u64, hd: u64) -> u64 {
    let (h, k) = (s / hd, s % hd);
    let (j, i) = (k / (hd / 2), k % (hd / 2));
    h * hd + 2 * i + j
}

/// Converts the GGUF model at `src` into an HF checkpoint folder `dst_dir`: `model.safetensors` (or shards with an
/// index), config.json, tokenizer.json, tokenizer_config.json. Staged, committed together at the end.
pub async fn convert_gguf_to_hf(
    src: &Location,
    dst_dir: &Location,
    dtype: Dtype,
    budget: u64,
    overwrite: bool,
) -> Result<Vec<Committed>> {
    let source = TensorSource::open(src).await?;
    let plan = plan_gguf_to_hf(&source, dtype).await?;
    write_hf(&source, &plan, dst_dir, budget, overwrite).await
}

/// Writes a planned conversion.
pub async fn write_hf(
    source: &TensorSource,
    plan: &HfPlan,
    dst_dir: &Location,
    budget: u64,
    overwrite: bool,
) -> Result<Vec<Committed>> {
    let descs: Vec<StTensorDesc> = plan
        .tensors
        .iter()
        .map(|t| StTensorDesc { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone() })
        .collect();
    let shards = plan_shards(&descs, MAX_SHARD_BYTES);
    let metadata = [("format".to_string(), "pt".to_string())];
    let mut writers = Vec::with_capacity(shards.len());
    for (i, range) in shards.iter().enumerate() {
        let target = dst_dir.child(&shard_file_name(i, shards.len()))?;
        let mut w = SafetensorsWriter::create(&target, &descs[range.clone()], &metadata, overwrite).await?;
        // The shard's pieces are read ahead while each is converted here and written behind by the sink.
        let cuts: Vec<HfCut> =
            plan.tensors[range.clone()].iter().map(|t| HfCut::new(source, t, budget, 0)).collect::<Result<_>>()?;
        let mut reads = Reads::default();
        for cut in &cuts {
            for p in cut.pieces() {
                reads.push(&cut.spans(source, p)?, cut.work(p));
            }
        }
        let mut reads = reads.start(budget);
        let mut bufs = HfBufs::default();
        for cut in &cuts {
            for p in cut.pieces() {
                let raw = reads.next().await?;
                w.write_piece(cut.convert(source, p, raw, &mut bufs)?).await?;
            }
        }
        writers.push(w);
    }
    let mut small = Vec::new();
    let config = ("config.json".to_string(), Json::Object(plan.config.clone()));
    for (name, value) in std::iter::once(&config).chain(&plan.json_files) {
        let mut text = serde_json::to_string_pretty(value).expect("JSON serializes");
        text.push('\n');
        let mut sink = StagedSink::create(&dst_dir.child(name)?, overwrite).await?;
        sink.write(text.as_bytes()).await?;
        small.push(sink);
    }
    for (name, bytes) in &plan.binary_files {
        let mut sink = StagedSink::create(&dst_dir.child(name)?, overwrite).await?;
        sink.write(bytes).await?;
        small.push(sink);
    }
    let present = if plan.carried.is_empty() { Vec::new() } else { source.location().list().await? };
    for name in plan.carried.iter().filter(|n| present.contains(n)) {
        let blob = quantfarm_store::Blob::open(&source.location().child(name)?).await?;
        let bytes = blob.read_vec(0, blob.len()).await?;
        let mut sink = StagedSink::create(&dst_dir.child(name)?, overwrite).await?;
        sink.write(&bytes).await?;
        small.push(sink);
    }
    let mut out = Vec::new();
    for w in writers {
        out.push(w.finish().await?);
    }
    for s in small {
        out.push(s.commit().await?);
    }
    if shards.len() > 1 {
        out.push(write_index(dst_dir, &descs, &shards, overwrite).await?);
    }
    Ok(out)
}

/// One tensor alone (to a comparison when verifying), whole rows at a time within `budget`, each piece read when
/// it is needed: dequantized, unpermuted and un-reordered, its value function and offset undone, rounded to the
/// dtype ([`HfCut`]).
pub async fn write_hf_tensor(src: &TensorSource, t: &HfTensor, budget: u64, w: &mut impl PieceWriter) -> Result<()> {
    let cut = HfCut::new(src, t, budget, 0)?;
    let (mut raw, mut bufs) = (Vec::new(), HfBufs::default());
    for p in cut.pieces() {
        read_spans(&cut.spans(src, p)?, &mut raw).await?;
        w.write_piece(cut.convert(src, p, &raw, &mut bufs)?).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::transform::permuted_source_row;
    use super::*;

    #[test]
    fn unpermute_inverts_permute() {
        for hd in [2u64, 4, 6, 64] {
            for r in 0..3 * hd {
                assert_eq!(unpermuted_source_row(permuted_source_row(r, hd), hd), r);
                assert_eq!(permuted_source_row(unpermuted_source_row(r, hd), hd), r);
            }
        }
    }

    #[test]
    fn head_order_inverts_the_converters_reorder() {
        // convert_hf_to_gguf's forward reorder: GGUF head r·groups + g holds HF head g·per_group + r
        // (`concat(hf_heads[r::per_group] for r in range(per_group))`).
        let (groups, per_group, block, skip) = (3u64, 2u64, 4u64, 5u64);
        let o = HeadOrder { rows: true, skip, groups, per_group, block };
        let mut gguf_of_hf = vec![0u64; (skip + groups * per_group * block) as usize];
        for i in 0..skip {
            gguf_of_hf[i as usize] = i;
        }
        for g in 0..groups {
            for r in 0..per_group {
                for d in 0..block {
                    gguf_of_hf[(skip + (g * per_group + r) * block + d) as usize] = skip + (r * groups + g) * block + d;
                }
            }
        }
        for (hf, gguf) in gguf_of_hf.iter().enumerate() {
            assert_eq!(o.source(hf as u64), *gguf, "HF index {hf}");
        }
    }

    #[test]
    fn per_layer_head_counts_give_their_one_value() {
        use crate::gguf::value::Array;
        let kv = vec![
            ("a.heads".to_string(), Value::Array(Array::U32(vec![0, 0, 0, 16, 0, 0, 0, 16]))),
            ("a.bad".to_string(), Value::Array(Array::U32(vec![0, 8, 16]))),
        ];
        let e = Eval { file: "x.gguf", arch: "a", kv: &kv };
        assert_eq!(e.scalar("{arch}.heads").unwrap(), Some(Json::from(16)));
        assert!(e.scalar("{arch}.bad").unwrap_err().to_string().contains("one nonzero value"));
        assert_eq!(e.scalar("{arch}.absent").unwrap(), None);
    }

    #[test]
    fn only_periodic_layer_patterns_convert() {
        use crate::convert::mapping::PeriodicLayers;
        use crate::gguf::value::Array;
        let p = PeriodicLayers { recurrent: "{arch}.rec".into(), interval: "{arch}.every".into() };
        let kv = |flags: Vec<bool>| {
            vec![("a.rec".to_string(), Value::Array(Array::Bool(flags))), ("a.every".to_string(), Value::U32(2))]
        };
        // The fifth flag is a NextN block's (false), not a layer.
        let good = kv(vec![true, false, true, false, false]);
        check_periodic(&Eval { file: "x.gguf", arch: "a", kv: &good }, &p, Some(4)).unwrap();
        let bad = kv(vec![true, true, true, false]);
        let e = check_periodic(&Eval { file: "x.gguf", arch: "a", kv: &bad }, &p, None).unwrap_err().to_string();
        assert!(e.contains("a.rec") && e.contains("layer 1 is recurrent"), "{e}");
    }

    #[test]
    fn f32_metadata_reads_back_short() {
        // The f64 is the decimal's, not the f32's widening (9.999999747378752e-06).
        assert_eq!(value_json(&Value::F32(1e-5)).unwrap().as_f64(), Some(1e-5));
        assert_eq!(value_json(&Value::F32(100000.0)).unwrap().as_f64(), Some(100000.0));
        assert_eq!(value_json(&Value::U32(7)).unwrap(), Json::from(7));
    }
}
