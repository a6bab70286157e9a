//! Which tensors an MLX checkpoint made from an HF (or unquantized MLX) checkpoint holds, as `mlx_lm.convert`
//! (mlx-lm 0.32.2) loads the checkpoint into its model before quantizing: the architecture's mapping
//! (`mappings/*.yaml`, found by config.json's `architectures`) says what the model's `sanitize` does, in its `mlx`
//! section, so no family is special-cased here.
//!
//! - vision and audio towers (the mapping's `multimodal`) are left out, as mlx-lm's text wrappers pop them;
//! - `self_attn.rotary_emb.inv_freq` is dropped, and `lm_head.weight` when the embeddings are tied
//!   (`mlx_lm/models/llama.py::sanitize` and its siblings);
//! - per-expert weights (the mapping's `experts`) are stacked into one 3-D tensor per block and weight, experts in
//!   order (`mlx_lm/models/qwen3_moe.py::sanitize`, `mx.stack`), named by `mlx.stack_experts`;
//! - a `…ForConditionalGeneration` checkpoint (config.json nests `text_config`) keeps its text model under
//!   `mlx.wrapper_prefix` (`mlx_lm/models/gemma3.py`: `language_model.`), whatever prefix the checkpoint's
//!   transformers version wrote;
//! - `mlx.quantize_3d` and `mlx.quant_overrides` say how the model's `quant_predicate` quantizes modules.
//!
//! - fused tensors the model's `sanitize` splits (`mlx.split`: gpt-oss's experts and their biases, interleaved,
//!   and transposed into `SwitchLinear`'s `(experts, out, in)`; Qwen3.5-MoE's `gate_up_proj` halves) become its
//!   own parameters, each part read from the fused source as it streams;
//! - the model's `sanitize` (`mlx.sanitize`), for a checkpoint that needs it (one with a tensor a `moveaxis` rule
//!   moves: mlx-lm's Qwen3.5 tells an HF checkpoint by its conv1d layout): size-1 axes moved (the bytes stay), and
//!   1-D tensors offset (`add`: Qwen3.5's RMSNorm weights, `v + 1.0` in their own dtype); the multi-token-prediction
//!   head (the mapping's `nextn`) dropped; `mlx.keep_dtype` tensors not cast (the model's `cast_predicate`); the
//!   config laid out as mlx-lm reads it (`mlx.nest_config`, `mlx.model_type`).
//!
//! A layout the model cannot load (`mlx.unsupported`) is refused by name rather than converted to something mlx-lm
//! would not make.

use std::collections::BTreeMap;

use serde_json::{Map, Value as Json};

use super::mapping::{mapping_for, FusedParts, Mapped, Mapping};
use super::to_hf::PartOf;
use crate::dtype::{Dtype, TensorType};
use crate::error::{Error, Result};
use crate::source::TensorSource;

/// One tensor of the MLX checkpoint before quantization.
#[derive(Clone, Debug, PartialEq)]
pub struct MlxTensor {
    /// mlx-lm's name (the wrapper prefix included).
    pub name: String,
    /// The source tensors it is read from, in order: one, or a block's experts stacked along a new first axis.
    pub sources: Vec<String>,
    /// The stored dtype of the sources (all the same).
    pub stored: TensorType,
    pub shape: Vec<u64>,
    /// Added to every value in f32, rounded to the stored dtype (mlx-lm's sanitize `v + 1.0`).
    pub add: Option<f32>,
    /// Kept in its stored dtype when the rest is cast (the model's `cast_predicate`).
    pub keep_dtype: bool,
    /// A part of its one (fused) source, as the model's `sanitize` splits it (`mlx.split`).
    pub part: Option<PartOf>,
}

/// What `mlx_lm.convert` makes of an HF checkpoint's tensors.
#[derive(Debug)]
pub struct HfToMlxPlan {
    /// Sorted by name.
    pub tensors: Vec<MlxTensor>,
    /// Modules (full paths) whose 3-D weights are quantized.
    pub quantize_3d: Vec<String>,
    /// Modules (full paths) quantized with their own `(bits, group_size)`.
    pub quant_overrides: Vec<(String, u32, usize)>,
    /// Tensors of vision or audio towers left out.
    pub multimodal: Vec<String>,
    /// config.json as mlx-lm reads it, where that is not the source's (`mlx.nest_config`, `mlx.model_type`).
    pub config: Option<Map<String, Json>>,
}

/// `config[key]`, else `config.text_config[key]`.
fn config_field<'a>(config: &'a Map<String, Json>, key: &str) -> Option<&'a Json> {
    config.get(key).or_else(|| config.get("text_config")?.get(key))
}

/// Plans the MLX checkpoint of the HF (or unquantized MLX) checkpoint `src`.
pub fn plan_hf_to_mlx(src: &TensorSource) -> Result<HfToMlxPlan> {
    let file = src.location().to_string();
    let config = src.metadata();
    let arch = config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Json::as_str)
        .ok_or_else(|| Error::format(&file, "config.json: architectures", "missing; it names the model class"))?;
    let mapping = mapping_for(arch)?;
    plan_with(src, &mapping, &config)
}

fn plan_with(src: &TensorSource, mapping: &Mapping, config: &Map<String, Json>) -> Result<HfToMlxPlan> {
    let file = src.location().to_string();
    let refuse = |msg: String| Error::Mapping { file: mapping.file.clone(), msg };
    let no_section = super::mapping::MlxSection::default();
    let mx = mapping.mlx.as_ref().unwrap_or(&no_section);
    let tied = config_field(config, "tie_word_embeddings").and_then(Json::as_bool).unwrap_or(false);
    let prefix = match (&mx.wrapper_prefix, config.get("text_config")) {
        _ if !mx.prefix.is_empty() => mx.prefix.as_str(),
        (Some(p), Some(_)) => p.as_str(),
        _ => "",
    };
    // mlx-lm's sanitize applies to a checkpoint that still has the HF layout: one a `moveaxis` rule changes.
    let moved = |text: &str, shape: &[u64]| -> Result<Option<Vec<u64>>> {
        let Some([from, to]) = mx.sanitize.iter().find(|r| r.name.is_match(text)).and_then(|r| r.moveaxis) else {
            return Ok(None);
        };
        if from >= shape.len() || to >= shape.len() {
            return Err(refuse(format!("tensor {text:?} of shape {shape:?} has no axes {from} and {to} to move")));
        }
        let mut out = shape.to_vec();
        let axis = out.remove(from);
        out.insert(to, axis);
        let sized = |s: &[u64]| s.iter().copied().filter(|d| *d != 1).collect::<Vec<_>>();
        if sized(&out) != sized(shape) {
            return Err(refuse(format!("tensor {text:?}: moving axis {from} of {shape:?} to {to} moves its values")));
        }
        Ok((out != shape).then_some(out))
    };
    let mut unsanitized = false;
    for e in src.tensors() {
        if let Some(text) = mapping.text_name(&e.name) {
            unsanitized |= moved(&text, &e.shape)?.is_some();
        }
    }

    let mut tensors = Vec::new();
    let mut multimodal = Vec::new();
    // (block, weight) → expert → source tensor, for the experts `stack_experts` joins.
    let mut experts: BTreeMap<(String, String), BTreeMap<u64, String>> = BTreeMap::new();
    let mut expert_rule = None;
    for e in src.tensors() {
        let Some(text) = mapping.text_name(&e.name) else {
            multimodal.push(e.name.clone());
            continue;
        };
        if let Some(u) = mx.unsupported.iter().find(|u| u.name.is_match(&text)) {
            return Err(Error::format(&file, format!("tensor {:?}", e.name), u.why.clone()));
        }
        if text.contains("self_attn.rotary_emb.inv_freq") || tied && text == "lm_head.weight" {
            continue;
        }
        // The multi-token-prediction head: mlx-lm's text models have none (Qwen3.5's sanitize drops `mtp.`).
        if let Some(n) = &mapping.nextn {
            if n.rename(&text, 0) != super::mapping::NextnName::Model {
                continue;
            }
        }
        // A fused tensor the model's sanitize splits into its own parameters (or renames).
        if let Some((rule, names)) = mx.split.iter().find_map(|r| Some((r, r.names(&text)?))) {
            let of = names.len() as u64;
            for (k, name) in names.into_iter().enumerate() {
                let part = (of > 1 || rule.parts != FusedParts::Halves).then_some(PartOf {
                    layout: rule.parts,
                    of,
                    part: k as u64,
                });
                let shape = match part {
                    None => e.shape.clone(),
                    Some(p) => p.shape(&e.shape).ok_or_else(|| {
                        Error::format(
                            &file,
                            format!("tensor {:?}", e.name),
                            format!("shape {:?} does not divide into {of} parts laid out as {:?}", e.shape, p.layout),
                        )
                    })?,
                };
                tensors.push(MlxTensor {
                    name: format!("{prefix}{name}"),
                    sources: vec![e.name.clone()],
                    stored: e.ty,
                    shape,
                    add: None,
                    keep_dtype: mx.keep_dtype.iter().any(|r| r.is_match(&name)),
                    part,
                });
            }
            continue;
        }
        // Only the per-expert weights are looked up in the mapping's rules; others keep their names.
        if let Ok(Mapped::Expert { rule, block, expert, weight }) = mapping.map_tensor(&e.name) {
            if mx.stack_experts.is_none() {
                return Err(refuse(format!("tensor {:?}: per-expert weights and no mlx.stack_experts", e.name)));
            }
            expert_rule = Some(rule);
            experts.entry((block, weight)).or_default().insert(expert, e.name.clone());
            continue;
        }
        let add = match mx.sanitize.iter().find(|r| r.name.is_match(&text)).and_then(|r| r.add) {
            Some(a) if unsanitized && e.shape.len() == 1 => Some(a),
            _ => None,
        };
        tensors.push(MlxTensor {
            name: format!("{prefix}{text}"),
            sources: vec![e.name.clone()],
            stored: e.ty,
            shape: if unsanitized {
                moved(&text, &e.shape)?.unwrap_or_else(|| e.shape.clone())
            } else {
                e.shape.clone()
            },
            add,
            keep_dtype: mx.keep_dtype.iter().any(|r| r.is_match(&text)),
            part: None,
        });
    }
    if let (Some(rule), Some(template)) = (expert_rule, &mx.stack_experts) {
        let r = &mapping.experts[rule];
        let count = r
            .count
            .iter()
            .find_map(|k| config_field(config, k).and_then(Json::as_u64))
            .ok_or_else(|| Error::format(&file, format!("config.json: {}", r.count.join(" or ")), "missing"))?;
        for ((block, weight), by_expert) in experts {
            let name = format!("{prefix}{}", template.replace("{b}", &block).replace("{w}", &weight));
            if by_expert.len() as u64 != count || by_expert.keys().next_back() != Some(&(count - 1)) {
                let missing: Vec<u64> = (0..count).filter(|i| !by_expert.contains_key(i)).take(4).collect();
                return Err(Error::format(
                    &file,
                    format!("block {block} {weight}"),
                    format!("{} expert weights for {count} experts (missing experts {missing:?})", by_expert.len()),
                ));
            }
            let sources: Vec<String> = by_expert.into_values().collect();
            let first = src.entry(&sources[0])?;
            for s in &sources[1..] {
                let other = src.entry(s)?;
                if (other.ty, &other.shape) != (first.ty, &first.shape) {
                    return Err(Error::format(
                        &file,
                        format!("tensor {s:?}"),
                        format!(
                            "{} {:?}; its block's experts are {} {:?}",
                            other.ty, other.shape, first.ty, first.shape
                        ),
                    ));
                }
            }
            let shape = [count].into_iter().chain(first.shape.iter().copied()).collect();
            tensors.push(MlxTensor {
                name,
                stored: first.ty,
                shape,
                sources,
                add: None,
                keep_dtype: false,
                part: None,
            });
        }
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));

    let (mut quantize_3d, mut quant_overrides) = (Vec::new(), Vec::new());
    for t in &tensors {
        let Some(module) = t.name.strip_suffix(".weight") else { continue };
        let local = &module[prefix.len()..];
        if t.shape.len() == 3 && mx.quantize_3d.iter().any(|r| r.is_match(local)) {
            quantize_3d.push(module.to_string());
        }
        if let Some(o) = mx.quant_override(local, &t.shape) {
            quant_overrides.push((module.to_string(), o.bits, o.group_size));
        }
    }
    mx.sort_overrides(&mut quant_overrides, prefix);
    if let Some(first) = multimodal.first() {
        tracing::warn!(
            file = %file,
            tensors = multimodal.len(),
            first = %first,
            "the vision/audio towers are left out: the MLX checkpoint holds the text model, as mlx_lm.convert writes it"
        );
    }
    // The config as mlx-lm reads it: a flat text config nested as its wrapper model wants (a checkpoint that
    // nests it already keeps its own).
    let laid_out = match &mx.nest_config {
        Some(key) if !config.contains_key(key.as_str()) => Some(super::to_hf::mlx_config_layout(config.clone(), mx)),
        _ => None,
    };
    Ok(HfToMlxPlan { tensors, quantize_3d, quant_overrides, multimodal, config: laid_out })
}

/// The dtype `mlx_lm.convert` casts floating tensors to: `torch_dtype`, else `text_config.dtype` (transformers 5's
/// name), when it is one mlx-lm converts to; `None` keeps each tensor's own.
pub fn mlx_cast_dtype(config: &Map<String, Json>) -> Option<Dtype> {
    let named = match config.get("torch_dtype") {
        Some(d) if !d.is_null() => d.as_str(),
        _ => config.get("text_config").and_then(|t| t.get("dtype")).and_then(Json::as_str),
    };
    match named? {
        "bfloat16" => Some(Dtype::BF16),
        "float16" => Some(Dtype::F16),
        "float32" => Some(Dtype::F32),
        _ => None,
    }
}
