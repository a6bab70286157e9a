//! The 256-element super-block formats Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, quantized as `ggml/src/ggml-quants.c` does and encoded in
//! `ggml-common.h` layout (little-endian).
//!
//! Without an importance matrix every super-block is quantized on its own by `quantize_row_q*_K_ref`. With one,
//! `quantize_row_q*_K_impl` runs per super-block with the imatrix slice of its columns (the K-quants take σ² over
//! the super-block, not the row, so rows need no statistics of their own).
//!
//! All five then **requantize** the elements with the fp16-rounded scales read back as f32, dividing by the
//! sub-block scale `dd` (not multiplying by a reciprocal), and keep the search's levels where `dd` is zero.

use crate::float::f32_to_f16_bits;
use crate::helpers::{make_qp_quants, make_qx_quants, nearest_int, GROUP_MAX_EPS};
use crate::lanes;
use quantfarm_tensors::dequant::f16_bits_to_f32;
use quantfarm_tensors::GgmlType;

/// Elements per super-block (`QK_K`).
pub(crate) const QK_K: usize = 256;

/// Bytes of one encoded super-block, for the types this module handles.
pub(crate) fn block_bytes(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q2_K => Some(84),
        GgmlType::Q3_K => Some(110),
        GgmlType::Q4_K => Some(144),
        GgmlType::Q5_K => Some(176),
        GgmlType::Q6_K => Some(210),
        _ => None,
    }
}

/// Quantizes whole rows of `ty` (Q2_K, Q3_K, Q4_K, Q5_K or Q6_K) into `dst`, whose length the caller has checked.
///
/// Mirrors `quantize_q*_K`: `_ref` over the whole chunk without an imatrix, `_impl` per row with one (the same
/// `imatrix`, of length `n_per_row`, for every row; super-block `i` of a row uses columns `256·i..256·(i+1)`).
/// Always inlined, with everything below it, so that it is also compiled for AVX2 (see `crate::quantize_chunk`).
#[inline(always)]
pub(crate) fn quantize_rows(ty: GgmlType, src: &[f32], n_per_row: usize, imatrix: Option<&[f32]>, dst: &mut [u8]) {
    let Some(size) = block_bytes(ty) else { return };
    let row_bytes = n_per_row / QK_K * size;
    for (row, out_row) in src.chunks_exact(n_per_row).zip(dst.chunks_exact_mut(row_bytes)) {
        for (i, (x, out)) in row.chunks_exact(QK_K).zip(out_row.chunks_exact_mut(size)).enumerate() {
            let x: [f32; QK_K] = std::array::from_fn(|j| x[j]);
            let qw: Option<[f32; QK_K]> = imatrix.map(|m| std::array::from_fn(|j| m[QK_K * i + j]));
            let qw = qw.as_ref();
            // Direct calls, not a table of function pointers: each body is inlined into both compilations.
            match ty {
                GgmlType::Q2_K => q2_k(&x, qw, out),
                GgmlType::Q3_K => q3_k(&x, qw, out),
                GgmlType::Q4_K => q4_k(&x, qw, out),
                GgmlType::Q5_K => q5_k(&x, qw, out),
                GgmlType::Q6_K => q6_k(&x, qw, out),
                _ => return,
            }
        }
    }
}

/// `N` consecutive values of `s` from `at`.
#[inline(always)]
fn sub<const N: usize>(s: &[f32], at: usize) -> [f32; N] {
    std::array::from_fn(|i| s[at + i])
}

fn put_f16(out: &mut [u8], at: usize, bits: u16) {
    out[at..at + 2].copy_from_slice(&bits.to_le_bytes());
}

/// The 2-bit "128-half" packing of `quantize_row_q2_K_ref` / `quantize_row_q3_K_ref`: for each half of 128 levels,
/// `qs[32h + l] = L[128h+l] | L[128h+l+32]<<2 | L[128h+l+64]<<4 | L[128h+l+96]<<6`. Levels must be in `0..4`.
#[inline(always)]
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8]) {
    for h in 0..2 {
        let j = 128 * h;
        for k in 0..32 {
            qs[32 * h + k] = l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6);
        }
    }
}

// ====================== Q2_K

/// `quantize_row_q2_K_ref` (`qw == None`) and `quantize_row_q2_K_impl` (imatrix) on one super-block. Layout:
/// `scales[16]` @0 (low nibble scale, high nibble min), `qs[64]` @16, `d` f16 @80, `dmin` f16 @82.
#[inline(always)]
fn q2_k(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>, out: &mut [u8]) {
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
    out[..16].copy_from_slice(&sc);
    pack_2bit(&l, &mut out[16..80]);
    put_f16(out, 80, d);
    put_f16(out, 82, dmin);
}

// ====================== Q3_K

/// Packs 16 six-bit Q3_K sub-block scales (`0..64`, stored +32) into 12 bytes, as `quantize_row_q3_K_ref` does:
/// low nibbles in bytes 0..8, the top 2 bits of scale `j` at bit `2·(j/4)` of byte `8 + j%4`.
#[inline(always)]
fn pack_q3_scales(ls: &[u8; 16]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for (j, &l) in ls.iter().enumerate() {
        if j < 8 {
            s[j] = l & 0xF;
        } else {
            s[j - 8] |= (l & 0xF) << 4;
        }
        s[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
    }
    s
}

/// Sub-block `j`'s signed scale (`−32..32`) from the 12 packed bytes, as the requant loop of
/// `quantize_row_q3_K_ref` decodes it.
#[inline(always)]
fn q3_scale(j: usize, s: &[u8; 12]) -> i8 {
    let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
    (low | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i8 - 32
}

/// `quantize_row_q3_K_ref` (`qw == None`) and `quantize_row_q3_K_impl` (imatrix) on one super-block. Layout:
/// `hmask[32]` @0, `qs[64]` @32, `scales[12]` @96, `d` f16 @108.
#[inline(always)]
fn q3_k(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>, out: &mut [u8]) {
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
                (pack_q3_scales(&ls), f32_to_f16_bits(1.0 / iscale))
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
            (pack_q3_scales(&ls.map(|v| v as u8)), f32_to_f16_bits(d_block))
        }
    };
    let df = f16_bits_to_f32(d);
    for j in 0..QK_K / 16 {
        let dd = df * q3_scale(j, &packed) as f32;
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
    out[..32].copy_from_slice(&hmask);
    pack_2bit(&low, &mut out[32..96]);
    out[96..108].copy_from_slice(&packed);
    put_f16(out, 108, d);
}

// ====================== Q6_K

/// `quantize_row_q6_K_ref` (`qw == None`) and `quantize_row_q6_K_impl` (raw imatrix weights, no σ² term) on one
/// super-block. Layout: `ql[128]` @0, `qh[64]` @128, `scales[16]` i8 @192, `d` f16 @208.
#[inline(always)]
fn q6_k(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>, out: &mut [u8]) {
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
#[inline(always)]
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
#[inline(always)]
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
#[inline(always)]
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
#[inline(always)]
fn q5_k(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>, out: &mut [u8]) {
    let k = k4_quants::<31>(x, qw);
    put_f16(out, 0, k.d);
    put_f16(out, 2, k.dmin);
    out[4..16].copy_from_slice(&k.scales);
    let (qh, qs) = out[16..176].split_at_mut(32);
    // Bit 4 of level `64c + j` goes to bit `2c` of `qh[j]`, of level `64c + 32 + j` to bit `2c + 1` (the C's
    // `m1`/`m2` masks); branch-free, as in `q3_k`.
    qh.fill(0);
    for c in 0..4 {
        let n = 64 * c;
        for j in 0..32 {
            let (l1, l2) = (k.l[n + j], k.l[n + j + 32]);
            qh[j] |= ((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1));
            qs[32 * c + j] = (l1 & 0xF) | ((l2 & 0xF) << 4);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_match_ggml_types() {
        for ty in [GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
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
    fn q3_scale_packing_round_trips() {
        let ls: [u8; 16] = std::array::from_fn(|j| ((j * 29 + 7) % 64) as u8);
        let packed = pack_q3_scales(&ls);
        for (j, &l) in ls.iter().enumerate() {
            assert_eq!(q3_scale(j, &packed), l as i8 - 32, "scale {j}");
        }
    }

    #[test]
    fn all_zero_super_blocks_encode_zero_in_q2_k_and_q3_k() {
        let x = [0.0f32; QK_K];
        for qw in [None, Some(&[1.0f32; QK_K])] {
            let mut out = [0xAAu8; 84];
            q2_k(&x, qw, &mut out);
            assert!(out.iter().all(|&b| b == 0), "Q2_K {out:?}");
            // An all-zero group gets level 0 from the search (not the offset 4), and d = 0 keeps it.
            let mut out = [0xAAu8; 110];
            q3_k(&x, qw, &mut out);
            assert!(out.iter().all(|&b| b == 0), "Q3_K {out:?}");
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
