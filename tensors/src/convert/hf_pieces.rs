//! One HF tensor of a GGUF → HF (or MLX → HF) conversion cut into pieces of whole rows: what each piece reads
//! (spans for the read stage of [`crate::pipeline`]) and how the bytes read become the output dtype's. The
//! conversions read the pieces ahead ([`super::write_hf`], the MLX writer) or one by one
//! ([`super::write_hf_tensor`], verification); the bytes are the same.

use super::hf_join::Join;
use super::mapping::FusedParts;
use super::to_hf::{unpermuted_source_row, HfTensor, PartOf};
use super::transform::encode_f32;
use crate::dtype::{Dtype, TensorType};
use crate::error::{Error, Result};
use crate::pipeline::{byte_span, decode_rows, row_spans, rows_per_piece, Span};
use crate::source::TensorSource;

/// What a piece's rows go through.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Stored in the output dtype already (a BF16 GGUF going to a BF16 checkpoint): moved as bytes, and put back
    /// in order within heads when permuted.
    Same,
    /// Decoded to f32; rows and columns reordered, the value function and the offset undone; rounded to the dtype.
    Values,
    /// An MLX affine tensor dequantized in its scales' dtype, as `mx.dequantize` computes it.
    MlxDequantized { bits: u8, group_size: u32, scale_dtype: Dtype },
}

/// Rows `first..first + rows` of the output tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HfPiece {
    pub first: usize,
    pub rows: usize,
}

/// The transform's buffers, kept from piece to piece.
#[derive(Default)]
pub struct HfBufs {
    values: Vec<f32>,
    ordered: Vec<f32>,
    row: Vec<f32>,
    out: Vec<u8>,
}

/// One output tensor cut into pieces within a budget.
pub struct HfCut {
    t: HfTensor,
    kind: Kind,
    rows: usize,
    cols: usize,
    /// Stored bytes of one source row (for MLX affine: its codes, scales and biases).
    raw_row: u64,
    /// Bytes of the transform's buffers per row.
    work_row: u64,
    /// Rows per head when the rows are to be unpermuted; pieces are then whole heads.
    hd: Option<u64>,
    /// One part of a fused tensor.
    fused: Option<Fused>,
    /// The source row of the output's first row (an expert's matrix of stacked experts: its first row).
    row_base: u64,
    /// Joined from several source tensors.
    join: Option<Join>,
    step: usize,
}

/// How a part of a fused tensor lies in its source.
#[derive(Clone, Copy, Debug)]
struct Fused {
    of: PartOf,
    /// The source's dtype.
    stored: Dtype,
    /// Values per source row.
    src_cols: u64,
    /// Output rows per matrix (the part's second-to-last axis).
    per: u64,
}

impl HfCut {
    /// Cuts output tensor `t` of a GGUF → HF (or MLX → HF) plan so that [`crate::pipeline::DEPTH`] pieces as read,
    /// one piece's transform buffers and `extra_row` bytes per row of the caller's (its own output) fit `budget`.
    pub fn new(src: &TensorSource, t: &HfTensor, budget: u64, extra_row: u64) -> Result<HfCut> {
        if let Some(of) = t.part {
            return HfCut::part(src, t, of, budget, extra_row);
        }
        if let Some(j) = &t.join {
            let c = Join::cut(src, t, j)?;
            let step = rows_per_piece(budget, c.raw_row, c.work_row + extra_row, c.unit) as usize;
            let kind = if c.same { Kind::Same } else { Kind::Values };
            let cut = HfCut::plain(t.clone(), kind, (c.rows, c.cols), (c.raw_row, c.work_row), step);
            return Ok(HfCut { join: Some(c.join), ..cut });
        }
        let e = src.entry(&t.source)?;
        // Arithmetic on the values (a row permutation alone moves bytes).
        let arithmetic = t.offset.is_some() || t.reorder.is_some() || t.values.is_some();
        let kind = match e.ty {
            TensorType::MlxAffine { bits, group_size, scale_dtype }
                if scale_dtype == t.dtype && !arithmetic && t.unpermute_heads.is_none() =>
            {
                Kind::MlxDequantized { bits, group_size, scale_dtype }
            }
            TensorType::Ggml(g) if !arithmetic && t.dtype.as_ggml() == Some(g) => Kind::Same,
            _ => Kind::Values,
        };
        let mut cut = HfCut::with_kind(src, t.clone(), kind, budget, extra_row)?;
        if let Some(x) = t.expert {
            // Expert x.expert's matrix: a run of the source's rows, whose first axis holds x.of experts.
            let bad = |msg: String| Error::format(src.location().to_string(), format!("tensor {:?}", t.source), msg);
            if t.unpermute_heads.is_some() || t.reorder.is_some() {
                return Err(bad("an expert's matrix is neither unpermuted nor reordered".into()));
            }
            let per = t.shape.first().copied().unwrap_or(0);
            if e.shape.len() != 3 || e.shape[0] != x.of || x.expert >= x.of || e.shape[1..] != t.shape[..] {
                return Err(bad(format!(
                    "shape {:?} does not hold expert {} of {} as a {:?} matrix",
                    e.shape, x.expert, x.of, t.shape
                )));
            }
            cut.rows = per as usize;
            cut.row_base = x.expert * per;
        }
        Ok(cut)
    }

    /// Cuts HF tensor `name` of `src` read as stored and written as `dtype`: its bytes when it is stored so, an MLX
    /// affine tensor dequantized as `mx.dequantize` computes it when `dtype` is its scales' (a quantized MLX
    /// checkpoint quantized again), else its values rounded to `dtype` (an HF or unquantized MLX checkpoint's tensor
    /// being cast).
    pub fn stored(src: &TensorSource, name: &str, dtype: Dtype, budget: u64, extra_row: u64) -> Result<HfCut> {
        let e = src.entry(name)?;
        let t = HfTensor::plain(name, name, e.shape.clone(), dtype);
        let kind = match e.ty {
            TensorType::MlxAffine { bits, group_size, scale_dtype } if scale_dtype == dtype => {
                Kind::MlxDequantized { bits, group_size, scale_dtype }
            }
            ty if ty == TensorType::Dtype(dtype) => Kind::Same,
            _ => Kind::Values,
        };
        HfCut::with_kind(src, t, kind, budget, extra_row)
    }

    fn with_kind(src: &TensorSource, t: HfTensor, kind: Kind, budget: u64, extra_row: u64) -> Result<HfCut> {
        let e = src.entry(&t.source)?;
        let cols = e.row_len().max(1);
        let rows = e.rows() as usize;
        let raw_row = match e.ty {
            TensorType::MlxAffine { bits, group_size, scale_dtype } => {
                cols * u64::from(bits) / 8 + 2 * (cols / u64::from(group_size)) * scale_dtype.size() as u64
            }
            TensorType::MlxFp { mode } => cols * u64::from(mode.bits()) / 8 + cols / mode.group_size() as u64,
            _ => e.row_bytes(),
        };
        let hd = t.unpermute_heads.map(|h| rows as u64 / h.max(1));
        if hd == Some(0) && rows > 0 {
            return Err(Error::format(
                src.location().to_string(),
                format!("tensor {:?}", t.source),
                format!("{rows} rows cannot be cut into {:?} heads", t.unpermute_heads),
            ));
        }
        let (size, f32_row) = (t.dtype.size() as u64 * cols, 4 * cols);
        let work_row = match kind {
            Kind::Same => hd.map_or(0, |_| size),
            // The values, reordered when permuted, and rounded.
            Kind::Values => f32_row + hd.map_or(0, |_| f32_row) + size,
            // The codes as floats, and the result.
            Kind::MlxDequantized { .. } => f32_row + size,
        };
        let step = rows_per_piece(budget, raw_row, work_row + extra_row, hd.unwrap_or(1)) as usize;
        Ok(HfCut { hd, ..HfCut::plain(t, kind, (rows, cols as usize), (raw_row, work_row), step) })
    }

    /// A cut of the source's rows in order (no heads, part, expert or join: the callers add theirs), `step` rows a
    /// piece.
    fn plain(
        t: HfTensor,
        kind: Kind,
        (rows, cols): (usize, usize),
        (raw_row, work_row): (u64, u64),
        step: usize,
    ) -> HfCut {
        HfCut { t, kind, rows, cols, raw_row, work_row, hd: None, fused: None, row_base: 0, join: None, step }
    }

    /// Part `of` of a fused float tensor (`t.shape` is the part's):
    /// - halves: runs of the source's rows, moved as bytes when the dtype stays;
    /// - interleaved columns: whole source rows read, every `of`-th value kept;
    /// - transposed rows: a piece of output rows within one matrix reads the band of their columns (every
    ///   part's) from each of the matrix's source rows, and gathers each output row from it.
    fn part(src: &TensorSource, t: &HfTensor, of: PartOf, budget: u64, extra_row: u64) -> Result<HfCut> {
        let e = src.entry(&t.source)?;
        let bad = |msg: String| Error::format(src.location().to_string(), format!("tensor {:?}", t.source), msg);
        let stored = match e.ty {
            TensorType::Dtype(d @ (Dtype::BF16 | Dtype::F16 | Dtype::F32)) => d,
            ty => return Err(bad(format!("is {ty}: only a float tensor is split into parts"))),
        };
        if t.unpermute_heads.is_some() || t.reorder.is_some() {
            return Err(bad("a part of a fused tensor is neither unpermuted nor reordered".into()));
        }
        let want = of.shape(&e.shape).ok_or_else(|| {
            bad(format!("shape {:?} does not divide into {} parts laid out as {:?}", e.shape, of.of, of.layout))
        })?;
        if want != t.shape {
            return Err(bad(format!("its part {} of {} is {want:?}; the plan says {:?}", of.part, of.of, t.shape)));
        }
        let n = want.len();
        let cols = want[n - 1];
        let rows = want[..n - 1].iter().product::<u64>().max(1);
        let per = if n >= 2 { want[n - 2].max(1) } else { 1 };
        let src_cols = e.shape[e.shape.len() - 1];
        let (size, out) = (stored.size() as u64, t.dtype.size() as u64);
        let same = t.offset.is_none() && t.values.is_none() && stored == t.dtype;
        // Bytes read per output row, and the buffers per output row: the values decoded, gathered and rounded.
        let (kind, raw_row, work_row) = match of.layout {
            FusedParts::Halves if same => (Kind::Same, src_cols * size, 0),
            FusedParts::Halves => (Kind::Values, src_cols * size, 2 * 4 * cols + out * cols),
            FusedParts::InterleavedColumns => (Kind::Values, src_cols * size, 4 * src_cols + (4 + out) * cols),
            FusedParts::TransposedRows => (Kind::Values, cols * of.of * size, 4 * cols * of.of + (4 + out) * cols),
        };
        let mut step = rows_per_piece(budget, raw_row, work_row + extra_row, 1);
        if of.layout == FusedParts::TransposedRows {
            step = step.min(per);
        }
        let fused = Some(Fused { of, stored, src_cols, per });
        let (rows, cols) = (rows as usize, cols as usize);
        Ok(HfCut { fused, ..HfCut::plain(t.clone(), kind, (rows, cols), (raw_row, work_row), step as usize) })
    }

    /// The pieces, in order (a transposed part's within one matrix each).
    pub fn pieces(&self) -> impl Iterator<Item = HfPiece> + '_ {
        let per = match (self.fused, &self.join) {
            (Some(f), _) if f.of.layout == FusedParts::TransposedRows => f.per as usize,
            (_, Some(j)) => j.matrix_rows().unwrap_or(self.rows).max(1),
            _ => self.rows.max(1),
        };
        (0..self.rows).step_by(per).flat_map(move |m| {
            let end = (m + per).min(self.rows);
            (m..end).step_by(self.step).map(move |first| HfPiece { first, rows: self.step.min(end - first) })
        })
    }

    /// Bytes of the transform's buffers for piece `p`.
    pub fn work(&self, p: HfPiece) -> u64 {
        p.rows as u64 * self.work_row
    }

    /// The runs of consecutive source rows piece `p` reads, in the order its output rows (before unpermuting
    /// within heads) come from them: one run, or several when the rows are reordered.
    fn runs(&self, p: HfPiece) -> Vec<(u64, usize)> {
        if let Some(f) = self.fused.filter(|f| f.of.layout == FusedParts::Halves) {
            // Output row j of matrix m is source row (m·of + part)·per + j.
            let mut runs = Vec::new();
            let (mut r, end) = (p.first as u64, (p.first + p.rows) as u64);
            while r < end {
                let (m, j) = (r / f.per, r % f.per);
                let len = (f.per - j).min(end - r);
                runs.push(((m * f.of.of + f.of.part) * f.per + j, len as usize));
                r += len;
            }
            return runs;
        }
        let Some(o) = self.t.reorder.filter(|o| o.rows && matches!(self.kind, Kind::Values)) else {
            return vec![(self.row_base + p.first as u64, p.rows)];
        };
        // Gathered run by run: a reordered head's rows are contiguous in the source.
        let mut runs = Vec::new();
        let mut k = 0;
        while k < p.rows {
            let first = o.source((p.first + k) as u64);
            let mut len = 1;
            while k + len < p.rows && o.source((p.first + k + len) as u64) == first + len as u64 {
                len += 1;
            }
            runs.push((first, len));
            k += len;
        }
        runs
    }

    /// Where piece `p`'s rows are stored, in the order [`HfCut::convert`] takes them.
    pub fn spans<'s>(&self, src: &'s TensorSource, p: HfPiece) -> Result<Vec<Span<'s>>> {
        if let Some(j) = &self.join {
            return j.spans(src, p.first as u64, p.rows as u64);
        }
        if let Some(f) = self.fused.filter(|f| f.of.layout == FusedParts::TransposedRows) {
            // From each of the matrix's k source rows, the columns of output rows j..j + n, every part's.
            let (m, j) = (p.first as u64 / f.per, p.first as u64 % f.per);
            let (k, of, size) = (self.cols as u64, f.of.of, f.stored.size() as u64);
            return (0..k)
                .map(|i| {
                    let row = (m * k + i) * f.per * of;
                    byte_span(src, &self.t.source, (row + j * of) * size, p.rows as u64 * of * size)
                })
                .collect();
        }
        let mut spans = Vec::new();
        for (first, len) in self.runs(p) {
            spans.extend(row_spans(src, &self.t.source, first, len as u64)?);
        }
        Ok(spans)
    }

    /// Piece `p` in the output dtype, from the bytes its spans hold: those bytes themselves when nothing changes
    /// them, else the result in `bufs`.
    pub fn convert<'b>(&self, src: &TensorSource, p: HfPiece, raw: &'b [u8], bufs: &'b mut HfBufs) -> Result<&'b [u8]> {
        let t = &self.t;
        let (cols, n) = (self.cols, p.rows);
        // The source row of each output row of this piece, relative to the piece.
        let source_row = |k: usize| match self.hd {
            None => k,
            Some(hd) => (unpermuted_source_row((p.first + k) as u64, hd) - p.first as u64) as usize,
        };
        if let Some(f) = self.fused.filter(|_| matches!(self.kind, Kind::Values)) {
            return self.convert_part(src, f, p, raw, bufs);
        }
        if let Some(j) = self.join.as_ref().filter(|_| matches!(self.kind, Kind::Values)) {
            let HfBufs { values, ordered, out, .. } = bufs;
            j.convert(src, (p.first as u64, n, cols), raw, values, ordered)?;
            out.clear();
            encode_f32(ordered, t.dtype, out);
            return Ok(out);
        }
        let HfBufs { values, ordered, row, out } = bufs;
        out.clear();
        match self.kind {
            Kind::Same if self.hd.is_none() => return Ok(raw),
            Kind::Same => {
                let row_bytes = self.raw_row as usize;
                for k in 0..n {
                    let s = source_row(k);
                    out.extend_from_slice(&raw[s * row_bytes..(s + 1) * row_bytes]);
                }
            }
            Kind::MlxDequantized { bits, group_size, scale_dtype } => {
                let codes = n * cols * usize::from(bits) / 8;
                let params = n * (cols / group_size as usize) * scale_dtype.size();
                if raw.len() != codes + 2 * params {
                    return Err(Error::format(
                        src.location().to_string(),
                        &t.source,
                        format!("{} bytes read are not {n} rows of codes, scales and biases", raw.len()),
                    ));
                }
                crate::dequant::dequantize_mlx_affine_as(
                    u32::from(bits),
                    group_size as usize,
                    &raw[..codes],
                    &raw[codes..codes + params],
                    &raw[codes + params..],
                    scale_dtype,
                    out,
                )?;
            }
            Kind::Values => {
                values.resize(n * cols, 0f32);
                let (mut at, mut k) = (0usize, 0usize);
                for (_, len) in self.runs(p) {
                    let bytes = len * self.raw_row as usize;
                    let raw_run = raw.get(at..at + bytes).ok_or_else(|| {
                        Error::format(src.location().to_string(), &t.source, "fewer bytes read than its rows need")
                    })?;
                    decode_rows(src, &t.source, raw_run, &mut values[k * cols..(k + len) * cols])?;
                    (at, k) = (at + bytes, k + len);
                }
                let rows_out: &mut [f32] = match self.hd {
                    None => values,
                    Some(_) => {
                        ordered.clear();
                        for k in 0..n {
                            let s = source_row(k);
                            ordered.extend_from_slice(&values[s * cols..(s + 1) * cols]);
                        }
                        ordered
                    }
                };
                if let Some(o) = t.reorder.filter(|o| !o.rows) {
                    row.resize(cols, 0f32);
                    for chunk in rows_out.chunks_exact_mut(cols) {
                        row.copy_from_slice(chunk);
                        for (c, x) in chunk.iter_mut().enumerate() {
                            *x = row[o.source(c as u64) as usize];
                        }
                    }
                }
                if let Some(f) = t.values {
                    rows_out.iter_mut().for_each(|x| *x = f.inverse(*x));
                }
                if let Some(o) = t.offset {
                    rows_out.iter_mut().for_each(|x| *x -= o);
                }
                encode_f32(rows_out, t.dtype, out);
            }
        }
        Ok(out)
    }

    /// A piece of a part of a fused tensor: the bytes read decoded, the part's values gathered from them, the
    /// value function and offset undone, rounded to the dtype.
    fn convert_part<'b>(
        &self,
        src: &TensorSource,
        f: Fused,
        p: HfPiece,
        raw: &'b [u8],
        bufs: &'b mut HfBufs,
    ) -> Result<&'b [u8]> {
        let t = &self.t;
        let (n, cols, of, part) = (p.rows, self.cols, f.of.of as usize, f.of.part as usize);
        let HfBufs { values, ordered, out, .. } = bufs;
        let want = n * self.raw_row as usize;
        if raw.len() != want {
            let msg = format!("{} bytes read for {n} rows of part {part} of {of}; {want} expected", raw.len());
            return Err(Error::format(src.location().to_string(), &t.source, msg));
        }
        values.resize(raw.len() / f.stored.size(), 0f32);
        decode_rows(src, &t.source, raw, values)?;
        ordered.clear();
        match f.of.layout {
            FusedParts::Halves => ordered.extend_from_slice(values),
            FusedParts::InterleavedColumns => {
                for r in values.chunks_exact(f.src_cols as usize) {
                    ordered.extend((0..cols).map(|c| r[c * of + part]));
                }
            }
            // The band holds, per source row i (an output column), n·of values: output row j's is j·of + part.
            FusedParts::TransposedRows => {
                for j in 0..n {
                    ordered.extend((0..cols).map(|i| values[i * n * of + j * of + part]));
                }
            }
        }
        if let Some(v) = t.values {
            ordered.iter_mut().for_each(|x| *x = v.inverse(*x));
        }
        if let Some(o) = t.offset {
            ordered.iter_mut().for_each(|x| *x -= o);
        }
        out.clear();
        encode_f32(ordered, t.dtype, out);
        Ok(out)
    }
}
