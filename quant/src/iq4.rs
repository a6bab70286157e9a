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

/// `Σ (w·q)·x` and `Σ (w·q)·q` over a sub-block with the codes `id · x` would get: the C loop, which [`sums16`]
/// computes for 16 scales at once (the tests hold the two to the same bits).
#[cfg(test)]
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
///
/// The 16 candidates' sums (the first guess and the 15 tries) are computed at once, one candidate per lane
/// ([`sums16`]); the choice among them is then made in candidate order, as the C loop makes it.
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
    let ids: [f32; 16] = std::array::from_fn(|c| match c {
        0 => 1.0 / (-max / kv0),
        c => (c as i32 - 8 + i32::from(KV[0])) as f32 / max,
    });
    let (sqx, sq2) = sums16(&ids, x, w);
    let (sumqx, sumq2) = (sqx[0], sq2[0]);
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for c in 1..16 {
        let (sumqx, sumq2) = (sqx[c], sq2[c]);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// [`sums`] for 16 inverse scales at once, lane `c` for `ids[c]`: each lane adds the same terms in the same element
/// order as [`sums`] does, so the sums are the same bits. The level is found without branches: scanning the grid
/// upwards, level `i` replaces level `i − 1` unless `v − KV[i−1] < KV[i] − v` — the comparison `best_index` makes
/// between the two levels around `v`, and true for every pair above them, false for every pair below (the grid
/// ascends) — so the last replacement is `best_index`'s choice, also at and beyond the ends. Exact for finite `v`,
/// which these are (`|id·x| ≤ 127·|x|/|max|` and the first guess's `|id| = 127/|max|`).
#[inline(always)]
fn sums16(ids: &[f32; 16], x: &[f32; QK], w: &[f32; QK]) -> ([f32; 16], [f32; 16]) {
    let kv: [f32; 16] = std::array::from_fn(|i| f32::from(KV[i]));
    let mut sumqx = [0.0f32; 16];
    let mut sumq2 = [0.0f32; 16];
    for j in 0..QK {
        let (xj, wj) = (x[j], w[j]);
        for c in 0..16 {
            let v = ids[c] * xj;
            let mut q = kv[0];
            for i in 1..16 {
                let up = !(v - kv[i - 1] < kv[i] - v);
                q = if up { kv[i] } else { q };
            }
            sumqx[c] += wj * q * xj;
            sumq2[c] += wj * q * q;
        }
    }
    (sumqx, sumq2)
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

    /// The 16-lane sums equal the C loop's bit for bit: random sub-blocks (outliers, zero weights), values on and
    /// halfway between the grid's levels (the ties), and values beyond its ends.
    #[test]
    fn sums16_equals_the_scalar_sums_bit_for_bit() {
        let mut r = crate::test_uniform(7);
        let mut cases: Vec<([f32; QK], [f32; QK])> = (0..400)
            .map(|k| {
                let x: [f32; QK] = std::array::from_fn(|j| r() * if j % 7 == k % 7 { 40.0 } else { 1.0 });
                let w: [f32; QK] = std::array::from_fn(|j| if (j + k) % 11 == 0 { 0.0 } else { r().abs() });
                (x, w)
            })
            .collect();
        // id = 1 below: the values themselves are the grid's levels, their midpoints, and beyond the ends.
        let ties: [f32; QK] = std::array::from_fn(|j| match j {
            0..16 => f32::from(KV[j]),
            16..31 => (f32::from(KV[j - 16]) + f32::from(KV[j - 15])) / 2.0,
            _ => 500.0,
        });
        cases.push((ties, [1.0; QK]));
        for (x, w) in cases {
            let max = x.iter().fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m });
            let ids: [f32; 16] = std::array::from_fn(|c| if c == 15 { 1.0 } else { (c as f32 - 130.0) / max });
            let (qx, q2) = sums16(&ids, &x, &w);
            for c in 0..16 {
                let (sx, s2) = sums(ids[c], &x, &w);
                assert_eq!((qx[c].to_bits(), q2[c].to_bits()), (sx.to_bits(), s2.to_bits()), "candidate {c}");
            }
        }
    }
}
