//! The 256-element super-block formats Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, quantized as `ggml/src/ggml-quants.c` does and encoded in
//! `ggml-common.h` layout (little-endian).
//!
//! Without an importance matrix every super-block is quantized on its own by `quantize_row_q*_K_ref`. With one,
//! `quantize_row_q*_K_impl` runs per super-block with the imatrix slice of its columns (the K-quants take σ² over
//! the super-block, not the row, so rows need no statistics of their own).
//!
//! All five then **requantize** the elements with the fp16-rounded scales read back as f32, dividing by the
//! sub-block scale `dd` (not multiplying by a reciprocal), and keep the search's levels where `dd` is zero.
//!
//! Each returns its block as the struct of `quantfarm_ggml::blocks`, whose layout the dequantizer reads too.

use crate::blockwise;
use crate::float::f32_to_f16_bits;
use crate::helpers::{make_qp_quants, make_qx_quants, nearest_int, sub, GROUP_MAX_EPS};
use crate::lanes;
use quantfarm_ggml::blocks::{k4_scales, q3_scales, two_bit, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K};
pub(crate) use quantfarm_ggml::QK_K;
use quantfarm_tensors::dequant::f16_bits_to_f32;
use quantfarm_tensors::GgmlType;

/// Quantizes whole rows of `ty` (Q2_K, Q3_K, Q4_K, Q5_K or Q6_K) into `dst`, whose length the caller has checked.
///
/// Mirrors `quantize_q*_K`: `_ref` over the whole chunk without an imatrix, `_impl` per row with one (the same
/// `imatrix`, of length `n_per_row`, for every row; super-block `i` of a row uses columns `256·i..256·(i+1)`).
/// Always inlined, with everything below it, so that it is also compiled for AVX2 (see `crate::quantize_chunk`).
#[inline(always)]
pub(crate) fn quantize_rows(ty: GgmlType, src: &[f32], n_per_row: usize, imatrix: Option<&[f32]>, dst: &mut [u8]) {
    // Direct calls, not a table of function pointers: each body is inlined into both compilations.
    match ty {
        GgmlType::Q2_K => blockwise::rows!(src, n_per_row, imatrix, dst, q2_k),
        GgmlType::Q3_K => blockwise::rows!(src, n_per_row, imatrix, dst, q3_k),
        GgmlType::Q4_K => blockwise::rows!(src, n_per_row, imatrix, dst, q4_k),
        GgmlType::Q5_K => blockwise::rows!(src, n_per_row, imatrix, dst, q5_k),
        GgmlType::Q6_K => blockwise::rows!(src, n_per_row, imatrix, dst, q6_k),
        _ => {}
    }
}

// ====================== Q2_K

/// `quantize_row_q2_K_ref` (`qw == None`) and `quantize_row_q2_K_impl` (imatrix) on one super-block.
#[inline(always)]
fn q2_k(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>) -> BlockQ2K {
    let mut l = [0u8; QK_K];
    let scales: [f32; QK_K / 16];
    let mins: [f32; QK_K / 16];
    let (sc, d, dmin) = match qw {
        None => {
            // quantize_row_q2_K_ref: weights |x|, make_qkx2_quants(16, 3, …, −0.5, 0.1, 15, use_mad = true).
            // make_qkx2_quants equals make_qkx3_quants for finite input (see `lanes::make_qkx3_quants`).
            let xs: [[f32; 16]; QK_K / 16] = std::array::from_fn(|j| sub(x, 16 * j));
            let w = xs.map(|xs| xs.map(f32::abs));
            let mut lb = [[0u8; 16]; QK_K / 16];
            (scales, mins) = lanes::make_qkx3_quants(3, &xs, &w, &mut lb, -0.5, 0.1, 15, true);
            let mut max_scale = 0.0f32;
            let mut max_min = 0.0f32;
            for j in 0..QK_K / 16 {
                l[16 * j..16 * j + 16].copy_from_slice(&lb[j]);
                if scales[j] > max_scale {
                    max_scale = scales[j];
                }
                if mins[j] > max_min {
                    max_min = mins[j];
                }
            }
            let mut sc = [0u8; QK_K / 16];
            let mut d = 0u16;
            let mut dmin = 0u16;
            if max_scale > 0.0 {
                let iscale = 15.0f32 / max_scale;
                for j in 0..QK_K / 16 {
                    // `y[i].scales[j] = l`: an int stored into a uint8_t (wraps, not clamped).
                    sc[j] = nearest_int(iscale * scales[j]) as u8;
                }
                d = f32_to_f16_bits(max_scale / 15.0);
            }
            if max_min > 0.0 {
                let iscale = 15.0f32 / max_min;
                for j in 0..QK_K / 16 {
                    sc[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
                }
                dmin = f32_to_f16_bits(max_min / 15.0);
            }
            (sc, d, dmin)
        }
        Some(qw) => {
            // quantize_row_q2_K_impl: σ² = Σx²/256 (no factor 2), w = qw·sqrt(σ² + x²),
            // make_qkx3_quants(16, 3, …, −0.9, 0.05, 36, false), make_qp_quants(16, 15, …) on scales and mins.
            let mut sumx2 = 0.0f32;
            for &v in x {
                sumx2 += v * v;
            }
            let sigma2 = sumx2 / QK_K as f32;
            let mut sw = [0f32; QK_K / 16];
            let xs: [[f32; 16]; QK_K / 16] = std::array::from_fn(|j| sub(x, 16 * j));
            let w: [[f32; 16]; QK_K / 16] = std::array::from_fn(|j| {
                std::array::from_fn(|i| qw[16 * j + i] * (sigma2 + xs[j][i] * xs[j][i]).sqrt())
            });
            for j in 0..QK_K / 16 {
                for &v in &w[j] {
                    sw[j] += v;
                }
            }
            let mut lb = [[0u8; 16]; QK_K / 16];
            (scales, mins) = lanes::make_qkx3_quants(3, &xs, &w, &mut lb, -0.9, 0.05, 36, false);
            for j in 0..QK_K / 16 {
                l[16 * j..16 * j + 16].copy_from_slice(&lb[j]);
            }
            let mut ls = [0u8; QK_K / 16];
            let mut lm = [0u8; QK_K / 16];
            let dm = make_qp_quants(15, &scales, &mut ls, &sw);
            let mm = make_qp_quants(15, &mins, &mut lm, &sw);
            let sc: [u8; QK_K / 16] = std::array::from_fn(|j| ls[j] | (lm[j] << 4));
            (sc, f32_to_f16_bits(dm), f32_to_f16_bits(mm))
        }
    };
    // Requantize with the fp16 scales read back (the impl's `requantize` is always true).
    let (df, dminf) = (f16_bits_to_f32(d), f16_bits_to_f32(dmin));
    for j in 0..QK_K / 16 {
        let dd = df * (sc[j] & 0xF) as f32;
        if dd == 0.0 {
            continue; // keep L from the search
        }
        let dm = dminf * (sc[j] >> 4) as f32;
        for ii in 0..16 {
            let q = nearest_int((x[16 * j + ii] + dm) / dd).clamp(0, 3);
            l[16 * j + ii] = q as u8;
        }
    }
    BlockQ2K { scales: sc, qs: two_bit::pack(&l), d, dmin }
}

// ====================== Q3_K

/// `quantize_row_q3_K_ref` (`qw == None`) and `quantize_row_q3_K_impl` (imatrix) on one super-block.
#[inline(always)]
fn q3_k(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>) -> BlockQ3K {
    let mut l = [0i8; QK_K];
    let scales: [f32; QK_K / 16];
    let (packed, d) = match qw {
        None => {
            // quantize_row_q3_K_ref: make_q3_quants(16, 4, x, L, true), then −32/max_scale.
            let mut max_scale = 0.0f32;
            let mut amax = 0.0f32;
            let xs: [[f32; 16]; QK_K / 16] = std::array::from_fn(|j| sub(x, 16 * j));
            let mut lb = [[0i8; 16]; QK_K / 16];
            scales = lanes::make_q3_quants(4, &xs, &mut lb);
            for j in 0..QK_K / 16 {
                l[16 * j..16 * j + 16].copy_from_slice(&lb[j]);
                let scale = scales[j].abs();
                if scale > amax {
                    amax = scale;
                    max_scale = scales[j];
                }
            }
            if max_scale != 0.0 {
                let iscale = -32.0f32 / max_scale;
                // `int8_t l = nearest_int(...)` (wraps), then MAX(-32, MIN(31, l)) + 32.
                let ls: [u8; 16] =
                    std::array::from_fn(|j| ((nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32) as u8);
                (q3_scales::pack(&ls), f32_to_f16_bits(1.0 / iscale))
            } else {
                ([0u8; 12], f32_to_f16_bits(0.0))
            }
        }
        Some(qw) => {
            // quantize_row_q3_K_impl: σ² = 2·Σx²/256, w = qw·sqrt(σ² + x²), make_qx_quants(16, 4, x, L, 1, w), then
            // make_qx_quants(16, 32, scales, Ls, 1, sw) for the super-block scale.
            let mut sumx2 = 0.0f32;
            for &v in x {
                sumx2 += v * v;
            }
            let sigma2 = 2.0 * sumx2 / QK_K as f32;
            let mut sw = [0f32; QK_K / 16];
            let xs: [[f32; 16]; QK_K / 16] = std::array::from_fn(|j| sub(x, 16 * j));
            let w: [[f32; 16]; QK_K / 16] = std::array::from_fn(|j| {
                std::array::from_fn(|i| qw[16 * j + i] * (sigma2 + xs[j][i] * xs[j][i]).sqrt())
            });
            for j in 0..QK_K / 16 {
                let mut sumw = 0.0f32;
                for &v in &w[j] {
                    sumw += v;
                }
                sw[j] = sumw;
            }
            let mut lb = [[0i8; 16]; QK_K / 16];
            scales = lanes::make_qx_quants(4, &xs, &mut lb, &w);
            for j in 0..QK_K / 16 {
                l[16 * j..16 * j + 16].copy_from_slice(&lb[j]);
            }
            let mut ls = [0i8; 16];
            let d_block = make_qx_quants(32, &scales, &mut ls, &sw);
            (q3_scales::pack(&ls.map(|v| v as u8)), f32_to_f16_bits(d_block))
        }
    };
    let df = f16_bits_to_f32(d);
    for j in 0..QK_K / 16 {
        let dd = df * q3_scales::get(j, &packed) as f32;
        if dd == 0.0 {
            continue; // keep L from the search
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / dd).clamp(-4, 3);
            l[16 * j + ii] = (q + 4) as i8;
        }
    }
    // High bit of element j goes to bit j/32 of hmask[j%32]; the low 2 bits stay in L.
    // Branch-free: the high bits are random, so a branch per element would mispredict half the time.
    let mut hmask = [0u8; 32];
    let mut low = [0u8; QK_K];
    for b in 0..QK_K / 32 {
        for k in 0..32 {
            let v = l[32 * b + k] as u8;
            let hi = u8::from(v > 3);
            hmask[k] |= hi << b;
            low[32 * b + k] = v - 4 * hi;
        }
    }
    BlockQ3K { hmask, qs: two_bit::pack(&low), scales: packed, d }
}

// ====================== Q6_K

/// `quantize_row_q6_K_ref` (`qw == None`) and `quantize_row_q6_K_impl` (raw imatrix weights, no σ² term) on one
/// super-block.
#[inline(always)]
fn q6_k(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>) -> BlockQ6K {
    let mut l = [0i8; QK_K];
    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    let xs: [[f32; 16]; QK_K / 16] = std::array::from_fn(|ib| sub(x, 16 * ib));
    // make_qx_quants(16, 32, x, L, 1, qw or NULL): with NULL, rmse_type 1 weighs by x².
    let w: [[f32; 16]; QK_K / 16] = match qw {
        Some(qw) => std::array::from_fn(|ib| sub(qw, 16 * ib)),
        None => xs.map(|xs| xs.map(|v| v * v)),
    };
    let mut lb = [[0i8; 16]; QK_K / 16];
    let scales = lanes::make_qx_quants(32, &xs, &mut lb, &w);
    for (ib, &scale) in scales.iter().enumerate() {
        l[16 * ib..16 * ib + 16].copy_from_slice(&lb[ib]);
        let abs_scale = scale.abs();
        if abs_scale > max_abs_scale {
            max_abs_scale = abs_scale;
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        // memset to 0, d = fp16(0) = 0x0000.
        return BlockQ6K { ql: [0; QK_K / 2], qh: [0; QK_K / 4], scales: [0; QK_K / 16], d: 0 };
    }
    let iscale = -128.0f32 / max_scale;
    let d = f32_to_f16_bits(1.0 / iscale);
    // `y[i].scales[ib] = MIN(127, nearest_int(...))`: an int stored into an int8_t.
    let sc: [i8; QK_K / 16] = std::array::from_fn(|ib| nearest_int(iscale * scales[ib]).min(127) as i8);
    let df = f16_bits_to_f32(d);
    for j in 0..QK_K / 16 {
        let dd = df * sc[j] as f32;
        if dd == 0.0 {
            continue; // keep L from make_qx_quants
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / dd).clamp(-32, 31);
            l[16 * j + ii] = (q + 32) as i8;
        }
    }
    let (mut ql, mut qh) = ([0u8; QK_K / 2], [0u8; QK_K / 4]);
    let lu = |e: usize| l[e] as u8;
    for h in 0..2 {
        let j = 128 * h;
        for k in 0..32 {
            let (q1, q2, q3, q4) = (lu(j + k), lu(j + k + 32), lu(j + k + 64), lu(j + k + 96));
            ql[64 * h + k] = (q1 & 0xF) | ((q3 & 0xF) << 4);
            ql[64 * h + k + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
            qh[32 * h + k] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    BlockQ6K { ql, qh, scales: sc, d }
}

// ====================== Q4_K / Q5_K

/// The scales, fp16 `d`/`dmin` and levels (`0..=NMAX`) of one Q4_K (`NMAX` 15) or Q5_K (`NMAX` 31) super-block,
/// before packing.
struct K4Quants {
    scales: [u8; 12],
    d: u16,
    dmin: u16,
    l: [u8; QK_K],
}

/// The body shared by `quantize_row_q4_K_ref`/`_impl` and `quantize_row_q5_K_ref`/`_impl`, up to packing the levels.
#[inline(always)]
fn k4_quants<const NMAX: i32>(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>) -> K4Quants {
    let mut l = [0u8; QK_K];
    let scales: [f32; 8];
    let mins: [f32; 8];
    let (packed, d, dmin) = match qw {
        None => {
            // quantize_row_q{4,5}_K_ref: weights av_x + |x| per sub-block, make_qkx2_quants.
            let (rmin, rdelta, nstep) = if NMAX == 15 { (-1.0f32, 0.1f32, 20) } else { (-0.5f32, 0.1f32, 15) };
            let xs: [[f32; 32]; 8] = std::array::from_fn(|j| sub(x, 32 * j));
            let w = xs.map(|xs| {
                let mut sum_x2 = 0.0f32;
                for &v in &xs {
                    sum_x2 += v * v;
                }
                let av_x = (sum_x2 / 32.0).sqrt();
                xs.map(|v| av_x + v.abs())
            });
            // make_qkx2_quants equals make_qkx3_quants for finite input (see `lanes::make_qkx3_quants`).
            let mut lb = [[0u8; 32]; 8];
            (scales, mins) = lanes::make_qkx3_quants(NMAX, &xs, &w, &mut lb, rmin, rdelta, nstep, false);
            let mut max_scale = 0.0f32;
            let mut max_min = 0.0f32;
            for j in 0..8 {
                l[32 * j..32 * j + 32].copy_from_slice(&lb[j]);
                if scales[j] > max_scale {
                    max_scale = scales[j];
                }
                if mins[j] > max_min {
                    max_min = mins[j];
                }
            }
            let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
            let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
            // `uint8_t ls = nearest_int(...)` then MIN(63, ls).
            let ls: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
            let lm: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
            (k4_scales::pack(&ls, &lm), f32_to_f16_bits(max_scale / 63.0), f32_to_f16_bits(max_min / 63.0))
        }
        Some(qw) => {
            // quantize_row_q{4,5}_K_impl: σ² = 2·Σx²/256 over the super-block, w = qw·sqrt(σ² + x²),
            // make_qkx3_quants(32, NMAX, …, −0.9, 0.05, 36), then make_qp_quants on the scales and mins.
            let mut sum_x2 = 0.0f32;
            for &v in x {
                sum_x2 += v * v;
            }
            let sigma2 = 2.0 * sum_x2 / QK_K as f32;
            let mut sw = [0f32; 8];
            let xs: [[f32; 32]; 8] = std::array::from_fn(|j| sub(x, 32 * j));
            let w: [[f32; 32]; 8] = std::array::from_fn(|j| {
                std::array::from_fn(|i| qw[32 * j + i] * (sigma2 + xs[j][i] * xs[j][i]).sqrt())
            });
            for j in 0..8 {
                let mut sumw = 0.0f32;
                for &v in &w[j] {
                    sumw += v;
                }
                sw[j] = sumw;
            }
            let mut lb = [[0u8; 32]; 8];
            (scales, mins) = lanes::make_qkx3_quants(NMAX, &xs, &w, &mut lb, -0.9, 0.05, 36, false);
            for j in 0..8 {
                l[32 * j..32 * j + 32].copy_from_slice(&lb[j]);
            }
            let mut ls = [0u8; 8];
            let mut lm = [0u8; 8];
            let d_block = make_qp_quants(63, &scales, &mut ls, &sw);
            let m_block = make_qp_quants(63, &mins, &mut lm, &sw);
            if NMAX == 31 {
                // Only quantize_row_q5_K_impl applies MIN(63, ·); make_qp_quants already caps at 63.
                for v in ls.iter_mut().chain(lm.iter_mut()) {
                    *v = (*v).min(63);
                }
            }
            (k4_scales::pack(&ls, &lm), f32_to_f16_bits(d_block), f32_to_f16_bits(m_block))
        }
    };
    let (df, dminf) = (f16_bits_to_f32(d), f16_bits_to_f32(dmin));
    for j in 0..8 {
        let (sc, m) = k4_scales::get(j, &packed);
        let dd = df * sc as f32;
        if dd == 0.0 {
            continue; // keep L from the search
        }
        let dm = dminf * m as f32;
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / dd).clamp(0, NMAX);
            l[32 * j + ii] = q as u8;
        }
    }
    K4Quants { scales: packed, d, dmin, l }
}

/// `quantize_row_q4_K_ref` / `quantize_row_q4_K_impl` on one super-block.
#[inline(always)]
fn q4_k(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>) -> BlockQ4K {
    let k = k4_quants::<15>(x, qw);
    let mut qs = [0u8; QK_K / 2];
    for c in 0..4 {
        for i in 0..32 {
            qs[32 * c + i] = k.l[64 * c + i] | (k.l[64 * c + i + 32] << 4);
        }
    }
    BlockQ4K { d: k.d, dmin: k.dmin, scales: k.scales, qs }
}

/// `quantize_row_q5_K_ref` / `quantize_row_q5_K_impl` on one super-block.
#[inline(always)]
fn q5_k(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>) -> BlockQ5K {
    let k = k4_quants::<31>(x, qw);
    let (mut qh, mut qs) = ([0u8; QK_K / 8], [0u8; QK_K / 2]);
    // Bit 4 of level `64c + j` goes to bit `2c` of `qh[j]`, of level `64c + 32 + j` to bit `2c + 1` (the C's
    // `m1`/`m2` masks); branch-free, as in `q3_k`.
    for c in 0..4 {
        let n = 64 * c;
        for j in 0..32 {
            let (l1, l2) = (k.l[n + j], k.l[n + j + 32]);
            qh[j] |= ((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1));
            qs[32 * c + j] = (l1 & 0xF) | ((l2 & 0xF) << 4);
        }
    }
    BlockQ5K { d: k.d, dmin: k.dmin, scales: k.scales, qh, qs }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quantfarm_ggml::blocks::Block;

    #[test]
    fn all_zero_super_blocks_encode_zero_in_q2_k_and_q3_k() {
        let x = [0.0f32; QK_K];
        for qw in [None, Some(&[1.0f32; QK_K])] {
            let mut out = [0xAAu8; 84];
            q2_k(&x, qw).write(&mut out);
            assert!(out.iter().all(|&b| b == 0), "Q2_K {out:?}");
            // An all-zero group gets level 0 from the search (not the offset 4), and d = 0 keeps it.
            let mut out = [0xAAu8; 110];
            q3_k(&x, qw).write(&mut out);
            assert!(out.iter().all(|&b| b == 0), "Q3_K {out:?}");
        }
    }

    #[test]
    fn all_zero_super_blocks_encode_zero() {
        let x = [0.0f32; QK_K];
        let mut out = [0xAAu8; 210];
        q6_k(&x, None).write(&mut out);
        assert!(out.iter().all(|&b| b == 0));
        let mut out = [0xAAu8; 144];
        q4_k(&x, Some(&[1.0; QK_K])).write(&mut out);
        assert!(out.iter().all(|&b| b == 0), "{out:?}");
    }
}
