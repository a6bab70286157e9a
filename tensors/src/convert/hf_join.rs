//! One HF tensor joined from several GGUF tensors, the way back of a mapping's `fused` rule ([`JoinOf`]): which
//! bytes of which part each piece of output rows reads, and how the parts' values become the output rows. The
//! inverse of each [`FusedParts`] layout:
//! - halves: the parts' matrices one after another along the second-to-last axis (Qwen3.5-MoE's
//!   `experts.gate_up_proj` (experts, 2·ff, hidden) from `ffn_gate_exps` and `ffn_up_exps`): runs of whole rows,
//!   moved as bytes when every part is stored in the output dtype;
//! - interleaved columns: output row `r` is row `r` of every part dealt out value by value (gpt-oss's
//!   `gate_up_proj_bias`);
//! - transposed rows: each part's matrices transposed, and their rows dealt out in turn (gpt-oss's dequantized
//!   `gate_up_proj` (experts, hidden, 2·ff) from `ffn_gate_exps` (experts, ff, hidden)): a piece of output rows
//!   `h..h + n` of one matrix reads, from every row of the parts' matrix, the band of columns `h..h + n` (whole
//!   blocks of a quantized part: the piece starts and ends on block boundaries), and gathers the output from it.
//!
//! Quantized parts are dequantized as [`crate::pipeline::decode_rows`] reads them; the pieces stay within the budget
//! like every other cut's.

use super::mapping::FusedParts;
use super::to_hf::{HfTensor, JoinOf};
use crate::dtype::TensorType;
use crate::error::{Error, Result};
use crate::pipeline::{byte_span, decode_rows, row_spans, Span};
use crate::source::TensorSource;

/// One part as stored.
#[derive(Clone, Debug)]
struct Part {
    name: String,
    /// Bytes of one stored row.
    row_bytes: u64,
    /// Values per block and bytes per block (1 and the element size for a float part).
    block: u64,
    block_bytes: u64,
    /// Stored in the output dtype already.
    same: bool,
}

/// How the parts of one joined tensor lie in the source.
#[derive(Clone, Debug)]
pub(super) struct Join {
    layout: FusedParts,
    parts: Vec<Part>,
    /// Rows of one part's matrix (its second-to-last axis; 1 for a vector) and values per part row.
    per: u64,
    part_cols: u64,
}

/// What a joined tensor's cut needs: the join, the output's rows and columns, bytes read and worked per output row,
/// the unit pieces are made of, and whether the bytes read are the output's as they are.
pub(super) struct Cut {
    pub join: Join,
    pub rows: usize,
    pub cols: usize,
    pub raw_row: u64,
    pub work_row: u64,
    pub unit: u64,
    pub same: bool,
}

impl Join {
    /// Plans output tensor `t` joined as `j` says, checking every part against the others and the plan.
    pub(super) fn cut(src: &TensorSource, t: &HfTensor, j: &JoinOf) -> Result<Cut> {
        let bad = |name: &str, msg: String| Error::format(src.location().to_string(), format!("tensor {name:?}"), msg);
        if t.unpermute_heads.is_some() || t.reorder.is_some() || t.offset.is_some() || t.values.is_some() {
            return Err(bad(&t.source, "a joined tensor is neither unpermuted, reordered nor offset".into()));
        }
        let first = src.entry(j.sources.first().ok_or_else(|| bad(&t.name, "joins no tensors".into()))?)?;
        let mut parts = Vec::with_capacity(j.sources.len());
        for name in &j.sources {
            let e = src.entry(name)?;
            if e.shape != first.shape {
                return Err(bad(
                    name,
                    format!("shape {:?} is not its sibling {}'s {:?}", e.shape, first.name, first.shape),
                ));
            }
            let (block, block_bytes) = match e.ty {
                TensorType::Ggml(g) => (g.block_size() as u64, g.type_size() as u64),
                TensorType::Dtype(d) => (1, d.size() as u64),
                ty @ (TensorType::MlxAffine { .. } | TensorType::MlxFp { .. }) => {
                    return Err(bad(name, format!("is {ty}: only a GGUF's tensors are joined")));
                }
            };
            let same = match e.ty {
                TensorType::Ggml(g) => t.dtype.as_ggml() == Some(g),
                TensorType::Dtype(d) => d == t.dtype,
                TensorType::MlxAffine { .. } | TensorType::MlxFp { .. } => false,
            };
            parts.push(Part { name: name.clone(), row_bytes: e.row_bytes(), block, block_bytes, same });
        }
        let want = j.shape(&first.shape);
        if want.as_deref() != Some(&t.shape[..]) {
            return Err(bad(&t.source, format!("its parts join to {want:?}; the plan says {:?}", t.shape)));
        }
        let n = first.shape.len();
        let part_cols = first.shape[n - 1];
        let per = if n >= 2 { first.shape[n - 2] } else { 1 };
        let cols = t.shape[t.shape.len() - 1];
        let rows = t.shape[..t.shape.len() - 1].iter().product::<u64>();
        let out = t.dtype.size() as u64;
        let stored: u64 = parts.iter().map(|p| p.row_bytes).sum();
        let same = j.layout == FusedParts::Halves && parts.iter().all(|p| p.same);
        // Bytes read per output row, and the buffers per output row: the parts' values decoded, gathered and
        // rounded.
        let (raw_row, work_row, unit) = match j.layout {
            // An output row is one part's row; the widest part's counts.
            FusedParts::Halves => {
                let widest = parts.iter().map(|p| p.row_bytes).max().unwrap_or(0);
                (widest, if same { 0 } else { 2 * 4 * cols + out * cols }, 1)
            }
            FusedParts::InterleavedColumns => (stored, 2 * 4 * cols + out * cols, 1),
            // An output row is one column of every part row of the matrix; a piece spans whole blocks of each.
            FusedParts::TransposedRows => {
                let unit = parts.iter().fold(1, |u, p| lcm(u, p.block));
                if let Some(p) = parts.iter().find(|p| part_cols % p.block != 0) {
                    let msg = format!("rows of {part_cols} values are not whole blocks of {}", p.block);
                    return Err(bad(&p.name, msg));
                }
                let read: u64 = parts.iter().map(|p| per * p.block_bytes.div_ceil(p.block)).sum();
                (read, 2 * 4 * cols + out * cols, unit)
            }
        };
        let join = Join { layout: j.layout, parts, per, part_cols };
        Ok(Cut { join, rows: rows as usize, cols: cols as usize, raw_row, work_row, unit, same })
    }

    /// Output rows per matrix that pieces must not cross (a transposed join's), else `None`.
    pub(super) fn matrix_rows(&self) -> Option<usize> {
        (self.layout == FusedParts::TransposedRows).then_some(self.part_cols as usize)
    }

    /// The runs of whole part rows output rows `first..first + rows` of a halves join are: (part, first row, rows).
    fn halves_runs(&self, first: u64, rows: u64) -> Vec<(usize, u64, u64)> {
        let (of, per) = (self.parts.len() as u64, self.per.max(1));
        let mut runs = Vec::new();
        let (mut r, end) = (first, first + rows);
        while r < end {
            let (m, rest) = (r / (of * per), r % (of * per));
            let (k, j) = (rest / per, rest % per);
            let len = (per - j).min(end - r);
            runs.push((k as usize, m * per + j, len));
            r += len;
        }
        runs
    }

    /// Where output rows `first..first + rows` are stored, in the order [`Join::convert`] takes them.
    pub(super) fn spans<'s>(&self, src: &'s TensorSource, first: u64, rows: u64) -> Result<Vec<Span<'s>>> {
        let mut spans = Vec::new();
        match self.layout {
            FusedParts::Halves => {
                for (k, row, len) in self.halves_runs(first, rows) {
                    spans.extend(row_spans(src, &self.parts[k].name, row, len)?);
                }
            }
            FusedParts::InterleavedColumns => {
                for p in &self.parts {
                    spans.extend(row_spans(src, &p.name, first, rows)?);
                }
            }
            FusedParts::TransposedRows => {
                // Output rows h..h + n of matrix m: columns h..h + n of each of the matrix's part rows.
                let (m, h) = (first / self.part_cols, first % self.part_cols);
                for p in &self.parts {
                    let (at, len) = (h / p.block * p.block_bytes, rows.div_ceil(p.block) * p.block_bytes);
                    for i in 0..self.per {
                        spans.push(byte_span(src, &p.name, (m * self.per + i) * p.row_bytes + at, len)?);
                    }
                }
            }
        }
        Ok(spans)
    }

    /// Output rows `first..first + rows` (`cols` values each) as f32 in `ordered`, from the bytes their spans hold;
    /// `values` holds the parts' values decoded.
    pub(super) fn convert(
        &self,
        src: &TensorSource,
        (first, rows, cols): (u64, usize, usize),
        raw: &[u8],
        values: &mut Vec<f32>,
        ordered: &mut Vec<f32>,
    ) -> Result<()> {
        let short = |name: &str| Error::format(src.location().to_string(), name, "fewer bytes read than its rows need");
        let (of, per) = (self.parts.len(), self.per as usize);
        ordered.clear();
        let mut at = 0usize;
        // Decodes the next `bytes` read of part `k` as `n` values at the end of `values`.
        let mut take = |k: usize, bytes: u64, n: usize, values: &mut Vec<f32>| -> Result<()> {
            let name = &self.parts[k].name;
            let chunk = raw.get(at..at + bytes as usize).ok_or_else(|| short(name))?;
            let start = values.len();
            values.resize(start + n, 0f32);
            decode_rows(src, name, chunk, &mut values[start..])?;
            at += bytes as usize;
            Ok(())
        };
        values.clear();
        match self.layout {
            FusedParts::Halves => {
                for (k, _, len) in self.halves_runs(first, rows as u64) {
                    take(k, len * self.parts[k].row_bytes, len as usize * cols, values)?;
                }
                ordered.extend_from_slice(values);
            }
            FusedParts::InterleavedColumns => {
                let pc = self.part_cols as usize;
                for k in 0..of {
                    take(k, rows as u64 * self.parts[k].row_bytes, rows * pc, values)?;
                }
                for r in 0..rows {
                    for c in 0..pc {
                        ordered.extend((0..of).map(|k| values[(k * rows + r) * pc + c]));
                    }
                }
            }
            FusedParts::TransposedRows => {
                // Per part, per part row i, the band's `band` values (whole blocks) of which the first `rows` count.
                let mut bands = Vec::with_capacity(of);
                for k in 0..of {
                    let p = &self.parts[k];
                    let blocks = (rows as u64).div_ceil(p.block);
                    let band = (blocks * p.block) as usize;
                    bands.push((values.len(), band));
                    for _ in 0..per {
                        take(k, blocks * p.block_bytes, band, values)?;
                    }
                }
                for j in 0..rows {
                    for i in 0..per {
                        ordered.extend(bands.iter().map(|&(start, band)| values[start + i * band + j]));
                    }
                }
            }
        }
        if at != raw.len() || ordered.len() != rows * cols {
            let msg = format!("{} bytes read for {rows} joined rows; {at} taken", raw.len());
            return Err(Error::format(src.location().to_string(), &self.parts[0].name, msg));
        }
        Ok(())
    }
}

fn lcm(a: u64, b: u64) -> u64 {
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    a / gcd(a, b).max(1) * b
}
