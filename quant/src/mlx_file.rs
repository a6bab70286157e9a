//! `mlx_lm.convert -q` for whole checkpoints: a Hugging Face or unquantized MLX folder becomes an MLX affine
//! checkpoint whose tensors (names, dtypes, shapes, bytes) are the ones mlx-lm 0.32.2 writes, streamed in pieces of
//! whole rows within a memory budget — read ahead, quantized and written behind at once (the `stream` module) — and
//! written through the staged sink.
//!
//! Pipeline of `mlx_lm/convert.py::convert`, with `quantize_model`, `save_model` and `save_config` from
//! `mlx_lm/utils.py` (mlx-lm 0.32.2):
//!
//! 1. `model.sanitize`, as the architecture's mapping describes it
//!    (`quantfarm_tensors::convert::plan_hf_to_mlx`): `self_attn.rotary_emb.inv_freq` dropped, `lm_head.weight`
//!    dropped with tied embeddings, vision towers left out, per-expert weights stacked, a multimodal wrapper's
//!    prefix;
//! 2. every floating tensor is cast to the config's `torch_dtype` (`set_dtype`, round to nearest even), **before**
//!    quantizing, so an f32 Linear is quantized from its bf16 values;
//! 3. `quantize_model`'s predicate: a module with `to_quantized` (Linear, Embedding: here the 2-D `*.weight` tensors,
//!    which for the supported architectures are exactly those) whose last dimension is a multiple of the group size
//!    is quantized with `mx.quantize` into `P.weight` (uint32), `P.scales` and `P.biases` (the cast dtype);
//! 4. `save_model`: `format: mlx` safetensors shards of at most 5 GiB, `model.safetensors.index.json` (always, with
//!    `total_size` and `total_parameters`, 4-space indent), and `save_config`: top-level keys sorted, `quantization`
//!    copied to `quantization_config`, written as Python's `json.dump(indent=4)` writes it.
//!
//! Not reproduced: the order of tensors inside a shard file (mlx writes them in `std::unordered_map` order), hence
//! the whole-file bytes and the shard boundaries of multi-shard models; tokenizer files are copied as they are
//! rather than re-serialized by `tokenizer.save_pretrained`. From an HF folder and from a GGUF alike, the
//! architecture's mapping says what mlx-lm does differently (`mlx:` in `mappings/*.yaml`: names, sanitize, 3-D
//! `SwitchLinear` experts, the `quant_predicate`'s per-module bits, dtypes mlx-lm never casts), which the plan
//! carries.

use serde_json::{Map, Value as Json};

use quantfarm_store::sink::StagedSink;
use quantfarm_store::Blob;
use quantfarm_store::{Committed, Location};
use quantfarm_tensors::convert::{mlx_cast_dtype, plan_hf_to_mlx, HfPlan, HfTensor, HfToMlxPlan, MlxTensor};
use quantfarm_tensors::mlx::CARRIED_FILES;
use quantfarm_tensors::safetensors::{shard_file_name, StTensorDesc};
use quantfarm_tensors::write::SafetensorsWriter;
use quantfarm_tensors::{Dtype, Format, TensorSource, TensorType};

pub(crate) use crate::mlx::round_to;
use crate::mlx::{check_params, MlxQuantError};
use crate::mlx_fp::{FpMode, FpQuantError};
use crate::mlx_recipe::{MixedRecipe, RecipeError};
use quantfarm_tensors::mlx::{AffineParams, ModuleQuant};

mod stream;

/// `mlx_lm.utils.MAX_FILE_SIZE_GB << 30`.
const MAX_SHARD_BYTES: u64 = 5 << 30;

#[derive(Debug, thiserror::Error)]
pub enum MlxFileError {
    #[error(transparent)]
    Tensors(#[from] quantfarm_tensors::Error),
    #[error(transparent)]
    Params(MlxQuantError),
    #[error("{} takes {} bits in groups of {} (mx.quantize refuses others), not {bits} bits in groups of {group_size}", mode.name(), mode.bits(), mode.group_size())]
    FpParams { mode: FpMode, bits: u32, group_size: usize },
    #[error("tensor {tensor:?}: {source}")]
    Quant {
        tensor: String,
        #[source]
        source: MlxQuantError,
    },
    #[error("tensor {tensor:?}: {source}")]
    FpQuant {
        tensor: String,
        #[source]
        source: FpQuantError,
    },
    #[error("{file}: mlx conversion reads Hugging Face or MLX safetensors folders, this is {format}")]
    NotSafetensors { file: String, format: &'static str },
    #[error("{file}: is already quantized ({what}); convert from the unquantized checkpoint")]
    AlreadyQuantized { file: String, what: String },
    #[error("{file}: config.json: {msg}")]
    Config { file: String, msg: String },
    #[error("{file}: {what} is not converted as mlx-lm converts it")]
    Unsupported { file: String, what: String },
    #[error("{file}: {source}")]
    Recipe {
        file: String,
        #[source]
        source: RecipeError,
    },
}

/// A store error (a missing object, a dropped connection) is a tensors error about that file.
impl From<quantfarm_store::Error> for MlxFileError {
    fn from(e: quantfarm_store::Error) -> MlxFileError {
        MlxFileError::Tensors(e.into())
    }
}

pub struct MlxOptions {
    /// `mlx_lm.convert -q --q-bits --q-group-size`; `None` casts and saves without quantizing (`mlx_lm.convert`
    /// without `-q`).
    pub quant: Option<MlxQuant>,
    /// `mlx_lm.convert --dtype`; `None` uses the config's `torch_dtype`, as mlx-lm does.
    pub dtype: Option<Dtype>,
    /// Bytes of tensor data held at once, shared by the pipeline's stages: the pieces read ahead, the one being
    /// converted and its codes (plus one tensor's scales and biases, and the sink's write-behind queue).
    pub budget: u64,
    pub overwrite: bool,
}

/// Quantization's parameters: `--q-bits`, `--q-group-size` and what else decides each module's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlxQuant {
    /// `--q-bits`: every module's bits, or with a recipe only the global entry of `config.json`'s `quantization`.
    pub bits: u32,
    pub group_size: usize,
    pub scheme: MlxScheme,
}

/// How modules are quantized beyond the global bits and group size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlxScheme {
    /// `--q-mode affine`: every module at the global bits, but those the model's own predicate treats otherwise.
    Affine,
    /// `--quant-predicate`: the bits of each module by mlx-lm's mixed recipe (`crate::mlx_recipe`), which replaces
    /// the model's own predicate (affine only, as in mlx-lm).
    Mixed(MixedRecipe),
    /// `--q-mode mxfp4|nvfp4|mxfp8` (`crate::mlx_fp`): every module in that mode (its one bit width and group
    /// size), but those the model's own predicate gives affine parameters (Qwen3-MoE's 8-bit router).
    Fp(FpMode),
}

impl MlxQuant {
    pub fn recipe(&self) -> Option<MixedRecipe> {
        match self.scheme {
            MlxScheme::Mixed(r) => Some(r),
            MlxScheme::Affine | MlxScheme::Fp(_) => None,
        }
    }

    /// The global entry's `mode`.
    pub fn mode_name(&self) -> &'static str {
        match self.scheme {
            MlxScheme::Affine | MlxScheme::Mixed(_) => "affine",
            MlxScheme::Fp(m) => m.name(),
        }
    }
}

impl MlxOptions {
    /// Quantized to `bits` in groups of `group_size` (mlx-lm's defaults for affine mode: 4 bits, groups of 64).
    pub fn new(bits: u32, group_size: usize) -> MlxOptions {
        let quant = MlxQuant { bits, group_size, scheme: MlxScheme::Affine };
        MlxOptions { quant: Some(quant), dtype: None, budget: 256 << 20, overwrite: false }
    }

    /// `mlx_lm.convert -q --q-group-size GROUP --quant-predicate RECIPE` (no `--q-bits`: the global entry says
    /// mlx-lm's default, 4).
    pub fn mixed(recipe: MixedRecipe, group_size: usize) -> MlxOptions {
        let quant = MlxQuant { bits: 4, group_size, scheme: MlxScheme::Mixed(recipe) };
        MlxOptions { quant: Some(quant), ..MlxOptions::new(4, group_size) }
    }

    /// `mlx_lm.convert -q --q-mode MODE` (the mode's own bits and group size, mlx-lm's defaults for it).
    pub fn fp(mode: FpMode) -> MlxOptions {
        let quant = MlxQuant { bits: mode.bits(), group_size: mode.group_size(), scheme: MlxScheme::Fp(mode) };
        MlxOptions { quant: Some(quant), ..MlxOptions::new(4, 64) }
    }

    /// Cast and saved, not quantized: the checkpoint mlx-lm loads as the model's bf16 weights.
    pub fn unquantized() -> MlxOptions {
        MlxOptions { quant: None, ..MlxOptions::new(4, 64) }
    }
}

/// What a conversion wrote.
pub struct MlxConverted {
    pub files: Vec<Committed>,
    /// Modules quantized (each wrote `.weight`, `.scales`, `.biases`).
    pub quantized: usize,
    /// `total_parameters` of the index: elements of the kept tensors, a quantized weight counted unpacked.
    pub total_parameters: u64,
}

/// One tensor of the source and what becomes of it.
enum Item {
    /// Stored as `dtype` under `name` (cast when it differs from the source's), read from `sources` in order.
    Plain { name: String, sources: Vec<String>, dtype: Dtype, shape: Vec<u64> },
    /// Quantized into `module.weight`, `module.scales` and (affine) `module.biases`: `rows` rows of `cols` values,
    /// shaped `lead + [cols]` (`lead` is `[rows]`, or `[experts, out]` for a 3-D `SwitchLinear` weight).
    Quant {
        name: String,
        sources: Vec<String>,
        module: String,
        lead: Vec<u64>,
        rows: u64,
        cols: u64,
        dtype: Dtype,
        quant: ModuleQuant,
    },
}

/// What an MLX checkpoint is made from: an HF (or unquantized MLX) folder through the plan of what mlx-lm loads
/// from it, or a GGUF read through its GGUF → HF plan, each tensor streamed as the HF conversion would write it
/// (no bf16 copy on disk).
#[derive(Clone, Copy)]
enum Input<'a> {
    Hf(&'a TensorSource, &'a HfToMlxPlan),
    Gguf(&'a TensorSource, &'a HfPlan),
}

impl Input<'_> {
    fn source(&self) -> &TensorSource {
        match self {
            Input::Hf(s, _) | Input::Gguf(s, _) => s,
        }
    }

    /// Every tensor of the MLX model before quantization (a GGUF's as its GGUF → HF plan makes them, in their
    /// planned dtype, which is not cast again).
    fn tensors(&self) -> Vec<MlxTensor> {
        match self {
            Input::Hf(_, plan) => plan.tensors.clone(),
            Input::Gguf(_, plan) => plan
                .tensors
                .iter()
                .map(|t| MlxTensor {
                    name: t.name.clone(),
                    sources: vec![t.name.clone()],
                    stored: TensorType::Dtype(t.dtype),
                    shape: t.shape.clone(),
                    add: None,
                    keep_dtype: true,
                    part: None,
                })
                .collect(),
        }
    }

    /// How tensor `name` is computed, written as `dtype`, when it is not read as stored: the GGUF → HF plan's
    /// entry, or an HF tensor mlx-lm's sanitize offsets (the offset added in f32, as mlx adds to a bf16 array).
    fn planned(&self, name: &str, dtype: Dtype) -> Option<HfTensor> {
        match self {
            Input::Hf(_, plan) => plan.tensors.iter().find(|t| t.name == name).and_then(|t| {
                let source = t.sources.first()?;
                if t.add.is_none() && t.part.is_none() {
                    return None;
                }
                let plain = HfTensor::plain(name, source, t.shape.clone(), dtype);
                Some(HfTensor { offset: t.add.map(|a| -a), part: t.part, ..plain })
            }),
            Input::Gguf(_, plan) => {
                plan.tensors.iter().find(|t| t.name == name).map(|t| HfTensor { dtype, ..t.clone() })
            }
        }
    }

    /// Modules whose 3-D weights are quantized, and modules with their own `(bits, group_size)`.
    fn quant_rules(&self) -> (&[String], &[(String, u32, usize)]) {
        match self {
            Input::Hf(_, plan) => (&plan.quantize_3d, &plan.quant_overrides),
            Input::Gguf(_, plan) => (&plan.quantize_3d, &plan.quant_overrides),
        }
    }
}

/// Converts the checkpoint `src` (a Hugging Face or unquantized MLX folder) into an MLX affine checkpoint in folder
/// `dst_dir`, as `mlx_lm.convert --hf-path SRC --mlx-path DST -q --q-bits BITS --q-group-size GROUP` does.
///
/// Every file is staged and committed at the end (config and index last), so a failure leaves no checkpoint that
/// looks complete.
pub async fn quantize_mlx_checkpoint(
    src: &TensorSource,
    dst_dir: &Location,
    opts: &MlxOptions,
) -> Result<MlxConverted, MlxFileError> {
    if !matches!(src.format(), Format::Safetensors | Format::Mlx) {
        let file = src.location().to_string();
        return Err(MlxFileError::NotSafetensors { file, format: src.format().name() });
    }
    let plan = plan_hf_to_mlx(src)?;
    convert(Input::Hf(src, &plan), dst_dir, opts).await
}

/// Converts the GGUF model `src` into an MLX affine checkpoint in folder `dst_dir`: each tensor is made as the GGUF
/// → HF conversion `plan` makes it (dequantized, permutation and offset undone, rounded to the plan's dtype) and
/// quantized as it streams, so the result is the bytes [`quantize_mlx_checkpoint`] writes for that HF checkpoint,
/// without the checkpoint ever being written; the tokenizer files are the plan's rebuilt ones.
pub async fn gguf_to_mlx(
    src: &TensorSource,
    plan: &HfPlan,
    dst_dir: &Location,
    opts: &MlxOptions,
) -> Result<MlxConverted, MlxFileError> {
    convert(Input::Gguf(src, plan), dst_dir, opts).await
}

async fn convert(input: Input<'_>, dst_dir: &Location, opts: &MlxOptions) -> Result<MlxConverted, MlxFileError> {
    let src = input.source();
    let file = src.location().to_string();
    let config = match input {
        Input::Hf(s, plan) => plan.config.clone().unwrap_or_else(|| s.metadata()),
        Input::Gguf(_, plan) => plan.config.clone(),
    };
    let tensors = input.tensors();
    // A quantized MLX checkpoint (a fused 4-bit model) is quantized again from its values as `mx.dequantize` gives
    // them, in its scales' dtype (what `convert --to hf` writes of it); a GGUF's plan has dequantized already.
    let mlx_source = matches!(input, Input::Hf(s, _) if s.format() == Format::Mlx);
    if let Some(t) = tensors.iter().find(|t| match t.stored {
        TensorType::Dtype(_) => false,
        TensorType::MlxAffine { .. } | TensorType::MlxFp { .. } => !mlx_source,
        TensorType::Ggml(_) => true,
    }) {
        return Err(MlxFileError::AlreadyQuantized { file, what: format!("tensor {:?} is {}", t.name, t.stored) });
    }
    let mut config = config;
    if mlx_source {
        config.remove("quantization");
        config.remove("quantization_config");
    } else if config.contains_key("quantization") {
        return Err(MlxFileError::AlreadyQuantized { file, what: "config.json has `quantization`".into() });
    }
    let cast = opts.dtype.or_else(|| mlx_cast_dtype(&config));
    if let Some(q) = opts.quant {
        let dtype = cast.unwrap_or(Dtype::F32);
        match q.scheme {
            MlxScheme::Fp(mode) if (q.bits, q.group_size) != (mode.bits(), mode.group_size()) => {
                return Err(MlxFileError::FpParams { mode, bits: q.bits, group_size: q.group_size })
            }
            MlxScheme::Fp(mode) => check_quant(ModuleQuant::Fp(mode), dtype),
            MlxScheme::Affine | MlxScheme::Mixed(_) => check_params(q.group_size, q.bits, q.group_size, dtype),
        }
        .map_err(MlxFileError::Params)?;
    }
    let (quantize_3d, model_overrides) = input.quant_rules();
    // A recipe replaces the model's predicate: it needs every module's name (it looks for `down_proj` among them)
    // and the number of blocks.
    let recipe = match opts.quant.and_then(|q| q.recipe()) {
        None => None,
        Some(r) => {
            let modules: Vec<&str> = tensors.iter().filter_map(|t| t.name.strip_suffix(".weight")).collect();
            Some(r.plan(&modules).map_err(|source| MlxFileError::Recipe { file: file.clone(), source })?)
        }
    };
    let overrides: &[(String, u32, usize)] = if recipe.is_some() { &[] } else { model_overrides };

    // Plan (sanitized by the input's plan): cast, predicate. Sorted by name, a quantized module's three tensors
    // together.
    let mut entries: Vec<_> = tensors.iter().collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let mut items = Vec::with_capacity(entries.len());
    for t in entries {
        let (name, sources, shape) = (&t.name, &t.sources, &t.shape);
        let (stored, dequantized) = match t.stored {
            TensorType::Dtype(d) => (d, false),
            TensorType::MlxAffine { scale_dtype, .. } => (scale_dtype, true),
            // `mx.dequantize` of uint8 scales gives bfloat16 (every such value exactly).
            TensorType::MlxFp { .. } => (Dtype::BF16, true),
            TensorType::Ggml(_) => unreachable!("checked above"),
        };
        let floating = matches!(stored, Dtype::F32 | Dtype::F16 | Dtype::BF16);
        // A GGUF's plan already gives each tensor its dtype (Qwen3.5's A_log stays f32, as mlx-lm's cast_predicate
        // keeps it); a dequantized affine tensor keeps its scales' dtype.
        let cast_here = floating && !dequantized && !t.keep_dtype && matches!(input, Input::Hf(..));
        let dtype = if cast_here { cast.unwrap_or(stored) } else { stored };
        // mlx adds in the stored dtype and casts after; in f32 and rounded once to `dtype` that is the same value
        // when the two dtypes are one, or the stored one is f32.
        if t.add.is_some() && !(stored == dtype || stored == Dtype::F32) {
            return Err(MlxFileError::Unsupported {
                file: file.clone(),
                what: format!("tensor {name:?}: an offset on {stored} values cast to {dtype}"),
            });
        }
        let module = name.strip_suffix(".weight");
        let cols = shape.last().copied().unwrap_or(1);
        let quant = match (opts.quant, recipe, module) {
            (None, ..) => None,
            (Some(q), Some(plan), Some(m)) => {
                let bits = plan.bits_for(m).map_err(|source| MlxFileError::Recipe { file: file.clone(), source })?;
                Some(module_quant(&q, bits, q.group_size))
            }
            // The model's predicate gives `{group_size, bits}` without a mode: affine, whatever the global mode.
            (Some(q), ..) => Some(match module.and_then(|m| overrides.iter().find(|o| o.0 == m)) {
                Some(o) => ModuleQuant::Affine(AffineParams { bits: o.1 as u8, group_size: o.2 as u32 }),
                None => module_quant(&q, q.bits, q.group_size),
            }),
        };
        let quantizable = |m: &str| shape.len() == 2 || shape.len() == 3 && quantize_3d.iter().any(|q| q == m);
        match (module, quant) {
            (Some(m), Some(quant))
                if floating && quantizable(m) && cols.is_multiple_of(u64::from(quant.group_size())) =>
            {
                check_quant(quant, dtype).map_err(MlxFileError::Params)?;
                let lead = shape[..shape.len() - 1].to_vec();
                items.push(Item::Quant {
                    name: name.clone(),
                    sources: sources.clone(),
                    module: m.to_string(),
                    rows: lead.iter().product(),
                    lead,
                    cols,
                    dtype,
                    quant,
                })
            }
            _ => items.push(Item::Plain { name: name.clone(), sources: sources.clone(), dtype, shape: shape.clone() }),
        }
    }

    let mut descs = Vec::new();
    let mut total_parameters = 0u64;
    for item in &items {
        match item {
            Item::Plain { name, dtype, shape, .. } => {
                total_parameters += shape.iter().product::<u64>();
                descs.push(StTensorDesc { name: name.clone(), dtype: *dtype, shape: shape.clone() });
            }
            Item::Quant { module, lead, rows, cols, dtype, quant, .. } => {
                total_parameters += rows * cols;
                let with_last = |last: u64| lead.iter().copied().chain([last]).collect::<Vec<_>>();
                let groups = with_last(cols / u64::from(quant.group_size()));
                descs.push(StTensorDesc {
                    name: format!("{module}.weight"),
                    dtype: Dtype::U32,
                    shape: with_last(cols * u64::from(quant.bits()) / 32),
                });
                match quant {
                    ModuleQuant::Affine(_) => {
                        let name = format!("{module}.scales");
                        descs.push(StTensorDesc { name, dtype: *dtype, shape: groups.clone() });
                        descs.push(StTensorDesc { name: format!("{module}.biases"), dtype: *dtype, shape: groups });
                    }
                    ModuleQuant::Fp(_) => {
                        descs.push(StTensorDesc { name: format!("{module}.scales"), dtype: Dtype::U8, shape: groups })
                    }
                }
            }
        }
    }

    let shards = quantfarm_tensors::safetensors::plan_shards(&descs, MAX_SHARD_BYTES);
    let shard_of_desc: Vec<usize> =
        shards.iter().enumerate().flat_map(|(i, r)| std::iter::repeat_n(i, r.len())).collect();
    let metadata = [("format".to_string(), "mlx".to_string())];
    let mut writers = Vec::with_capacity(shards.len());
    for (i, range) in shards.iter().enumerate() {
        let target = dst_dir.child(&shard_file_name(i, shards.len()))?;
        writers.push(SafetensorsWriter::create(&target, &descs[range.clone()], &metadata, opts.overwrite).await?);
    }

    stream::write_tensors(input, &items, &mut writers, &shard_of_desc, opts.budget).await?;
    let quantized = items.iter().filter(|i| matches!(i, Item::Quant { .. })).count();

    let mut files = Vec::with_capacity(writers.len() + 2 + CARRIED_FILES.len());
    for w in writers {
        files.push(w.finish().await?);
    }

    match input {
        // Files mlx-lm carries over, when the source folder has them.
        Input::Hf(..) => {
            let src_dir = src.location();
            let present = src_dir.list().await.unwrap_or_default();
            for name in CARRIED_FILES.iter().filter(|n| present.iter().any(|p| p == *n)) {
                let blob = Blob::open(&src_dir.child(name)?).await?;
                let bytes = blob.read_vec(0, blob.len()).await?;
                files.push(write_file(dst_dir, name, &bytes, opts.overwrite).await?);
            }
        }
        // The tokenizer files rebuilt from the GGUF, as the GGUF → HF conversion writes them.
        Input::Gguf(_, plan) => {
            for (name, value) in &plan.json_files {
                let mut text = serde_json::to_string_pretty(value).expect("JSON serializes");
                text.push('\n');
                files.push(write_file(dst_dir, name, text.as_bytes(), opts.overwrite).await?);
            }
            for (name, bytes) in &plan.binary_files {
                files.push(write_file(dst_dir, name, bytes, opts.overwrite).await?);
            }
        }
    }

    let mut weight_map = Map::new();
    for (i, r) in shards.iter().enumerate() {
        for d in &descs[r.clone()] {
            weight_map.insert(d.name.clone(), Json::String(shard_file_name(i, shards.len())));
        }
    }
    weight_map.sort_keys();
    let total_size: u64 = descs.iter().map(StTensorDesc::nbytes).sum();
    let index = serde_json::json!({
        "metadata": { "total_size": total_size, "total_parameters": total_parameters },
        "weight_map": weight_map,
    });
    files.push(write_file(dst_dir, "model.safetensors.index.json", &python_json(&index), opts.overwrite).await?);

    let config = match opts.quant {
        Some(q) => match recipe {
            // Every quantized module has its entry, in mlx-lm's module order.
            Some(plan) => {
                let modules = items
                    .iter()
                    .filter_map(|i| match i {
                        Item::Quant { module, .. } => Some(module.clone()),
                        Item::Plain { .. } => None,
                    })
                    .collect();
                let entries = plan
                    .config_entries(modules, q.group_size)
                    .map_err(|source| MlxFileError::Recipe { file: file.clone(), source })?;
                mlx_config(config, &q, &entries)
            }
            None => mlx_config(config, &q, overrides),
        },
        None => unquantized_config(config),
    };
    files.push(write_file(dst_dir, "config.json", &python_json(&Json::Object(config)), opts.overwrite).await?);
    Ok(MlxConverted { files, quantized, total_parameters })
}

/// A module's quantization under `quant` at `bits` and `group_size` (the global ones, or a recipe's bits).
fn module_quant(quant: &MlxQuant, bits: u32, group_size: usize) -> ModuleQuant {
    match quant.scheme {
        MlxScheme::Fp(mode) => ModuleQuant::Fp(mode),
        MlxScheme::Affine | MlxScheme::Mixed(_) => {
            ModuleQuant::Affine(AffineParams { bits: bits as u8, group_size: group_size as u32 })
        }
    }
}

/// Refuses what `mx.quantize` refuses: affine's bits and group sizes, a scale dtype that is not a float.
fn check_quant(quant: ModuleQuant, dtype: Dtype) -> Result<(), MlxQuantError> {
    match quant {
        ModuleQuant::Affine(p) => {
            let g = p.group_size as usize;
            check_params(g, u32::from(p.bits), g, dtype)
        }
        ModuleQuant::Fp(_) if matches!(dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) => Ok(()),
        ModuleQuant::Fp(_) => Err(MlxQuantError::ScaleDtype(dtype)),
    }
}

/// `quantize_model` + `save_config`: the global `quantization` block (and its `quantization_config` copy), with an
/// entry per module the predicate gives parameters (`modules`: full path, bits, group size, in order): the model's
/// `quant_predicate` only for modules it treats otherwise, a recipe for every quantized module (and with the
/// mode); without `_name_or_path` and `vision_config`, top-level keys sorted.
pub fn mlx_config(
    mut config: Map<String, Json>,
    quant: &MlxQuant,
    modules: &[(String, u32, usize)],
) -> Map<String, Json> {
    let mut q = serde_json::json!({ "group_size": quant.group_size, "bits": quant.bits, "mode": quant.mode_name() });
    for (module, bits, group_size) in modules {
        q[module.as_str()] = match quant.scheme {
            MlxScheme::Mixed(_) => serde_json::json!({ "group_size": group_size, "bits": bits, "mode": "affine" }),
            MlxScheme::Affine | MlxScheme::Fp(_) => serde_json::json!({ "group_size": group_size, "bits": bits }),
        };
    }
    config.insert("quantization".into(), q.clone());
    config.insert("quantization_config".into(), q);
    unquantized_config(config)
}

/// `save_config` of an unquantized model: without `_name_or_path` and `vision_config`, top-level keys sorted.
pub fn unquantized_config(mut config: Map<String, Json>) -> Map<String, Json> {
    config.remove("_name_or_path");
    config.remove("vision_config");
    config.sort_keys();
    config
}

/// Writes `bytes` as file `name` of `dir` through the staged sink (whole or not at all).
pub(crate) async fn write_file(
    dir: &Location,
    name: &str,
    bytes: &[u8],
    overwrite: bool,
) -> Result<Committed, quantfarm_tensors::Error> {
    let mut sink = StagedSink::create(&dir.child(name)?, overwrite).await?;
    sink.write(bytes).await?;
    Ok(sink.commit().await?)
}

/// `json.dumps(value, indent=4)` (ensure_ascii, Python float repr, no trailing newline).
pub fn python_json(value: &Json) -> Vec<u8> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(
        &mut out,
        PyFormatter(serde_json::ser::PrettyFormatter::with_indent(b"    ")),
    );
    serde::Serialize::serialize(value, &mut ser).expect("JSON values serialize");
    // ensure_ascii: non-ASCII only occurs inside strings, where \uXXXX (UTF-16) is what Python writes.
    let text = String::from_utf8(out).expect("serde_json writes UTF-8");
    let mut ascii = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            ascii.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                ascii.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    ascii.into_bytes()
}

/// Python's `repr(float)`: shortest round-trip digits, positional for decimal exponents in [-4, 16), else
/// `d.ddde±XX`; integral values keep `.0`.
pub fn python_float_repr(x: f64) -> String {
    if !x.is_finite() {
        return if x.is_nan() {
            "NaN".into()
        } else if x > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    // `{:e}` gives the shortest round-trip digits as d.ddde±X.
    let sci = format!("{x:e}");
    let (mant, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let (sign, mant) = mant.strip_prefix('-').map(|m| ("-", m)).unwrap_or(("", mant));
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let s = if exp < 0 {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        } else if exp + 1 >= n {
            format!("{}{}.0", digits, "0".repeat((exp + 1 - n) as usize))
        } else {
            format!("{}.{}", &digits[..(exp + 1) as usize], &digits[(exp + 1) as usize..])
        };
        format!("{sign}{s}")
    } else {
        let m = if digits.len() > 1 { format!("{}.{}", &digits[..1], &digits[1..]) } else { digits };
        format!("{sign}{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

/// serde_json's pretty printer with Python's float formatting.
struct PyFormatter<'a>(serde_json::ser::PrettyFormatter<'a>);

impl serde_json::ser::Formatter for PyFormatter<'_> {
    fn write_f64<W: ?Sized + std::io::Write>(&mut self, w: &mut W, value: f64) -> std::io::Result<()> {
        w.write_all(python_float_repr(value).as_bytes())
    }
    fn write_f32<W: ?Sized + std::io::Write>(&mut self, w: &mut W, value: f32) -> std::io::Result<()> {
        self.write_f64(w, f64::from(value))
    }
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object_value(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (x, s) in [
            (1e-5, "1e-05"),
            (1e-6, "1e-06"),
            (100000.0, "100000.0"),
            (0.02, "0.02"),
            (0.0001, "0.0001"),
            (1.5e-7, "1.5e-07"),
            (1e16, "1e+16"),
            (123456789012345.6, "123456789012345.6"),
            (-2.5, "-2.5"),
            (0.0, "0.0"),
            (10000000.0, "10000000.0"),
        ] {
            assert_eq!(python_float_repr(x), s, "{x}");
        }
    }

    #[test]
    fn json_is_python_indent_4() {
        let v = serde_json::json!({"b": [1, 2.0], "a": {"x": "é"}, "e": [], "o": {}});
        let text = String::from_utf8(python_json(&v)).unwrap();
        assert_eq!(
            text,
            "{\n    \"b\": [\n        1,\n        2.0\n    ],\n    \"a\": {\n        \"x\": \"\\u00e9\"\n    },\n    \"e\": [],\n    \"o\": {}\n}"
        );
    }
}
