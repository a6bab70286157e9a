//! The one way to read tensors: [`TensorSource`] opens a GGUF (single or split), a safetensors file or folder, or
//! an MLX folder at any [`Location`], lists tensors from headers only, and reads byte ranges or dequantized rows
//! into caller-owned buffers sized to a memory budget.

use serde_json::{Map, Value as Json};

use crate::dequant;
use crate::dtype::{Dtype, TensorType};
use crate::error::{Error, Result};
use crate::gguf::GgufModel;
use crate::mlx::{self, MlxModel, MlxParts};
use crate::safetensors::SafetensorsModel;
use quantfarm_store::Blob;
use quantfarm_store::Location;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Gguf,
    Safetensors,
    Mlx,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Gguf => "gguf",
            Format::Safetensors => "safetensors",
            Format::Mlx => "mlx",
        }
    }
}

/// A tensor as listed by any format.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    pub ty: TensorType,
    /// Outermost dimension first (numpy order; a GGUF `ne` reversed).
    pub shape: Vec<u64>,
    /// Stored bytes (for MLX affine: codes + scales + biases).
    pub bytes: u64,
    /// Smallest unit a read may start and end on (a GGUF block, an element, an MLX row).
    pub(crate) unit: u64,
    /// Bytes of one row (the innermost dimension).
    pub(crate) row_bytes: u64,
}

impl TensorEntry {
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// The innermost dimension.
    pub fn row_len(&self) -> u64 {
        self.shape.last().copied().unwrap_or(1)
    }

    pub fn rows(&self) -> u64 {
        self.elements() / self.row_len().max(1)
    }

    /// Stored bytes of one row, the stride of [`TensorSource::read_range`] over rows.
    pub fn row_bytes(&self) -> u64 {
        self.row_bytes
    }
}

enum Inner {
    Gguf(GgufModel),
    /// A safetensors file or folder, with the folder's `config.json` when it has one.
    Safetensors(SafetensorsModel, Option<Map<String, Json>>),
    Mlx(MlxModel),
}

pub struct TensorSource {
    location: Location,
    inner: Inner,
    entries: Vec<TensorEntry>,
}

impl TensorSource {
    /// Opens whatever model is at `loc`: a folder is MLX when its config has `quantization` or its weights say
    /// `format: mlx`, else a safetensors checkpoint; a file is GGUF when it starts with the GGUF magic, else
    /// safetensors.
    pub async fn open(loc: &Location) -> Result<TensorSource> {
        let inner = if loc.is_dir().await? {
            let names = loc.list().await?;
            if names.iter().any(|n| n == mlx::CONFIG_FILE) {
                let config = mlx::read_config(loc).await?;
                let files = SafetensorsModel::open(loc, None).await?;
                if mlx::is_mlx(&config, &files) {
                    Inner::Mlx(MlxModel::from_parts(config, files, &format!("{loc}/{}", mlx::CONFIG_FILE))?)
                } else {
                    Inner::Safetensors(files, Some(config))
                }
            } else {
                Inner::Safetensors(SafetensorsModel::open(loc, None).await?, None)
            }
        } else {
            let blob = Blob::open(loc).await?;
            let mut magic = [0u8; 4];
            if blob.len() >= 4 {
                blob.read_at(0, &mut magic).await?;
            }
            if &magic == b"GGUF" || loc.file_name().ends_with(".gguf") {
                Inner::Gguf(GgufModel::open(loc).await?)
            } else {
                Inner::Safetensors(SafetensorsModel::open(loc, None).await?, None)
            }
        };
        let entries = list(&inner);
        Ok(TensorSource { location: loc.clone(), inner, entries })
    }

    /// Opens the GGUF model at `loc` (a single file or the first of a split set), reading each file for which
    /// `resolve` (given its name) returns a location from there: see [`GgufModel::open_resolved`].
    pub async fn open_gguf_resolved(
        loc: &Location,
        resolve: &(dyn Fn(&str) -> Option<Location> + Sync),
    ) -> Result<TensorSource> {
        let inner = Inner::Gguf(GgufModel::open_resolved(loc, resolve).await?);
        let entries = list(&inner);
        Ok(TensorSource { location: loc.clone(), inner, entries })
    }

    pub fn location(&self) -> &Location {
        &self.location
    }

    pub fn format(&self) -> Format {
        match self.inner {
            Inner::Gguf(_) => Format::Gguf,
            Inner::Safetensors(..) => Format::Safetensors,
            Inner::Mlx(_) => Format::Mlx,
        }
    }

    pub fn gguf(&self) -> Option<&GgufModel> {
        match &self.inner {
            Inner::Gguf(m) => Some(m),
            _ => None,
        }
    }

    pub fn mlx(&self) -> Option<&MlxModel> {
        match &self.inner {
            Inner::Mlx(m) => Some(m),
            _ => None,
        }
    }

    pub fn safetensors(&self) -> Option<&SafetensorsModel> {
        match &self.inner {
            Inner::Safetensors(m, _) => Some(m),
            Inner::Mlx(m) => Some(&m.files),
            Inner::Gguf(_) => None,
        }
    }

    /// Every file the model is made of.
    pub fn files(&self) -> Vec<&Blob> {
        match &self.inner {
            Inner::Gguf(m) => m.shards.iter().map(|(b, _)| b).collect(),
            Inner::Safetensors(m, _) => m.files.iter().map(|(b, _)| b).collect(),
            Inner::Mlx(m) => m.files.files.iter().map(|(b, _)| b).collect(),
        }
    }

    pub fn tensors(&self) -> &[TensorEntry] {
        &self.entries
    }

    pub fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.entries
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| Error::NoSuchTensor { file: self.location.to_string(), name: name.to_string() })
    }

    /// The architecture named by the metadata (`general.architecture`, or a config's `model_type`).
    pub fn architecture(&self) -> Option<String> {
        let model_type = |c: &Map<String, Json>| c.get("model_type").and_then(Json::as_str).map(str::to_string);
        match &self.inner {
            Inner::Gguf(m) => m.header().architecture().map(str::to_string),
            Inner::Mlx(m) => model_type(&m.config),
            Inner::Safetensors(_, config) => config.as_ref().and_then(model_type),
        }
    }

    /// Model-level metadata as JSON: GGUF key/values, an MLX or HF `config.json`, or a safetensors `__metadata__`.
    pub fn metadata(&self) -> Map<String, Json> {
        match &self.inner {
            Inner::Gguf(m) => m.header().metadata.iter().map(|(k, v)| (k.clone(), v.to_json())).collect(),
            Inner::Safetensors(_, Some(config)) => config.clone(),
            Inner::Safetensors(m, None) => m
                .files
                .iter()
                .flat_map(|(_, h)| h.metadata.iter())
                .map(|(k, v)| (k.clone(), Json::String(v.clone())))
                .collect(),
            Inner::Mlx(m) => m.config.clone(),
        }
    }

    /// Byte ranges that cover tensor `e` in reads of at most `budget` bytes each, each a whole number of rows when
    /// a row fits, else of blocks (elements).
    pub fn chunks(&self, e: &TensorEntry, budget: u64) -> Result<Vec<std::ops::Range<u64>>> {
        let step_unit = if e.row_bytes > 0 && e.row_bytes <= budget { e.row_bytes } else { e.unit };
        if step_unit == 0 || step_unit > budget {
            return Err(Error::Budget {
                file: self.location.to_string(),
                tensor: e.name.clone(),
                msg: format!("its smallest readable unit is {} bytes, more than the budget of {budget}", e.unit),
            });
        }
        let step = budget / step_unit * step_unit;
        let total = self.raw_len(e);
        Ok((0..total.div_ceil(step)).map(|i| i * step..((i + 1) * step).min(total)).collect())
    }

    /// Length of the bytes [`TensorSource::read_range`] serves for `e` (for MLX affine: the codes only).
    fn raw_len(&self, e: &TensorEntry) -> u64 {
        match self.mlx().and_then(|m| m.tensors.iter().find(|t| t.name == e.name)) {
            Some(t) => t.main_part().1.nbytes(),
            None => e.bytes,
        }
    }

    /// Reads bytes `offset..offset + buf.len()` of tensor `name` as stored (for an MLX affine tensor: its packed
    /// codes; use [`TensorSource::read_f32_rows`] for values).
    pub async fn read_range(&self, name: &str, offset: u64, buf: &mut [u8]) -> Result<()> {
        let (blob, start, len) = self.locate(name)?;
        if offset.checked_add(buf.len() as u64).is_none_or(|end| end > len) {
            return Err(Error::Budget {
                file: blob.name().to_string(),
                tensor: name.to_string(),
                msg: format!("bytes {offset}..+{} are outside its {len} bytes", buf.len()),
            });
        }
        blob.read_at(start + offset, buf).await.map_err(Into::into)
    }

    /// (file, absolute start, length) of the stored bytes of `name`.
    pub(crate) fn locate(&self, name: &str) -> Result<(&Blob, u64, u64)> {
        let missing = || Error::NoSuchTensor { file: self.location.to_string(), name: name.to_string() };
        match &self.inner {
            Inner::Gguf(m) => {
                let t = m.tensor(name)?;
                let (blob, h) = &m.shards[t.shard];
                Ok((blob, h.data_offset + t.info.offset, t.info.nbytes()))
            }
            Inner::Safetensors(m, _) => {
                let (f, t) = m.find(name).ok_or_else(missing)?;
                let (blob, h) = &m.files[f];
                Ok((blob, h.data_offset + t.begin, t.nbytes()))
            }
            Inner::Mlx(m) => {
                let t = m.tensors.iter().find(|t| t.name == name).ok_or_else(missing)?;
                let (f, st) = t.main_part();
                let (blob, h) = &m.files.files[f];
                Ok((blob, h.data_offset + st.begin, st.nbytes()))
            }
        }
    }

    /// Reads rows `first_row..first_row + rows` of the MLX quantized tensor `name` as stored: packed codes, scales
    /// and (affine) biases, into `bufs` in that order (each little-endian); returns how many parts it read.
    pub async fn read_quantized_rows(
        &self,
        name: &str,
        first_row: u64,
        rows: u64,
        bufs: &mut [Vec<u8>; 3],
    ) -> Result<usize> {
        let e = self.entry(name)?;
        let not_quantized = || Error::format(self.location.to_string(), name, "is not an MLX quantized tensor");
        let m = self.mlx().ok_or_else(not_quantized)?;
        let parts = m.tensors.iter().find(|t| t.name == name).and_then(|t| t.quantized_parts());
        let parts = parts.ok_or_else(not_quantized)?;
        if first_row + rows > e.rows() {
            return Err(Error::Budget {
                file: self.location.to_string(),
                tensor: name.to_string(),
                msg: format!("rows {first_row}..+{rows} are outside its {} rows", e.rows()),
            });
        }
        for ((part, row_bytes), buf) in parts.iter().zip(bufs.iter_mut()) {
            read_part_rows(m, part, first_row, rows, *row_bytes, buf).await?;
        }
        Ok(parts.len())
    }

    /// Reads rows `first_row..first_row + out.len() / row_len` of tensor `name`, dequantized to f32. `scratch` is
    /// reused between calls to hold the stored bytes.
    pub async fn read_f32_rows(
        &self,
        name: &str,
        first_row: u64,
        out: &mut [f32],
        scratch: &mut Vec<u8>,
    ) -> Result<()> {
        let e = self.entry(name)?;
        let row_len = e.row_len().max(1);
        let rows = out.len() as u64 / row_len;
        if rows * row_len != out.len() as u64 || first_row + rows > e.rows() {
            return Err(Error::Budget {
                file: self.location.to_string(),
                tensor: name.to_string(),
                msg: format!(
                    "{} values from row {first_row} are not whole rows inside its {} rows",
                    out.len(),
                    e.rows()
                ),
            });
        }
        if let Some(t) = self.mlx().and_then(|m| m.tensors.iter().find(|t| t.name == name)) {
            if t.quantized_parts().is_some() {
                let mut bufs = [std::mem::take(scratch), Vec::new(), Vec::new()];
                self.read_quantized_rows(name, first_row, rows, &mut bufs).await?;
                let [codes, s_raw, b_raw] = bufs;
                match &t.parts {
                    MlxParts::Affine { params, scales, .. } => {
                        let s = to_f32(scales.1.dtype, &s_raw, name)?;
                        let b = to_f32(scales.1.dtype, &b_raw, name)?;
                        let (bits, group) = (u32::from(params.bits), params.group_size as usize);
                        dequant::dequantize_mlx_affine(bits, group, &codes, &s, &b, out)?;
                    }
                    MlxParts::Fp { mode, .. } => dequant::dequantize_fp_into(&codes, &s_raw, *mode, out),
                    MlxParts::Plain { .. } => unreachable!("a plain tensor has no quantized parts"),
                }
                *scratch = codes;
                return Ok(());
            }
        }
        scratch.resize((rows * e.row_bytes) as usize, 0);
        self.read_range(name, first_row * e.row_bytes, scratch).await?;
        match e.ty {
            TensorType::Ggml(t) => dequant::dequantize_ggml(t, scratch, out)?,
            TensorType::Dtype(d) => {
                let v = to_f32(d, scratch, name)?;
                out.copy_from_slice(&v);
            }
            TensorType::MlxAffine { .. } | TensorType::MlxFp { .. } => {
                unreachable!("MLX quantized tensors are handled above")
            }
        }
        Ok(())
    }
}

/// Reads `rows` rows of `row_bytes` each, from `first_row`, of one stored tensor of an MLX model.
async fn read_part_rows(
    m: &MlxModel,
    part: &(usize, crate::safetensors::StTensor),
    first_row: u64,
    rows: u64,
    row_bytes: u64,
    buf: &mut Vec<u8>,
) -> Result<()> {
    let (blob, h) = &m.files.files[part.0];
    buf.resize((rows * row_bytes) as usize, 0);
    blob.read_at(h.data_offset + part.1.begin + first_row * row_bytes, buf).await.map_err(Into::into)
}

fn to_f32(d: Dtype, raw: &[u8], name: &str) -> Result<Vec<f32>> {
    let ty =
        d.as_ggml().ok_or_else(|| Error::format(name, "dtype", format!("{d} values cannot be read as numbers")))?;
    let mut out = vec![0f32; raw.len() / d.size()];
    dequant::dequantize_ggml(ty, raw, &mut out)?;
    Ok(out)
}

fn list(inner: &Inner) -> Vec<TensorEntry> {
    match inner {
        Inner::Gguf(m) => m
            .tensors()
            .map(|t| {
                let i = t.info;
                TensorEntry {
                    name: i.name.clone(),
                    ty: TensorType::Ggml(i.ty),
                    shape: i.dims.iter().rev().copied().collect(),
                    bytes: i.nbytes(),
                    unit: i.ty.type_size() as u64,
                    row_bytes: i.row_bytes(),
                }
            })
            .collect(),
        Inner::Safetensors(m, _) => m
            .tensors()
            .map(|(_, t)| {
                let size = t.dtype.size() as u64;
                TensorEntry {
                    name: t.name.clone(),
                    ty: TensorType::Dtype(t.dtype),
                    shape: t.shape.clone(),
                    bytes: t.nbytes(),
                    unit: size,
                    row_bytes: t.shape.last().copied().unwrap_or(1) * size,
                }
            })
            .collect(),
        Inner::Mlx(m) => m
            .tensors
            .iter()
            .map(|t| {
                let (unit, row_bytes) = match &t.parts {
                    MlxParts::Plain { tensor, .. } => {
                        let s = tensor.dtype.size() as u64;
                        (s, tensor.shape.last().copied().unwrap_or(1) * s)
                    }
                    // Codes are read a whole row at a time (a row is whole groups, and groups start on words).
                    MlxParts::Affine { weight, .. } | MlxParts::Fp { weight, .. } => {
                        let r = weight.1.shape.last().copied().unwrap_or(1) * 4;
                        (r, r)
                    }
                };
                TensorEntry {
                    name: t.name.clone(),
                    ty: t.ty,
                    shape: t.shape.clone(),
                    bytes: t.nbytes(),
                    unit,
                    row_bytes,
                }
            })
            .collect(),
    }
}
