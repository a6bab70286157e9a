//! IQ4_NL (32-element blocks) and IQ4_XS (256-element super-blocks of 8 × 32): 4-bit codes into the non-linear grid
//! `KVALUES_IQ4NL`, as `quantize_iq4_nl` and `quantize_iq4_xs` (`ggml/src/ggml-quants.c`, llama.cpp 0c1e570) make
//! them: both run `quantize_row_iq4_nl_impl` with `ntry = 7` (the `_ref` path's `ntry = −1` is not what
//! llama-quantize runs), with or without an importance matrix.
//!
//! Per 32-element sub-block the scale is searched: a first guess `d = −max/−127` refined by least squares, then 15
//! candidate inverse scales `(itry − 127)/max`, each accepted only on strict improvement of `Σwqx²/Σwq²`. The
//! weights are `qw · √(σ² + x²)` with an imatrix (σ² over the whole (super-)block), `x²` without. IQ4_XS then
//! quantizes the 8 sub-block scales to 6 bits against the largest one.

use quantfarm_ggml::blocks::{BlockIQ4NL, BlockIQ4XS, QK};
use quantfarm_ggml::tables::KVALUES_IQ4NL as KV;
use quantfarm_ggml::QK_K;

use crate::float::f32_to_f16_bits;
use crate::helpers::{nearest_int, sub, GROUP_MAX_EPS};

/// `best_index_int8(16, kvalues_iq4nl, x)`: the nearest grid level, ties to the upper one; below the first level
/// 0, above the last 15.
#[inline(always)]
fn best_index(x: f32) -> u8 {
    let v = |i: usize| f32::from(KV[i]);
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - v(mu - 1) < v(mu) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// `Σ (w·q)·x` and `Σ (w·q)·q` over a sub-block with the codes `id · x` would get.
#[inline(always)]
fn sums(id: f32, x: &[f32; QK], w: &[f32; QK]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for j in 0..QK {
        let q = f32::from(KV[usize::from(best_index(id * x[j]))]);
        sumqx += w[j] * q * x[j];
        sumq2 += w[j] * q * q;
    }
    (sumqx, sumq2)
}

/// The searched scale of one 32-element sub-block (0 for one whose largest magnitude is below `GROUP_MAX_EPS`).
#[inline(always)]
fn sub_block_scale(x: &[f32; QK], w: &[f32; QK]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let kv0 = f32::from(KV[0]);
    let (sumqx, sumq2) = sums(1.0 / (-max / kv0), x, w);
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -7..=7 {
        let id = (itry + i32::from(KV[0])) as f32 / max;
        let (sumqx, sumq2) = sums(id, x, w);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// The weights of sub-block `ib` of `x` (`N` values): `qw · √(σ² + x²)` with an imatrix, `x²` without.
#[inline(always)]
fn weights<const N: usize>(x: &[f32; N], qw: Option<&[f32; N]>, sigma2: f32, ib: usize) -> [f32; QK] {
    std::array::from_fn(|j| {
        let v = x[QK * ib + j];
        match qw {
            Some(qw) => qw[QK * ib + j] * (sigma2 + v * v).sqrt(),
            None => v * v,
        }
    })
}

/// `σ² = (Σ x²) · (2/N)`, summed in order.
#[inline(always)]
fn sigma2<const N: usize>(x: &[f32; N]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v * v;
    }
    s * (2.0 / N as f32)
}

/// 32 codes packed two per byte: element `j` low, `j + 16` high.
#[inline(always)]
fn pack(l: &[u8], out: &mut [u8]) {
    for j in 0..QK / 2 {
        out[j] = l[j] | (l[j + QK / 2] << 4);
    }
}

/// `quantize_iq4_nl` on one block.
#[inline(always)]
pub(crate) fn iq4_nl(x: &[f32; QK], qw: Option<&[f32; QK]>) -> BlockIQ4NL {
    let w = weights(x, qw, sigma2(x), 0);
    let d = sub_block_scale(x, &w);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let l: [u8; QK] = std::array::from_fn(|j| best_index(id * x[j]));
    let mut qs = [0u8; QK / 2];
    pack(&l, &mut qs);
    BlockIQ4NL { d: f32_to_f16_bits(d), qs }
}

/// `quantize_iq4_xs` on one super-block.
#[inline(always)]
pub(crate) fn iq4_xs(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>) -> BlockIQ4XS {
    let s2 = sigma2(x);
    let mut scales = [0.0f32; QK_K / QK];
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    for (ib, scale) in scales.iter_mut().enumerate() {
        *scale = sub_block_scale(&sub(x, QK * ib), &weights(x, qw, s2, ib));
        if scale.abs() > amax_scale {
            amax_scale = scale.abs();
            max_scale = *scale;
        }
    }
    // An all-zero super-block gives d = −0.0, stored as 0x8000, as ggml does.
    let d = -max_scale / 32.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut b = BlockIQ4XS { d: f32_to_f16_bits(d), scales_h: 0, scales_l: [0; QK_K / 64], qs: [0; QK_K / 2] };
    for (ib, &scale) in scales.iter().enumerate() {
        let l = nearest_int(id * scale).clamp(-32, 31);
        let dl = d * l as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        let xb: [f32; QK] = sub(x, QK * ib);
        let codes: [u8; QK] = std::array::from_fn(|j| best_index(idl * xb[j]));
        pack(&codes, &mut b.qs[16 * ib..16 * (ib + 1)]);
        let ls = (l + 32) as u8;
        b.scales_l[ib / 2] |= (ls & 0x0f) << (4 * (ib % 2));
        b.scales_h |= u16::from(ls >> 4) << (2 * ib);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_index_takes_the_upper_level_on_a_tie() {
        assert_eq!(best_index(-200.0), 0);
        assert_eq!(best_index(200.0), 15);
        // Halfway between 1 and 13.
        assert_eq!(best_index(7.0), 9);
        assert_eq!(best_index(6.9), 8);
        for (i, &v) in KV.iter().enumerate() {
            assert_eq!(usize::from(best_index(f32::from(v))), i);
        }
    }
}
