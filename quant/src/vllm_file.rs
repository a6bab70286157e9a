//! A Hugging Face bf16 checkpoint as the compressed-tensors checkpoint llm-compressor writes for vLLM: its Linear
//! weights quantized FP8_DYNAMIC or W4A16 (`crate::compressed_tensors`), everything else as it is, and
//! `config.json`'s `quantization_config`, which vLLM and transformers read the format from.
//!
//! Which weights: every 2-D `*.weight` of a module that is not a norm (its name ends in `norm`), an embedding
//! (`embed_tokens`, a vision tower's `position_embedding`: [`linear_module`]) or a mixture of experts' router ([`routers`]), nor named in `ignore` (by default
//! `lm_head`, as llm-compressor's examples and vLLM's loaders expect) — the decoder's Linear layers, every expert's
//! included; fused 3-D experts are split per expert first, as llm-compressor splits them ([`crate::vllm_pieces`]).
//! A model with multi-token-prediction layers made like `oneshot` keeps its `mtp.*` tensors as stored, unquantized,
//! with `re:^mtp.*` in `ignore` (compressed-tensors' `utils/mtp.py`, `save_mtp_tensors_to_checkpoint`: transformers
//! does not load them, so oneshot copies them from the source). Per quantized module `M`:
//! - FP8_DYNAMIC (`float-quantized`): `M.weight` F8_E4M3 `[out, in]`, `M.weight_scale` BF16 `[out, 1]`;
//! - W4A16 (`pack-quantized`, group `g`): `M.weight_packed` I32 `[out, ceil(in/8)]`, `M.weight_scale` BF16
//!   `[out, in/g]`, `M.weight_shape` I64 `[2]`.
//!
//! The output keeps the source's files (each shard file holds what it held, its quantized weights in place) and
//! index; the tokenizer and generation files are copied. Rows are read and written in pieces within the memory
//! budget; a weight's scales (one or `in/g` per row) are held until the weight's codes are written.

use rayon::prelude::*;
use serde_json::{json, Map, Value as Json};

use quantfarm_store::{Blob, Committed, Location};

use crate::vllm_ignore::{Ignore, IgnoreEntry};
use crate::vllm_pieces::{pieces, split, ExpertLayout, Piece};
use quantfarm_tensors::mlx::CARRIED_FILES;
use quantfarm_tensors::safetensors::StTensorDesc;
use quantfarm_tensors::write::{copy_tensor, SafetensorsWriter};
use quantfarm_tensors::{Dtype, Format, TensorSource};

use crate::compressed_tensors as ct;
use crate::mlx_file::write_file;

/// The compressed-tensors version whose minimal `quantization_config` form is written (what its 0.19 and 0.20
/// readers both accept: `QuantizationArgs` parse with `extra="forbid"`).
pub const CT_FORMAT_VERSION: &str = "0.20.1";

/// A vLLM quantization scheme, as llm-compressor names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VllmScheme {
    /// 8-bit float weights with a scale per output row; activations quantized per token at run time.
    Fp8Dynamic,
    /// Symmetric 4-bit integer weights with a scale per group of `group_size` input columns; 16-bit activations.
    W4A16 { group_size: u32 },
}

impl VllmScheme {
    pub fn name(self) -> &'static str {
        match self {
            VllmScheme::Fp8Dynamic => "FP8_DYNAMIC",
            VllmScheme::W4A16 { .. } => "W4A16",
        }
    }

    /// compressed-tensors' format name for the scheme's weights.
    fn format(self) -> &'static str {
        match self {
            VllmScheme::Fp8Dynamic => "float-quantized",
            VllmScheme::W4A16 { .. } => "pack-quantized",
        }
    }

    /// The `quantization_config` block of `config.json` for this scheme, leaving `ignore` out.
    pub fn quantization_config(self, ignore: &[String]) -> Json {
        let (weights, activations) = match self {
            VllmScheme::Fp8Dynamic => (
                json!({"dynamic": false, "group_size": null, "num_bits": 8, "strategy": "channel", "symmetric": true, "type": "float"}),
                json!({"dynamic": true, "group_size": null, "num_bits": 8, "strategy": "token", "symmetric": true, "type": "float"}),
            ),
            VllmScheme::W4A16 { group_size } => (
                json!({"dynamic": false, "group_size": group_size, "num_bits": 4, "strategy": "group", "symmetric": true, "type": "int"}),
                Json::Null,
            ),
        };
        json!({
            "config_groups": {"group_0": {
                "format": self.format(),
                "input_activations": activations,
                "output_activations": null,
                "targets": ["Linear"],
                "weights": weights,
            }},
            "format": self.format(),
            "global_compression_ratio": null,
            "ignore": ignore,
            "kv_cache_scheme": null,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
            "sparsity_config": {},
            "transform_config": {},
            "version": CT_FORMAT_VERSION,
        })
    }
}

/// Which of llm-compressor's two entry points the checkpoint is made like. They quantize the same weights to the
/// same bytes and differ in two things only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anchor {
    /// `oneshot` over the model loaded in transformers: the tensors left unquantized are in the config's dtype (an
    /// f32 norm of a bf16 model is saved bf16), and an exact -0.0 weight comes out +0 in FP8 (the symmetric zero
    /// point is added while compressing).
    Oneshot,
    /// `model_free_ptq` over the safetensors files: unquantized tensors keep their stored dtype and bytes, and -0.0
    /// stays -0.
    ModelFree,
}

#[derive(Clone, Debug)]
pub struct VllmOptions {
    pub scheme: VllmScheme,
    pub like: Anchor,
    /// Modules left unquantized, by name (`lm_head`).
    pub ignore: Vec<String>,
    /// Bytes of rows read at once.
    pub budget: u64,
    pub overwrite: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum VllmFileError {
    #[error(transparent)]
    Tensors(#[from] quantfarm_tensors::Error),
    #[error(transparent)]
    Store(#[from] quantfarm_store::Error),
    #[error("{file}: the vLLM destination reads a Hugging Face safetensors folder, this is {format}")]
    NotHf { file: String, format: &'static str },
    #[error("{file}: config.json already has a quantization_config: the checkpoint is quantized")]
    AlreadyQuantized { file: String },
    #[error("tensor {tensor:?}: {scheme} quantizes bf16 weights, this one is {dtype}")]
    Dtype { tensor: String, scheme: &'static str, dtype: String },
    #[error("tensor {tensor:?}: W4A16 groups of {group_size} columns must divide its {cols} columns (use 32 or 64)")]
    Group { tensor: String, group_size: u32, cols: u64 },
    #[error("tensor {tensor:?}: a NaN or infinite weight at row {row}")]
    NotFinite { tensor: String, row: u64 },
    #[error("{scheme}: group size {group_size}: compressed-tensors takes a positive multiple of 8 up to the row")]
    GroupSize { scheme: &'static str, group_size: u32 },
    #[error(transparent)]
    Experts(#[from] ExpertLayout),
    #[error("config.json: dtype {dtype:?}: expected bfloat16, float16 or float32")]
    ConfigDtype { dtype: String },
    #[error("{file}: has no compressed-tensors quantization_config: the checkpoint is not one for vLLM")]
    NotCompressed { file: String },
    #[error("config.json: {key}: {msg}")]
    Unsupported { key: String, msg: String },
    #[error("ignore: {msg}")]
    Ignore { msg: String },
    #[error("tensor {tensor:?}: {msg}")]
    Layout { tensor: String, msg: String },
}

/// What was written.
#[derive(Debug)]
pub struct VllmWritten {
    pub files: Vec<Committed>,
    /// The modules quantized.
    pub quantized: Vec<String>,
}

/// The module whose weight tensor `name` of `shape` is, when it is a Linear's (`targets="Linear"`: a matrix, not a
/// norm's or an embedding's: the token embedding `embed_tokens`, a vision tower's `position_embedding`, any
/// `embed*` or `*embedding(s)` module, which are `nn.Embedding` tables, never Linear).
fn linear_module<'a>(name: &'a str, shape: &[u64]) -> Option<&'a str> {
    let module = name.strip_suffix(".weight")?;
    let last = module.rsplit('.').next().unwrap_or(module);
    let embedding = last.starts_with("embed") || last.ends_with("embedding") || last.ends_with("embeddings");
    (shape.len() == 2 && !last.ends_with("norm") && !embedding).then_some(module)
}

/// Whether tensor `name` of `shape` is a Linear weight the scheme quantizes (see the module's overview).
pub fn is_target(name: &str, shape: &[u64], ignore: &Ignore) -> bool {
    linear_module(name, shape).is_some_and(|m| !ignore.matches(m))
}

/// The config's floating dtype (`dtype`, or `torch_dtype` as older transformers wrote it), if it names one.
fn config_dtype(config: &Map<String, Json>) -> Result<Option<Dtype>, VllmFileError> {
    let Some(name) = config.get("dtype").or_else(|| config.get("torch_dtype")).and_then(Json::as_str) else {
        return Ok(None);
    };
    match name {
        "bfloat16" => Ok(Some(Dtype::BF16)),
        "float16" => Ok(Some(Dtype::F16)),
        "float32" => Ok(Some(Dtype::F32)),
        other => Err(VllmFileError::ConfigDtype { dtype: other.to_string() }),
    }
}

/// The dtype an unquantized piece is saved in: the config's, for a floating tensor made like `oneshot` (but a
/// multi-token-prediction tensor, which oneshot copies from the source: `mtp`).
fn saved_dtype(piece: &Piece, like: Anchor, config: Option<Dtype>, mtp: bool) -> Dtype {
    let floating = matches!(piece.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16);
    match (like, config) {
        _ if mtp && is_mtp(&piece.name) => piece.dtype,
        (Anchor::Oneshot, Some(c)) if floating => c,
        (Anchor::Oneshot | Anchor::ModelFree, _) => piece.dtype,
    }
}

/// Whether the config (or its text config) declares multi-token-prediction layers (`mtp_num_hidden_layers`, or
/// `num_mtp_layers`), which transformers does not load.
/// Made like oneshot, a model with multi-token-prediction layers has them copied, not quantized.
fn copies_mtp(src: &TensorSource, opts: &VllmOptions) -> bool {
    opts.like == Anchor::Oneshot && has_mtp(&src.metadata())
}

fn has_mtp(config: &Map<String, Json>) -> bool {
    let declares = |c: &Map<String, Json>| {
        ["mtp_num_hidden_layers", "num_mtp_layers"].iter().any(|k| c.get(*k).and_then(Json::as_u64).unwrap_or(0) > 0)
    };
    declares(config) || config.get("text_config").and_then(Json::as_object).is_some_and(declares)
}

/// Which tensors are written whole, not split per expert: made like oneshot, the multi-token-prediction layers it
/// copies.
fn kept(src: &TensorSource, opts: &VllmOptions) -> impl Fn(&str) -> bool + Copy {
    let mtp = copies_mtp(src, opts);
    move |name: &str| mtp && is_mtp(name)
}

/// A tensor of the multi-token-prediction layers (compressed-tensors' prefix `mtp`).
fn is_mtp(name: &str) -> bool {
    name.starts_with("mtp")
}

/// compressed-tensors' `ignore` entry for the multi-token-prediction layers oneshot copies.
const MTP_IGNORE: &str = "re:^mtp.*";

/// The routers of a mixture of experts: modules `P.gate` whose parent `P` holds experts (`P.experts.…`). They are
/// left unquantized, as `oneshot` leaves them (transformers' router is not a Linear) and as vLLM loads them (its MoE
/// gate takes no quantization), and recorded in `ignore`.
pub fn routers(src: &TensorSource) -> Vec<String> {
    let names: Vec<&str> = src.tensors().iter().map(|e| e.name.as_str()).collect();
    src.tensors()
        .iter()
        .filter_map(|e| e.name.strip_suffix(".gate.weight").filter(|_| e.shape.len() == 2))
        .filter(|parent| names.iter().any(|n| n.starts_with(&format!("{parent}.experts."))))
        .map(|parent| format!("{parent}.gate"))
        .collect()
}

/// The modules left unquantized: the routers by name, then the user's entries (and, made like oneshot, the
/// multi-token-prediction layers).
fn left_alone(src: &TensorSource, opts: &VllmOptions) -> Result<Ignore, VllmFileError> {
    let mut entries = opts.ignore.clone();
    if copies_mtp(src, opts) {
        entries.push(MTP_IGNORE.to_string());
    }
    Ok(Ignore::names(routers(src)).with(Ignore::parse(&entries).map_err(|msg| VllmFileError::Ignore { msg })?))
}

/// Each of the user's `ignore` entries names a module of the checkpoint (one that holds a tensor), but `lm_head`,
/// which a tied checkpoint has as a module without a tensor of its own: an entry that names nothing (a typo) would
/// leave quantized what its writer meant to keep. An entry may name modules without a Linear (llm-compressor's
/// examples ignore `re:.*multi_modal_projector.*`, which in Gemma 3 holds a bare projection parameter and a norm):
/// it then leaves nothing out, as in oneshot.
fn check_ignore(all: &[Piece], opts: &VllmOptions) -> Result<(), VllmFileError> {
    let ignore = Ignore::parse(&opts.ignore).map_err(|msg| VllmFileError::Ignore { msg })?;
    let modules: Vec<&str> = all.iter().filter_map(|p| p.name.rsplit_once('.').map(|(m, _)| m)).collect();
    for entry in ignore.entries() {
        if entry.text() != "lm_head" && !modules.iter().any(|m| entry.matches(m)) {
            return Err(VllmFileError::Ignore {
                msg: format!(
                    "{:?}: names no module of the checkpoint (a module by its full name, \
                     `model.layers.0.mlp.down_proj`, or `re:` and a pattern matched from the name's start)",
                    entry.text()
                ),
            });
        }
    }
    Ok(())
}

/// The `ignore` list `oneshot` writes: every Linear left unquantized by name, in the checkpoint's order (its
/// patterns expanded: compressed-tensors lists the modules, `QuantizationConfig.from_pretrained`), and a named
/// module without a tensor (a tied `lm_head`) last, as the model lists it; `mtp`: the multi-token-prediction
/// layers, which the model oneshot saves does not hold, as compressed-tensors appends them after.
fn oneshot_ignore(src: &TensorSource, left: &Ignore, mtp: bool) -> Result<Vec<String>, VllmFileError> {
    let mut out: Vec<String> = Vec::new();
    let all = pieces(src, |n| mtp && is_mtp(n))?;
    for p in all.iter().filter(|p| !(mtp && is_mtp(&p.name))) {
        if let Some(m) = linear_module(&p.name, &p.shape).filter(|m| left.matches(m)) {
            if !out.iter().any(|o| o == m) {
                out.push(m.to_string());
            }
        }
    }
    let has_weight = |m: &str| all.iter().any(|p| p.name.strip_suffix(".weight") == Some(m));
    for entry in left.entries() {
        if let IgnoreEntry::Name(n) = entry {
            if !has_weight(n) && !out.contains(n) {
                out.push(n.clone());
            }
        }
    }
    if mtp {
        out.push(MTP_IGNORE.to_string());
    }
    Ok(out)
}

/// The tensors one source tensor becomes.
fn outputs(name: &str, shape: &[u64], dtype: Dtype, scheme: Option<VllmScheme>) -> Vec<StTensorDesc> {
    let d = |n: String, dtype, shape: Vec<u64>| StTensorDesc { name: n, dtype, shape };
    let module = name.trim_end_matches(".weight");
    match scheme {
        None => vec![d(name.to_string(), dtype, shape.to_vec())],
        Some(VllmScheme::Fp8Dynamic) => vec![
            d(name.to_string(), Dtype::F8E4M3, shape.to_vec()),
            d(format!("{module}.weight_scale"), Dtype::BF16, vec![shape[0], 1]),
        ],
        Some(VllmScheme::W4A16 { group_size }) => vec![
            d(
                format!("{module}.weight_packed"),
                Dtype::I32,
                vec![shape[0], ct::packed_words(shape[1] as usize) as u64],
            ),
            d(format!("{module}.weight_scale"), Dtype::BF16, vec![shape[0], shape[1] / u64::from(group_size)]),
            d(format!("{module}.weight_shape"), Dtype::I64, vec![2]),
        ],
    }
}

/// The pre-flight of [`write_vllm_checkpoint`], before any compute: the folder is an unquantized Hugging Face
/// checkpoint, every weight to quantize is bf16 and, for W4A16, its columns divide into groups. Returns the modules
/// that would be quantized, in the checkpoint's order.
pub async fn check(src_dir: &Location, opts: &VllmOptions) -> Result<Vec<String>, VllmFileError> {
    let src = TensorSource::open(src_dir).await?;
    preflight(&src, src_dir, opts)?;
    let left = left_alone(&src, opts)?;
    Ok(pieces(&src, kept(&src, opts))?
        .iter()
        .filter(|p| is_target(&p.name, &p.shape, &left))
        .map(|p| p.name.trim_end_matches(".weight").to_string())
        .collect())
}

fn preflight(src: &TensorSource, src_dir: &Location, opts: &VllmOptions) -> Result<(), VllmFileError> {
    let file = src_dir.to_string();
    if src.format() != Format::Safetensors || src.safetensors().is_none() {
        return Err(VllmFileError::NotHf { file, format: src.format().name() });
    }
    if src.metadata().contains_key("quantization_config") {
        return Err(VllmFileError::AlreadyQuantized { file });
    }
    if let VllmScheme::W4A16 { group_size } = opts.scheme {
        if group_size == 0 || group_size % 8 != 0 {
            return Err(VllmFileError::GroupSize { scheme: opts.scheme.name(), group_size });
        }
    }
    // Fused 3-D experts are split, or refused naming the tensor: never left unquantized.
    let all = pieces(src, kept(src, opts))?;
    check_ignore(&all, opts)?;
    let left = left_alone(src, opts)?;
    for e in all.iter().filter(|p| is_target(&p.name, &p.shape, &left)) {
        if e.dtype != Dtype::BF16 {
            return Err(VllmFileError::Dtype {
                tensor: e.name.clone(),
                scheme: opts.scheme.name(),
                dtype: e.dtype.to_string(),
            });
        }
        if let VllmScheme::W4A16 { group_size } = opts.scheme {
            if e.shape[1] % u64::from(group_size) != 0 {
                return Err(VllmFileError::Group { tensor: e.name.clone(), group_size, cols: e.shape[1] });
            }
        }
    }
    Ok(())
}

/// Writes the vLLM checkpoint of the Hugging Face folder `src_dir` into `dst_dir`.
pub async fn write_vllm_checkpoint(
    src_dir: &Location,
    dst_dir: &Location,
    opts: &VllmOptions,
) -> Result<VllmWritten, VllmFileError> {
    let src = TensorSource::open(src_dir).await?;
    preflight(&src, src_dir, opts)?;
    let Some(model) = src.safetensors() else {
        return Err(VllmFileError::NotHf { file: src_dir.to_string(), format: src.format().name() });
    };
    let mut config = src.metadata();
    let cast_to = config_dtype(&config)?;
    let mtp = copies_mtp(&src, opts);
    let left = left_alone(&src, opts)?;
    let mut files = Vec::new();
    let mut quantized = Vec::new();
    let mut all_descs: Vec<(String, StTensorDesc)> = Vec::new();
    let mut buf = Vec::new();
    for (blob, header) in &model.files {
        let mut descs = Vec::new();
        let file_pieces: Vec<Piece> =
            header.tensors.iter().map(|t| split(&src, t, kept(&src, opts))).collect::<Result<Vec<_>, _>>()?.concat();
        for p in &file_pieces {
            let scheme = is_target(&p.name, &p.shape, &left).then_some(opts.scheme);
            descs.extend(outputs(&p.name, &p.shape, saved_dtype(p, opts.like, cast_to, mtp), scheme));
        }
        let metadata: Vec<(String, String)> = header.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let file_name = blob.location().file_name().to_string();
        let target = dst_dir.child(&file_name)?;
        let mut w = SafetensorsWriter::create(&target, &descs, &metadata, opts.overwrite).await?;
        for p in &file_pieces {
            let to = saved_dtype(p, opts.like, cast_to, mtp);
            if is_target(&p.name, &p.shape, &left) {
                quantize_tensor(&src, p, opts, &mut w).await?;
                quantized.push(p.name.trim_end_matches(".weight").to_string());
            } else if to != p.dtype || !p.is_whole() {
                cast_tensor(&src, p, to, opts.budget, &mut w).await?;
            } else {
                copy_tensor(&src, &p.name, opts.budget, &mut buf, &mut w).await?;
            }
        }
        files.push(w.finish().await?);
        all_descs.extend(descs.into_iter().map(|d| (file_name.clone(), d)));
    }
    if model.files.len() > 1 {
        files.push(write_index(dst_dir, &all_descs, opts.overwrite).await?);
    }
    // oneshot lists the Linear modules it left (lm_head, even when tied and absent from the files; a pattern's
    // matches by name); model_free_ptq the entries it was told to leave, patterns as written, which must include the
    // token embedding (it targets weights by name).
    let ignore: Vec<String> = match opts.like {
        Anchor::Oneshot => oneshot_ignore(&src, &left, mtp)?,
        Anchor::ModelFree => src
            .tensors()
            .iter()
            .filter_map(|e| e.name.strip_suffix(".weight").filter(|m| m.rsplit('.').next() == Some("embed_tokens")))
            .map(str::to_string)
            .chain(left.entries().iter().map(|e| e.text().to_string()))
            .collect(),
    };
    let present = src_dir.list().await.unwrap_or_default();
    for name in CARRIED_FILES.iter().filter(|n| present.iter().any(|p| p == *n)) {
        let blob = Blob::open(&src_dir.child(name)?).await?;
        let bytes = blob.read_vec(0, blob.len()).await?;
        files.push(write_file(dst_dir, name, &bytes, opts.overwrite).await?);
    }
    // Last: a folder that has its config.json is whole (what the farm's executor takes for a finished output).
    config.insert("quantization_config".into(), opts.scheme.quantization_config(&ignore));
    let text = serde_json::to_string_pretty(&Json::Object(sorted(config))).expect("JSON serializes") + "\n";
    files.push(write_file(dst_dir, "config.json", text.as_bytes(), opts.overwrite).await?);
    Ok(VllmWritten { files, quantized })
}

/// oneshot adds the symmetric zero point (+0) to each scaled weight before the e4m3 cast
/// (`forward_helpers.py::_quantize`: `scaled += zero_point`, then clamp, then round): a quotient of exactly -0.0 (a
/// -0.0 weight) becomes +0, while a tiny negative one stays negative and rounds to e4m3's -0 (0x80), as
/// model_free_ptq, which adds no zero point, leaves every -0.
fn oneshot_zero_point(row: &[f32], codes: &mut [u8]) {
    for (w, b) in row.iter().zip(codes.iter_mut()) {
        if *w == 0.0 && w.is_sign_negative() {
            *b = 0x00;
        }
    }
}

/// One weight row (bf16 values) quantized by the scheme: its codes into `codes` (FP8: one byte a weight; W4A16: the
/// packed words' little-endian bytes) and its scales' bf16 bytes into `scale_bytes` (one, or one per group).
fn quantize_row(row: &[f32], opts: &VllmOptions, codes: &mut [u8], scale_bytes: &mut [u8]) {
    match opts.scheme {
        VllmScheme::Fp8Dynamic => {
            let s = ct::fp8_row_scale(row);
            scale_bytes.copy_from_slice(&ct::bf16_bits(s).to_le_bytes());
            ct::fp8_row(row, s, codes);
            if opts.like == Anchor::Oneshot {
                oneshot_zero_point(row, codes);
            }
        }
        VllmScheme::W4A16 { group_size } => {
            let mut ints = vec![0i8; row.len()];
            let groups = row.chunks_exact(group_size as usize).zip(ints.chunks_exact_mut(group_size as usize));
            for ((group, q), sb) in groups.zip(scale_bytes.chunks_exact_mut(2)) {
                let s = ct::int4_group_scale(group);
                sb.copy_from_slice(&ct::bf16_bits(s).to_le_bytes());
                for (x, v) in group.iter().zip(q.iter_mut()) {
                    *v = ct::int4_value(*x, s);
                }
            }
            let mut words = vec![0i32; codes.len() / 4];
            ct::pack_int4_row(&ints, &mut words);
            for (w, b) in words.iter().zip(codes.chunks_exact_mut(4)) {
                b.copy_from_slice(&w.to_le_bytes());
            }
        }
    }
}

/// Quantizes weight `piece` (`[out, in]` bf16) into `w`: its codes row piece by row piece, then its scales (and for
/// W4A16 its shape).
async fn quantize_tensor(
    src: &TensorSource,
    piece: &Piece,
    opts: &VllmOptions,
    w: &mut SafetensorsWriter,
) -> Result<(), VllmFileError> {
    let (name, shape) = (piece.name.as_str(), piece.shape.as_slice());
    let (rows, cols) = (shape[0], shape[1] as usize);
    let per_piece = (opts.budget / (cols as u64 * 4)).clamp(1, rows);
    // Each row's codes and scale bytes: rows are independent, so a piece's rows are quantized in parallel (rayon)
    // straight into their places; the bytes do not depend on the threads.
    let (row_codes, row_scales) = match opts.scheme {
        VllmScheme::Fp8Dynamic => (cols, 2),
        VllmScheme::W4A16 { group_size } => (ct::packed_words(cols) * 4, cols / group_size as usize * 2),
    };
    let mut values = Vec::new();
    let mut scratch = Vec::new();
    let mut scales: Vec<u8> = Vec::new();
    let mut out: Vec<u8> = Vec::new();
    let mut first = 0;
    while first < rows {
        let n = per_piece.min(rows - first);
        values.resize(n as usize * cols, 0.0);
        src.read_f32_rows(&piece.source, piece.first_row + first, &mut values, &mut scratch).await?;
        if let Some(r) = values.chunks_exact(cols).position(|row| row.iter().any(|x| !x.is_finite())) {
            return Err(VllmFileError::NotFinite { tensor: name.to_string(), row: first + r as u64 });
        }
        out.resize(n as usize * row_codes, 0);
        let start = scales.len();
        scales.resize(start + n as usize * row_scales, 0);
        values
            .par_chunks_exact(cols)
            .zip(out.par_chunks_exact_mut(row_codes))
            .zip(scales[start..].par_chunks_exact_mut(row_scales))
            .for_each(|((row, codes), scale_bytes)| quantize_row(row, opts, codes, scale_bytes));
        w.write(&out).await?;
        first += n;
    }
    w.write(&scales).await?;
    if let VllmScheme::W4A16 { .. } = opts.scheme {
        let shape_bytes: Vec<u8> = [rows as i64, cols as i64].iter().flat_map(|v| v.to_le_bytes()).collect();
        w.write(&shape_bytes).await?;
    }
    Ok(())
}

/// Writes floating `piece` cast to `to` (round to nearest even, as torch's `.to()`; its own dtype: the same values),
/// row piece by row piece.
async fn cast_tensor(
    src: &TensorSource,
    piece: &Piece,
    to: Dtype,
    budget: u64,
    w: &mut SafetensorsWriter,
) -> Result<(), VllmFileError> {
    let cols = piece.shape.last().copied().unwrap_or(1).max(1);
    let rows = piece.rows();
    let per_piece = (budget / (cols * 4)).clamp(1, rows.max(1));
    let (mut values, mut scratch, mut out) = (Vec::new(), Vec::new(), Vec::new());
    let mut first = 0;
    while first < rows {
        let n = per_piece.min(rows - first);
        values.resize((n * cols) as usize, 0.0);
        src.read_f32_rows(&piece.source, piece.first_row + first, &mut values, &mut scratch).await?;
        out.clear();
        for &x in &values {
            match to {
                Dtype::BF16 => out.extend_from_slice(&ct::bf16_bits(x).to_le_bytes()),
                Dtype::F16 => out.extend_from_slice(&crate::float::f32_to_f16_bits(x).to_le_bytes()),
                Dtype::F32 => out.extend_from_slice(&x.to_le_bytes()),
                other => return Err(VllmFileError::ConfigDtype { dtype: other.to_string() }),
            }
        }
        w.write(&out).await?;
        first += n;
    }
    Ok(())
}

/// `model.safetensors.index.json` for the tensors written, each with its file.
pub(crate) async fn write_index(
    dir: &Location,
    descs: &[(String, StTensorDesc)],
    overwrite: bool,
) -> Result<Committed, VllmFileError> {
    let weight_map: Map<String, Json> = {
        let mut m: Vec<(&String, &String)> = descs.iter().map(|(f, d)| (&d.name, f)).collect();
        m.sort();
        m.into_iter().map(|(n, f)| (n.clone(), Json::String(f.clone()))).collect()
    };
    let total: u64 = descs.iter().map(|(_, d)| d.nbytes()).sum();
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    let text = serde_json::to_string_pretty(&index).expect("JSON serializes") + "\n";
    Ok(write_file(dir, "model.safetensors.index.json", text.as_bytes(), overwrite).await?)
}

/// A JSON object with its keys sorted (transformers writes `config.json` with `sort_keys=True`).
pub(crate) fn sorted(m: Map<String, Json>) -> Map<String, Json> {
    let mut v: Vec<(String, Json)> = m.into_iter().collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decoder_linears_are_the_targets() {
        let ignore = Ignore::parse(&["lm_head"]).unwrap();
        let two = [8, 8];
        assert!(is_target("model.layers.0.self_attn.q_proj.weight", &two, &ignore));
        assert!(is_target("model.layers.0.mlp.down_proj.weight", &two, &ignore));
        assert!(!is_target("model.layers.0.input_layernorm.weight", &[8], &ignore));
        assert!(!is_target("model.norm.weight", &two, &ignore));
        assert!(!is_target("model.embed_tokens.weight", &two, &ignore));
        assert!(!is_target("lm_head.weight", &two, &ignore));
        assert!(!is_target("model.layers.0.self_attn.q_proj.bias", &[8], &ignore));
    }

    /// Only an exact -0.0 weight turns +0 like oneshot: a tiny negative one rounds to e4m3's -0 in both entry
    /// points (found on a random-weight checkpoint by bench/vllm-vs-llm-compressor; SmolLM2 has neither).
    #[test]
    fn oneshot_turns_only_an_exact_negative_zero_positive() {
        let row = [-0.0f32, -3.52e-7, 0.1875, -0.1875, 0.0];
        let s = ct::fp8_row_scale(&row);
        let mut codes = [0u8; 5];
        ct::fp8_row(&row, s, &mut codes);
        assert_eq!((codes[0], codes[1]), (0x80, 0x80), "model_free_ptq keeps both signs");
        oneshot_zero_point(&row, &mut codes);
        assert_eq!((codes[0], codes[1], codes[4]), (0x00, 0x80, 0x00));
    }
}
