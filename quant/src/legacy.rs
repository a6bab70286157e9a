//! The 32-element formats Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: one block type each, quantized as
//! `ggml/src/ggml-quants.c` does and encoded in `ggml-common.h` layout (little-endian).
//!
//! Without an importance matrix every block is quantized on its own by `quantize_row_*_ref`. With one, ggml's
//! `quantize_row_*_impl` weights each element by `qw_j·sqrt(σ² + x_j²)`, where σ² is the mean square of the **whole
//! row**, and searches the scale (Q8_0 ignores the imatrix).
//!
//! The block layouts are `quantfarm_ggml::blocks` (the dequantizer reads the same structs); this module adds how
//! each is quantized ([`Quantize`]).

use crate::float::f32_to_f16_bits;
use crate::helpers::{c_round_block, c_trunc_block};
use crate::lanes;
pub(crate) use quantfarm_ggml::blocks::{Block, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, QK};

/// Blocks of a row searched together on the imatrix path, one per SIMD lane (see `lanes`).
pub(crate) const LANES: usize = 8;

/// How one block of a 32-element format is quantized.
pub(crate) trait Quantize: Block {
    /// Whether `quantize_<type>` takes the imatrix path (`false` for Q8_0, which ignores it).
    const USES_IMATRIX: bool;

    /// `quantize_row_<type>_ref` on one block.
    fn quantize_ref(x: &[f32; QK]) -> Self;
    /// The per-block body of `quantize_row_<type>_impl` on [`LANES`] blocks at once, with the element weights
    /// already computed; block `k` of the result is what the C computes for block `k`.
    fn quantize_weighted(x: &[[f32; QK]; LANES], weights: &[[f32; QK]; LANES]) -> [Self; LANES];
}

/// Quantizes whole rows of `B` into `dst`, whose length the caller has checked (rows × blocks × `B::SIZE`).
///
/// Mirrors `quantize_q4_0` and friends: the `_ref` path runs over the whole chunk; the imatrix path runs per row so
/// that σ² is taken over the row, with the same `imatrix` (length `n_per_row`) for every row. Always inlined, so
/// that it is also compiled for AVX2 (see `crate::quantize_chunk`).
#[inline(always)]
pub(crate) fn quantize_rows<B: Quantize>(src: &[f32], n_per_row: usize, imatrix: Option<&[f32]>, dst: &mut [u8]) {
    match imatrix.filter(|_| B::USES_IMATRIX) {
        None => {
            for (x, out) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(B::SIZE)) {
                if let Ok(x) = <&[f32; QK]>::try_from(x) {
                    B::quantize_ref(x).write(out);
                }
            }
        }
        Some(imatrix) => {
            let row_bytes = n_per_row / QK * B::SIZE;
            for (row, out_row) in src.chunks_exact(n_per_row).zip(dst.chunks_exact_mut(row_bytes)) {
                let sigma2 = mean_square(row);
                // LANES blocks at a time; a last, partial group is padded with all-zero blocks (weights 0), whose
                // results are dropped.
                let groups = row.chunks(LANES * QK).zip(imatrix.chunks(LANES * QK));
                for ((x, qw), out) in groups.zip(out_row.chunks_mut(LANES * B::SIZE)) {
                    let mut xs = [[0.0f32; QK]; LANES];
                    let mut ws = [[0.0f32; QK]; LANES];
                    for (k, (x, qw)) in x.chunks_exact(QK).zip(qw.chunks_exact(QK)).enumerate() {
                        for j in 0..QK {
                            xs[k][j] = x[j];
                            ws[k][j] = qw[j] * (sigma2 + x[j] * x[j]).sqrt();
                        }
                    }
                    for (block, out) in B::quantize_weighted(&xs, &ws).iter().zip(out.chunks_exact_mut(B::SIZE)) {
                        block.write(out);
                    }
                }
            }
        }
    }
}

/// `sigma2 = (Σ x²)/n_per_row`, summed sequentially in f32 as the `_impl` functions do.
#[inline(always)]
fn mean_square(row: &[f32]) -> f32 {
    let mut sum_x2 = 0.0f32;
    for &x in row {
        sum_x2 += x * x;
    }
    sum_x2 / row.len() as f32
}

/// The signed value of largest magnitude, first occurrence (`if (amax < fabsf(v))` in the `_ref` functions).
///
/// The block's maximum and minimum (order-free, so they vectorize) decide it unless `max == −min`, where the
/// first of the two decides: then, and for an all-zero block, the C's scan runs as written.
#[inline(always)]
fn signed_absmax(x: &[f32; QK]) -> f32 {
    let (mut hi, mut lo) = ([f32::NEG_INFINITY; 8], [f32::INFINITY; 8]);
    for chunk in x.chunks_exact(8) {
        for ((h, l), &v) in hi.iter_mut().zip(lo.iter_mut()).zip(chunk) {
            *h = h.max(v);
            *l = l.min(v);
        }
    }
    let hi = hi.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let lo = lo.iter().fold(f32::INFINITY, |m, &v| m.min(v));
    // A zero is never returned from here, so `max`/`min` choosing either sign of zero cannot show.
    if hi > -lo {
        hi
    } else if -lo > hi {
        lo
    } else {
        signed_absmax_scan(x)
    }
}

/// The `_ref` functions' scan as written: `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }` from 0.
fn signed_absmax_scan(x: &[f32; QK]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// `MAX(amax, fabsf(v))` over the block, from 0. For finite input the maximum does not depend on the order, so
/// it is taken over 8 lanes (which the compiler keeps in vector registers) and then across them.
#[inline(always)]
fn abs_max(x: &[f32; QK]) -> f32 {
    // `f32::max` equals the C's `a > b ? a : b` here: no NaN, and every magnitude is +0 or more.
    let mut lanes = [0.0f32; 8];
    for chunk in x.chunks_exact(8) {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = m.max(v.abs());
        }
    }
    lanes.iter().fold(0.0f32, |m, &v| m.max(v))
}

/// Block minimum and maximum, starting from `FLT_MAX` / `-FLT_MAX` as `quantize_row_q4_1_ref` does.
fn min_max(x: &[f32; QK]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `id = d ? 1.0f/d : 0.0f`: the fp32 reciprocal the `_ref` functions multiply by (never the fp16-rounded `d`).
fn reciprocal(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// `MIN(cap, (int8_t)(v))` stored into a `uint8_t`, for every element, as the `_ref` functions compute it.
#[inline(always)]
fn capped_i8(v: &[f32; QK], cap: i32) -> [u8; QK] {
    let t = c_trunc_block(v);
    let mut out = [0u8; QK];
    for (o, t) in out.iter_mut().zip(t) {
        *o = i32::from(t as i8).min(cap) as u8;
    }
    out
}

/// `f(x_j)` for every element of a block, in a plain loop the compiler vectorizes (`array::from_fn` often is not).
#[inline(always)]
fn each(x: &[f32; QK], f: impl Fn(f32) -> f32) -> [f32; QK] {
    let mut out = [0f32; QK];
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f(v);
    }
    out
}

/// Packs 32 4-bit values: element j in the low nibble of byte j, element j+16 in the high nibble.
fn pack_nibbles(l: &[u8; QK]) -> [u8; QK / 2] {
    std::array::from_fn(|j| l[j] | (l[j + QK / 2] << 4))
}

/// Packs 32 5-bit values: low nibbles as [`pack_nibbles`], bit 4 of element j in bit j of `qh`.
fn pack_q5(l: &[u8; QK]) -> ([u8; QK / 2], u32) {
    let mut qs = [0u8; QK / 2];
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let (xi0, xi1) = (l[j], l[j + QK / 2]);
        qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
        qh |= u32::from((xi0 & 0x10) >> 4) << j;
        qh |= u32::from((xi1 & 0x10) >> 4) << (j + QK / 2);
    }
    (qs, qh)
}

/// `make_qx_quants` levels are `0..2·nmax`, hence non-negative: reinterpret them as the unsigned quants.
fn unsigned_levels(l: &[i8; QK]) -> [u8; QK] {
    std::array::from_fn(|j| l[j] as u8)
}

impl Quantize for BlockQ8_0 {
    const USES_IMATRIX: bool = false;

    /// `quantize_row_q8_0_ref`: `d = amax/127`, `q = roundf(x·(1/d))` (half away from zero).
    #[inline(always)]
    fn quantize_ref(x: &[f32; QK]) -> Self {
        let d = abs_max(x) / 127.0;
        let id = reciprocal(d);
        let q = c_round_block(&each(x, |v| v * id));
        let mut qs = [0i8; QK];
        for (o, q) in qs.iter_mut().zip(q) {
            *o = q as i8;
        }
        Self { d: f32_to_f16_bits(d), qs }
    }

    #[inline(always)]
    fn quantize_weighted(x: &[[f32; QK]; LANES], _weights: &[[f32; QK]; LANES]) -> [Self; LANES] {
        x.each_ref().map(Self::quantize_ref)
    }
}

impl Quantize for BlockQ4_0 {
    const USES_IMATRIX: bool = true;

    /// `quantize_row_q4_0_ref`: `d = max/−8` (signed absmax), `q = MIN(15, (int8)(x·(1/d) + 8.5))`.
    #[inline(always)]
    fn quantize_ref(x: &[f32; QK]) -> Self {
        let d = signed_absmax(x) / -8.0;
        let id = reciprocal(d);
        let l = capped_i8(&each(x, |v| v * id + 8.5), 15);
        Self { d: f32_to_f16_bits(d), qs: pack_nibbles(&l) }
    }

    /// `quantize_row_q4_0_impl`: `d = make_qx_quants(32, 8, x, L, 1, w)`, the levels packed as they are.
    #[inline(always)]
    fn quantize_weighted(x: &[[f32; QK]; LANES], weights: &[[f32; QK]; LANES]) -> [Self; LANES] {
        let mut l = [[0i8; QK]; LANES];
        let d = lanes::make_qx_quants(8, x, &mut l, weights);
        std::array::from_fn(|k| Self { d: f32_to_f16_bits(d[k]), qs: pack_nibbles(&unsigned_levels(&l[k])) })
    }
}

impl Quantize for BlockQ4_1 {
    const USES_IMATRIX: bool = true;

    /// `quantize_row_q4_1_ref`: `d = (max − min)/15`, `q = MIN(15, (int8)((x − min)·(1/d) + 0.5))`.
    #[inline(always)]
    fn quantize_ref(x: &[f32; QK]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = reciprocal(d);
        let l = capped_i8(&each(x, |v| (v - min) * id + 0.5), 15);
        Self { d: f32_to_f16_bits(d), m: f32_to_f16_bits(min), qs: pack_nibbles(&l) }
    }

    /// `quantize_row_q4_1_impl`: `make_qkx3_quants(32, 15, x, w, L, &min, Laux, −0.9, 0.05, 36, false)`.
    #[inline(always)]
    fn quantize_weighted(x: &[[f32; QK]; LANES], weights: &[[f32; QK]; LANES]) -> [Self; LANES] {
        let mut l = [[0u8; QK]; LANES];
        let (d, min) = lanes::make_qkx3_quants(15, x, weights, &mut l, -0.9, 0.05, 36, false);
        std::array::from_fn(|k| Self { d: f32_to_f16_bits(d[k]), m: f32_to_f16_bits(-min[k]), qs: pack_nibbles(&l[k]) })
    }
}

impl Quantize for BlockQ5_0 {
    const USES_IMATRIX: bool = true;

    /// `quantize_row_q5_0_ref`: `d = max/−16` (signed absmax), `q = MIN(31, (int8)(x·(1/d) + 16.5))`.
    #[inline(always)]
    fn quantize_ref(x: &[f32; QK]) -> Self {
        let d = signed_absmax(x) / -16.0;
        let id = reciprocal(d);
        let l = capped_i8(&each(x, |v| v * id + 16.5), 31);
        let (qs, qh) = pack_q5(&l);
        Self { d: f32_to_f16_bits(d), qh: qh.to_le_bytes(), qs }
    }

    /// `quantize_row_q5_0_impl`: `d = make_qx_quants(32, 16, x, L, 1, w)`.
    #[inline(always)]
    fn quantize_weighted(x: &[[f32; QK]; LANES], weights: &[[f32; QK]; LANES]) -> [Self; LANES] {
        let mut l = [[0i8; QK]; LANES];
        let d = lanes::make_qx_quants(16, x, &mut l, weights);
        std::array::from_fn(|k| {
            let (qs, qh) = pack_q5(&unsigned_levels(&l[k]));
            Self { d: f32_to_f16_bits(d[k]), qh: qh.to_le_bytes(), qs }
        })
    }
}

impl Quantize for BlockQ5_1 {
    const USES_IMATRIX: bool = true;

    /// `quantize_row_q5_1_ref`: `d = (max − min)/31`, `q = (uint8)((x − min)·(1/d) + 0.5)` with **no** cap.
    #[inline(always)]
    fn quantize_ref(x: &[f32; QK]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = reciprocal(d);
        let t = c_trunc_block(&each(x, |v| (v - min) * id + 0.5));
        let mut l = [0u8; QK];
        for (o, t) in l.iter_mut().zip(t) {
            *o = t as u8;
        }
        let (qs, qh) = pack_q5(&l);
        Self { d: f32_to_f16_bits(d), m: f32_to_f16_bits(min), qh: qh.to_le_bytes(), qs }
    }

    /// `quantize_row_q5_1_impl`: `make_qkx3_quants(32, 31, x, w, L, &min, Laux, −0.9, 0.05, 36, false)`.
    #[inline(always)]
    fn quantize_weighted(x: &[[f32; QK]; LANES], weights: &[[f32; QK]; LANES]) -> [Self; LANES] {
        let mut l = [[0u8; QK]; LANES];
        let (d, min) = lanes::make_qkx3_quants(31, x, weights, &mut l, -0.9, 0.05, 36, false);
        std::array::from_fn(|k| {
            let (qs, qh) = pack_q5(&l[k]);
            Self { d: f32_to_f16_bits(d[k]), m: f32_to_f16_bits(-min[k]), qh: qh.to_le_bytes(), qs }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_absmax_is_the_first_largest_magnitude() {
        let mut cases: Vec<[f32; QK]> = vec![[0.0; QK], [-0.0; QK], [3.0; QK], [-2.0; QK]];
        for (a, b) in [(3.0f32, -3.0f32), (-3.0, 3.0), (-0.0, 0.0), (1e-40, -1e-40)] {
            let mut x = [0.5f32; QK];
            (x[7], x[20]) = (a, b);
            cases.push(x);
        }
        cases.extend((0..50).map(|k| std::array::from_fn(|i| ((i * 37 + k * 11) % 29) as f32 - 14.0)));
        for x in cases {
            assert_eq!(signed_absmax(&x).to_bits(), signed_absmax_scan(&x).to_bits(), "{x:?}");
        }
    }

    #[test]
    fn q8_0_rounds_half_away_from_zero() {
        // amax 127 gives d = 1 exactly, so x·id = x and the ties are visible.
        let mut x = [0.0f32; QK];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 0.5;
        let b = BlockQ8_0::quantize_ref(&x);
        assert_eq!(b.d, 0x3C00);
        assert_eq!(&b.qs[..5], &[127, 3, -3, 1, 0]);
    }

    #[test]
    fn all_zero_blocks_encode_zero_scale() {
        let x = [0.0f32; QK];
        // d = 0/−8 is −0.0 in C as well, hence the sign bit; the zero quant sits at level 8.
        let b = BlockQ4_0::quantize_ref(&x);
        assert_eq!((b.d, b.qs), (0x8000, [0x88; 16]));
        let b = &BlockQ5_0::quantize_weighted(&[x; LANES], &[[1.0; QK]; LANES])[3];
        assert_eq!((b.d, b.qh, b.qs), (0, [0; 4], [0; 16]));
    }
}
