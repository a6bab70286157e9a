//! A compressed-tensors checkpoint for vLLM (what `vllm_file` and llm-compressor write) read back as the bf16
//! Hugging Face checkpoint its quantized weights stand for: every quantized module's weight dequantized as
//! compressed-tensors' decompressor does it when transformers loads the checkpoint (`compressed_tensors::fp8_dequant`,
//! `int4_dequant`: the code times its scale, rounded to bf16), every other tensor copied. What llama.cpp then runs
//! is the rung's weights with 16-bit activations: vLLM's weight-only path (W4A16 always; FP8 where the GPU has no
//! FP8 matmul, or on CPU), not its FP8 W8A8 one.
//!
//! Read from `config.json`'s `quantization_config`: `quant_method: compressed-tensors`, status `compressed`, one
//! config group whose weights are `float` 8-bit per `channel` (format `float-quantized`) or symmetric `int` 4-bit per
//! `group` (format `pack-quantized`). Per quantized module `M`, as `vllm_file` describes them: `M.weight` F8_E4M3
//! with `M.weight_scale` `[out, 1]`; or `M.weight_packed` I32, `M.weight_scale` `[out, in/g]`, `M.weight_shape`.

use serde_json::{Map, Value as Json};

use quantfarm_store::{Blob, Committed, Location};
use quantfarm_tensors::mlx::CARRIED_FILES;
use quantfarm_tensors::safetensors::StTensorDesc;
use quantfarm_tensors::write::{copy_tensor, SafetensorsWriter};
use quantfarm_tensors::{Dtype, TensorSource, TensorType};

use crate::compressed_tensors as ct;
use crate::mlx_file::write_file;
use crate::vllm_file::{sorted, write_index, VllmFileError};

/// How a checkpoint's weights are quantized, read from its `quantization_config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compressed {
    /// 8-bit float weights, a scale per output row (FP8_DYNAMIC's).
    Fp8Channel,
    /// Symmetric 4-bit integers, a scale per group of input columns (W4A16's).
    Int4Group,
}

impl Compressed {
    pub fn name(self) -> &'static str {
        match self {
            Compressed::Fp8Channel => "FP8_DYNAMIC: e4m3 weights, a scale per channel",
            Compressed::Int4Group => "W4A16: int4 weights, a scale per group",
        }
    }
}

fn unsupported(key: &str, msg: String) -> VllmFileError {
    VllmFileError::Unsupported { key: format!("quantization_config.{key}"), msg }
}

/// The scheme of a checkpoint whose `config.json` is `config`: `None` when it has no compressed-tensors
/// `quantization_config` (an unquantized checkpoint, or another library's quantization).
pub fn compressed(config: &Map<String, Json>) -> Result<Option<Compressed>, VllmFileError> {
    let Some(q) = config.get("quantization_config").and_then(Json::as_object) else { return Ok(None) };
    if q.get("quant_method").and_then(Json::as_str) != Some("compressed-tensors") {
        return Ok(None);
    }
    let status = q.get("quantization_status").and_then(Json::as_str).unwrap_or("compressed");
    if status != "compressed" {
        return Err(unsupported("quantization_status", format!("{status:?}: only compressed checkpoints are read")));
    }
    let groups = q.get("config_groups").and_then(Json::as_object).map_or(0, Map::len);
    let Some((name, group)) = q.get("config_groups").and_then(Json::as_object).and_then(|g| g.iter().next()) else {
        return Err(unsupported("config_groups", "names no group".into()));
    };
    if groups != 1 {
        return Err(unsupported("config_groups", format!("{groups} groups: one scheme per checkpoint is read")));
    }
    let w = group
        .get("weights")
        .and_then(Json::as_object)
        .ok_or_else(|| unsupported(&format!("config_groups.{name}.weights"), "is not an object".into()))?;
    let field = |k: &str| w.get(k).cloned().unwrap_or(Json::Null);
    let key = format!("config_groups.{name}.weights");
    match (field("type").as_str(), field("num_bits").as_u64(), field("strategy").as_str()) {
        (Some("float"), Some(8), Some("channel")) => Ok(Some(Compressed::Fp8Channel)),
        (Some("int"), Some(4), Some("group")) if field("symmetric") == Json::Bool(true) => {
            Ok(Some(Compressed::Int4Group))
        }
        (t, b, s) => Err(unsupported(
            &key,
            format!(
                "type {t:?}, {b:?} bits, strategy {s:?}: read are float 8-bit per channel (FP8_DYNAMIC) and \
                 symmetric int 4-bit per group (W4A16)"
            ),
        )),
    }
}

/// One quantized module of the checkpoint, found by its tensors.
struct Module {
    name: String,
    rows: u64,
    cols: u64,
    /// Input columns per scale (the whole row for a channel scale).
    group: u64,
}

impl Module {
    /// Its stored tensors: what the dequantized weight replaces.
    fn stored(&self, scheme: Compressed) -> Vec<String> {
        let m = &self.name;
        match scheme {
            Compressed::Fp8Channel => vec![format!("{m}.weight"), format!("{m}.weight_scale")],
            Compressed::Int4Group => {
                vec![format!("{m}.weight_packed"), format!("{m}.weight_scale"), format!("{m}.weight_shape")]
            }
        }
    }
}

/// The quantized module whose codes are `tensor` (`M.weight` of F8_E4M3, `M.weight_packed`), if it is one, checked
/// against `scheme`'s layout.
async fn module_of(src: &TensorSource, tensor: &str, scheme: Compressed) -> Result<Option<Module>, VllmFileError> {
    let codes = match scheme {
        Compressed::Fp8Channel => ".weight",
        Compressed::Int4Group => ".weight_packed",
    };
    let Some(module) = tensor.strip_suffix(codes) else { return Ok(None) };
    let weight = src.entry(tensor)?;
    if scheme == Compressed::Fp8Channel && weight.ty != TensorType::Dtype(Dtype::F8E4M3) {
        // An unquantized weight (lm_head, a norm, the embedding).
        return Ok(None);
    }
    let bad = |t: &str, msg: String| VllmFileError::Layout { tensor: t.to_string(), msg };
    let scale_name = format!("{module}.weight_scale");
    let scale = src.entry(&scale_name).map_err(|_| bad(tensor, format!("has no {scale_name}")))?;
    if !matches!(scale.ty, TensorType::Dtype(Dtype::BF16 | Dtype::F16 | Dtype::F32)) {
        return Err(bad(&scale_name, format!("is {}, a scale is BF16, F16 or F32", scale.ty)));
    }
    let (rows, cols) = match scheme {
        Compressed::Fp8Channel => match weight.shape[..] {
            [rows, cols] => (rows, cols),
            _ => return Err(bad(tensor, format!("shape {:?}, expected [out, in]", weight.shape))),
        },
        Compressed::Int4Group => {
            let shape_name = format!("{module}.weight_shape");
            let shape = src.entry(&shape_name).map_err(|_| bad(tensor, format!("has no {shape_name}")))?;
            if shape.ty != TensorType::Dtype(Dtype::I64) || shape.shape != [2] {
                return Err(bad(&shape_name, format!("is {} {:?}, expected I64 [2]", shape.ty, shape.shape)));
            }
            let mut raw = [0u8; 16];
            src.read_range(&shape_name, 0, &mut raw).await?;
            let dim = |i: usize| i64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            let (rows, cols) = (dim(0), dim(1));
            let words = (cols.max(0) as u64).div_ceil(8);
            if rows <= 0
                || cols <= 0
                || weight.ty != TensorType::Dtype(Dtype::I32)
                || weight.shape != [rows as u64, words]
            {
                return Err(bad(
                    tensor,
                    format!(
                        "is {} {:?}, expected I32 [{rows}, {words}] for a weight of {rows}×{cols}",
                        weight.ty, weight.shape
                    ),
                ));
            }
            (rows as u64, cols as u64)
        }
    };
    let groups = match scale.shape[..] {
        [r, g] if r == rows && g > 0 && cols % g == 0 => g,
        _ => {
            return Err(bad(
                &scale_name,
                format!("shape {:?} does not divide a weight of {rows}×{cols} into groups", scale.shape),
            ))
        }
    };
    if scheme == Compressed::Fp8Channel && groups != 1 {
        return Err(bad(&scale_name, format!("shape {:?}, expected [{rows}, 1] (a scale per channel)", scale.shape)));
    }
    Ok(Some(Module { name: module.to_string(), rows, cols, group: cols / groups }))
}

/// Each logical tensor of a compressed-tensors checkpoint as (type, weights, stored bytes): a quantized module's
/// tensors as one, typed by its scheme (`FP8_E4M3_CHANNEL`, `INT4_G64`), its scales' and shape's bytes counted with
/// its codes (so bits per weight are the rung's, as MLX's `MLX_Q4_G64` counts its scales); every other tensor as
/// stored. What the report's type mix and size columns sum.
pub async fn type_mix(src: &TensorSource) -> Result<Vec<(String, u64, u64)>, VllmFileError> {
    let Some(scheme) = compressed(&src.metadata())? else {
        return Ok(src.tensors().iter().map(|e| (e.ty.to_string(), e.elements(), e.bytes)).collect());
    };
    let mut modules = Vec::new();
    for e in src.tensors() {
        if let Some(m) = module_of(src, &e.name, scheme).await? {
            modules.push(m);
        }
    }
    let mut stored = std::collections::HashSet::new();
    let mut out = Vec::new();
    for m in &modules {
        let bytes: u64 = m.stored(scheme).iter().map(|t| src.entry(t).map_or(0, |e| e.bytes)).sum();
        stored.extend(m.stored(scheme));
        let ty = match scheme {
            Compressed::Fp8Channel => "FP8_E4M3_CHANNEL".to_string(),
            Compressed::Int4Group => format!("INT4_G{}", m.group),
        };
        out.push((ty, m.rows * m.cols, bytes));
    }
    out.extend(
        src.tensors().iter().filter(|e| !stored.contains(&e.name)).map(|e| (e.ty.to_string(), e.elements(), e.bytes)),
    );
    Ok(out)
}

/// What was written.
#[derive(Debug)]
pub struct Dequantized {
    pub files: Vec<Committed>,
    pub scheme: Compressed,
    /// The modules dequantized.
    pub modules: usize,
}

/// Writes the bf16 Hugging Face checkpoint the compressed-tensors checkpoint `src_dir` stands for into `dst_dir`
/// (see the module's overview): each file holds what it held, the quantized modules' tensors replaced by their bf16
/// weight; `config.json` without its `quantization_config`, written last; the tokenizer files copied.
pub async fn dequantize_vllm_checkpoint(
    src_dir: &Location,
    dst_dir: &Location,
    budget: u64,
    overwrite: bool,
) -> Result<Dequantized, VllmFileError> {
    let src = TensorSource::open(src_dir).await?;
    let mut config = src.metadata();
    let Some(scheme) = compressed(&config)? else {
        return Err(VllmFileError::NotCompressed { file: format!("{src_dir}/config.json") });
    };
    let Some(model) = src.safetensors() else {
        return Err(VllmFileError::NotHf { file: src_dir.to_string(), format: src.format().name() });
    };
    let (mut files, mut all_descs, mut buf) = (Vec::new(), Vec::new(), Vec::new());
    let mut modules = 0;
    for (blob, header) in &model.files {
        let mut plan: Vec<(StTensorDesc, Option<Module>)> = Vec::new();
        let mut replaced: Vec<String> = Vec::new();
        for t in &header.tensors {
            if let Some(m) = module_of(&src, &t.name, scheme).await? {
                replaced.extend(m.stored(scheme));
                let desc = StTensorDesc {
                    name: format!("{}.weight", m.name),
                    dtype: Dtype::BF16,
                    shape: vec![m.rows, m.cols],
                };
                plan.push((desc, Some(m)));
            } else {
                plan.push((StTensorDesc { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone() }, None));
            }
        }
        // A module's other tensors are left out wherever they stand in the file (its codes stand for them).
        plan.retain(|(d, m)| m.is_some() || !replaced.contains(&d.name));
        let descs: Vec<StTensorDesc> = plan.iter().map(|(d, _)| d.clone()).collect();
        let metadata: Vec<(String, String)> = header.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let file_name = blob.location().file_name().to_string();
        let mut w = SafetensorsWriter::create(&dst_dir.child(&file_name)?, &descs, &metadata, overwrite).await?;
        for (desc, module) in &plan {
            match module {
                Some(m) => {
                    dequantize_module(&src, m, scheme, budget, &mut w).await?;
                    modules += 1;
                }
                None => copy_tensor(&src, &desc.name, budget, &mut buf, &mut w).await?,
            }
        }
        files.push(w.finish().await?);
        all_descs.extend(descs.into_iter().map(|d| (file_name.clone(), d)));
    }
    if model.files.len() > 1 {
        files.push(write_index(dst_dir, &all_descs, overwrite).await?);
    }
    let present = src_dir.list().await.unwrap_or_default();
    for name in CARRIED_FILES.iter().filter(|n| present.iter().any(|p| p == *n)) {
        let blob = Blob::open(&src_dir.child(name)?).await?;
        let bytes = blob.read_vec(0, blob.len()).await?;
        files.push(write_file(dst_dir, name, &bytes, overwrite).await?);
    }
    config.remove("quantization_config");
    let text = serde_json::to_string_pretty(&Json::Object(sorted(config))).expect("JSON serializes") + "\n";
    files.push(write_file(dst_dir, "config.json", text.as_bytes(), overwrite).await?);
    Ok(Dequantized { files, scheme, modules })
}

/// Writes module `m`'s bf16 weight into `w`: its scales read whole (one per row, or `cols/group` per row), then its
/// codes row piece by row piece within `budget`.
async fn dequantize_module(
    src: &TensorSource,
    m: &Module,
    scheme: Compressed,
    budget: u64,
    w: &mut SafetensorsWriter,
) -> Result<(), VllmFileError> {
    let scale_name = format!("{}.weight_scale", m.name);
    let n_scales = (m.rows * (m.cols / m.group)) as usize;
    let mut scales = vec![0f32; n_scales];
    src.read_f32_rows(&scale_name, 0, &mut scales, &mut Vec::new()).await?;
    let (codes_name, code_row) = match scheme {
        Compressed::Fp8Channel => (format!("{}.weight", m.name), m.cols),
        Compressed::Int4Group => (format!("{}.weight_packed", m.name), ct::packed_words(m.cols as usize) as u64 * 4),
    };
    let cols = m.cols as usize;
    let groups = cols / m.group as usize;
    let per_piece = (budget / (code_row + m.cols * 2).max(1)).clamp(1, m.rows);
    let (mut codes, mut out, mut ints) = (Vec::new(), Vec::new(), vec![0i8; cols]);
    let mut first = 0;
    while first < m.rows {
        let n = per_piece.min(m.rows - first);
        codes.resize((n * code_row) as usize, 0);
        src.read_range(&codes_name, first * code_row, &mut codes).await?;
        out.clear();
        for (r, row) in codes.chunks_exact(code_row as usize).enumerate() {
            let row_scales = &scales[(first as usize + r) * groups..][..groups];
            match scheme {
                Compressed::Fp8Channel => {
                    out.extend(row.iter().flat_map(|&b| ct::fp8_dequant(b, row_scales[0]).to_le_bytes()));
                }
                Compressed::Int4Group => {
                    let words: Vec<i32> =
                        row.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                    ct::unpack_int4_row(&words, cols, &mut ints);
                    let g = m.group as usize;
                    out.extend(
                        ints.iter()
                            .enumerate()
                            .flat_map(|(c, &q)| ct::int4_dequant(q, row_scales[c / g]).to_le_bytes()),
                    );
                }
            }
        }
        w.write(&out).await?;
        first += n;
    }
    Ok(())
}
