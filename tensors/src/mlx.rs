//! MLX (mlx-lm) checkpoints: `config.json` with its `quantization` block (global `group_size`/`bits`/`mode` plus
//! per-module overrides), and safetensors shards in which a quantized module `P` is stored as `P.weight` (uint32
//! codes), `P.scales` and `P.biases`. Each such triple is one logical tensor `P.weight` of the unpacked shape
//! (mlx-lm 0.32.2 `mlx_lm/utils.py`: `quantize_model`, `save_model`, `load_model`; mlx
//! `python/mlx/nn/layers/quantized.py::QuantizedLinear`; packing: `docs/formats.md` §2).

use serde_json::{Map, Value as Json};

use crate::dequant::FpMode;
use crate::dtype::{Dtype, TensorType};
use crate::error::{Error, Result};
use crate::safetensors::{SafetensorsModel, StTensor};
use quantfarm_store::Blob;
use quantfarm_store::Location;

/// How one module is affine-quantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AffineParams {
    pub bits: u8,
    pub group_size: u32,
}

/// How one module is quantized: `mode: affine` (scales and biases in the model's dtype) or one of the
/// floating-point modes (uint8 scales, no biases; each mode has one bit width and one group size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleQuant {
    Affine(AffineParams),
    Fp(FpMode),
}

impl ModuleQuant {
    pub fn bits(self) -> u32 {
        match self {
            ModuleQuant::Affine(p) => u32::from(p.bits),
            ModuleQuant::Fp(m) => m.bits(),
        }
    }

    pub fn group_size(self) -> u32 {
        match self {
            ModuleQuant::Affine(p) => p.group_size,
            ModuleQuant::Fp(m) => m.group_size() as u32,
        }
    }
}

/// The `quantization` block of an MLX `config.json`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuantConfig {
    pub global: Option<ModuleQuant>,
    /// Module path → its parameters, or `None` where the override says the module is not quantized (`false`).
    /// An entry without `mode` is affine whatever the global mode (mlx-lm passes the entry to `to_quantized`, whose
    /// `mode` defaults to `"affine"`).
    pub overrides: Vec<(String, Option<ModuleQuant>)>,
}

fn params(obj: &Map<String, Json>, field: &str, file: &str) -> Result<ModuleQuant> {
    let mode = match obj.get("mode") {
        None => None,
        Some(Json::String(m)) if m == "affine" => None,
        Some(Json::String(m)) if FpMode::parse(m).is_some() => FpMode::parse(m),
        Some(m) => {
            return Err(Error::format(
                file,
                format!("{field}.mode"),
                format!("{m} is not supported (\"affine\", \"mxfp4\", \"nvfp4\" or \"mxfp8\")"),
            ))
        }
    };
    let get = |k: &str| obj.get(k).and_then(Json::as_u64);
    let bits = get("bits").ok_or_else(|| Error::format(file, format!("{field}.bits"), "missing or not an integer"))?;
    let group = get("group_size")
        .ok_or_else(|| Error::format(file, format!("{field}.group_size"), "missing or not an integer"))?;
    if let Some(mode) = mode {
        if bits != u64::from(mode.bits()) || group != mode.group_size() as u64 {
            return Err(Error::format(
                file,
                field,
                format!(
                    "{} takes bits {} and group_size {}, not {bits} and {group}",
                    mode.name(),
                    mode.bits(),
                    mode.group_size()
                ),
            ));
        }
        return Ok(ModuleQuant::Fp(mode));
    }
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
    Ok(ModuleQuant::Affine(AffineParams { bits: bits as u8, group_size: group as u32 }))
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
    pub fn for_module(&self, path: &str) -> Option<ModuleQuant> {
        match self.overrides.iter().find(|(k, _)| k == path) {
            Some((_, p)) => *p,
            None => self.global,
        }
    }

    /// The override entry of module `path`: `Some(None)` where it says the module is not quantized.
    pub fn entry(&self, path: &str) -> Option<Option<ModuleQuant>> {
        self.overrides.iter().find(|(k, _)| k == path).map(|(_, p)| *p)
    }
}

/// Where a logical tensor's bytes are: one stored tensor, an affine triple, or a floating-point pair.
#[derive(Clone, Debug)]
pub enum MlxParts {
    Plain {
        file: usize,
        tensor: StTensor,
    },
    Affine {
        params: AffineParams,
        weight: (usize, StTensor),
        scales: (usize, StTensor),
        biases: (usize, StTensor),
    },
    /// `mxfp4` / `nvfp4` / `mxfp8`: uint32 codes and uint8 scales.
    Fp {
        mode: FpMode,
        weight: (usize, StTensor),
        scales: (usize, StTensor),
    },
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
            MlxParts::Fp { weight, scales, .. } => weight.1.nbytes() + scales.1.nbytes(),
        }
    }

    /// A quantized weight's stored tensors, each with its bytes per row (of the logical shape's last dimension):
    /// codes, scales and, for affine, biases, in that order. `None` for a plain tensor.
    pub fn quantized_parts(&self) -> Option<Vec<(&(usize, StTensor), u64)>> {
        let cols = self.shape.last().copied().unwrap_or(1);
        match &self.parts {
            MlxParts::Plain { .. } => None,
            MlxParts::Affine { params, weight, scales, biases } => {
                let group_row = cols / u64::from(params.group_size) * scales.1.dtype.size() as u64;
                let code_row = cols * u64::from(params.bits) / 8;
                Some(vec![(weight, code_row), (scales, group_row), (biases, group_row)])
            }
            MlxParts::Fp { mode, weight, scales } => {
                let code_row = cols * u64::from(mode.bits()) / 8;
                Some(vec![(weight, code_row), (scales, cols / mode.group_size() as u64)])
            }
        }
    }

    /// The stored tensor a plain tensor is, or that holds a quantized weight's codes, with its file's index.
    pub fn main_part(&self) -> (usize, &StTensor) {
        match &self.parts {
            MlxParts::Plain { file, tensor } => (*file, tensor),
            MlxParts::Affine { weight, .. } | MlxParts::Fp { weight, .. } => (weight.0, &weight.1),
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
            let configured = quant.as_ref().and_then(|q| match q.entry(module) {
                Some(entry) => entry,
                None => q.global,
            });
            let configured = configured.ok_or_else(|| {
                Error::format(
                    config_name,
                    "quantization",
                    format!("gives no bits/group_size for quantized module {module:?}"),
                )
            })?;
            // mlx-lm 0.32.2 (`utils.py::infer_quant_config`) reads a module the config does not name from its
            // tensors: uint8 scales are one of the floating-point modes, told apart by `bits × group_size`.
            let params = match (configured, scales.1.dtype) {
                (ModuleQuant::Affine(_), Dtype::U8) if quant.as_ref().is_some_and(|q| q.entry(module).is_none()) => {
                    ModuleQuant::Fp(infer_fp(&t.shape, &scales.1.shape).ok_or_else(|| {
                        Error::format(
                            fname,
                            &scales.1.name,
                            format!(
                                "uint8 scales {:?} for codes {:?} are none of mxfp4, nvfp4, mxfp8",
                                scales.1.shape, t.shape
                            ),
                        )
                    })?)
                }
                (p, _) => p,
            };
            match params {
                ModuleQuant::Affine(params) => {
                    let biases = find(&format!("{module}.biases")).ok_or_else(|| {
                        Error::format(
                            fname,
                            format!("{module}.biases"),
                            "missing (an affine-quantized module needs weight, scales and biases)",
                        )
                    })?;
                    tensors.push(affine_tensor(module, (*file, (*t).clone()), scales, biases, params, fname)?);
                }
                ModuleQuant::Fp(mode) => {
                    if find(&format!("{module}.biases")).is_some() {
                        return Err(Error::format(
                            fname,
                            format!("{module}.biases"),
                            format!("present, but {} has no biases", mode.name()),
                        ));
                    }
                    tensors.push(fp_tensor(module, (*file, (*t).clone()), scales, mode, fname)?);
                }
            }
        }
        Ok(MlxModel { config, quant, files, tensors })
    }
}

/// The words per row of a quantized weight's codes, which are uint32 with at least one dimension.
fn packed_words(w: &StTensor, file: &str) -> Result<u64> {
    match (w.dtype, w.shape.last()) {
        (Dtype::U32, Some(&words)) => Ok(words),
        _ => Err(Error::format(
            file,
            &w.name,
            format!("is {} {:?}; a quantized weight is uint32 with ≥1 dimension", w.dtype, w.shape),
        )),
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
    let packed = packed_words(w, file)?;
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

/// The floating-point mode whose `bits × group_size` the shapes give: words per row × 32 / groups per row.
fn infer_fp(weight: &[u64], scales: &[u64]) -> Option<FpMode> {
    let (words, groups) = (*weight.last()?, *scales.last()?);
    if groups == 0 || !(words * 32).is_multiple_of(groups) {
        return None;
    }
    let per_group = words * 32 / groups;
    FpMode::ALL.into_iter().find(|m| (m.bits() as usize * m.group_size()) as u64 == per_group)
}

fn fp_tensor(
    module: &str,
    weight: (usize, StTensor),
    scales: (usize, StTensor),
    mode: FpMode,
    file: &str,
) -> Result<MlxTensor> {
    let w = &weight.1;
    let (bits, group) = (u64::from(mode.bits()), mode.group_size() as u64);
    let packed = packed_words(w, file)?;
    let cols = packed * 32 / bits;
    let mut group_shape = w.shape.clone();
    *group_shape.last_mut().expect("non-empty shape") = cols / group;
    if !cols.is_multiple_of(group) || scales.1.shape != group_shape || scales.1.dtype != Dtype::U8 {
        return Err(Error::format(
            file,
            &scales.1.name,
            format!(
                "{} {:?}, expected U8 {group_shape:?} for {} ({bits} bits, groups of {group})",
                scales.1.dtype,
                scales.1.shape,
                mode.name()
            ),
        ));
    }
    let mut shape = w.shape.clone();
    *shape.last_mut().expect("non-empty shape") = cols;
    Ok(MlxTensor {
        name: format!("{module}.weight"),
        shape,
        ty: TensorType::MlxFp { mode },
        parts: MlxParts::Fp { mode, weight, scales },
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
        let affine = |bits, group_size| Some(ModuleQuant::Affine(AffineParams { bits, group_size }));
        assert_eq!(q.for_module("model.layers.3.self_attn.q_proj"), affine(4, 64));
        assert_eq!(q.for_module("model.layers.0.mlp.gate"), affine(8, 64));
        assert_eq!(q.for_module("lm_head"), None);
        assert!(QuantConfig::from_config(&config(serde_json::json!({})), "c").unwrap().is_none());
    }

    /// `mlx_lm.convert --q-mode mxfp4` of Qwen3-MoE: the global mode is mxfp4, the router's entry (from the
    /// model's predicate, without `mode`) is affine.
    #[test]
    fn a_floating_point_global_with_an_affine_entry() {
        let c = config(serde_json::json!({"quantization": {
            "group_size": 32, "bits": 4, "mode": "mxfp4",
            "model.layers.0.mlp.gate": {"group_size": 64, "bits": 8},
            "model.layers.0.mlp.up": {"group_size": 16, "bits": 4, "mode": "nvfp4"}
        }}));
        let q = QuantConfig::from_config(&c, "config.json").unwrap().unwrap();
        assert_eq!(q.for_module("model.layers.3.self_attn.q_proj"), Some(ModuleQuant::Fp(FpMode::Mxfp4)));
        assert_eq!(q.for_module("model.layers.0.mlp.up"), Some(ModuleQuant::Fp(FpMode::Nvfp4)));
        let affine = ModuleQuant::Affine(AffineParams { bits: 8, group_size: 64 });
        assert_eq!(q.for_module("model.layers.0.mlp.gate"), Some(affine));
        assert_eq!(infer_fp(&[8, 16], &[8, 4]), Some(FpMode::Mxfp4));
        assert_eq!(infer_fp(&[8, 16], &[8, 8]), Some(FpMode::Nvfp4));
        assert_eq!(infer_fp(&[8, 32], &[8, 4]), Some(FpMode::Mxfp8));
        assert_eq!(infer_fp(&[8, 16], &[8, 3]), None);
    }

    #[test]
    fn bad_parameters_name_the_key() {
        for (v, field) in [
            (serde_json::json!({"quantization": {"group_size": 64, "bits": 7}}), "quantization.bits"),
            (serde_json::json!({"quantization": {"group_size": 48, "bits": 4}}), "quantization.group_size"),
            (serde_json::json!({"quantization": {"group_size": 32, "bits": 4, "mode": "fp3"}}), "quantization.mode"),
            (
                serde_json::json!({"quantization": {"group_size": 64, "bits": 4, "mode": "mxfp4"}}),
                "takes bits 4 and group_size 32",
            ),
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
