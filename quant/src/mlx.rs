//! MLX affine quantization, byte-identical to `mlx.core.quantize(w, group_size, bits)` (mode "affine") on CPU.
//!
//! A checkpoint written here must be the one `mlx_lm.convert -q` writes, so the per-group arithmetic is a port of
//! the CPU kernel `mlx/backend/cpu/quantized.cpp::quantize` (mlx 0.32), not of the `mx.quantize` docstring
//! (`python/src/ops.cpp`):
//!
//! * everything is f32, the extremes are C `std::max`/`std::min` folds starting at ∓∞;
//! * the larger-magnitude extreme is the anchor (`edge`), so the scale is negative when `|max| ≥ |min|`;
//! * `scale = max((max − min) / n, 1e-7)` with its sign, then `q0 = rint(edge / scale)` and, when `q0 ≠ 0`,
//!   `scale = edge / q0` and `bias = edge` (0.0 becomes exactly representable);
//! * codes are `clamp(rint((w − bias) / scale), 0, n)` computed from the **unrounded f32** scale and bias; only the
//!   stored scale and bias are cast to the source dtype (bf16 / f16 / f32, round to nearest even);
//! * `rint` is round-half-even (the CPU kernel; Metal and CUDA round half away from zero and differ).
//!
//! Packing: code `i` of a row occupies bits `[i·b, (i+1)·b)` of the row's little-endian bitstream, bit `k` being bit
//! `k mod 32` of uint32 word `k / 32`. For 2/4/8 bits that is the kernel's word packing, for 3/5/6 bits it is its
//! 3-, 5- and 3-byte packs read back as little-endian words (codes cross word boundaries). Every group starts on a
//! word boundary because `group_size · bits` is a multiple of 32 for every supported pair (`docs/formats.md` §2).

use quantfarm_tensors::dequant::{bf16_bits_to_f32, f16_bits_to_f32};
use quantfarm_tensors::Dtype;
use rayon::prelude::*;

use crate::float::{f32_to_bf16_bits, f32_to_f16_bits};

/// Bit widths `mx.quantize` accepts in affine mode.
pub const MLX_BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];
/// Group sizes `mx.quantize` accepts in affine mode.
pub const MLX_GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// The `eps` floor of the scale's magnitude in the CPU kernel (`float eps = 1e-7`).
const EPS: f32 = 1e-7;

/// Why an MLX quantization request was refused. Everything is checked before any work is done.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MlxQuantError {
    #[error("MLX affine quantization supports bits 2, 3, 4, 5, 6, 8 and group sizes 32, 64, 128, not {bits} bits with groups of {group_size}")]
    Unsupported { bits: u32, group_size: usize },
    #[error("scales and biases must be F32, F16 or BF16 (the source dtype), not {0:?}")]
    ScaleDtype(Dtype),
    #[error("rows of {cols} elements are not a whole number of {group_size}-element groups")]
    PartialGroup { cols: usize, group_size: usize },
    #[error("input of {len} elements is not a whole number of {cols}-element rows")]
    PartialRow { len: usize, cols: usize },
    #[error("input value {value} at row {row}, column {col} is not finite")]
    NonFinite { row: usize, col: usize, value: f32 },
    #[error("values to quantize must be F32, F16 or BF16, not {0:?}")]
    InputDtype(Dtype),
    #[error("input of {len} bytes is not a whole number of {size}-byte values")]
    PartialValue { len: usize, size: usize },
}

impl MlxQuantError {
    /// The error with its row counted from `first` rows earlier (the input was a piece of a tensor from that row).
    pub fn from_row(self, first: usize) -> MlxQuantError {
        match self {
            MlxQuantError::NonFinite { row, col, value } => MlxQuantError::NonFinite { row: row + first, col, value },
            e => e,
        }
    }
}

/// The three arrays `mx.quantize` returns, row-major, in the layout mlx stores them.
#[derive(Debug, Clone, PartialEq)]
pub struct MlxQuantized {
    /// `rows × cols·bits/32` uint32 words (`P.weight`).
    pub packed: Vec<u32>,
    /// `rows × cols/group_size` scales, little-endian bytes of the requested dtype (`P.scales`).
    pub scales: Vec<u8>,
    /// `rows × cols/group_size` biases, little-endian bytes of the requested dtype (`P.biases`).
    pub biases: Vec<u8>,
}

impl MlxQuantized {
    /// The packed words as the little-endian bytes a safetensors file holds.
    pub fn packed_bytes(&self) -> Vec<u8> {
        self.packed.iter().flat_map(|w| w.to_le_bytes()).collect()
    }
}

/// Checks a request: supported `bits`/`group_size`, a float scale dtype, `cols` a whole number of groups.
pub fn check_params(cols: usize, bits: u32, group_size: usize, dtype: Dtype) -> Result<(), MlxQuantError> {
    if !MLX_BITS.contains(&bits) || !MLX_GROUP_SIZES.contains(&group_size) {
        return Err(MlxQuantError::Unsupported { bits, group_size });
    }
    if !matches!(dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
        return Err(MlxQuantError::ScaleDtype(dtype));
    }
    if cols == 0 || !cols.is_multiple_of(group_size) {
        return Err(MlxQuantError::PartialGroup { cols, group_size });
    }
    Ok(())
}

/// Quantizes `w` (whole rows of `cols` values, row-major, already widened to f32 from the source dtype) as
/// `mx.quantize(w, group_size, bits)` does on CPU, with scales and biases stored in `dtype`.
///
/// Pass the source dtype as `dtype`: mlx keeps scales and biases in the input's dtype, and converting bf16 or f16
/// to f32 first is exact, so the codes do not depend on it. Rows are quantized in parallel; groups are independent,
/// so the bytes do not depend on the number of threads.
///
/// NaN and infinity are refused: the kernel would cast a NaN code to an integer (undefined in C++).
pub fn quantize_affine(
    w: &[f32],
    cols: usize,
    bits: u32,
    group_size: usize,
    dtype: Dtype,
) -> Result<MlxQuantized, MlxQuantError> {
    let mut out = AffineBytes::default();
    quantize_affine_into(AffineInput::F32(w), cols, bits, group_size, dtype, &mut out)?;
    let packed = out.codes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Ok(MlxQuantized { packed, scales: out.scales, biases: out.biases })
}

/// The values [`quantize_affine_into`] quantizes: f32 already, or the little-endian bytes of a float dtype, widened
/// group by group as they are quantized (no f32 copy of the whole input).
#[derive(Clone, Copy, Debug)]
pub enum AffineInput<'a> {
    F32(&'a [f32]),
    /// F32, F16 or BF16 values. In another dtype than the scales' they are first rounded to it, as mlx-lm casts
    /// weights to the model's dtype before quantizing them.
    Bytes(&'a [u8], Dtype),
}

impl AffineInput<'_> {
    fn len(&self) -> Result<usize, MlxQuantError> {
        match *self {
            AffineInput::F32(w) => Ok(w.len()),
            AffineInput::Bytes(b, d @ (Dtype::F32 | Dtype::F16 | Dtype::BF16)) => {
                if !b.len().is_multiple_of(d.size()) {
                    return Err(MlxQuantError::PartialValue { len: b.len(), size: d.size() });
                }
                Ok(b.len() / d.size())
            }
            AffineInput::Bytes(_, d) => Err(MlxQuantError::InputDtype(d)),
        }
    }

    /// Values `at..at + out.len()` as quantized: widened, and rounded to `dtype` when they come in another one.
    #[inline]
    fn values(&self, at: usize, dtype: Dtype, out: &mut [f32]) {
        match *self {
            AffineInput::F32(w) => out.copy_from_slice(&w[at..at + out.len()]),
            AffineInput::Bytes(b, from) => {
                let size = from.size();
                let bytes = b[at * size..(at + out.len()) * size].chunks_exact(size);
                match from {
                    Dtype::BF16 => out
                        .iter_mut()
                        .zip(bytes)
                        .for_each(|(x, c)| *x = bf16_bits_to_f32(u16::from_le_bytes([c[0], c[1]]))),
                    Dtype::F16 => out
                        .iter_mut()
                        .zip(bytes)
                        .for_each(|(x, c)| *x = f16_bits_to_f32(u16::from_le_bytes([c[0], c[1]]))),
                    _ => out.iter_mut().zip(bytes).for_each(|(x, c)| *x = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                }
                if from != dtype {
                    round_to(out, dtype);
                }
            }
        }
    }
}

/// Codes (the little-endian bytes of the packed uint32 words, `P.weight`), scales and biases, as stored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AffineBytes {
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
    pub biases: Vec<u8>,
}

/// [`quantize_affine`] of whole rows given as `input`, **appended** to `out` (the caller clears what it wants
/// cleared: a tensor's scales and biases can gather over its pieces while each piece's codes go out). Rayon tasks
/// of whole rows each widen their own groups, so nothing of the input's size is allocated. The first non-finite
/// value (after rounding) is reported by its row and column within `input`; `out`'s contents are then unspecified.
pub fn quantize_affine_into(
    input: AffineInput<'_>,
    cols: usize,
    bits: u32,
    group_size: usize,
    dtype: Dtype,
    out: &mut AffineBytes,
) -> Result<(), MlxQuantError> {
    check_params(cols, bits, group_size, dtype)?;
    let len = input.len()?;
    if !len.is_multiple_of(cols) {
        return Err(MlxQuantError::PartialRow { len, cols });
    }
    let rows = len / cols;
    let row_code_bytes = cols * bits as usize / 8;
    let row_param_bytes = cols / group_size * dtype.size();
    let grow = |v: &mut Vec<u8>, n: usize| {
        let at = v.len();
        v.resize(at + n, 0);
        at
    };
    let codes_at = grow(&mut out.codes, rows * row_code_bytes);
    let scales_at = grow(&mut out.scales, rows * row_param_bytes);
    let biases_at = grow(&mut out.biases, rows * row_param_bytes);
    // Enough rows per task that small tensors do not drown in scheduling, independent of the thread count.
    let rows_per_task = (65536 / cols).max(1);
    let first_bad = out.codes[codes_at..]
        .par_chunks_mut(row_code_bytes * rows_per_task)
        .zip(out.scales[scales_at..].par_chunks_mut(row_param_bytes * rows_per_task))
        .zip(out.biases[biases_at..].par_chunks_mut(row_param_bytes * rows_per_task))
        .enumerate()
        .filter_map(|(task, ((codes, scales), biases))| {
            quantize_groups(&input, task * rows_per_task * cols, bits, group_size, dtype, [codes, scales, biases])
        })
        .min();
    if let Some(i) = first_bad {
        let mut value = [0f32];
        input.values(i, dtype, &mut value);
        return Err(MlxQuantError::NonFinite { row: i / cols, col: i % cols, value: value[0] });
    }
    Ok(())
}

/// Quantizes the groups of one task, whose values start at `first` in `input`, into its slices of the codes,
/// scales and biases; the index of the first non-finite value stops it.
#[inline]
fn quantize_groups(
    input: &AffineInput<'_>,
    first: usize,
    bits: u32,
    group_size: usize,
    dtype: Dtype,
    [codes, scales, biases]: [&mut [u8]; 3],
) -> Option<usize> {
    let esize = dtype.size();
    let n_words = group_size * bits as usize / 32;
    let (mut values, mut words) = ([0f32; 128], [0u32; 32]);
    let (values, words) = (&mut values[..group_size], &mut words[..n_words]);
    let params = scales.chunks_exact_mut(esize).zip(biases.chunks_exact_mut(esize));
    for (g, (code_bytes, (s, b))) in codes.chunks_exact_mut(n_words * 4).zip(params).enumerate() {
        let at = first + g * group_size;
        input.values(at, dtype, values);
        // A vectorizable check first; the position only when something is wrong.
        if !values.iter().fold(true, |ok, v| ok & v.is_finite()) {
            return Some(at + values.iter().position(|v| !v.is_finite()).unwrap_or(0));
        }
        let (scale, bias) = quantize_group(values, bits, words);
        for (o, w) in code_bytes.chunks_exact_mut(4).zip(words.iter()) {
            o.copy_from_slice(&w.to_le_bytes());
        }
        store(scale, dtype, s);
        store(bias, dtype, b);
    }
    None
}

/// `x.astype(dtype)` for values already widened to f32 (round to nearest even).
pub(crate) fn round_to(vals: &mut [f32], dtype: Dtype) {
    vals.iter_mut().for_each(|x| *x = round_value(*x, dtype));
}

/// `x` rounded to `dtype` (bf16 and f16 to nearest even; f32 as it is), as an f32.
pub(crate) fn round_value(x: f32, dtype: Dtype) -> f32 {
    match dtype {
        Dtype::BF16 => f32::from_bits(u32::from(f32_to_bf16_bits(x)) << 16),
        Dtype::F16 => f16_bits_to_f32(f32_to_f16_bits(x)),
        _ => x,
    }
}

/// C++ `std::max(a, b)`: `(a < b) ? b : a` (keeps `a` on ties and when `b` is NaN).
#[inline]
fn c_max(a: f32, b: f32) -> f32 {
    if a < b {
        b
    } else {
        a
    }
}

/// C++ `std::min(a, b)`: `(b < a) ? b : a`.
#[inline]
fn c_min(a: f32, b: f32) -> f32 {
    if b < a {
        b
    } else {
        a
    }
}

/// One group of the CPU kernel `quantize<T, U>`: returns the f32 (scale, bias) and packs the codes into `words`
/// (`group.len() · bits / 32` words, overwritten).
#[inline]
fn quantize_group(group: &[f32], bits: u32, words: &mut [u32]) -> (f32, f32) {
    let n_bins = ((1u32 << bits) - 1) as f32;
    // The extremes over 8 lanes, then across them: for finite values max and min do not depend on the order (a
    // signed zero may come out with the other sign, which changes neither the scale nor any code).
    let (mut maxs, mut mins) = ([f32::NEG_INFINITY; 8], [f32::INFINITY; 8]);
    for chunk in group.chunks_exact(8) {
        for i in 0..8 {
            maxs[i] = c_max(maxs[i], chunk[i]);
            mins[i] = c_min(mins[i], chunk[i]);
        }
    }
    let w_max = maxs.into_iter().fold(f32::NEG_INFINITY, c_max);
    let w_min = mins.into_iter().fold(f32::INFINITY, c_min);
    let mask = w_min.abs() > w_max.abs();
    let mut scale = c_max((w_max - w_min) / n_bins, EPS);
    scale = if mask { scale } else { -scale };
    let edge = if mask { w_min } else { w_max };
    let q0 = (edge / scale).round_ties_even();
    let mut bias = 0.0f32;
    if q0 != 0.0 {
        scale = edge / q0;
        bias = edge;
    }

    // The codes, in a branch-free loop the compiler vectorizes: `clamp(rint((x − bias) / scale), 0, n)`. Clamping
    // to [−1, n + 1] before rounding changes no result and keeps the value where adding and subtracting 1.5·2²³
    // is exactly round-half-even (|v| < 2²²), which spares a libm `rintf` call per weight.
    const MAGIC: f32 = 12_582_912.0;
    let mut codes = [0f32; 128];
    let codes = &mut codes[..group.len()];
    for (c, &x) in codes.iter_mut().zip(group) {
        let v = c_min(c_max((x - bias) / scale, -1.0), n_bins + 1.0);
        *c = c_min(c_max((v + MAGIC) - MAGIC, 0.0), n_bins);
    }
    match bits {
        2 => pack_whole::<2>(codes, words),
        4 => pack_whole::<4>(codes, words),
        8 => pack_whole::<8>(codes, words),
        _ => pack_stream(codes, bits, words),
    }
    (scale, bias)
}

/// Packing for widths that divide 32: word `k` holds codes `k·32/B ..` from its lowest bits up (the same bits as
/// the bitstream), unrolled so the compiler can vectorize it.
#[inline]
fn pack_whole<const B: u32>(codes: &[f32], words: &mut [u32]) {
    let per = (32 / B) as usize;
    for (w, c) in words.iter_mut().zip(codes.chunks_exact(per)) {
        let mut v = 0u32;
        for (j, &q) in c.iter().enumerate() {
            v |= (q as u32) << (B as usize * j);
        }
        *w = v;
    }
}

/// Packing for 3, 5 and 6 bits: codes cross word boundaries in the row's little-endian bitstream.
#[inline]
fn pack_stream(codes: &[f32], bits: u32, words: &mut [u32]) {
    words.fill(0);
    let mut acc = 0u64;
    let mut have = 0u32;
    let mut next = 0usize;
    for &c in codes {
        acc |= (c as u64) << have;
        have += bits;
        if have >= 32 {
            words[next] = acc as u32;
            next += 1;
            acc >>= 32;
            have -= 32;
        }
    }
    debug_assert!(have == 0 && next == words.len());
}

/// `static_cast<T>(x)` into little-endian bytes: bf16 and f16 round to nearest even (mlx's software conversions
/// agree with ggml's for every finite value, and the scale and bias of finite input are finite).
#[inline]
fn store(x: f32, dtype: Dtype, out: &mut [u8]) {
    match dtype {
        Dtype::BF16 => out.copy_from_slice(&f32_to_bf16_bits(x).to_le_bytes()),
        Dtype::F16 => out.copy_from_slice(&f32_to_f16_bits(x).to_le_bytes()),
        _ => out.copy_from_slice(&x.to_le_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quantfarm_tensors::dequant::dequantize_mlx_affine;

    fn f32s(bytes: &[u8]) -> Vec<f32> {
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    #[test]
    fn worked_examples_from_the_spec() {
        // [-1, 0.5] at 4 bits: positive scale 0.1, bias -1, 0 is code 10.
        let mut w: Vec<f32> = (0..32).map(|i| -1.0 + 1.5 * i as f32 / 31.0).collect();
        w[5] = 0.0;
        let q = quantize_affine(&w, 32, 4, 32, Dtype::F32).unwrap();
        let (s, b) = (f32s(&q.scales)[0], f32s(&q.biases)[0]);
        assert_eq!(b, -1.0);
        assert!((s - 0.1).abs() < 1e-6, "{s}");
        assert_eq!((q.packed[0] >> 20) & 0xF, 10, "code of 0.0");
        // [-0.5, 1]: negative scale, bias +1, 1.0 is code 0.
        let w: Vec<f32> = w.iter().map(|x| -x).collect();
        let q = quantize_affine(&w, 32, 4, 32, Dtype::F32).unwrap();
        assert_eq!(f32s(&q.biases)[0], 1.0);
        assert!(f32s(&q.scales)[0] < 0.0);
        assert_eq!(q.packed[0] & 0xF, 0);
    }

    #[test]
    fn constant_and_zero_groups() {
        let q = quantize_affine(&[0.0; 64], 64, 4, 64, Dtype::F32).unwrap();
        assert!(q.packed.iter().all(|&w| w == 0));
        assert_eq!(f32s(&q.scales), [-EPS]);
        assert_eq!(f32s(&q.biases), [0.0]);
        // A constant group: the anchor is the value itself, every code is 0 and decodes exactly.
        let q = quantize_affine(&[0.75; 64], 64, 3, 64, Dtype::F32).unwrap();
        let mut out = [0f32; 64];
        dequantize_mlx_affine(3, 64, &q.packed_bytes(), &f32s(&q.scales), &f32s(&q.biases), &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0.75), "{out:?}");
    }

    #[test]
    fn decodes_to_the_nearest_grid_point_at_every_width() {
        for bits in MLX_BITS {
            for g in MLX_GROUP_SIZES {
                let cols = 256;
                let w: Vec<f32> = (0..cols * 3).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
                let q = quantize_affine(&w, cols, bits, g, Dtype::F32).unwrap();
                assert_eq!(q.packed.len(), 3 * cols * bits as usize / 32);
                let (s, b) = (f32s(&q.scales), f32s(&q.biases));
                let mut out = vec![0f32; w.len()];
                dequantize_mlx_affine(bits, g, &q.packed_bytes(), &s, &b, &mut out).unwrap();
                for (i, (x, y)) in w.iter().zip(&out).enumerate() {
                    // Each value decodes to the nearest point of its group's grid (the far extreme may lie beyond
                    // the grid, `docs/formats.md` §2, so "within half a step" is not the property).
                    let (sc, bi) = (s[i / g], b[i / g]);
                    let best =
                        (0..1u32 << bits).map(|q| (x - (sc * q as f32 + bi)).abs()).fold(f32::INFINITY, f32::min);
                    assert!((x - y).abs() <= best + sc.abs() * 1e-4, "bits {bits} g {g} i {i}: {x} vs {y}");
                }
            }
        }
    }

    #[test]
    fn bytes_do_not_depend_on_thread_count() {
        let w: Vec<f32> = (0..4096 * 64).map(|i| ((i as u64 * 2654435761) % 1000) as f32 / 333.0 - 1.5).collect();
        let many = quantize_affine(&w, 4096, 5, 64, Dtype::BF16).unwrap();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let one = pool.install(|| quantize_affine(&w, 4096, 5, 64, Dtype::BF16).unwrap());
        assert_eq!(many, one);
    }

    /// Little-endian bytes of `w` in a float dtype (rounded to nearest even).
    fn encode(w: &[f32], dtype: Dtype) -> Vec<u8> {
        match dtype {
            Dtype::BF16 => w.iter().flat_map(|&x| f32_to_bf16_bits(x).to_le_bytes()).collect(),
            Dtype::F16 => w.iter().flat_map(|&x| f32_to_f16_bits(x).to_le_bytes()).collect(),
            _ => w.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    #[test]
    fn bytes_quantize_as_their_values_cast_to_the_scales_dtype() {
        let cols = 512;
        let w: Vec<f32> = (0..cols * 5).map(|i| ((i as u64 * 2654435761) % 1777) as f32 / 611.0 - 1.37).collect();
        for from in [Dtype::BF16, Dtype::F16, Dtype::F32] {
            let bytes = encode(&w, from);
            let mut widened = vec![0f32; w.len()];
            quantfarm_tensors::dequant::dequantize_ggml(from.as_ggml().unwrap(), &bytes, &mut widened).unwrap();
            for dtype in [Dtype::BF16, Dtype::F16, Dtype::F32] {
                // What the writer did before: widen, cast (mlx-lm's set_dtype), quantize.
                let mut cast = widened.clone();
                if from != dtype {
                    round_to(&mut cast, dtype);
                }
                let want = quantize_affine(&cast, cols, 4, 64, dtype).unwrap();
                let mut got = AffineBytes::default();
                quantize_affine_into(AffineInput::Bytes(&bytes, from), cols, 4, 64, dtype, &mut got).unwrap();
                assert_eq!(got.codes, want.packed_bytes(), "{from} -> {dtype}");
                assert_eq!((&got.scales, &got.biases), (&want.scales, &want.biases), "{from} -> {dtype}");
            }
        }
    }

    #[test]
    fn pieces_append_to_one_tensor() {
        let cols = 256;
        let w: Vec<f32> = (0..cols * 7).map(|i| ((i * 53 % 97) as f32 - 48.0) / 13.0).collect();
        let bytes = encode(&w, Dtype::BF16);
        let mut whole = AffineBytes::default();
        quantize_affine_into(AffineInput::Bytes(&bytes, Dtype::BF16), cols, 6, 32, Dtype::BF16, &mut whole).unwrap();
        let mut pieces = AffineBytes::default();
        let mut codes = Vec::new();
        for piece in bytes.chunks(3 * cols * 2) {
            pieces.codes.clear();
            quantize_affine_into(AffineInput::Bytes(piece, Dtype::BF16), cols, 6, 32, Dtype::BF16, &mut pieces)
                .unwrap();
            codes.extend_from_slice(&pieces.codes);
        }
        assert_eq!(codes, whole.codes);
        assert_eq!((pieces.scales, pieces.biases), (whole.scales, whole.biases));
    }

    #[test]
    fn bad_bytes_are_refused_where_they_are() {
        let mut w = vec![0.25f32; 64 * 4];
        // Finite in f32, infinite once cast to bf16 (as mlx-lm would cast it): row 2, column 5.
        w[2 * 64 + 5] = f32::MAX;
        let bytes = encode(&w, Dtype::F32);
        let mut out = AffineBytes::default();
        let e =
            quantize_affine_into(AffineInput::Bytes(&bytes, Dtype::F32), 64, 4, 64, Dtype::BF16, &mut out).unwrap_err();
        assert_eq!(e, MlxQuantError::NonFinite { row: 2, col: 5, value: f32::INFINITY });
        assert_eq!(e.from_row(10), MlxQuantError::NonFinite { row: 12, col: 5, value: f32::INFINITY });
        // Kept as f32, the same value quantizes.
        quantize_affine_into(AffineInput::Bytes(&bytes, Dtype::F32), 64, 4, 64, Dtype::F32, &mut out).unwrap();
        assert_eq!(
            quantize_affine_into(AffineInput::Bytes(&[0; 64], Dtype::U8), 64, 4, 64, Dtype::BF16, &mut out),
            Err(MlxQuantError::InputDtype(Dtype::U8))
        );
        assert_eq!(
            quantize_affine_into(AffineInput::Bytes(&[0; 129], Dtype::BF16), 64, 4, 64, Dtype::BF16, &mut out),
            Err(MlxQuantError::PartialValue { len: 129, size: 2 })
        );
    }

    #[test]
    fn rejects_bad_requests() {
        let w = [0.5f32; 128];
        assert_eq!(
            quantize_affine(&w, 64, 7, 64, Dtype::F32),
            Err(MlxQuantError::Unsupported { bits: 7, group_size: 64 })
        );
        assert_eq!(
            quantize_affine(&w, 64, 4, 16, Dtype::F32),
            Err(MlxQuantError::Unsupported { bits: 4, group_size: 16 })
        );
        assert_eq!(quantize_affine(&w, 64, 4, 64, Dtype::U32), Err(MlxQuantError::ScaleDtype(Dtype::U32)));
        assert_eq!(
            quantize_affine(&w, 96, 4, 64, Dtype::F32),
            Err(MlxQuantError::PartialGroup { cols: 96, group_size: 64 })
        );
        assert_eq!(
            quantize_affine(&w[..100], 64, 4, 64, Dtype::F32),
            Err(MlxQuantError::PartialRow { len: 100, cols: 64 })
        );
        let mut bad = w;
        bad[70] = f32::NAN;
        assert!(matches!(
            quantize_affine(&bad, 64, 4, 64, Dtype::F32),
            Err(MlxQuantError::NonFinite { row: 1, col: 6, .. })
        ));
        assert!(quantize_affine(&[], 64, 4, 64, Dtype::F32).unwrap().packed.is_empty());
    }
}
