//! Streaming the files of a plan: header first, then each tensor converted in chunks that fit the memory budget,
//! through [`GgufWriter`] (a staged sink), so a failure leaves nothing visible.

use std::ops::Range;

use super::{transform, GgufPlan, PlannedTensor, GGUF_VERSION};
use crate::dtype::{Dtype, TensorType};
use crate::error::{Error, Result};
use crate::gguf::split::split_metadata;
use crate::source::TensorSource;
use crate::write::{GgufWriter, PieceWriter};
use quantfarm_store::Location;

/// Stages file `shard` of the plan cut by `ranges` at `dst` and writes all its bytes; not yet committed.
pub(super) async fn stage_shard(
    plan: &GgufPlan,
    source: &TensorSource,
    ranges: &[Range<usize>],
    shard: usize,
    dst: &Location,
    budget: u64,
    overwrite: bool,
) -> Result<GgufWriter> {
    let bad = |msg: String| Error::format(dst.to_string(), "split", msg);
    let range = ranges.get(shard).cloned().ok_or_else(|| bad(format!("no shard {shard} of {}", ranges.len())))?;
    if range.end > plan.tensors.len() || range.start > range.end {
        return Err(bad(format!("range {range:?} is outside the plan's {} tensors", plan.tensors.len())));
    }
    let n = ranges.len();
    let metadata = if n == 1 {
        plan.metadata.clone()
    } else {
        let count = u16::try_from(n).map_err(|_| bad(format!("{n} files (at most 65535)")))?;
        let total = i32::try_from(plan.tensors.len()).map_err(|_| bad("too many tensors".into()))?;
        // gguf-split (`tools/gguf-split/gguf-split.cpp`): shard 0 carries all KVs then the split keys; the others
        // only the split keys.
        let keys = split_metadata(shard as u16, count, total);
        if shard == 0 {
            plan.metadata.iter().cloned().chain(keys).collect()
        } else {
            keys
        }
    };
    let mut w = GgufWriter::create(dst, GGUF_VERSION, &metadata, &plan.descs(range.clone()), overwrite).await?;
    let mut bufs = (Vec::new(), Vec::new());
    for t in &plan.tensors[range] {
        write_tensor(source, t, budget, &mut bufs, &mut w).await?;
    }
    Ok(w)
}

/// Streams one tensor (to a file, or to a comparison when verifying): whole rows (or, when permuted, whole heads) at a time within `budget`, converted to the
/// planned type; a head that does not fit is gathered row by row.
pub(crate) async fn write_tensor(
    src: &TensorSource,
    t: &PlannedTensor,
    budget: u64,
    (inb, outb): &mut (Vec<u8>, Vec<u8>),
    w: &mut impl PieceWriter,
) -> Result<()> {
    let e = src.entry(&t.source)?;
    let expect_ne: Vec<u64> = e.shape.iter().rev().copied().collect();
    if e.ty != t.source_type || expect_ne != t.ne {
        return Err(Error::format(
            src.location().to_string(),
            format!("tensor {:?}", t.source),
            format!("is {} {:?} but the plan says {} {:?}", e.ty, e.shape, t.source_type, t.ne),
        ));
    }
    let rows = e.shape.first().copied().unwrap_or(1).max(1);
    // Rows as read: stored bytes of a dense tensor, or the f32 values of a dequantized MLX affine one.
    let (read_dtype, src_row) = match e.ty {
        TensorType::Dtype(d) => (d, e.bytes / rows),
        TensorType::MlxAffine { .. } => (Dtype::F32, e.row_len() * 4),
        TensorType::Ggml(g) => {
            return Err(Error::format(src.location().to_string(), format!("tensor {:?}", t.source), format!("{g}")))
        }
    };
    let affine = matches!(e.ty, TensorType::MlxAffine { .. });
    let mut read = Rows { src, name: &t.source, affine, src_row, values: Vec::new(), scratch: Vec::new() };
    let out_row = t.nbytes / rows;
    let per_row = src_row + out_row;
    if per_row > budget {
        return Err(Error::Budget {
            file: src.location().to_string(),
            tensor: t.source.clone(),
            msg: format!("one row needs {per_row} bytes (read + converted), more than the budget of {budget}"),
        });
    }
    let fit = (budget / per_row).max(1);
    let hd = t.permute_heads.map(|h| rows / h);
    // Rows per chunk: whole heads when a head fits, else any number of rows.
    let step = match hd {
        Some(hd) if hd <= fit => fit / hd * hd,
        _ => fit,
    };
    let mut r = 0;
    while r < rows {
        let n = step.min(rows - r);
        inb.resize((n * src_row) as usize, 0);
        outb.clear();
        match hd {
            None => {
                read.rows(r, inb).await?;
                transform::convert_elements(read_dtype, t.ty, inb, outb, &t.source, t.offset)?;
            }
            Some(hd) if n % hd == 0 && r % hd == 0 => {
                // Whole heads: read them contiguously, then take rows in permuted order.
                read.rows(r, inb).await?;
                for k in 0..n {
                    let s = (transform::permuted_source_row(k, hd) * src_row) as usize;
                    transform::convert_elements(
                        read_dtype,
                        t.ty,
                        &inb[s..s + src_row as usize],
                        outb,
                        &t.source,
                        t.offset,
                    )?;
                }
            }
            Some(hd) => {
                // A head larger than the budget: gather each output row from its source row.
                for k in 0..n {
                    let s = transform::permuted_source_row(r + k, hd);
                    let dst = &mut inb[(k * src_row) as usize..((k + 1) * src_row) as usize];
                    read.rows(s, dst).await?;
                }
                transform::convert_elements(read_dtype, t.ty, inb, outb, &t.source, t.offset)?;
            }
        }
        w.write_piece(outb).await?;
        r += n;
    }
    Ok(())
}

/// Reads whole rows of one source tensor into a buffer of `src_row`-byte rows.
struct Rows<'a> {
    src: &'a TensorSource,
    name: &'a str,
    /// An MLX affine triple: rows are dequantized to little-endian f32 (`mx.dequantize`'s `scale·q + bias`).
    affine: bool,
    src_row: u64,
    /// Dequantized values and the stored codes they come from, kept between reads.
    values: Vec<f32>,
    scratch: Vec<u8>,
}

impl Rows<'_> {
    /// Fills `buf` (whole rows) from row `first`.
    async fn rows(&mut self, first: u64, buf: &mut [u8]) -> Result<()> {
        if !self.affine {
            return self.src.read_range(self.name, first * self.src_row, buf).await;
        }
        self.values.resize(buf.len() / 4, 0.0);
        self.src.read_f32_rows(self.name, first, &mut self.values, &mut self.scratch).await?;
        for (o, v) in buf.chunks_exact_mut(4).zip(&self.values) {
            o.copy_from_slice(&v.to_le_bytes());
        }
        Ok(())
    }
}
