//! MLX (mlx-lm) checkpoints: `config.json` with its `quantization` block (global `group_size`/`bits`/`mode` plus
//! per-module overrides), and safetensors shards in which a quantized module `P` is stored as `P.weight` (uint32
//! codes), `P.scales` and `P.biases`. Each such triple is one logical tensor `P.weight` of the unpacked shape
//! (mlx-lm 0.32.2 `mlx_lm/utils.py`: `quantize_model`, `save_model`, `load_model`; mlx
//! `python/mlx/nn/layers/quantized.py::QuantizedLinear`; packing: `docs/formats.md` §2).

use serde_json::{Map, Value as Json};

use crate::dtype::{Dtype, TensorType};
use crate::error::{Error, Result};
use crate::safetensors::{SafetensorsModel, StTensor};
use quantfarm_store::Blob;
use quantfarm_store::Location;

/// How one module is quantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AffineParams {
    pub bits: u8,
    pub group_size: u32,
}

/// The `quantization` block of an MLX `config.json`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuantConfig {
    pub global: Option<AffineParams>,
    /// Module path → its parameters, or `None` where the override says the module is not quantized (`false`).
    pub overrides: Vec<(String, Option<AffineParams>)>,
}

fn params(obj: &Map<String, Json>, field: &str, file: &str) -> Result<AffineParams> {
    if let Some(mode) = obj.get("mode") {
        if mode.as_str() != Some("affine") {
            return Err(Error::format(
                file,
                format!("{field}.mode"),
                format!("{mode} is not supported (only \"affine\")"),
            ));
        }
    }
    let get = |k: &str| obj.get(k).and_then(Json::as_u64);
    let bits = get("bits").ok_or_else(|| Error::format(file, format!("{field}.bits"), "missing or not an integer"))?;
    let group = get("group_size")
        .ok_or_else(|| Error::format(file, format!("{field}.group_size"), "missing or not an integer"))?;
    if !matches!(bits, 2 | 3 | 4 | 5 | 6 | 8) {
        return Err(Error::format(
            file,
            format!("{field}.bits"),
            format!("{bits} (MLX affine takes 2, 3, 4, 5, 6 or 8)"),
        ));
    }
    if !matches!(group, 32 | 64 | 128) {
        return Err(Error::format(
            file,
            format!("{field}.group_size"),
            format!("{group} (MLX affine takes 32, 64 or 128)"),
        ));
    }
    Ok(AffineParams { bits: bits as u8, group_size: group as u32 })
}

impl QuantConfig {
    /// Reads `config["quantization"]` (or `quantization_config`, which mlx-lm writes as a copy).
    pub fn from_config(config: &Map<String, Json>, file: &str) -> Result<Option<QuantConfig>> {
        let Some(q) = config.get("quantization").or_else(|| config.get("quantization_config")) else {
            return Ok(None);
        };
        let q = q.as_object().ok_or_else(|| Error::format(file, "quantization", "is not an object"))?;
        let mut out = QuantConfig::default();
        if q.contains_key("bits") || q.contains_key("group_size") {
            out.global = Some(params(q, "quantization", file)?);
        }
        for (k, v) in q {
            match v {
                Json::Object(o) => {
                    out.overrides.push((k.clone(), Some(params(o, &format!("quantization.{k}"), file)?)))
                }
                Json::Bool(false) => out.overrides.push((k.clone(), None)),
                _ if matches!(k.as_str(), "bits" | "group_size" | "mode") => {}
                _ => return Err(Error::format(file, format!("quantization.{k}"), format!("unexpected value {v}"))),
            }
        }
        Ok(Some(out))
    }

    /// The parameters for module `path`: its override if any, else the global ones.
    pub fn for_module(&self, path: &str) -> Option<AffineParams> {
        match self.overrides.iter().find(|(k, _)| k == path) {
            Some((_, p)) => *p,
            None => self.global,
        }
    }
}

/// Where a logical tensor's bytes are: one stored tensor, or an affine triple.
#[derive(Clone, Debug)]
pub enum MlxParts {
    Plain { file: usize, tensor: StTensor },
    Affine { params: AffineParams, weight: (usize, StTensor), scales: (usize, StTensor), biases: (usize, StTensor) },
}

#[derive(Clone, Debug)]
pub struct MlxTensor {
    pub name: String,
    /// The logical (unpacked) shape, outermost first.
    pub shape: Vec<u64>,
    pub ty: TensorType,
    pub parts: MlxParts,
}

impl MlxTensor {
    /// Stored bytes (codes + scales + biases for a quantized weight).
    pub fn nbytes(&self) -> u64 {
        match &self.parts {
            MlxParts::Plain { tensor, .. } => tensor.nbytes(),
            MlxParts::Affine { weight, scales, biases, .. } => {
                weight.1.nbytes() + scales.1.nbytes() + biases.1.nbytes()
            }
        }
    }
}

pub struct MlxModel {
    pub config: Map<String, Json>,
    pub quant: Option<QuantConfig>,
    pub files: SafetensorsModel,
    pub tensors: Vec<MlxTensor>,
}

/// Files beside the weights that `mlx_lm.convert` carries over (the tokenizer's, `generation_config.json`).
pub const CARRIED_FILES: [&str; 10] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
];

pub const CONFIG_FILE: &str = "config.json";

/// Whether a folder holds an MLX checkpoint rather than a plain Hugging Face one: its config has a
/// `quantization` block, or its weights say `format: mlx`.
pub fn is_mlx(config: &Map<String, Json>, files: &SafetensorsModel) -> bool {
    config.contains_key("quantization")
        || files.files.iter().any(|(_, h)| h.metadata.iter().any(|(k, v)| k == "format" && v == "mlx"))
}

pub async fn read_config(dir: &Location) -> Result<Map<String, Json>> {
    let blob = Blob::open(&dir.child(CONFIG_FILE)?).await?;
    let bytes = blob.read_vec(0, blob.len()).await?;
    match serde_json::from_slice::<Json>(&bytes) {
        Ok(Json::Object(m)) => Ok(m),
        Ok(_) => Err(Error::format(blob.name(), "config", "is not a JSON object")),
        Err(e) => Err(Error::format(blob.name(), "config", format!("not JSON: {e}"))),
    }
}

impl MlxModel {
    pub async fn open(dir: &Location) -> Result<MlxModel> {
        let config = read_config(dir).await?;
        let files = SafetensorsModel::open(dir, Some("model")).await?;
        Self::from_parts(config, files, &format!("{dir}/{CONFIG_FILE}"))
    }

    pub fn from_parts(config: Map<String, Json>, files: SafetensorsModel, config_name: &str) -> Result<MlxModel> {
        let quant = QuantConfig::from_config(&config, config_name)?;
        let mut tensors = Vec::new();
        let all: Vec<(usize, &StTensor)> = files.tensors().collect();
        let find = |n: &str| all.iter().find(|(_, t)| t.name == n).map(|(i, t)| (*i, (*t).clone()));
        for (file, t) in &all {
            let fname = files.files[*file].0.name();
            if let Some(module) = t.name.strip_suffix(".scales").or_else(|| t.name.strip_suffix(".biases")) {
                if find(&format!("{module}.weight")).is_none() {
                    return Err(Error::format(fname, &t.name, format!("has no {module}.weight beside it")));
                }
                continue;
            }
            let module = t.name.strip_suffix(".weight");
            let scales = module.and_then(|m| find(&format!("{m}.scales")));
            let (Some(module), Some(scales)) = (module, scales) else {
                tensors.push(MlxTensor {
                    name: t.name.clone(),
                    shape: t.shape.clone(),
                    ty: TensorType::Dtype(t.dtype),
                    parts: MlxParts::Plain { file: *file, tensor: (*t).clone() },
                });
                continue;
            };
            let biases = find(&format!("{module}.biases")).ok_or_else(|| {
                Error::format(
                    fname,
                    format!("{module}.biases"),
                    "missing (an affine-quantized module needs weight, scales and biases)",
                )
            })?;
            let params = quant.as_ref().and_then(|q| q.for_module(module)).ok_or_else(|| {
                Error::format(
                    config_name,
                    "quantization",
                    format!("gives no bits/group_size for quantized module {module:?}"),
                )
            })?;
            tensors.push(affine_tensor(module, (*file, (*t).clone()), scales, biases, params, fname)?);
        }
        Ok(MlxModel { config, quant, files, tensors })
    }
}

fn affine_tensor(
    module: &str,
    weight: (usize, StTensor),
    scales: (usize, StTensor),
    biases: (usize, StTensor),
    params: AffineParams,
    file: &str,
) -> Result<MlxTensor> {
    let w = &weight.1;
    if w.dtype != Dtype::U32 || w.shape.is_empty() {
        return Err(Error::format(
            file,
            &w.name,
            format!("is {} {:?}; a quantized weight is uint32 with ≥1 dimension", w.dtype, w.shape),
        ));
    }
    let packed = *w.shape.last().expect("non-empty shape");
    let cols = packed * 32 / u64::from(params.bits);
    if !(packed * 32).is_multiple_of(u64::from(params.bits)) || !cols.is_multiple_of(u64::from(params.group_size)) {
        return Err(Error::format(
            file,
            &w.name,
            format!(
                "{packed} words per row do not unpack to whole groups of {} at {} bits",
                params.group_size, params.bits
            ),
        ));
    }
    let mut group_shape = w.shape.clone();
    *group_shape.last_mut().expect("non-empty shape") = cols / u64::from(params.group_size);
    for (what, t) in [("scales", &scales.1), ("biases", &biases.1)] {
        if t.shape != group_shape {
            return Err(Error::format(
                file,
                &t.name,
                format!(
                    "shape {:?}, expected {group_shape:?} for {} bits, group size {}",
                    t.shape, params.bits, params.group_size
                ),
            ));
        }
        if !matches!(t.dtype, Dtype::F16 | Dtype::BF16 | Dtype::F32) || t.dtype != scales.1.dtype {
            return Err(Error::format(
                file,
                &t.name,
                format!("{what} are {}, expected F16, BF16 or F32 like the scales", t.dtype),
            ));
        }
    }
    let mut shape = w.shape.clone();
    *shape.last_mut().expect("non-empty shape") = cols;
    Ok(MlxTensor {
        name: format!("{module}.weight"),
        shape,
        ty: TensorType::MlxAffine { bits: params.bits, group_size: params.group_size, scale_dtype: scales.1.dtype },
        parts: MlxParts::Affine { params, weight, scales, biases },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(v: serde_json::Value) -> Map<String, Json> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn global_and_per_module_parameters() {
        let c = config(serde_json::json!({"quantization": {
            "group_size": 64, "bits": 4, "mode": "affine",
            "model.layers.0.mlp.gate": {"group_size": 64, "bits": 8},
            "lm_head": false
        }}));
        let q = QuantConfig::from_config(&c, "config.json").unwrap().unwrap();
        assert_eq!(q.for_module("model.layers.3.self_attn.q_proj"), Some(AffineParams { bits: 4, group_size: 64 }));
        assert_eq!(q.for_module("model.layers.0.mlp.gate"), Some(AffineParams { bits: 8, group_size: 64 }));
        assert_eq!(q.for_module("lm_head"), None);
        assert!(QuantConfig::from_config(&config(serde_json::json!({})), "c").unwrap().is_none());
    }

    #[test]
    fn bad_parameters_name_the_key() {
        for (v, field) in [
            (serde_json::json!({"quantization": {"group_size": 64, "bits": 7}}), "quantization.bits"),
            (serde_json::json!({"quantization": {"group_size": 48, "bits": 4}}), "quantization.group_size"),
            (serde_json::json!({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}}), "quantization.mode"),
            (
                serde_json::json!({"quantization": {"bits": 4, "group_size": 64, "m.x": {"bits": 4}}}),
                "quantization.m.x.group_size",
            ),
        ] {
            let e = QuantConfig::from_config(&config(v), "cfg.json").unwrap_err().to_string();
            assert!(e.contains("cfg.json") && e.contains(field), "{e}");
        }
    }
}
