//! Where the rows of a tensor are stored, as spans of bytes the read stage can read without the source, and how
//! rows read that way become values (what [`TensorSource::read_f32_rows`] gives).

use quantfarm_store::Blob;

use crate::dequant;
use crate::dtype::TensorType;
use crate::error::{Error, Result};
use crate::source::TensorSource;

/// `len` bytes of one file or object at `offset`.
#[derive(Clone, Copy, Debug)]
pub struct Span<'a> {
    pub(crate) blob: &'a Blob,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

impl Span<'_> {
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The stored bytes `offset..offset + len` of tensor `name` (of an MLX affine tensor: its codes), as
/// [`TensorSource::read_range`] reads them.
pub fn byte_span<'a>(src: &'a TensorSource, name: &str, offset: u64, len: u64) -> Result<Span<'a>> {
    let (blob, start, size) = src.locate(name)?;
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(Error::Budget {
            file: blob.name().to_string(),
            tensor: name.to_string(),
            msg: format!("bytes {offset}..+{len} are outside its {size} bytes"),
        });
    }
    Ok(Span { blob, offset: start + offset, len })
}

/// Rows `first..first + rows` of tensor `name` as stored: one span, or three for an MLX affine tensor (its codes,
/// scales and biases), which [`decode_rows`] takes apart again.
pub fn row_spans<'a>(src: &'a TensorSource, name: &str, first: u64, rows: u64) -> Result<Vec<Span<'a>>> {
    let e = src.entry(name)?;
    if first.checked_add(rows).is_none_or(|end| end > e.rows()) {
        return Err(Error::Budget {
            file: src.location().to_string(),
            tensor: name.to_string(),
            msg: format!("rows {first}..+{rows} are outside its {} rows", e.rows()),
        });
    }
    let quantized = src.mlx().and_then(|m| Some((m, m.tensors.iter().find(|t| t.name == name)?.quantized_parts()?)));
    let Some((model, parts)) = quantized else {
        return Ok(vec![byte_span(src, name, first * e.row_bytes(), rows * e.row_bytes())?]);
    };
    parts
        .into_iter()
        .map(|((file, t), row)| {
            let (blob, h) = model.files.files.get(*file).ok_or_else(|| {
                Error::format(src.location().to_string(), &t.name, format!("names file {file}, which is not open"))
            })?;
            Ok(Span { blob, offset: h.data_offset + t.begin + first * row, len: rows * row })
        })
        .collect()
}

/// The values of whole rows of tensor `name` read as [`row_spans`] gives them (`out.len()` values), widened or
/// dequantized to f32 exactly as [`TensorSource::read_f32_rows`] does.
pub fn decode_rows(src: &TensorSource, name: &str, raw: &[u8], out: &mut [f32]) -> Result<()> {
    let e = src.entry(name)?;
    let to_f32 = |d: crate::Dtype, raw: &[u8], out: &mut [f32]| -> Result<()> {
        let ty =
            d.as_ggml().ok_or_else(|| Error::format(name, "dtype", format!("{d} values cannot be read as numbers")))?;
        Ok(dequant::dequantize_ggml(ty, raw, out)?)
    };
    match e.ty {
        TensorType::Dtype(d) => to_f32(d, raw, out),
        TensorType::Ggml(t) => Ok(dequant::dequantize_ggml(t, raw, out)?),
        TensorType::MlxAffine { bits, group_size, scale_dtype } => {
            let cols = e.row_len().max(1) as usize;
            let rows = out.len() / cols;
            let codes = rows * cols * usize::from(bits) / 8;
            let groups = rows * (cols / group_size as usize);
            let params = groups * scale_dtype.size();
            if raw.len() != codes + 2 * params || rows * cols != out.len() {
                return Err(Error::format(
                    src.location().to_string(),
                    name,
                    format!("{} bytes read are not {rows} rows of codes, scales and biases", raw.len()),
                ));
            }
            let (mut scales, mut biases) = (vec![0f32; groups], vec![0f32; groups]);
            to_f32(scale_dtype, &raw[codes..codes + params], &mut scales)?;
            to_f32(scale_dtype, &raw[codes + params..], &mut biases)?;
            Ok(dequant::dequantize_mlx_affine(
                u32::from(bits),
                group_size as usize,
                &raw[..codes],
                &scales,
                &biases,
                out,
            )?)
        }
        TensorType::MlxFp { mode } => {
            let cols = e.row_len().max(1) as usize;
            let rows = out.len() / cols;
            let codes = rows * cols * mode.bits() as usize / 8;
            let groups = rows * (cols / mode.group_size());
            if raw.len() != codes + groups || rows * cols != out.len() {
                return Err(Error::format(
                    src.location().to_string(),
                    name,
                    format!("{} bytes read are not {rows} rows of codes and scales", raw.len()),
                ));
            }
            dequant::dequantize_fp_into(&raw[..codes], &raw[codes..], mode, out);
            Ok(())
        }
    }
}

/// Reads `spans` one after another into `buf` now, without a read stage (for a tensor converted alone).
pub async fn read_spans(spans: &[Span<'_>], buf: &mut Vec<u8>) -> Result<()> {
    super::read_ahead::read_into(spans.iter().map(|s| (s.blob, s.offset, s.len)), buf).await
}
