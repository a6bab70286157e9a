//! Streaming the files of a plan: header first, then each tensor converted in pieces that fit the memory budget,
//! through [`GgufWriter`] (a staged sink), so a failure leaves nothing visible. A file's pieces go through the
//! pipeline of [`crate::pipeline`]: read ahead on a task of their own, converted here, written behind by the sink;
//! the budget is shared between the pieces read ahead and the one being converted.

use std::ops::Range;

use super::{transform, GgufPlan, PlannedTensor, RowSource, GGUF_VERSION};
use crate::dequant::{bf16_bits_to_f32, f16_bits_to_f32};
use crate::dtype::{Dtype, TensorType};
use crate::error::{Error, Result};
use crate::gguf::split::split_metadata;
use crate::pipeline::{byte_span, decode_rows, read_spans, row_spans, rows_per_piece, Reads, Span};
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
    // The read stage reads the shard's pieces ahead while each is converted here and written behind by the sink.
    // Generated tensors (the mapping's `generate`) have their bytes in the plan and read nothing.
    let cuts = plan.tensors[range]
        .iter()
        .map(|t| match &t.generated {
            Some(bytes) => Ok(Err(bytes.as_slice())),
            None => Cut::new(source, t, budget).map(Ok),
        })
        .collect::<Result<Vec<_>>>()?;
    let mut reads = Reads::default();
    for c in cuts.iter().flatten() {
        for (r, n) in c.chunks() {
            reads.push(&c.spans(source, r, n)?, c.work(n));
        }
    }
    let mut reads = reads.start(budget);
    let mut bufs = Bufs::default();
    for c in &cuts {
        match c {
            Err(bytes) => w.write_piece(bytes).await?,
            Ok(c) => {
                for (r, n) in c.chunks() {
                    let raw = reads.next().await?;
                    w.write_piece(c.convert(source, r, n, raw, &mut bufs)?).await?;
                }
            }
        }
    }
    Ok(w)
}

/// Streams one tensor alone (to a comparison when verifying), reading each piece when it is needed.
pub(crate) async fn write_tensor(
    src: &TensorSource,
    t: &PlannedTensor,
    budget: u64,
    bufs: &mut Bufs,
    w: &mut impl PieceWriter,
) -> Result<()> {
    if let Some(bytes) = &t.generated {
        return w.write_piece(bytes).await;
    }
    let c = Cut::new(src, t, budget)?;
    let mut raw = Vec::new();
    for (r, n) in c.chunks() {
        read_spans(&c.spans(src, r, n)?, &mut raw).await?;
        w.write_piece(c.convert(src, r, n, &raw, bufs)?).await?;
    }
    Ok(())
}

/// An error unless one row of `t` (`need` bytes: `what`) fits the budget.
fn fits(src: &TensorSource, t: &PlannedTensor, need: u64, what: &str, budget: u64) -> Result<()> {
    if need > budget {
        return Err(Error::Budget {
            file: src.location().to_string(),
            tensor: t.source.clone(),
            msg: format!("one row needs {need} bytes ({what}), more than the budget of {budget}"),
        });
    }
    Ok(())
}

/// The transform's buffers, kept from piece to piece.
#[derive(Default)]
pub(crate) struct Bufs {
    /// Decoded MLX affine values, and their little-endian bytes.
    values: Vec<f32>,
    value_bytes: Vec<u8>,
    /// The converted piece.
    out: Vec<u8>,
    /// Values reordered or transformed before the conversion.
    floats: Vec<f32>,
}

/// How one planned tensor is cut into pieces: whole rows at a time within the budget, and whole heads when its
/// rows are permuted and a head fits (else the rows of a piece are gathered one by one from their source rows).
struct Cut<'a> {
    t: &'a PlannedTensor,
    rows: u64,
    cols: u64,
    /// Bytes of one row as stored (for MLX affine: its codes, scales and biases).
    raw_row: u64,
    /// Bytes of one row as converted from: the stored bytes, or the f32 of decoded MLX affine values.
    src_row: u64,
    /// Bytes of the transform's buffers per row: the converted row, and the decoded values and their bytes.
    work_row: u64,
    /// The dtype of the rows converted from.
    read_dtype: Dtype,
    /// Rows are decoded to f32 first (MLX affine, or a block-quantized GGUF tensor).
    affine: bool,
    /// Rows per head, when the rows are permuted within heads.
    hd: Option<u64>,
    step: u64,
}

impl<'a> Cut<'a> {
    fn new(src: &TensorSource, t: &'a PlannedTensor, budget: u64) -> Result<Cut<'a>> {
        match &t.rows {
            RowSource::Mxfp4 { scales, parts, .. } => return Cut::mxfp4(src, t, scales, *parts, budget),
            RowSource::Transposed { parts, .. } => return Cut::transposed(src, t, *parts, budget),
            _ => {}
        }
        let e = src.entry(&t.source)?;
        let shape_err = |want: String| {
            Error::format(
                src.location().to_string(),
                format!("tensor {:?}", t.source),
                format!("is {} {:?} but the plan says {} {want}", e.ty, e.shape, t.source_type),
            )
        };
        // The source's ne as the plan implies it: the output's, or one stacked part's, or the unsplit tensor's.
        let mut expect_ne = t.ne.clone();
        match &t.rows {
            RowSource::Direct => {}
            RowSource::Stack(parts) => {
                if expect_ne.pop() != Some(parts.len() as u64) {
                    return Err(shape_err(format!("{:?} for {} stacked parts", t.ne, parts.len())));
                }
            }
            RowSource::Split { parts, .. } => match expect_ne.get_mut(1) {
                Some(n) => *n *= parts,
                None => return Err(shape_err(format!("{:?}, split along an axis it lacks", t.ne))),
            },
            RowSource::Columns { parts, .. } => match expect_ne.get_mut(0) {
                Some(n) => *n *= parts,
                None => return Err(shape_err(format!("{:?}, split along an axis it lacks", t.ne))),
            },
            RowSource::Mxfp4 { .. } | RowSource::Transposed { .. } => {
                return Err(shape_err("(cut by Cut::mxfp4 or Cut::transposed)".into()))
            }
        }
        let actual_ne: Vec<u64> = e.shape.iter().rev().copied().collect();
        // The converter's squeeze writes a (C, 1, K) tensor {K, C}: the same rows.
        let squeezed = |ne: &[u64]| ne.iter().copied().filter(|d| *d != 1).collect::<Vec<_>>();
        if e.ty != t.source_type || (actual_ne != expect_ne && squeezed(&actual_ne) != squeezed(&expect_ne)) {
            return Err(shape_err(format!("{:?}", expect_ne.iter().rev().collect::<Vec<_>>())));
        }
        if let RowSource::Stack(parts) = &t.rows {
            for p in parts {
                let pe = src.entry(p)?;
                if pe.ty != e.ty || pe.shape != e.shape {
                    return Err(Error::format(
                        src.location().to_string(),
                        format!("tensor {p:?}"),
                        format!(
                            "is {} {:?}, but is stacked with {:?} ({} {:?})",
                            pe.ty, pe.shape, t.source, e.ty, e.shape
                        ),
                    ));
                }
            }
        }
        let cols = e.row_len().max(1);
        // Rows (a dense tensor's along its first axis; every axis but the last when stacked or split) as
        // converted from: stored bytes of a dense tensor, or the f32 values of a dequantized MLX affine one.
        let (rows, read_dtype, src_row, raw_row) = match e.ty {
            TensorType::Dtype(d) if t.rows != RowSource::Direct => {
                let rows = t.ne.iter().skip(1).product::<u64>().max(1);
                (rows, d, cols * d.size() as u64, cols * d.size() as u64)
            }
            TensorType::Dtype(d) => {
                let rows = e.shape.first().copied().unwrap_or(1).max(1);
                (rows, d, e.bytes / rows, e.bytes / rows)
            }
            TensorType::MlxAffine { .. } | TensorType::MlxFp { .. } if t.rows != RowSource::Direct => {
                return Err(shape_err("(an MLX quantized tensor is not stacked or split)".into()));
            }
            TensorType::MlxAffine { bits, group_size, scale_dtype } => {
                let params = cols / u64::from(group_size) * scale_dtype.size() as u64;
                (e.rows().max(1), Dtype::F32, cols * 4, cols * u64::from(bits) / 8 + 2 * params)
            }
            TensorType::MlxFp { mode } => {
                let raw = cols * u64::from(mode.bits()) / 8 + cols / mode.group_size() as u64;
                (e.rows().max(1), Dtype::F32, cols * 4, raw)
            }
            // A GGUF source (the release's reference made from a GGUF): float tensors as they are, quantized ones
            // decoded to f32 row by row, as MLX affine ones are.
            TensorType::Ggml(g) if t.rows != RowSource::Direct || t.reorder.is_some() || t.values.is_some() => {
                return Err(shape_err(format!("(a GGUF {g} tensor is not stacked, split, reordered or transformed)")));
            }
            TensorType::Ggml(g) => match Dtype::from_ggml(g) {
                Some(d) => {
                    let rows = e.shape.first().copied().unwrap_or(1).max(1);
                    (rows, d, e.bytes / rows, e.bytes / rows)
                }
                None => (e.rows().max(1), Dtype::F32, cols * 4, e.row_bytes()),
            },
        };
        let affine = match e.ty {
            TensorType::MlxAffine { .. } | TensorType::MlxFp { .. } => true,
            TensorType::Ggml(g) => Dtype::from_ggml(g).is_none(),
            TensorType::Dtype(_) => false,
        };
        let out_row = t.nbytes / rows;
        fits(src, t, src_row + out_row, "read + converted", budget)?;
        // The converted row, and for MLX affine the decoded values and their bytes; a row whose values are
        // reordered or transformed is also decoded to f32 first.
        let work_row = out_row
            + if affine { 2 * src_row } else { 0 }
            + if t.values.is_some() || t.reorder.is_some_and(|o| !o.rows) || t.columns().is_some() {
                4 * cols
            } else {
                0
            };
        let fit = rows_per_piece(budget, raw_row, work_row, 1);
        let hd = t.permute_heads.map(|h| rows / h.max(1));
        if hd == Some(0) && rows > 0 || (hd.is_some() && t.rows != RowSource::Direct) {
            return Err(Error::format(
                src.location().to_string(),
                format!("tensor {:?}", t.source),
                format!("{rows} rows cannot be cut into {:?} heads", t.permute_heads),
            ));
        }
        // Rows per piece: whole heads when a head fits, else any number of rows.
        let step = match hd {
            Some(hd) if hd <= fit => fit / hd * hd,
            _ => fit,
        };
        Ok(Cut { t, rows, cols, raw_row, src_row, work_row, read_dtype, affine, hd, step })
    }

    /// An MXFP4 pair repacked (see [`super::RowSource::Mxfp4`]): output rows are read with their experts' other
    /// parts between them (one contiguous run of codes and one of exponents per expert a piece touches), so a row
    /// costs `parts` source rows of codes and exponents.
    fn mxfp4(src: &TensorSource, t: &'a PlannedTensor, scales: &str, parts: u64, budget: u64) -> Result<Cut<'a>> {
        let (blocks, exps) = (src.entry(&t.source)?, src.entry(scales)?);
        let [cols, per, experts] = t.ne[..] else {
            return Err(Error::format(src.location().to_string(), &t.name, format!("ne {:?} is not 3-D", t.ne)));
        };
        let nb = cols / 32;
        let u8 = TensorType::Dtype(Dtype::U8);
        let want_blocks = [experts, per * parts, nb, 16];
        for (e, want) in [(blocks, &want_blocks[..]), (exps, &want_blocks[..3])] {
            if e.ty != u8 || e.shape != want {
                return Err(Error::format(
                    src.location().to_string(),
                    format!("tensor {:?}", e.name),
                    format!("is {} {:?} but MXFP4 {:?} needs U8 {want:?}", e.ty, e.shape, t.name),
                ));
            }
        }
        let (raw_row, out_row) = (parts * nb * 17, nb * 17);
        fits(src, t, raw_row + out_row, "read + repacked", budget)?;
        let step = rows_per_piece(budget, raw_row, out_row, 1);
        let rows = per * experts;
        Ok(Cut {
            t,
            rows,
            cols,
            raw_row,
            src_row: raw_row,
            work_row: out_row,
            read_dtype: Dtype::U8,
            affine: false,
            hd: None,
            step,
        })
    }

    /// A transposed tensor (see [`super::RowSource::Transposed`]): a piece of output rows within one matrix reads
    /// the band of their columns (every part's) from each of the matrix's `k` rows; each output row is gathered
    /// from the band and converted.
    fn transposed(src: &TensorSource, t: &'a PlannedTensor, parts: u64, budget: u64) -> Result<Cut<'a>> {
        let e = src.entry(&t.source)?;
        let bad = |msg: String| Error::format(src.location().to_string(), format!("tensor {:?}", t.source), msg);
        let d = match e.ty {
            TensorType::Dtype(d @ (Dtype::BF16 | Dtype::F16 | Dtype::F32)) => d,
            ty => return Err(bad(format!("is {ty}: only a float tensor is transposed"))),
        };
        // The source's ne: the output's first two axes swapped and the (new) first one whole again.
        let mut want: Vec<u64> = t.ne.clone();
        if want.len() < 2 {
            return Err(bad(format!("the plan's ne {:?} has no two axes to transpose", t.ne)));
        }
        (want[0], want[1]) = (t.ne[1] * parts, t.ne[0]);
        let actual: Vec<u64> = e.shape.iter().rev().copied().collect();
        if actual != want {
            let shape: Vec<u64> = want.iter().rev().copied().collect();
            return Err(bad(format!("is {:?} but its transpose in {parts} parts needs {shape:?}", e.shape)));
        }
        let (k, size) = (t.ne[0], d.size() as u64);
        let rows = t.ne.iter().skip(1).product::<u64>().max(1);
        let out_row = t.nbytes / rows;
        // Per output row: `parts` columns of each of the k source rows read, then one gathered row and its output.
        let (raw_row, work_row) = (k * parts * size, k * size + out_row);
        fits(src, t, raw_row + work_row, "read + transposed", budget)?;
        let step = rows_per_piece(budget, raw_row, work_row, 1);
        Ok(Cut { t, rows, cols: k, raw_row, src_row: raw_row, work_row, read_dtype: d, affine: false, hd: None, step })
    }

    /// The (tensor, first row, rows) runs that output rows `r..r + n` of a stacked or split tensor are read from.
    fn runs(&self, r: u64, n: u64) -> Vec<(&'a str, u64, u64)> {
        let mut out = Vec::new();
        let (mut r, end) = (r, r + n);
        while r < end {
            match &self.t.rows {
                RowSource::Direct => match self.t.reorder.filter(|o| o.rows) {
                    None => {
                        out.push((self.t.source.as_str(), r, end - r));
                        r = end;
                    }
                    // Reordered heads: runs of rows consecutive in the source (a head's rows are).
                    Some(o) => {
                        let first = o.source(r);
                        let mut len = 1;
                        while r + len < end && o.source(r + len) == first + len {
                            len += 1;
                        }
                        out.push((self.t.source.as_str(), first, len));
                        r += len;
                    }
                },
                RowSource::Stack(parts) => {
                    let per = (self.rows / parts.len().max(1) as u64).max(1);
                    let (p, k) = (r / per, r % per);
                    let len = (per - k).min(end - r);
                    out.push((parts[p as usize].as_str(), k, len));
                    r += len;
                }
                RowSource::Split { parts, part, block } => {
                    let (b, k) = (r / block, r % block);
                    let len = (block - k).min(end - r);
                    out.push((self.t.source.as_str(), b * block * parts + part * block + k, len));
                    r += len;
                }
                RowSource::Columns { .. } => {
                    out.push((self.t.source.as_str(), r, end - r));
                    r = end;
                }
                // Output rows of one matrix at a time (the row index is the matrix's, not the source's).
                RowSource::Transposed { .. } => {
                    let per = self.t.ne[1].max(1);
                    let (m, k) = (r / per, r % per);
                    let len = (per - k).min(end - r);
                    out.push((self.t.source.as_str(), m * per + k, len));
                    r += len;
                }
                // Source rows (every part's) of one expert at a time: output row k of expert e is its source row
                // k·parts + part.
                RowSource::Mxfp4 { parts, .. } => {
                    let per = self.t.ne[1].max(1);
                    let (e, k) = (r / per, r % per);
                    let len = (per - k).min(end - r);
                    out.push((self.t.source.as_str(), (e * per + k) * parts, len * parts));
                    r += len;
                }
            }
        }
        out
    }

    /// (first row, rows) of each piece.
    fn chunks(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (0..self.rows).step_by(self.step as usize).map(|r| (r, self.step.min(self.rows - r)))
    }

    /// A piece of rows permuted within heads that is not whole heads: its rows are read one by one, each from its
    /// source row.
    /// Whether rows `r..r + n` are read one by one (each with its own spans) rather than as one run: rows of
    /// heads cut across, and reordered rows of a quantized tensor (each row's codes, scales and biases).
    fn gathered(&self, r: u64, n: u64) -> bool {
        self.hd.is_some_and(|hd| !n.is_multiple_of(hd) || !r.is_multiple_of(hd))
            || (self.affine && self.t.reorder.is_some_and(|o| o.rows))
    }

    fn spans<'s>(&self, src: &'s TensorSource, r: u64, n: u64) -> Result<Vec<Span<'s>>> {
        match self.hd {
            Some(hd) if self.gathered(r, n) => {
                let mut spans = Vec::with_capacity(n as usize);
                for k in 0..n {
                    spans.extend(self.rows_at(src, transform::permuted_source_row(r + k, hd), 1)?);
                }
                Ok(spans)
            }
            _ => self.rows_at(src, r, n),
        }
    }

    /// Where rows `first..first + n` are stored.
    fn rows_at<'s>(&self, src: &'s TensorSource, first: u64, n: u64) -> Result<Vec<Span<'s>>> {
        if let RowSource::Transposed { parts, .. } = self.t.rows {
            // Per run (rows o..o + len of matrix m): from each of the matrix's k source rows, columns
            // o·parts..(o + len)·parts.
            let (per, k, size) = (self.t.ne[1].max(1), self.cols, self.read_dtype.size() as u64);
            let mut spans = Vec::new();
            for (name, r, len) in self.runs(first, n) {
                let (m, o) = (r / per, r % per);
                for i in 0..k {
                    let row = (m * k + i) * per * parts;
                    spans.push(byte_span(src, name, (row + o * parts) * size, len * parts * size)?);
                }
            }
            return Ok(spans);
        }
        if let RowSource::Mxfp4 { scales, .. } = &self.t.rows {
            // Per run, its codes then its exponents.
            let nb = self.cols / 32;
            let mut spans = Vec::new();
            for (name, k, len) in self.runs(first, n) {
                spans.push(byte_span(src, name, k * nb * 16, len * nb * 16)?);
                spans.push(byte_span(src, scales, k * nb, len * nb)?);
            }
            return Ok(spans);
        }
        if let Some(o) = self.t.reorder.filter(|o| o.rows && self.affine) {
            // A quantized row is read with its scales and biases: row by row, in the output's order.
            let mut spans = Vec::with_capacity(3 * n as usize);
            for k in first..first + n {
                spans.extend(row_spans(src, &self.t.source, o.source(k), 1)?);
            }
            return Ok(spans);
        }
        if self.t.rows != RowSource::Direct || self.t.reorder.is_some_and(|o| o.rows) {
            return self
                .runs(first, n)
                .into_iter()
                .map(|(name, k, len)| byte_span(src, name, k * self.raw_row, len * self.raw_row))
                .collect();
        }
        if self.affine {
            return row_spans(src, &self.t.source, first, n);
        }
        Ok(vec![byte_span(src, &self.t.source, first * self.raw_row, n * self.raw_row)?])
    }

    /// Bytes of the transform's buffers for a piece of `n` rows.
    fn work(&self, n: u64) -> u64 {
        n * self.work_row
    }

    /// Converts rows `r..r + n` read as [`Cut::spans`] gave them into the planned type: the bytes as read when
    /// nothing changes them, else the converted bytes in `bufs`.
    fn convert<'b>(&self, src: &TensorSource, r: u64, n: u64, raw: &'b [u8], bufs: &'b mut Bufs) -> Result<&'b [u8]> {
        let Bufs { values, value_bytes, out, floats } = bufs;
        if let RowSource::Mxfp4 { parts, part, .. } = self.t.rows {
            let nb = (self.cols / 32) as usize;
            let short =
                || Error::format(src.location().to_string(), &self.t.source, "fewer bytes read than its rows need");
            out.clear();
            let mut at = 0;
            for (_, _, len) in self.runs(r, n) {
                let (bl, sl) = (len as usize * nb * 16, len as usize * nb);
                let codes = raw.get(at..at + bl).ok_or_else(short)?;
                let exps = raw.get(at + bl..at + bl + sl).ok_or_else(short)?;
                at += bl + sl;
                for row in (part as usize..len as usize).step_by(parts as usize) {
                    for i in row * nb..(row + 1) * nb {
                        let block: &[u8; 16] = codes[i * 16..i * 16 + 16].try_into().map_err(|_| short())?;
                        super::mxfp4_block(exps[i], block, out);
                    }
                }
            }
            return Ok(out);
        }
        if let RowSource::Transposed { parts, part } = self.t.rows {
            let (k, size) = (self.cols as usize, self.read_dtype.size());
            let short =
                || Error::format(src.location().to_string(), &self.t.source, "fewer bytes read than its rows need");
            out.clear();
            let mut at = 0;
            for (_, _, len) in self.runs(r, n) {
                let band = len as usize * parts as usize * size;
                let read = raw.get(at..at + k * band).ok_or_else(short)?;
                at += k * band;
                for o in 0..len as usize {
                    let c = (o * parts as usize + part as usize) * size;
                    value_bytes.clear();
                    for i in 0..k {
                        value_bytes.extend_from_slice(&read[i * band + c..i * band + c + size]);
                    }
                    transform::convert_elements(
                        self.read_dtype,
                        self.t.ty,
                        &value_bytes[..],
                        out,
                        &self.t.source,
                        None,
                    )?;
                }
            }
            return Ok(out);
        }
        let gathered = self.gathered(r, n);
        let rows_in: &[u8] = if self.affine {
            let cols = self.cols as usize;
            values.resize(n as usize * cols, 0.0);
            if gathered {
                // Each row's codes, scales and biases were read together.
                let rows = raw.chunks(self.raw_row as usize).zip(values.chunks_mut(cols));
                for (row, vals) in rows {
                    decode_rows(src, &self.t.source, row, vals)?;
                }
            } else {
                decode_rows(src, &self.t.source, raw, values)?;
            }
            value_bytes.clear();
            value_bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
            value_bytes
        } else {
            raw
        };
        let t = self.t;
        out.clear();
        let columns = t.reorder.filter(|o| !o.rows);
        let pick = t.columns();
        if columns.is_some() || t.values.is_some() || pick.is_some() {
            // Decoded to f32 (as the converter converts every tensor before modifying it), each row's values
            // reordered and the value function applied, then converted with the offset.
            let size = self.read_dtype.size();
            let row_len = (self.src_row as usize / size).max(1);
            let decode = |b: &[u8]| match self.read_dtype {
                Dtype::BF16 => bf16_bits_to_f32(u16::from_le_bytes([b[0], b[1]])),
                Dtype::F16 => f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]])),
                _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            };
            floats.clear();
            for row in rows_in.chunks(row_len * size) {
                match (columns, pick) {
                    (Some(o), _) => floats.extend((0..row.len() / size).map(|c| {
                        let s = o.source(c as u64) as usize * size;
                        decode(&row[s..s + size])
                    })),
                    (None, Some((parts, part))) => {
                        floats.extend(row.chunks_exact(size).skip(part).step_by(parts).map(decode))
                    }
                    (None, None) => floats.extend(row.chunks_exact(size).map(decode)),
                }
            }
            if let Some(f) = t.values {
                floats.iter_mut().for_each(|x| *x = f.forward(*x));
            }
            let bytes: Vec<u8> = floats.iter().flat_map(|v| v.to_le_bytes()).collect();
            transform::convert_elements(Dtype::F32, t.ty, &bytes, out, &t.source, t.offset)?;
            return Ok(out);
        }
        match self.hd {
            // Whole heads, read contiguously: rows taken in permuted order.
            Some(hd) if !gathered => {
                let src_row = self.src_row as usize;
                for k in 0..n {
                    let s = transform::permuted_source_row(k, hd) as usize * src_row;
                    let row = &rows_in[s..s + src_row];
                    transform::convert_elements(self.read_dtype, t.ty, row, out, &t.source, t.offset)?;
                }
            }
            // Already the planned bytes.
            _ if self.read_dtype.as_ggml() == Some(t.ty) && t.offset.is_none() => return Ok(rows_in),
            _ => transform::convert_elements(self.read_dtype, t.ty, rows_in, out, &t.source, t.offset)?,
        }
        Ok(out)
    }
}
