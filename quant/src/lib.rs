//! ggml's reference quantizers, ported so that quantfarm writes the **same bytes as llama-quantize**.
//!
//! A release farm must be able to prove its outputs: a tensor quantized here is byte-identical to the one
//! `ggml_quantize_chunk` (the function llama-quantize calls) produces on x86-64, so checksums can be compared with
//! llama.cpp's and no model needs re-running to trust a release. That rules out "close enough": every rounding
//! (round-half-even `nearest_int`, `roundf`, C casts, software fp16), accumulation order and association is copied
//! from `ggml/src/ggml-quants.c` (llama.cpp 0c1e570), and nothing fuses multiply-adds (ggml-base is built without
//! FMA on x86-64; see `docs/formats.md` §1).
//!
//! Supported: F32, F16, BF16, Q8_0, and Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ1_M, IQ2_S,
//! IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS with or without an importance matrix; IQ1_S, IQ2_XXS and IQ2_XS with one only
//! (ggml aborts without); MXFP4, NVFP4, TQ1_0, TQ2_0, Q1_0 and Q2_0 (which ignore one): every type llama-quantize
//! writes.
//!
//! Rows are quantized in parallel on the current rayon pool. Every row is quantized on its own, exactly as before,
//! so the bytes do not depend on the number of threads.
//!
//! Modules: `float` (fp16/bf16 conversion), `helpers` (`nearest_int` and the scale searches), `legacy` (the
//! 32-element block formats), `kquants` (the 256-element super-block formats), `iq_grid` (the i-quants' grid search
//! structures), `iq_search` (their shared sub-block scale search), `iq1` (IQ1_S, IQ1_M), `iq2` (IQ2_XXS, IQ2_XS,
//! IQ2_S), `iq3` (IQ3_XXS, IQ3_S), `iq4` (IQ4_NL, IQ4_XS), `fp4` (MXFP4, NVFP4), `ternary` (TQ1_0, TQ2_0), `low_bit`
//! (Q1_0, Q2_0), `blockwise` (rows walked block by block).

mod blockwise;
pub mod compressed_tensors;
pub mod edits;
pub mod file;
mod float;
mod fp4;
mod helpers;
pub mod imatrix;
mod iq1;
mod iq2;
mod iq3;
mod iq4;
mod iq_grid;
mod iq_search;
mod kquants;
mod lanes;
mod legacy;
mod low_bit;
pub mod mixture;
pub mod mlx;
pub mod mlx_file;
pub mod mlx_fp;
pub mod mlx_recipe;
pub mod recipe_search;
mod ternary;
pub mod verify;
pub mod vllm_file;
pub mod vllm_ignore;
pub mod vllm_pieces;
pub mod vllm_read;

pub use float::{f32_to_bf16_bits, f32_to_f16_bits};
pub use helpers::nearest_int;
pub use quantfarm_ggml::FileType;
pub use quantfarm_tensors::GgmlType;

use legacy::{Block, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use rayon::prelude::*;

/// Why a quantization request was refused. Inputs are checked before anything is written to `dst`.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum QuantError {
    #[error("quantization to {0} is not supported")]
    Unsupported(GgmlType),
    #[error("rows of {n_per_row} elements are not a whole number of {block_size}-element {ty} blocks")]
    PartialBlock { ty: GgmlType, n_per_row: usize, block_size: usize },
    #[error("input of {len} elements is not a whole number of {n_per_row}-element rows")]
    PartialRow { len: usize, n_per_row: usize },
    #[error("output buffer is {got} bytes, but {rows} rows of {ty} need {expected}")]
    DstLen { ty: GgmlType, rows: usize, expected: usize, got: usize },
    #[error("importance matrix has {got} entries, expected one per column ({expected})")]
    ImatrixLen { expected: usize, got: usize },
    #[error("quantizing to {0} needs an importance matrix (ggml's search for it is weighted by one)")]
    ImatrixRequired(GgmlType),
    #[error("input value {value} at row {row}, column {col} is not finite")]
    NonFinite { row: usize, col: usize, value: f32 },
    #[error("input of {len} {ty} bytes is not a whole number of {row_bytes}-byte rows")]
    PartialRawRow { ty: GgmlType, len: usize, row_bytes: usize },
    /// A quantizing thread panicked (a bug in quantfarm, not in the input).
    #[error("the quantizing thread failed without a result (a bug: please report it)")]
    Lost,
}

/// Whether [`quantize`] can produce `ty` (the list is `quantfarm_ggml::QUANTIZED_BY_QUANTFARM`).
pub fn supported(ty: GgmlType) -> bool {
    quantfarm_ggml::QUANTIZED_BY_QUANTFARM.contains(&ty)
}

/// Quantizes `src` (whole rows of `n_per_row` f32 values, row-major) to `ty` into `dst`, exactly as
/// `ggml_quantize_chunk(ty, src, dst, 0, nrows, n_per_row, imatrix)` does.
///
/// `imatrix`, when given, holds one importance weight per column and applies to every row (llama-quantize passes
/// each expert's slice separately). F32, F16, BF16 and Q8_0 ignore it, as ggml does, but its length is still
/// checked. `dst` must be exactly `rows × ty.row_bytes(n_per_row)` bytes.
///
/// Rows are split into chunks quantized in parallel on the current rayon pool (`ThreadPool::install` to bound it);
/// each row is quantized exactly as ggml would, so the bytes are the same for any number of threads.
///
/// NaN and infinity are refused: ggml would quantize them into garbage scales that llama-quantize's
/// `ggml_validate_row_data` then rejects. The error names the first bad value in row order; `dst` then holds
/// partial output (each chunk is checked just before it is quantized, while its values are in cache), which
/// callers discard — the file writer never commits it.
pub fn quantize(
    ty: GgmlType,
    src: &[f32],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
    dst: &mut [u8],
) -> Result<(), QuantError> {
    let rows = || match src.len().is_multiple_of(n_per_row) {
        true => Ok(src.len() / n_per_row),
        false => Err(QuantError::PartialRow { len: src.len(), n_per_row }),
    };
    let row_bytes = check_request(ty, rows, n_per_row, imatrix, dst)?;
    run_chunks(ty, Input::F32(src), n_per_row, row_bytes, imatrix, dst)
}

/// [`quantize`] from the raw little-endian bytes of a tensor of type `src_ty` (F32, F16, BF16, or any type
/// `quantfarm_tensors::dequant` reads, for requantizing), as llama-quantize widens its input to f32 first.
///
/// Each parallel task widens its own rows, so the conversion runs in parallel and the f32 values are quantized
/// while still in cache. A non-finite value is reported as by [`quantize`].
pub fn quantize_raw(
    ty: GgmlType,
    src_ty: GgmlType,
    raw: &[u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
    dst: &mut [u8],
) -> Result<(), QuantError> {
    let src_row = src_ty.row_bytes(n_per_row as u64).unwrap_or(0) as usize;
    let rows = || match src_row > 0 && raw.len().is_multiple_of(src_row) {
        true => Ok(raw.len() / src_row),
        false => Err(QuantError::PartialRawRow { ty: src_ty, len: raw.len(), row_bytes: src_row }),
    };
    let row_bytes = check_request(ty, rows, n_per_row, imatrix, dst)?;
    run_chunks(ty, Input::Raw { ty: src_ty, data: raw, row_bytes: src_row }, n_per_row, row_bytes, imatrix, dst)
}

/// Checks a request and returns the output bytes per row; `rows` counts the input rows once the row length is
/// known to be valid (the checks run in the order the errors are documented).
fn check_request(
    ty: GgmlType,
    rows: impl FnOnce() -> Result<usize, QuantError>,
    n_per_row: usize,
    imatrix: Option<&[f32]>,
    dst: &[u8],
) -> Result<usize, QuantError> {
    if !supported(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    let block_size = ty.block_size();
    if n_per_row == 0 || !n_per_row.is_multiple_of(block_size) {
        return Err(QuantError::PartialBlock { ty, n_per_row, block_size });
    }
    let rows = rows()?;
    let row_bytes = (n_per_row / block_size).checked_mul(ty.type_size());
    let expected = row_bytes.and_then(|row_bytes| row_bytes.checked_mul(rows)).ok_or(QuantError::DstLen {
        ty,
        rows,
        expected: usize::MAX,
        got: dst.len(),
    })?;
    if dst.len() != expected {
        return Err(QuantError::DstLen { ty, rows, expected, got: dst.len() });
    }
    if imatrix.is_none() && ty.quantize_requires_imatrix() {
        return Err(QuantError::ImatrixRequired(ty));
    }
    if let Some(imatrix) = imatrix {
        if imatrix.len() != n_per_row {
            return Err(QuantError::ImatrixLen { expected: n_per_row, got: imatrix.len() });
        }
    }
    // `expected` did not overflow, so neither does one row.
    Ok(row_bytes.unwrap_or(0))
}

/// The rows to quantize, as f32 or as raw bytes each task widens itself.
#[derive(Clone, Copy)]
enum Input<'a> {
    F32(&'a [f32]),
    Raw { ty: GgmlType, data: &'a [u8], row_bytes: usize },
}

/// Quantizes the checked request in chunks of whole rows, in parallel. The result is the first failing chunk's
/// error, in row order, so it does not depend on the thread count either.
fn run_chunks(
    ty: GgmlType,
    input: Input,
    n_per_row: usize,
    row_bytes: usize,
    imatrix: Option<&[f32]>,
    dst: &mut [u8],
) -> Result<(), QuantError> {
    if dst.is_empty() || row_bytes == 0 {
        return Ok(());
    }
    // Chunks of whole rows, about `MIN_CHUNK_ELEMS` input values each, so small tensors stay on one thread and the
    // per-task overhead is negligible for large ones. Each chunk is quantized as the whole input would have been.
    let rows = dst.len() / row_bytes;
    let rows_per_chunk = MIN_CHUNK_ELEMS.div_ceil(n_per_row).clamp(1, rows);
    let results: Vec<Result<(), QuantError>> = dst
        .par_chunks_mut(rows_per_chunk * row_bytes)
        .enumerate()
        .map(|(k, dst)| {
            let first_row = k * rows_per_chunk;
            let n_rows = dst.len() / row_bytes;
            let rows = match input {
                Input::F32(src) => Input::F32(&src[first_row * n_per_row..(first_row + n_rows) * n_per_row]),
                Input::Raw { ty: src_ty, data, row_bytes: src_row } => {
                    let data = &data[first_row * src_row..(first_row + n_rows) * src_row];
                    Input::Raw { ty: src_ty, data, row_bytes: src_row }
                }
            };
            let chunk = Chunk { ty, rows, n_per_row, imatrix };
            let done = SCRATCH.with_borrow_mut(|scratch| quantize_chunk(chunk, dst, scratch));
            done.map_err(|e| match e {
                QuantError::NonFinite { row, col, value } => QuantError::NonFinite { row: first_row + row, col, value },
                e => e,
            })
        })
        .collect();
    results.into_iter().collect()
}

/// Input values per parallel task (rounded up to whole rows).
const MIN_CHUNK_ELEMS: usize = 64 * 1024;

thread_local! {
    /// Each quantizing thread's widened values of raw input: one chunk's worth (about `MIN_CHUNK_ELEMS`, more for
    /// very long rows), kept between chunks so that it is not allocated and page-faulted in again for every one.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The index of the first NaN or infinity. A vectorizable fold finds the 256-value piece that holds one; only
/// that piece is searched element by element.
#[inline(always)]
fn first_non_finite(src: &[f32]) -> Option<usize> {
    const PIECE: usize = 256;
    src.chunks(PIECE).enumerate().find_map(|(k, piece)| {
        // An all-ones exponent is NaN or infinity; OR-ing integer compares vectorizes where a `bool` fold does not.
        if piece.iter().fold(0u32, |bad, v| bad | u32::from(v.to_bits() & 0x7F80_0000 == 0x7F80_0000)) == 0 {
            None
        } else {
            piece.iter().position(|v| !v.is_finite()).map(|i| k * PIECE + i)
        }
    })
}

/// Widens, checks and quantizes whole rows (a request already validated by [`quantize`] or [`quantize_raw`]) on
/// the calling thread; `scratch` holds the widened values of raw input. A non-finite value's row is counted from
/// the first of these rows.
///
/// On x86-64 CPUs with AVX2 the same code runs compiled for AVX2, so the lane loops (`lanes`, and the per-block
/// loops of `legacy`) process 8 values per instruction instead of 4. The arithmetic is the same IEEE single
/// precision either way (no fused multiply-adds: Rust never contracts), so the bytes are too; the golden tests run
/// whichever path the CPU takes, and `bytes_do_not_depend_on_the_cpu_path` compares the two.
fn quantize_chunk(c: Chunk, dst: &mut [u8], scratch: &mut Vec<f32>) -> Result<(), QuantError> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { quantize_chunk_avx2(c, dst, scratch) };
    }
    quantize_chunk_portable(c, dst, scratch)
}

/// One chunk's request: the output type, its rows and the imatrix.
#[derive(Clone, Copy)]
struct Chunk<'a> {
    ty: GgmlType,
    rows: Input<'a>,
    n_per_row: usize,
    imatrix: Option<&'a [f32]>,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn quantize_chunk_avx2(c: Chunk, dst: &mut [u8], scratch: &mut Vec<f32>) -> Result<(), QuantError> {
    quantize_chunk_portable(c, dst, scratch)
}

/// The body of [`quantize_chunk`], for the baseline CPU. Always inlined, as is everything below it that matters
/// for speed, so that `quantize_chunk_avx2` compiles all of it again for AVX2.
#[inline(always)]
fn quantize_chunk_portable(c: Chunk, dst: &mut [u8], scratch: &mut Vec<f32>) -> Result<(), QuantError> {
    let Chunk { ty, rows, n_per_row, imatrix } = c;
    let src: &[f32] = match rows {
        Input::F32(src) => src,
        Input::Raw { ty: src_ty, data, .. } => {
            scratch.resize(data.len() / src_ty.type_size() * src_ty.block_size(), 0.0);
            if src_ty == GgmlType::BF16 {
                // The common case, widened here so that it is compiled with the rest (bf16 is the top half of an
                // f32, as `dequant::bf16_to_f32`).
                for (o, b) in scratch.iter_mut().zip(data.chunks_exact(2)) {
                    *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
                }
            } else if quantfarm_tensors::dequant::dequantize_ggml(src_ty, data, scratch).is_err() {
                // `quantize_raw` checked that `data` is whole rows, so this cannot happen.
                return Err(QuantError::Lost);
            }
            scratch
        }
    };
    if let Some(i) = first_non_finite(src) {
        return Err(QuantError::NonFinite { row: i / n_per_row, col: i % n_per_row, value: src[i] });
    }
    match ty {
        GgmlType::F32 => float::f32_row(src, dst),
        GgmlType::F16 => float::f16_row(src, dst),
        GgmlType::BF16 => float::bf16_row(src, dst),
        GgmlType::Q8_0 => legacy::quantize_rows::<BlockQ8_0>(src, n_per_row, imatrix, dst),
        GgmlType::Q4_0 => legacy::quantize_rows::<BlockQ4_0>(src, n_per_row, imatrix, dst),
        GgmlType::Q4_1 => legacy::quantize_rows::<BlockQ4_1>(src, n_per_row, imatrix, dst),
        GgmlType::Q5_0 => legacy::quantize_rows::<BlockQ5_0>(src, n_per_row, imatrix, dst),
        GgmlType::Q5_1 => legacy::quantize_rows::<BlockQ5_1>(src, n_per_row, imatrix, dst),
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            kquants::quantize_rows(ty, src, n_per_row, imatrix, dst)
        }
        GgmlType::IQ4_NL => blockwise::rows!(src, n_per_row, imatrix, dst, iq4::iq4_nl),
        GgmlType::IQ4_XS => blockwise::rows!(src, n_per_row, imatrix, dst, iq4::iq4_xs),
        GgmlType::IQ3_XXS => blockwise::rows!(src, n_per_row, imatrix, dst, iq3::iq3_xxs),
        GgmlType::IQ3_S => blockwise::rows!(src, n_per_row, imatrix, dst, iq3::iq3_s),
        // `check_request` refused IQ2_XXS and IQ2_XS without an imatrix (ggml aborts there), so `None` does not occur;
        // it would give all-zero blocks.
        GgmlType::IQ2_XXS => blockwise::rows!(src, n_per_row, imatrix, dst, iq2::iq2_xxs_or_zero),
        GgmlType::IQ2_XS => blockwise::rows!(src, n_per_row, imatrix, dst, iq2::iq2_xs_or_zero),
        GgmlType::IQ2_S => blockwise::rows!(src, n_per_row, imatrix, dst, iq2::iq2_s),
        GgmlType::IQ1_S => blockwise::rows!(src, n_per_row, imatrix, dst, iq1::iq1_s_or_empty),
        GgmlType::IQ1_M => blockwise::rows!(src, n_per_row, imatrix, dst, iq1::iq1_m),
        // These ignore an importance matrix, as ggml does.
        GgmlType::MXFP4 => blockwise::rows!(src, n_per_row, None, dst, no_imatrix::mxfp4),
        GgmlType::NVFP4 => blockwise::rows!(src, n_per_row, None, dst, no_imatrix::nvfp4),
        GgmlType::TQ1_0 => blockwise::rows!(src, n_per_row, None, dst, no_imatrix::tq1_0),
        GgmlType::TQ2_0 => blockwise::rows!(src, n_per_row, None, dst, no_imatrix::tq2_0),
        GgmlType::Q1_0 => blockwise::rows!(src, n_per_row, None, dst, no_imatrix::q1_0),
        GgmlType::Q2_0 => blockwise::rows!(src, n_per_row, None, dst, no_imatrix::q2_0),
        // Not made here: `quantize` refused them (`supported`; the test below keeps the two lists in step).
        GgmlType::Q8_1
        | GgmlType::Q8_K
        | GgmlType::I8
        | GgmlType::I16
        | GgmlType::I32
        | GgmlType::I64
        | GgmlType::F64 => {}
    }
    Ok(())
}

/// The block quantizers that take no importance matrix, in the shape `blockwise::rows!` calls. Functions, not
/// closures at the dispatch: a closure is compiled on its own for the baseline CPU, where these are inlined into
/// the AVX2 build of [`quantize_chunk`].
mod no_imatrix {
    use quantfarm_ggml::blocks::*;

    use crate::{fp4, low_bit, ternary};

    #[inline(always)]
    pub(crate) fn mxfp4(x: &[f32; 32], _: Option<&[f32; 32]>) -> BlockMXFP4 {
        fp4::mxfp4(x)
    }

    #[inline(always)]
    pub(crate) fn nvfp4(x: &[f32; 64], _: Option<&[f32; 64]>) -> BlockNVFP4 {
        fp4::nvfp4(x)
    }

    #[inline(always)]
    pub(crate) fn tq1_0(x: &[f32; 256], _: Option<&[f32; 256]>) -> BlockTQ1_0 {
        ternary::tq1_0(x)
    }

    #[inline(always)]
    pub(crate) fn tq2_0(x: &[f32; 256], _: Option<&[f32; 256]>) -> BlockTQ2_0 {
        ternary::tq2_0(x)
    }

    #[inline(always)]
    pub(crate) fn q1_0(x: &[f32; 128], _: Option<&[f32; 128]>) -> BlockQ1_0 {
        low_bit::q1_0(x)
    }

    #[inline(always)]
    pub(crate) fn q2_0(x: &[f32; 64], _: Option<&[f32; 64]>) -> BlockQ2_0 {
        low_bit::q2_0(x)
    }
}

/// Pseudo-random values uniform in [−1, 1) from a 64-bit LCG seeded with `seed`: a fixed, dependency-free stream
/// for the tests' inputs (the benchmark in `benches/blocks.rs` draws the same stream).
#[cfg(test)]
pub(crate) fn test_uniform(seed: u64) -> impl FnMut() -> f32 {
    let mut state = seed;
    move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 40) as i32 - 8_388_608) as f32 / 8_388_608.0
    }
}

/// Compile-time link between the block types and the dispatch above: each block names the type it encodes.
const _: () = {
    assert!(matches!(BlockQ8_0::TYPE, GgmlType::Q8_0));
    assert!(matches!(BlockQ4_0::TYPE, GgmlType::Q4_0));
    assert!(matches!(BlockQ4_1::TYPE, GgmlType::Q4_1));
    assert!(matches!(BlockQ5_0::TYPE, GgmlType::Q5_0));
    assert!(matches!(BlockQ5_1::TYPE, GgmlType::Q5_1));
};

#[cfg(test)]
mod tests {
    use super::*;

    fn dst_for(ty: GgmlType, n_per_row: usize, rows: usize) -> Vec<u8> {
        vec![0; n_per_row / ty.block_size() * ty.type_size() * rows]
    }

    #[test]
    fn rejects_bad_requests() {
        let src = vec![0.5f32; 64];
        let mut dst = dst_for(GgmlType::Q4_0, 32, 2);
        assert_eq!(quantize(GgmlType::Q8_K, &src, 256, None, &mut dst), Err(QuantError::Unsupported(GgmlType::Q8_K)));
        assert!(matches!(quantize(GgmlType::Q4_0, &src, 48, None, &mut dst), Err(QuantError::PartialBlock { .. })));
        assert!(matches!(quantize(GgmlType::Q4_0, &src, 0, None, &mut dst), Err(QuantError::PartialBlock { .. })));
        assert!(matches!(quantize(GgmlType::Q4_0, &src[..48], 32, None, &mut dst), Err(QuantError::PartialRow { .. })));
        assert_eq!(
            quantize(GgmlType::Q4_0, &src, 32, None, &mut dst[..35]),
            Err(QuantError::DstLen { ty: GgmlType::Q4_0, rows: 2, expected: 36, got: 35 })
        );
        assert_eq!(
            quantize(GgmlType::Q4_0, &src, 32, Some(&[1.0; 31]), &mut dst),
            Err(QuantError::ImatrixLen { expected: 32, got: 31 })
        );
        assert!(quantize(GgmlType::Q4_0, &src, 32, Some(&[1.0; 32]), &mut dst).is_ok());
    }

    #[test]
    fn reports_where_a_non_finite_value_is() {
        let mut src = vec![0.5f32; 96];
        src[70] = f32::NAN;
        let mut dst = dst_for(GgmlType::F16, 32, 3);
        let err = quantize(GgmlType::F16, &src, 32, None, &mut dst).unwrap_err();
        assert!(matches!(err, QuantError::NonFinite { row: 2, col: 6, .. }), "{err}");
        src[70] = f32::NEG_INFINITY;
        let err = quantize(GgmlType::Q8_0, &src, 32, None, &mut dst_for(GgmlType::Q8_0, 32, 3)).unwrap_err();
        assert_eq!(err.to_string(), "input value -inf at row 2, column 6 is not finite");
    }

    #[test]
    fn raw_input_gives_the_bytes_of_its_f32_values() {
        let (rows, n) = (40, 4096); // several parallel chunks
        let f32s: Vec<f32> = (0..rows * n).map(|i| ((i * 7919) % 2003) as f32 / 97.0 - 10.0).collect();
        let bf16: Vec<u8> = f32s.iter().flat_map(|v| f32_to_bf16_bits(*v).to_le_bytes()).collect();
        let widened: Vec<f32> =
            bf16.chunks(2).map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)).collect();
        let imatrix: Vec<f32> = (0..n).map(|j| (j % 13 + 1) as f32).collect();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("pool");
        for ty in [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q6_K] {
            for imat in [None, Some(imatrix.as_slice())] {
                let mut want = dst_for(ty, n, rows);
                quantize(ty, &widened, n, imat, &mut want).expect("f32");
                let mut got = dst_for(ty, n, rows);
                pool.install(|| quantize_raw(ty, GgmlType::BF16, &bf16, n, imat, &mut got)).expect("raw");
                assert!(got == want, "{ty} imatrix {}", imat.is_some());
            }
        }
    }

    #[test]
    fn raw_input_errors_name_the_first_bad_value_in_row_order() {
        let (rows, n) = (64, 2048);
        let mut bf16: Vec<u8> = (0..rows * n).flat_map(|i| f32_to_bf16_bits(i as f32 / 1e5).to_le_bytes()).collect();
        // Infinity in a late chunk, NaN in an earlier one: whichever thread gets there first, the NaN is reported.
        bf16[2 * (60 * n + 5)..][..2].copy_from_slice(&0x7F80u16.to_le_bytes());
        bf16[2 * (33 * n + 9)..][..2].copy_from_slice(&0x7FC1u16.to_le_bytes());
        let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build().expect("pool");
        let mut dst = dst_for(GgmlType::Q4_0, n, rows);
        let err = pool.install(|| quantize_raw(GgmlType::Q4_0, GgmlType::BF16, &bf16, n, None, &mut dst)).unwrap_err();
        assert!(matches!(err, QuantError::NonFinite { row: 33, col: 9, .. }), "{err}");
        assert_eq!(
            quantize_raw(GgmlType::Q4_0, GgmlType::BF16, &bf16[..1000], n, None, &mut dst),
            Err(QuantError::PartialRawRow { ty: GgmlType::BF16, len: 1000, row_bytes: 4096 })
        );
    }

    #[test]
    fn bytes_do_not_depend_on_the_cpu_path() {
        #[cfg(target_arch = "x86_64")]
        if !std::is_x86_feature_detected!("avx2") {
            eprintln!("SKIP bytes_do_not_depend_on_the_cpu_path: this CPU has no AVX2, so there is one path only");
        }
        let n_per_row = 4 * 256 + 96; // K-quants use the first 1024 columns; 35 legacy blocks leave a partial group
        let rows = 48;
        let mut next = test_uniform(0x9e37_79b9_7f4a_7c15);
        let src: Vec<f32> = (0..rows * n_per_row)
            .map(|i| {
                let x = next();
                match i % 1000 {
                    0..=255 if i / 1000 % 7 == 3 => 0.0, // all-zero blocks and super-blocks
                    _ if i % 89 == 0 => x * 20.0,
                    _ => x,
                }
            })
            .collect();
        let imatrix: Vec<f32> = (0..n_per_row).map(|j| ((j * 13) % 31) as f32 / 8.0).collect();
        for &ty in GgmlType::ALL.iter().filter(|&&ty| supported(ty)) {
            let n = n_per_row / ty.block_size() * ty.block_size();
            let src: Vec<f32> = src.chunks(n_per_row).flat_map(|row| &row[..n]).copied().collect();
            for imat in [None, Some(&imatrix[..n])] {
                if imat.is_none() && ty.quantize_requires_imatrix() {
                    continue; // refused before quantize_chunk
                }
                let (mut fast, mut portable) = (dst_for(ty, n, rows), dst_for(ty, n, rows));
                let mut scratch = Vec::new();
                let chunk = Chunk { ty, rows: Input::F32(&src), n_per_row: n, imatrix: imat };
                quantize_chunk(chunk, &mut fast, &mut scratch).expect("finite");
                quantize_chunk_portable(chunk, &mut portable, &mut scratch).expect("finite");
                assert!(fast == portable, "{ty} imatrix {}", imat.is_some());
            }
        }
    }

    #[test]
    fn supported_list_is_what_quantize_accepts() {
        for &ty in GgmlType::ALL {
            let n = ty.block_size().max(32) * 2;
            let src: Vec<f32> = (0..n).map(|i| i as f32 / 7.0 - 3.0).collect();
            let mut dst = dst_for(ty, n, 1);
            let imatrix = vec![1.0; n];
            let imatrix = ty.quantize_requires_imatrix().then_some(&imatrix[..]);
            let result = quantize(ty, &src, n, imatrix, &mut dst);
            assert_eq!(result.is_ok(), supported(ty), "{ty}: {result:?}");
        }
    }

    #[test]
    fn empty_input_is_zero_rows() {
        assert!(quantize(GgmlType::Q5_1, &[], 32, None, &mut []).is_ok());
    }

    /// Quantizes `rows × n_per_row` pseudo-random values (with outliers) to every supported type, with and without
    /// an imatrix (with one only where ggml needs it), on a pool of `threads` threads: (type, imatrix?, bytes).
    fn quantize_all_on(
        threads: usize,
        src: &[f32],
        n_per_row: usize,
        imatrix: &[f32],
    ) -> Vec<(GgmlType, bool, Vec<u8>)> {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("thread pool");
        pool.install(|| {
            let mut outs = Vec::new();
            for &ty in GgmlType::ALL.iter().filter(|&&ty| supported(ty)) {
                for imat in [None, Some(imatrix)] {
                    if imat.is_none() && ty.quantize_requires_imatrix() {
                        continue;
                    }
                    let mut dst = dst_for(ty, n_per_row, src.len() / n_per_row);
                    quantize(ty, src, n_per_row, imat, &mut dst).unwrap_or_else(|e| panic!("{ty}: {e}"));
                    outs.push((ty, imat.is_some(), dst));
                }
            }
            outs
        })
    }

    #[test]
    fn bytes_do_not_depend_on_thread_count() {
        let (rows, n_per_row) = (300, 512);
        let mut next = test_uniform(0x0123_4567_89ab_cdef);
        let src: Vec<f32> = (0..rows * n_per_row)
            .map(|i| {
                let x = next();
                if i % 97 == 0 {
                    x * 8.0
                } else {
                    x
                }
            })
            .collect();
        let imatrix: Vec<f32> = (0..n_per_row).map(|j| ((j * 37) % 101 + 1) as f32 / 64.0).collect();
        let one = quantize_all_on(1, &src, n_per_row, &imatrix);
        let four = quantize_all_on(4, &src, n_per_row, &imatrix);
        assert_eq!(one.len(), four.len());
        for (a, b) in one.iter().zip(&four) {
            assert!(a == b, "{} imatrix {}: the output differs between 1 and 4 threads", a.0, a.1);
        }
        // Also against a row-at-a-time reference: each row alone gives the same bytes as within the whole tensor.
        let ty = GgmlType::Q3_K;
        let row_bytes = dst_for(ty, n_per_row, 1).len();
        let (_, _, whole) = one.iter().find(|(t, imat, _)| *t == ty && !imat).expect("Q3_K is supported");
        for (r, x) in src.chunks(n_per_row).enumerate().step_by(37) {
            let mut dst = dst_for(ty, n_per_row, 1);
            quantize(ty, x, n_per_row, None, &mut dst).expect("one row");
            assert_eq!(dst, whole[r * row_bytes..(r + 1) * row_bytes], "row {r}");
        }
    }
}
