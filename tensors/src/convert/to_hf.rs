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

use super::hf_tokenizer;
use super::mapping::mapping_for_gguf;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::gguf::Value;
use crate::safetensors::{plan_shards, shard_file_name, write_index, StTensorDesc};
use crate::sink::{Committed, StagedSink};
use crate::source::TensorSource;
use crate::store::Location;
use crate::write::{PieceWriter, SafetensorsWriter};

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
}

/// Everything a GGUF → HF (or MLX → HF) conversion writes besides tensor bytes.
#[derive(Debug)]
pub struct HfPlan {
    pub config: Map<String, Json>,
    /// Sorted by name, as `save_pretrained` orders them.
    pub tensors: Vec<HfTensor>,
    /// Files rebuilt from the source (a GGUF's tokenizer.json and tokenizer_config.json), written as pretty JSON.
    pub json_files: Vec<(String, Json)>,
    /// Files of the source folder copied as they are (an MLX checkpoint's tokenizer and generation files).
    pub carried: Vec<String>,
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
pub fn plan_gguf_to_hf(src: &TensorSource, dtype: Dtype) -> Result<HfPlan> {
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

    let mut config = Map::new();
    config.insert("architectures".into(), Json::Array(vec![m.hf_architectures[0].clone().into()]));
    config.insert("model_type".into(), hc.model_type.clone().into());
    for (field, key) in &hc.fields {
        let (Some(field), Some(key)) = (field.as_str(), key.as_str()) else {
            return Err(Error::Mapping {
                file: m.file.clone(),
                msg: "hf_config.fields maps names to GGUF keys".into(),
            });
        };
        let key = key.replace("{arch}", &arch);
        match get(&key).and_then(value_json) {
            Some(v) => {
                config.insert(field.to_string(), v);
            }
            None if hc.required.iter().any(|r| r == field) => {
                return Err(Error::format(&file, &key, format!("missing: config.json needs it for {field}")))
            }
            None => {}
        }
    }
    for (field, v) in &hc.literals {
        let field = field.as_str().ok_or_else(|| Error::Mapping {
            file: m.file.clone(),
            msg: "hf_config.literals maps names to values".into(),
        })?;
        let v = serde_json::to_value(v).map_err(|e| Error::Mapping { file: m.file.clone(), msg: e.to_string() })?;
        config.insert(field.to_string(), v);
    }

    let mut tensors = Vec::new();
    let mut has_output = false;
    for t in model.tensors() {
        let info = t.info;
        let u = m.unmap_tensor(&info.name)?;
        has_output |= u.hf == "lm_head.weight";
        let shape: Vec<u64> = info.dims.iter().rev().copied().collect();
        let unpermute_heads = match u.permute {
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
        tensors.push(HfTensor {
            name: u.hf,
            source: info.name.clone(),
            shape,
            dtype,
            unpermute_heads,
            offset: u.offset,
        });
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = tensors.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(Error::format(&file, &w[0].source, format!("and {} both map to {}", w[1].source, w[0].name)));
    }

    let (tokenizer_json, tokenizer_config) = hf_tokenizer::rebuild(kv, &file)?;
    let vocab = match get("tokenizer.ggml.tokens") {
        Some(Value::Array(a)) => Some(a.len() as u64),
        _ => None,
    };
    let embd_rows = tensors.iter().find(|t| t.source == "token_embd.weight").and_then(|t| t.shape.first().copied());
    if let Some(v) = vocab.or(embd_rows) {
        config.insert("vocab_size".into(), v.into());
    }
    config.insert("tie_word_embeddings".into(), (!has_output).into());
    config.insert("torch_dtype".into(), dtype_name(dtype).into());
    let json_files =
        vec![("tokenizer.json".to_string(), tokenizer_json), ("tokenizer_config.json".to_string(), tokenizer_config)];
    Ok(HfPlan { config, tensors, json_files, carried: Vec::new() })
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
            crate::dtype::TensorType::Dtype(d) => d,
            crate::dtype::TensorType::Ggml(g) => {
                return Err(Error::format(&file, &t.name, format!("a {g} tensor in an MLX checkpoint")))
            }
        };
        let name = WRAPPER_PREFIXES.iter().find_map(|p| t.name.strip_prefix(p)).unwrap_or(&t.name).to_string();
        tensors.push(HfTensor {
            name,
            source: t.name.clone(),
            shape: t.shape.clone(),
            dtype,
            unpermute_heads: None,
            offset: None,
        });
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
        carried: crate::mlx::CARRIED_FILES.map(String::from).to_vec(),
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
    let plan = plan_gguf_to_hf(&source, dtype)?;
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
        for t in &plan.tensors[range.clone()] {
            write_hf_tensor(source, t, budget, &mut w).await?;
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
    let present = if plan.carried.is_empty() { Vec::new() } else { source.location().list().await? };
    for name in plan.carried.iter().filter(|n| present.contains(n)) {
        let blob = crate::blob::Blob::open(&source.location().child(name)?).await?;
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

/// One tensor (to a file, or to a comparison when verifying), whole rows at a time within `budget`: dequantized, unpermuted, offset removed, rounded to the dtype.
pub async fn write_hf_tensor(src: &TensorSource, t: &HfTensor, budget: u64, w: &mut impl PieceWriter) -> Result<()> {
    if let crate::dtype::TensorType::MlxAffine { scale_dtype, .. } = src.entry(&t.source)?.ty {
        if scale_dtype == t.dtype && t.unpermute_heads.is_none() && t.offset.is_none() {
            return write_mlx_dequantized(src, t, budget, w).await;
        }
    }
    let cols = t.shape.last().copied().unwrap_or(1).max(1) as usize;
    let rows = (t.shape.iter().product::<u64>() as usize) / cols;
    // Stored in the output dtype already (a BF16 GGUF going to a BF16 checkpoint): rows are moved as bytes.
    let e = src.entry(&t.source)?;
    let same = t.offset.is_none() && t.dtype.as_ggml().is_some_and(|g| e.ty == crate::dtype::TensorType::Ggml(g));
    // Read and converted (or reordered) bytes; a consumer may widen them to f32 again.
    let per_row = (cols * (4 + t.dtype.size())) as u64;
    let hd = t.unpermute_heads.map(|h| rows as u64 / h);
    // Whole heads per chunk when permuted, so every source row of a chunk is inside it.
    let unit = hd.unwrap_or(1) as usize;
    let step = ((budget / per_row.max(1)) as usize / unit).max(1) * unit;
    let (mut vals, mut ordered, mut bytes, mut scratch) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let row_bytes = cols * t.dtype.size();
    let mut r = 0;
    while r < rows {
        let n = step.min(rows - r);
        // The source row of each output row of this chunk, relative to the chunk.
        let source_row = |k: usize| match hd {
            None => k,
            Some(hd) => (unpermuted_source_row((r + k) as u64, hd) - r as u64) as usize,
        };
        if same {
            scratch.resize(n * row_bytes, 0);
            src.read_range(&t.source, (r * row_bytes) as u64, &mut scratch).await?;
            if hd.is_none() {
                w.write_piece(&scratch).await?;
            } else {
                bytes.clear();
                for k in 0..n {
                    let s = source_row(k);
                    bytes.extend_from_slice(&scratch[s * row_bytes..(s + 1) * row_bytes]);
                }
                w.write_piece(&bytes).await?;
            }
            r += n;
            continue;
        }
        vals.resize(n * cols, 0f32);
        src.read_f32_rows(&t.source, r as u64, &mut vals, &mut scratch).await?;
        let rows_out: &mut [f32] = match hd {
            None => &mut vals,
            Some(_) => {
                ordered.clear();
                for k in 0..n {
                    let s = source_row(k);
                    ordered.extend_from_slice(&vals[s * cols..(s + 1) * cols]);
                }
                &mut ordered
            }
        };
        if let Some(o) = t.offset {
            rows_out.iter_mut().for_each(|x| *x -= o);
        }
        bytes.clear();
        super::transform::encode_f32(rows_out, t.dtype, &mut bytes);
        w.write_piece(&bytes).await?;
        r += n;
    }
    Ok(())
}

/// An MLX affine tensor dequantized in its scales' dtype as `mx.dequantize` computes it, whole rows at a time.
async fn write_mlx_dequantized(src: &TensorSource, t: &HfTensor, budget: u64, w: &mut impl PieceWriter) -> Result<()> {
    let e = src.entry(&t.source)?;
    let crate::dtype::TensorType::MlxAffine { bits, group_size, scale_dtype } = e.ty else {
        return Err(Error::format(src.location().to_string(), &t.source, "is not MLX affine"));
    };
    let cols = e.row_len().max(1);
    let step = (budget / (cols * (4 + scale_dtype.size() as u64))).max(1);
    let (mut codes, mut scales, mut biases, mut out) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut r = 0;
    while r < e.rows() {
        let n = step.min(e.rows() - r);
        src.read_affine_rows(&t.source, r, n, &mut codes, &mut scales, &mut biases).await?;
        out.clear();
        crate::dequant::dequantize_mlx_affine_as(
            u32::from(bits),
            group_size as usize,
            &codes,
            &scales,
            &biases,
            scale_dtype,
            &mut out,
        )?;
        w.write_piece(&out).await?;
        r += n;
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
    fn f32_metadata_reads_back_short() {
        // The f64 is the decimal's, not the f32's widening (9.999999747378752e-06).
        assert_eq!(value_json(&Value::F32(1e-5)).unwrap().as_f64(), Some(1e-5));
        assert_eq!(value_json(&Value::F32(100000.0)).unwrap().as_f64(), Some(100000.0));
        assert_eq!(value_json(&Value::U32(7)).unwrap(), Json::from(7));
    }
}
