//! The 256-element super-block formats Q4_K, Q5_K and Q6_K, quantized as `ggml/src/ggml-quants.c` does and encoded in
//! `ggml-common.h` layout (little-endian).
//!
//! Without an importance matrix every super-block is quantized on its own by `quantize_row_q*_K_ref`. With one,
//! `quantize_row_q*_K_impl` runs per super-block with the imatrix slice of its columns (Q4_K/Q5_K take σ² over the
//! super-block, not the row, so rows need no statistics of their own).
//!
//! All three then **requantize** the elements with the fp16-rounded scales read back as f32, dividing by the
//! sub-block scale `dd` (not multiplying by a reciprocal), and keep the search's levels where `dd` is zero.

use crate::float::f32_to_f16_bits;
use crate::helpers::{make_qkx3_quants, make_qp_quants, make_qx_quants, nearest_int, GROUP_MAX_EPS};
use quantfarm_tensors::dequant::f16_bits_to_f32;
use quantfarm_tensors::GgmlType;

/// Elements per super-block (`QK_K`).
pub(crate) const QK_K: usize = 256;

/// One super-block quantizer: `ref` when `qw` is `None`, `impl` with the super-block's imatrix slice otherwise.
/// `out` is exactly one encoded block.
type SuperBlockFn = fn(&[f32; QK_K], Option<&[f32; QK_K]>, &mut [u8]);

/// Bytes of one encoded super-block, for the types this module handles.
pub(crate) fn block_bytes(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_K => Some(144),
        GgmlType::Q5_K => Some(176),
        GgmlType::Q6_K => Some(210),
        _ => None,
    }
}

/// Quantizes whole rows of `ty` (Q4_K, Q5_K or Q6_K) into `dst`, whose length the caller has checked.
///
/// Mirrors `quantize_q*_K`: `_ref` over the whole chunk without an imatrix, `_impl` per row with one (the same
/// `imatrix`, of length `n_per_row`, for every row; super-block `i` of a row uses columns `256·i..256·(i+1)`).
pub(crate) fn quantize_rows(ty: GgmlType, src: &[f32], n_per_row: usize, imatrix: Option<&[f32]>, dst: &mut [u8]) {
    let f: SuperBlockFn = match ty {
        GgmlType::Q4_K => q4_k,
        GgmlType::Q5_K => q5_k,
        GgmlType::Q6_K => q6_k,
        _ => return,
    };
    let Some(size) = block_bytes(ty) else { return };
    let row_bytes = n_per_row / QK_K * size;
    for (row, out_row) in src.chunks_exact(n_per_row).zip(dst.chunks_exact_mut(row_bytes)) {
        for (i, (x, out)) in row.chunks_exact(QK_K).zip(out_row.chunks_exact_mut(size)).enumerate() {
            let x: [f32; QK_K] = std::array::from_fn(|j| x[j]);
            let qw: Option<[f32; QK_K]> = imatrix.map(|m| std::array::from_fn(|j| m[QK_K * i + j]));
            f(&x, qw.as_ref(), out);
        }
    }
}

/// `N` consecutive values of `s` from `at`.
fn sub<const N: usize>(s: &[f32], at: usize) -> [f32; N] {
    std::array::from_fn(|i| s[at + i])
}

fn put_f16(out: &mut [u8], at: usize, bits: u16) {
    out[at..at + 2].copy_from_slice(&bits.to_le_bytes());
}

// ====================== Q6_K

/// `quantize_row_q6_K_ref` (`qw == None`) and `quantize_row_q6_K_impl` (raw imatrix weights, no σ² term) on one
/// super-block. Layout: `ql[128]` @0, `qh[64]` @128, `scales[16]` i8 @192, `d` f16 @208.
fn q6_k(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>, out: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    for ib in 0..QK_K / 16 {
        let xs: [f32; 16] = sub(x, 16 * ib);
        // make_qx_quants(16, 32, x, L, 1, qw or NULL): with NULL, rmse_type 1 weighs by x².
        let w: [f32; 16] = match qw {
            Some(qw) => sub(qw, 16 * ib),
            None => std::array::from_fn(|i| xs[i] * xs[i]),
        };
        let mut lb = [0i8; 16];
        let scale = make_qx_quants(32, &xs, &mut lb, &w);
        l[16 * ib..16 * ib + 16].copy_from_slice(&lb);
        scales[ib] = scale;
        let abs_scale = scale.abs();
        if abs_scale > max_abs_scale {
            max_abs_scale = abs_scale;
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        // memset to 0, d = fp16(0) = 0x0000.
        out.fill(0);
        return;
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
    let (ql, rest) = out.split_at_mut(128);
    let (qh, rest) = rest.split_at_mut(64);
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
    for (o, s) in rest[..16].iter_mut().zip(sc) {
        *o = s as u8;
    }
    put_f16(out, 208, d);
}

// ====================== Q4_K / Q5_K

/// Packs 8 (scale, min) pairs of 6 bits into the 12 bytes `get_scale_min_k4` reads (`quantize_row_q4_K_ref`).
/// Bits above the sixth are dropped as the C's `uint8_t` stores drop them.
fn pack_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        let (ls, lm) = (ls[j], lm[j]);
        if j < 4 {
            s[j] = ls;
            s[j + 4] = lm;
        } else {
            s[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            s[j - 4] |= (ls >> 4) << 6;
            s[j] |= (lm >> 4) << 6;
        }
    }
    s
}

/// `get_scale_min_k4(j, q, &sc, &m)`.
fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The scales, fp16 `d`/`dmin` and levels (`0..=NMAX`) of one Q4_K (`NMAX` 15) or Q5_K (`NMAX` 31) super-block,
/// before packing.
struct K4Quants {
    scales: [u8; 12],
    d: u16,
    dmin: u16,
    l: [u8; QK_K],
}

/// The body shared by `quantize_row_q4_K_ref`/`_impl` and `quantize_row_q5_K_ref`/`_impl`, up to packing the levels.
fn k4_quants<const NMAX: i32>(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>) -> K4Quants {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let (packed, d, dmin) = match qw {
        None => {
            // quantize_row_q{4,5}_K_ref: weights av_x + |x| per sub-block, make_qkx2_quants (identical to
            // make_qkx3_quants with weights given, for finite input).
            let (rmin, rdelta, nstep) = if NMAX == 15 { (-1.0f32, 0.1f32, 20) } else { (-0.5f32, 0.1f32, 15) };
            let mut max_scale = 0.0f32;
            let mut max_min = 0.0f32;
            for j in 0..8 {
                let xs: [f32; 32] = sub(x, 32 * j);
                let mut sum_x2 = 0.0f32;
                for &v in &xs {
                    sum_x2 += v * v;
                }
                let av_x = (sum_x2 / 32.0).sqrt();
                let w: [f32; 32] = std::array::from_fn(|i| av_x + xs[i].abs());
                let mut lb = [0u8; 32];
                let (scale, min) = make_qkx3_quants(NMAX, &xs, &w, &mut lb, rmin, rdelta, nstep, false);
                l[32 * j..32 * j + 32].copy_from_slice(&lb);
                scales[j] = scale;
                mins[j] = min;
                if scale > max_scale {
                    max_scale = scale;
                }
                if min > max_min {
                    max_min = min;
                }
            }
            let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
            let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
            // `uint8_t ls = nearest_int(...)` then MIN(63, ls).
            let ls: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
            let lm: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
            (pack_k4(&ls, &lm), f32_to_f16_bits(max_scale / 63.0), f32_to_f16_bits(max_min / 63.0))
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
            for j in 0..8 {
                let xs: [f32; 32] = sub(x, 32 * j);
                let w: [f32; 32] = std::array::from_fn(|i| qw[32 * j + i] * (sigma2 + xs[i] * xs[i]).sqrt());
                let mut sumw = 0.0f32;
                for &v in &w {
                    sumw += v;
                }
                sw[j] = sumw;
                let mut lb = [0u8; 32];
                let (scale, min) = make_qkx3_quants(NMAX, &xs, &w, &mut lb, -0.9, 0.05, 36, false);
                l[32 * j..32 * j + 32].copy_from_slice(&lb);
                scales[j] = scale;
                mins[j] = min;
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
            (pack_k4(&ls, &lm), f32_to_f16_bits(d_block), f32_to_f16_bits(m_block))
        }
    };
    let (df, dminf) = (f16_bits_to_f32(d), f16_bits_to_f32(dmin));
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &packed);
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

/// `quantize_row_q4_K_ref` / `quantize_row_q4_K_impl` on one super-block. Layout: `d` @0, `dmin` @2,
/// `scales[12]` @4, `qs[128]` @16.
fn q4_k(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>, out: &mut [u8]) {
    let k = k4_quants::<15>(x, qw);
    put_f16(out, 0, k.d);
    put_f16(out, 2, k.dmin);
    out[4..16].copy_from_slice(&k.scales);
    let qs = &mut out[16..144];
    for c in 0..4 {
        for i in 0..32 {
            qs[32 * c + i] = k.l[64 * c + i] | (k.l[64 * c + i + 32] << 4);
        }
    }
}

/// `quantize_row_q5_K_ref` / `quantize_row_q5_K_impl` on one super-block. Layout: `d` @0, `dmin` @2,
/// `scales[12]` @4, `qh[32]` @16, `qs[128]` @48.
fn q5_k(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>, out: &mut [u8]) {
    let k = k4_quants::<31>(x, qw);
    put_f16(out, 0, k.d);
    put_f16(out, 2, k.dmin);
    out[4..16].copy_from_slice(&k.scales);
    let (qh, qs) = out[16..176].split_at_mut(32);
    qh.fill(0);
    let (mut m1, mut m2) = (1u8, 2u8);
    for c in 0..4 {
        let n = 64 * c;
        for j in 0..32 {
            let mut l1 = k.l[n + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = k.l[n + j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            qs[32 * c + j] = l1 | (l2 << 4);
        }
        m1 <<= 2;
        m2 <<= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_match_ggml_types() {
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            assert_eq!(ty.block_size(), QK_K, "{ty}");
            assert_eq!(block_bytes(ty), Some(ty.type_size()), "{ty}");
        }
    }

    #[test]
    fn k4_scale_packing_round_trips() {
        let ls = [0, 1, 17, 63, 5, 33, 48, 63];
        let lm = [63, 2, 40, 0, 62, 31, 16, 1];
        let packed = pack_k4(&ls, &lm);
        for j in 0..8 {
            assert_eq!(get_scale_min_k4(j, &packed), (ls[j], lm[j]), "pair {j}");
        }
    }

    #[test]
    fn all_zero_super_blocks_encode_zero() {
        let x = [0.0f32; QK_K];
        let mut out = [0xAAu8; 210];
        q6_k(&x, None, &mut out);
        assert!(out.iter().all(|&b| b == 0));
        let mut out = [0xAAu8; 144];
        q4_k(&x, Some(&[1.0; QK_K]), &mut out);
        assert!(out.iter().all(|&b| b == 0), "{out:?}");
    }
}
