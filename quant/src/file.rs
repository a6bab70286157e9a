//! `llama-quantize` for whole GGUF models: the same output metadata, tensor order, per-tensor types and bytes,
//! streamed tensor by tensor (and row chunk by row chunk) within a memory budget, written through the staged sink.
//! Pipeline of `llama_model_quantize_impl` (`../shared/specs/ggml-llamacpp.md` §3.1).

use quantfarm_tensors::gguf::{split, TensorDesc, Value};
use quantfarm_tensors::write::{copy_tensor, GgufWriter};
use quantfarm_tensors::{Committed, GgmlType, Location, TensorSource};

use crate::ftype::FileType;
use crate::mixture::{self, Choice, ModelFacts};
use crate::QuantError;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(transparent)]
    Tensors(#[from] quantfarm_tensors::Error),
    #[error("{file}: quantize reads GGUF models, this is {format}")]
    NotGguf { file: String, format: &'static str },
    #[error("{file}: metadata {key}: {msg}")]
    Metadata { file: String, key: String, msg: String },
    #[error("tensor {tensor:?}: requantizing from {from} to {to} is disabled (pass --allow-requantize)")]
    Requantize { tensor: String, from: GgmlType, to: GgmlType },
    #[error("tensor {tensor:?}: {ftype} gives it type {ty}, which quantfarm cannot produce yet")]
    Unsupported { tensor: String, ftype: FileType, ty: GgmlType },
    #[error("tensor {tensor:?}: {source}")]
    Quant {
        tensor: String,
        #[source]
        source: QuantError,
    },
}

pub struct Options {
    pub ftype: FileType,
    /// Allow changing the type of tensors that are already quantized (llama-quantize's `--allow-requantize`).
    pub allow_requantize: bool,
    /// Bytes of f32 values (plus their quantized output) held at once.
    pub budget: u64,
    pub overwrite: bool,
}

/// What was written, and the type each tensor got (in file order).
pub struct Quantized {
    pub committed: Committed,
    pub choices: Vec<Choice>,
}

/// The model facts the type rules read, from the first file's metadata and the tensor names.
pub fn model_facts(src: &TensorSource) -> Result<ModelFacts, FileError> {
    let file = src.location().to_string();
    let gguf = src.gguf().ok_or_else(|| FileError::NotGguf { file: file.clone(), format: src.format().name() })?;
    let h = gguf.header();
    let meta_err = |key: &str, msg: &str| FileError::Metadata { file: file.clone(), key: key.into(), msg: msg.into() };
    let arch = h.architecture().ok_or_else(|| meta_err("general.architecture", "missing"))?;
    let int = |key: String| -> Result<Option<i64>, FileError> {
        match h.get(&key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(a.to_json().get(0).and_then(|v| v.as_i64())),
            Some(v) => {
                v.as_u64().map(|x| Some(x as i64)).ok_or_else(|| meta_err(&key, "is not a non-negative integer"))
            }
        }
    };
    let block_count = format!("{arch}.block_count");
    let n_layer = int(block_count.clone())?.ok_or_else(|| meta_err(&block_count, "missing"))?;
    let n_head = int(format!("{arch}.attention.head_count"))?.unwrap_or(1).max(1);
    let n_head_kv = int(format!("{arch}.attention.head_count_kv"))?.unwrap_or(n_head).max(1);
    let names: Vec<&str> = src.tensors().iter().map(|e| e.name.as_str()).collect();
    Ok(ModelFacts {
        n_layer,
        gqa: n_head / n_head_kv,
        tied_embeddings: !names.contains(&"output.weight"),
        n_attention_wv: names.iter().filter(|n| mixture::is_attn_v(n)).count() as i64,
    })
}

/// The output metadata: the input's, without split keys, then `general.quantization_version` and
/// `general.file_type` removed and appended (the C writer's remove-and-append).
fn output_metadata(input: &[(String, Value)], ftype: FileType) -> Vec<(String, Value)> {
    const MOVED: [&str; 2] = ["general.quantization_version", "general.file_type"];
    let mut out: Vec<(String, Value)> = input
        .iter()
        .filter(|(k, _)| ![split::SPLIT_NO, split::SPLIT_COUNT, split::SPLIT_TENSORS_COUNT].contains(&k.as_str()))
        .filter(|(k, _)| !MOVED.contains(&k.as_str()))
        .cloned()
        .collect();
    out.push((MOVED[0].into(), Value::U32(2)));
    out.push((MOVED[1].into(), Value::U32(ftype.id())));
    out
}

fn is_float(t: GgmlType) -> bool {
    matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Quantizes the GGUF model `src` (one file or a split) to `dst` as `llama-quantize SRC DST FTYPE` does.
/// Every decision is checked before anything is written; the file appears only when complete.
pub async fn quantize_gguf(src: &TensorSource, dst: &Location, opts: &Options) -> Result<Quantized, FileError> {
    quantize_part(src, None, dst, opts).await
}

/// Quantizes the tensors of split file `shard` of `src` into `dst`, as split file `shard` of the quantized split
/// model (llama-quantize `--keep-split`): the types are chosen over the whole model — the mixture rules count
/// layers and attention tensors across every file — and the first file carries all metadata followed by the split
/// keys, the others only the split keys. A one-file model is quantized whole. This is the farm's per-shard task.
pub async fn quantize_gguf_shard(
    src: &TensorSource,
    shard: usize,
    dst: &Location,
    opts: &Options,
) -> Result<Quantized, FileError> {
    quantize_part(src, Some(shard), dst, opts).await
}

async fn quantize_part(
    src: &TensorSource,
    shard: Option<usize>,
    dst: &Location,
    opts: &Options,
) -> Result<Quantized, FileError> {
    let facts = model_facts(src)?;
    let gguf = src.gguf().expect("model_facts checked the format");
    let n_shards = gguf.shards.len();
    if let Some(s) = shard {
        if s >= n_shards {
            return Err(FileError::Metadata {
                file: src.location().to_string(),
                key: split::SPLIT_COUNT.into(),
                msg: format!("the model has {n_shards} file(s), there is no split file {}", s + 1),
            });
        }
    }
    let shard = shard.filter(|_| n_shards > 1);
    let infos: Vec<_> = gguf.tensors().map(|t| t.info.clone()).collect();
    let in_part: std::collections::HashSet<&str> =
        gguf.tensors().filter(|t| shard.is_none_or(|s| t.shard == s)).map(|t| t.info.name.as_str()).collect();
    let list: Vec<(String, Vec<u64>, GgmlType)> =
        infos.iter().map(|t| (t.name.clone(), t.dims.clone(), t.ty)).collect();
    let choices: Vec<Choice> = mixture::choose_types(opts.ftype, &facts, &list)
        .into_iter()
        .filter(|c| in_part.contains(c.name.as_str()))
        .collect();

    let mut descs = Vec::with_capacity(choices.len());
    for c in &choices {
        let info = infos.iter().find(|t| t.name == c.name).expect("choices name input tensors");
        if c.ty != info.ty {
            if !is_float(info.ty) && !opts.allow_requantize {
                return Err(FileError::Requantize { tensor: c.name.clone(), from: info.ty, to: c.ty });
            }
            if !crate::supported(c.ty) {
                return Err(FileError::Unsupported { tensor: c.name.clone(), ftype: opts.ftype, ty: c.ty });
            }
        }
        // The C writer stores `ggml_n_dims` dimensions: trailing 1s are dropped.
        let dims = info.dims[..mixture::n_dims(&info.dims).min(info.dims.len())].to_vec();
        descs.push(TensorDesc { name: c.name.clone(), dims, ty: c.ty });
    }

    let metadata = match shard {
        None => output_metadata(&gguf.header().metadata, opts.ftype),
        Some(s) => {
            let split_keys = split::split_metadata(s as u16, n_shards as u16, infos.len() as i32);
            if s == 0 {
                let mut m = output_metadata(&gguf.header().metadata, opts.ftype);
                m.extend(split_keys);
                m
            } else {
                split_keys
            }
        }
    };
    let mut w = GgufWriter::create(dst, 3, &metadata, &descs, opts.overwrite).await?;
    let mut raw = Vec::new();
    let mut values = Vec::new();
    let mut out = Vec::new();
    for (c, d) in choices.iter().zip(&descs) {
        let info = infos.iter().find(|t| t.name == c.name).expect("choices name input tensors");
        let e = src.entry(&c.name)?;
        if c.ty == info.ty {
            copy_tensor(src, &c.name, opts.budget, &mut raw, &mut w).await?;
            continue;
        }
        let row_len = e.row_len() as usize;
        let out_row = c.ty.row_bytes(row_len as u64).expect("types were checked against the row length") as usize;
        let rows_per_step = (opts.budget as usize / (row_len * 4 + out_row).max(1)).max(1) as u64;
        let mut row = 0;
        while row < e.rows() {
            let n = rows_per_step.min(e.rows() - row);
            values.resize(n as usize * row_len, 0f32);
            src.read_f32_rows(&c.name, row, &mut values, &mut raw).await?;
            out.resize(n as usize * out_row, 0u8);
            crate::quantize(c.ty, &values, row_len, None, &mut out)
                .map_err(|source| FileError::Quant { tensor: d.name.clone(), source })?;
            w.write(&out).await?;
            row += n;
        }
    }
    let committed = w.finish().await?;
    Ok(Quantized { committed, choices })
}
