//! IQ1_S (256-element super-blocks of 8 × 32) and IQ1_M (16 × 16): groups of 8 elements coded as points of the
//! 2048-point ternary grid `Grid8::Iq1s`, each level `L ∈ {0, 1, 2}` standing for `L − 1` moved by a shift of
//! `±0.125`, as `quantize_iq1_s` and `quantize_iq1_m` (`ggml/src/ggml-quants.c`, llama.cpp 0c1e570) make them through
//! `quantize_row_iq1_s_impl` and `quantize_row_iq1_m_impl`. IQ1_S needs an importance matrix (ggml aborts without
//! one; `quantize` refuses); IQ1_M weighs by `x²` without one.
//!
//! Per sub-block the values are sorted (stably: glibc's `qsort` is a merge sort for these sizes), and every split of
//! the sorted order into three runs (levels 0, 1, 2) is scored exactly from prefix sums, with either shift (IQ1_M:
//! either shift per 8-element group); the first strictly best split wins. The level patterns that fall off the grid
//! are replaced by their best listed neighbour (`iq1_find_best_neighbour2`) and the scale refitted by least squares.
//! The super-block scale then codes each sub-block scale in 3 bits; IQ1_M refits it over the coded sub-blocks.
//!
//! Every float expression is evaluated as the C writes it, left to right in f32, and every sum in index order.

use quantfarm_ggml::blocks::{BlockIQ1M, BlockIQ1S};
use quantfarm_ggml::grids::Grid8;
use quantfarm_ggml::QK_K;

use crate::float::f32_to_f16_bits;
use crate::helpers::{nearest_int, sub};
use crate::iq_grid::{search8, Lookup, Search};

/// `IQ1S_DELTA` = `IQ1M_DELTA`.
const DELTA: f32 = 0.125;
/// The values of levels 0, 1, 2 with the shift `+DELTA` (`x_p`) and `−DELTA` (`x_m`).
const X_P: [f32; 3] = [-1.0 + DELTA, DELTA, 1.0 + DELTA];
const X_M: [f32; 3] = [-1.0 - DELTA, -DELTA, 1.0 - DELTA];
/// `GROUP_MAX_EPS_IQ1_S`, `GROUP_MAX_EPS_IQ1_M`.
const EPS_S: f32 = 1e-12;
const EPS_M: f32 = 1e-7;
/// Sub-block sizes (`IQ1S_BLOCK_SIZE`, `IQ1M_BLOCK_SIZE`).
const BS_S: usize = 32;
const BS_M: usize = 16;
/// IQ1_M's shift bits in `qh` per sign combination k (bit 3: group 0 negative, bit 7: group 1).
const MASKS_M: [u8; 4] = [0x00, 0x80, 0x08, 0x88];

/// An all-zero IQ1_S block (what an empty super-block gives).
pub(crate) const EMPTY_S: BlockIQ1S = BlockIQ1S { d: 0, qs: [0; QK_K / 8], qh: [0; QK_K / 32] };

/// `sigma2 = 2·Σx²/QK_K`, summed in order.
#[inline(always)]
fn sigma2(x: &[f32; QK_K]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v * v;
    }
    2.0 * s / QK_K as f32
}

/// The weights of the `B` elements from `at`: `qw · √(σ² + x²)` with an imatrix, `x²` without.
#[inline(always)]
fn weights<const B: usize>(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>, sigma2: f32, at: usize) -> [f32; B] {
    std::array::from_fn(|i| {
        let v = x[at + i];
        match qw {
            Some(qw) => qw[at + i] * (sigma2 + v * v).sqrt(),
            None => v * v,
        }
    })
}

/// `MAX(max, fabsf(x))` over the sub-block from its first element (keeps the earlier value on ties).
#[inline(always)]
fn max_abs<const B: usize>(xb: &[f32; B]) -> f32 {
    let mut max = xb[0].abs();
    for v in &xb[1..] {
        let a = v.abs();
        max = if max > a { max } else { a };
    }
    max
}

/// `MAX(a, b)` as the C macro: `a > b ? a : b`.
#[inline(always)]
fn c_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// The element indices in ascending order of value, equal values in index order: what glibc's (merge-sorting, so
/// stable) `qsort` with `iq1_sort_helper` gives. Each element's place is its rank under the total order (value,
/// index), counted without branches: the same permutation as a stable sort, and faster than one on 16 or 32 values.
/// (The values are finite: `quantize` refuses NaN, under which ranks could collide.)
#[inline(always)]
fn ascending<const B: usize>(xb: &[f32; B]) -> [u8; B] {
    let mut idx = [0u8; B];
    for (i, &v) in xb.iter().enumerate() {
        let mut rank = 0u8;
        for (j, &u) in xb.iter().enumerate() {
            rank += u8::from(u < v) + u8::from((u == v) & (j < i));
        }
        idx[usize::from(rank) % B] = i as u8;
    }
    idx
}

/// The levels of a split: sorted positions below `i1` get 0, `[i1, i2)` 1, the rest 2; `2 − L` when `flip`.
#[inline(always)]
fn split_levels<const B: usize, const G: usize>(order: &[u8; B], i1: usize, i2: usize, flip: bool) -> [[u8; 8]; G] {
    debug_assert_eq!(B, 8 * G);
    let mut l = [[0u8; 8]; G];
    for (j, &i) in order.iter().enumerate() {
        let level = if j < i1 {
            0
        } else if j < i2 {
            1
        } else {
            2
        };
        let i = usize::from(i);
        l[i / 8][i % 8] = if flip { 2 - level } else { level };
    }
    l
}

/// The value a grid point's byte `2L + 1` stands for.
#[inline(always)]
fn value(v: &[f32; 3], q: i8) -> f32 {
    v[usize::from((q - 1) as u8 / 2)]
}

/// Codes each group's levels as a grid point (an off-grid pattern becomes its best listed neighbour at `scale`,
/// with group `k`'s values `v[k]`, and its levels are rewritten); then, if any was off the grid, refits the scale
/// by least squares (`Σ(w·q)·x / Σ(w·q)·q`, kept when both are positive). Returns the indices and the scale.
#[inline(always)]
fn snap<const B: usize, const G: usize>(
    search: &Search<8>,
    xb: &[f32; B],
    w: &[f32; B],
    l: &mut [[u8; 8]; G],
    scale: f32,
    v: [&[f32; 3]; G],
) -> ([u16; G], f32) {
    let mut index = [0u16; G];
    let mut all_on_grid = true;
    for k in 0..G {
        index[k] = match search.lookup(&l[k]) {
            Lookup::On(i) => i,
            Lookup::Off(list) => {
                all_on_grid = false;
                search.best_neighbour_valued(list, &sub(xb, 8 * k), &sub(w, 8 * k), scale, v[k], &mut l[k])
            }
        };
    }
    if all_on_grid {
        return (index, scale);
    }
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for k in 0..G {
        let p = search.point(index[k]);
        for j in 0..8 {
            let w = w[8 * k + j];
            let q = value(v[k], p[j]);
            sumqx += w * q * xb[8 * k + j];
            sumq2 += w * q * q;
        }
    }
    let scale = if sumqx > 0.0 && sumq2 > 0.0 { sumqx / sumq2 } else { scale };
    (index, scale)
}

/// A coded sub-block: its scale (≥ 0), its shift choice and its groups' grid indices.
struct Coded<const G: usize> {
    scale: f32,
    /// IQ1_S: the shift is −DELTA; IQ1_M: the sign combination k (bit 1: group 0 negative, bit 0: group 1).
    shift: u8,
    index: [u16; G],
}

/// The running best of a split search: its score and (scale, i1, i2, k).
struct Best {
    score: f32,
    found: Option<(f32, usize, usize, u8)>,
}

/// Tests the candidates `(i2, k)` of row `i1` in the C's order (`i2` ascending from `i1`, `k` ascending) against
/// the running best with its acceptance rule, `sumq2 > 0 && sumqx·sumqx > best·sumq2`, keeping the first strict
/// improvement. Eight values of `i2` at a time: when none of their candidates passes against the current best, the
/// best cannot change among them, so they are skipped whole (this test vectorizes); otherwise they are walked one
/// by one. Rows are padded with `sumq2 = 0` past the last `i2`, which never passes; `R` is at least the last
/// `i2` + 8.
#[inline(always)]
fn scan<const K: usize, const R: usize>(qx: &[[f32; R]; K], q2: &[[f32; R]; K], i1: usize, best: &mut Best) {
    let mut i2 = i1;
    while i2 + 8 <= R {
        let mut any = false;
        for k in 0..K {
            for l in 0..8 {
                let (x, q) = (qx[k][i2 + l], q2[k][i2 + l]);
                any |= (q > 0.0) & (x * x > best.score * q);
            }
        }
        if any {
            for j in i2..i2 + 8 {
                for k in 0..K {
                    let (x, q) = (qx[k][j], q2[k][j]);
                    if q > 0.0 && x * x > best.score * q {
                        let scale = x / q;
                        best.score = scale * x;
                        best.found = Some((scale, i1, j, k as u8));
                    }
                }
            }
        }
        i2 += 8;
    }
}

/// IQ1_S's candidate rows: `i2` up to 32, padded to 8 past it.
const ROW_S: usize = BS_S + 8;

/// The best split of one IQ1_S sub-block: (scale, i1, i2, shift negative), or `None` when no split scores. The
/// candidates are scored exactly as `quantize_row_iq1_s_impl` scores them, from prefix sums in sorted order, for
/// each `i1` all `i2` at once, then tested in the C's order (`scan`).
#[inline(always)]
fn split_s(xb: &[f32; BS_S], w: &[f32; BS_S], order: &[u8; BS_S]) -> Option<(f32, usize, usize, bool)> {
    let mut sumx = [0.0f32; BS_S + 1];
    let mut sumw = [0.0f32; BS_S + 1];
    for (j, &i) in order.iter().enumerate() {
        let i = usize::from(i);
        sumx[j + 1] = sumx[j] + w[i] * xb[i];
        sumw[j + 1] = sumw[j] + w[i];
    }
    let mut best = Best { score: -f32::MAX, found: None };
    // Per shift (0: x_p, 1: x_m) and i2: sumqx and sumq2.
    let mut qx = [[0.0f32; ROW_S]; 2];
    let mut q2 = [[0.0f32; ROW_S]; 2];
    // Exclusive ranges: LLVM vectorizes `a..b + 1` where it leaves `a..=b` scalar.
    for i1 in 0..BS_S + 1 {
        for (s, v) in [&X_P, &X_M].into_iter().enumerate() {
            let (x0, w0) = (sumx[i1] - sumx[0], sumw[i1] - sumw[0]);
            for i2 in i1..BS_S + 1 {
                qx[s][i2] = x0 * v[0] + (sumx[i2] - sumx[i1]) * v[1] + (sumx[BS_S] - sumx[i2]) * v[2];
                q2[s][i2] =
                    w0 * v[0] * v[0] + (sumw[i2] - sumw[i1]) * v[1] * v[1] + (sumw[BS_S] - sumw[i2]) * v[2] * v[2];
            }
        }
        scan(&qx, &q2, i1, &mut best);
    }
    best.found.map(|(scale, i1, i2, s)| (scale, i1, i2, s == 1))
}

/// One IQ1_S sub-block (`quantize_row_iq1_s_impl`'s loop body); `None` for one left empty (scale 0, shift +).
#[inline(always)]
fn sub_block_s(search: &Search<8>, xb: &[f32; BS_S], w: &[f32; BS_S]) -> Option<Coded<4>> {
    if max_abs(xb) < EPS_S {
        return None;
    }
    let order = ascending(xb);
    let (mut scale, i1, i2, mut negative) = split_s(xb, w, &order)?;
    let flip = scale < 0.0;
    if flip {
        scale = -scale;
        negative = !negative;
    }
    let mut l = split_levels::<BS_S, 4>(&order, i1, i2, flip);
    let v = if negative { &X_M } else { &X_P };
    let (index, scale) = snap(search, xb, w, &mut l, scale, [v; 4]);
    Some(Coded { scale, shift: u8::from(negative), index })
}

/// `quantize_iq1_s` on one super-block, with its columns' importance.
/// [`iq1_s`] where there is an importance matrix; `quantize` refuses IQ1_S without one (ggml aborts there), so the
/// empty block is never written. A function rather than a closure at the dispatch, so that it is inlined into the
/// AVX2 build of `crate::quantize_chunk`.
#[inline(always)]
pub(crate) fn iq1_s_or_empty(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>) -> BlockIQ1S {
    match qw {
        Some(qw) => iq1_s(x, qw),
        None => {
            debug_assert!(false, "IQ1_S without an importance matrix");
            EMPTY_S
        }
    }
}

#[inline(always)]
pub(crate) fn iq1_s(x: &[f32; QK_K], qw: &[f32; QK_K]) -> BlockIQ1S {
    let search = search8(Grid8::Iq1s);
    let s2 = sigma2(x);
    let mut b = EMPTY_S;
    let mut scales = [0.0f32; QK_K / BS_S];
    let mut negative = [false; QK_K / BS_S];
    let mut max_scale = 0.0f32;
    for ib in 0..QK_K / BS_S {
        let xb: [f32; BS_S] = sub(x, BS_S * ib);
        let w = weights::<BS_S>(x, Some(qw), s2, BS_S * ib);
        let Some(c) = sub_block_s(search, &xb, &w) else { continue };
        let mut h = 0u16;
        for (k, &i) in c.index.iter().enumerate() {
            b.qs[4 * ib + k] = (i & 255) as u8;
            h |= (i >> 8) << (3 * k);
        }
        b.qh[ib] = h;
        scales[ib] = c.scale;
        negative[ib] = c.shift != 0;
        max_scale = c_max(max_scale, c.scale);
    }
    if max_scale == 0.0 {
        return b;
    }
    let d = max_scale / 15.0;
    // ggml's fudge factor.
    b.d = f32_to_f16_bits(d * 1.125);
    let id = 1.0 / d;
    for ib in 0..QK_K / BS_S {
        let mut l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7) as u16;
        if negative[ib] {
            l |= 8;
        }
        b.qh[ib] |= l << 12;
    }
    b
}

/// IQ1_M's values of group `g` (0 or 1) under the sign combination `k`.
#[inline(always)]
fn values_m(k: u8, g: usize) -> &'static [f32; 3] {
    let negative = if g == 0 { k >= 2 } else { k % 2 == 1 };
    if negative {
        &X_M
    } else {
        &X_P
    }
}

/// IQ1_M's candidate rows: `i2` up to 16, padded to 8 past it.
const ROW_M: usize = BS_M + 8;

/// The best split of one IQ1_M sub-block with the per-half prefix sums: (scale, i1, i2, k), or `None`. Scored
/// exactly as `quantize_row_iq1_m_impl` scores them, for each `i1` all `i2` at once, then tested in the C's order.
#[inline(always)]
fn split_m(xb: &[f32; BS_M], w: &[f32; BS_M], order: &[u8; BS_M]) -> Option<(f32, usize, usize, u8)> {
    let mut px = [[0.0f32; BS_M + 1]; 2];
    let mut pw = [[0.0f32; BS_M + 1]; 2];
    for (j, &i) in order.iter().enumerate() {
        let i = usize::from(i);
        let h = if i < BS_M / 2 { 0 } else { 1 };
        px[h][j + 1] = px[h][j] + w[i] * xb[i];
        px[1 - h][j + 1] = px[1 - h][j];
        pw[h][j + 1] = pw[h][j] + w[i];
        pw[1 - h][j + 1] = pw[1 - h][j];
    }
    let txs = [px[0][BS_M], px[1][BS_M]];
    let tws = [pw[0][BS_M], pw[1][BS_M]];
    let (p2, m2) = (X_P[2], X_M[2]);
    let cp1 = X_P[0] * X_P[0] - X_P[1] * X_P[1];
    let cp2 = X_P[1] * X_P[1] - X_P[2] * X_P[2];
    let cm1 = X_M[0] * X_M[0] - X_M[1] * X_M[1];
    let cm2 = X_M[1] * X_M[1] - X_M[2] * X_M[2];
    // `tws·p2·p2` and `tws·m2·m2` per half: the first terms of q2, the same for every split.
    let tp = [tws[0] * p2 * p2, tws[1] * p2 * p2];
    let tm = [tws[0] * m2 * m2, tws[1] * m2 * m2];
    let mut best = Best { score: -f32::MAX, found: None };
    // Per sign combination k (0: ++, 1: +−, 2: −+, 3: −−) and i2: sumqx and sumq2.
    let mut qx = [[0.0f32; ROW_M]; 4];
    let mut q2 = [[0.0f32; ROW_M]; 4];
    // Exclusive ranges, as in `split_s`.
    for i1 in 0..BS_M + 1 {
        for i2 in i1..BS_M + 1 {
            let (mut qx_p, mut qx_m, mut q2_p, mut q2_m) = ([0.0f32; 2], [0.0f32; 2], [0.0f32; 2], [0.0f32; 2]);
            for h in 0..2 {
                let sx = px[h][i1] + px[h][i2];
                qx_p[h] = txs[h] * p2 - sx;
                qx_m[h] = txs[h] * m2 - sx;
                q2_p[h] = tp[h] + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                q2_m[h] = tm[h] + pw[h][i1] * cm1 + pw[h][i2] * cm2;
            }
            qx[0][i2] = qx_p[0] + qx_p[1];
            qx[1][i2] = qx_p[0] + qx_m[1];
            qx[2][i2] = qx_m[0] + qx_p[1];
            qx[3][i2] = qx_m[0] + qx_m[1];
            q2[0][i2] = q2_p[0] + q2_p[1];
            q2[1][i2] = q2_p[0] + q2_m[1];
            q2[2][i2] = q2_m[0] + q2_p[1];
            q2[3][i2] = q2_m[0] + q2_m[1];
        }
        scan(&qx, &q2, i1, &mut best);
    }
    best.found
}

/// One IQ1_M sub-block (`quantize_row_iq1_m_impl`'s loop body); `None` for one left empty (scale 0, k 0).
#[inline(always)]
fn sub_block_m(search: &Search<8>, xb: &[f32; BS_M], w: &[f32; BS_M]) -> Option<Coded<2>> {
    if max_abs(xb) < EPS_M {
        return None;
    }
    let order = ascending(xb);
    let (mut scale, i1, i2, mut k) = split_m(xb, w, &order)?;
    let flip = scale < 0.0;
    if flip {
        scale = -scale;
        k = 3 - k;
    }
    let mut l = split_levels::<BS_M, 2>(&order, i1, i2, flip);
    let (index, scale) = snap(search, xb, w, &mut l, scale, [values_m(k, 0), values_m(k, 1)]);
    Some(Coded { scale, shift: k, index })
}

/// `quantize_iq1_m` on one super-block, with or without its columns' importance.
#[inline(always)]
pub(crate) fn iq1_m(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>) -> BlockIQ1M {
    let search = search8(Grid8::Iq1s);
    let s2 = sigma2(x);
    let mut b = BlockIQ1M { qs: [0; QK_K / 8], qh: [0; QK_K / 16], scales: [0; QK_K / 32] };
    let mut scales = [0.0f32; QK_K / BS_M];
    let mut shifts = [0u8; QK_K / BS_M];
    let mut max_scale = 0.0f32;
    for ib in 0..QK_K / BS_M {
        let xb: [f32; BS_M] = sub(x, BS_M * ib);
        let w = weights::<BS_M>(x, qw, s2, BS_M * ib);
        let Some(c) = sub_block_m(search, &xb, &w) else { continue };
        b.qs[2 * ib] = (c.index[0] & 255) as u8;
        b.qs[2 * ib + 1] = (c.index[1] & 255) as u8;
        b.qh[ib] = ((c.index[0] >> 8) | ((c.index[1] >> 8) << 4)) as u8;
        scales[ib] = c.scale;
        shifts[ib] = c.shift;
        max_scale = c_max(max_scale, c.scale);
    }
    if max_scale == 0.0 {
        return b;
    }
    let mut sc = [0u16; 4];
    let mut d = max_scale / 15.0;
    let id = 1.0 / d;
    // The super-block scale refitted over every sub-block as coded (empty ones too: index 0, x_p, l = 0).
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for ib in 0..QK_K / BS_M {
        let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
        sc[ib / 4] |= (l as u16) << (3 * (ib % 4));
        b.qh[ib] |= MASKS_M[usize::from(shifts[ib] & 3)];
        let xb: [f32; BS_M] = sub(x, BS_M * ib);
        let w = weights::<BS_M>(x, qw, s2, BS_M * ib);
        let m = (2 * l + 1) as f32;
        for k in 0..2 {
            let v = values_m(shifts[ib], k);
            // The mask 0x700 drops the shift bit (bit 3 or 7) above the index's bits 8..10.
            let i = u16::from(b.qs[2 * ib + k]) | ((u16::from(b.qh[ib]) << (8 - 4 * k)) & 0x700);
            let p = search.point(i);
            for j in 0..8 {
                let w = w[8 * k + j];
                let q = value(v, p[j]) * m;
                sumqx += w * q * xb[8 * k + j];
                sumq2 += w * q * q;
            }
        }
    }
    if sumq2 > 0.0 {
        d = sumqx / sumq2;
    }
    // ggml's fudge factor.
    let s = f32_to_f16_bits(d * 1.1125);
    sc[0] |= (s & 0x000f) << 12;
    sc[1] |= (s & 0x00f0) << 8;
    sc[2] |= (s & 0x0f00) << 4;
    sc[3] |= s & 0xf000;
    for (o, s) in b.scales.chunks_exact_mut(2).zip(sc) {
        o.copy_from_slice(&s.to_le_bytes());
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    // The C's split searches as written (one candidate at a time), to check the batched ones against.

    /// The best split of one IQ1_S sub-block: (scale, i1, i2, shift negative), or `None` when no split scores.
    fn split_s_c(xb: &[f32; BS_S], w: &[f32; BS_S], order: &[u8; BS_S]) -> Option<(f32, usize, usize, bool)> {
        let mut sumx = [0.0f32; BS_S + 1];
        let mut sumw = [0.0f32; BS_S + 1];
        for (j, &i) in order.iter().enumerate() {
            let i = usize::from(i);
            sumx[j + 1] = sumx[j] + w[i] * xb[i];
            sumw[j + 1] = sumw[j] + w[i];
        }
        let mut best_score = -f32::MAX;
        let mut best = None;
        for i1 in 0..=BS_S {
            for i2 in i1..=BS_S {
                for (v, negative) in [(&X_P, false), (&X_M, true)] {
                    let sumqx =
                        (sumx[i1] - sumx[0]) * v[0] + (sumx[i2] - sumx[i1]) * v[1] + (sumx[BS_S] - sumx[i2]) * v[2];
                    let sumq2 = (sumw[i1] - sumw[0]) * v[0] * v[0]
                        + (sumw[i2] - sumw[i1]) * v[1] * v[1]
                        + (sumw[BS_S] - sumw[i2]) * v[2] * v[2];
                    if sumq2 > 0.0 && sumqx * sumqx > best_score * sumq2 {
                        let scale = sumqx / sumq2;
                        best_score = scale * sumqx;
                        best = Some((scale, i1, i2, negative));
                    }
                }
            }
        }
        best
    }

    /// The best split of one IQ1_M sub-block with the per-half prefix sums: (scale, i1, i2, k), or `None`.
    fn split_m_c(xb: &[f32; BS_M], w: &[f32; BS_M], order: &[u8; BS_M]) -> Option<(f32, usize, usize, u8)> {
        let mut px = [[0.0f32; BS_M + 1]; 2];
        let mut pw = [[0.0f32; BS_M + 1]; 2];
        for (j, &i) in order.iter().enumerate() {
            let i = usize::from(i);
            let h = if i < BS_M / 2 { 0 } else { 1 };
            px[h][j + 1] = px[h][j] + w[i] * xb[i];
            px[1 - h][j + 1] = px[1 - h][j];
            pw[h][j + 1] = pw[h][j] + w[i];
            pw[1 - h][j + 1] = pw[1 - h][j];
        }
        let txs = [px[0][BS_M], px[1][BS_M]];
        let tws = [pw[0][BS_M], pw[1][BS_M]];
        let (p2, m2) = (X_P[2], X_M[2]);
        let cp1 = X_P[0] * X_P[0] - X_P[1] * X_P[1];
        let cp2 = X_P[1] * X_P[1] - X_P[2] * X_P[2];
        let cm1 = X_M[0] * X_M[0] - X_M[1] * X_M[1];
        let cm2 = X_M[1] * X_M[1] - X_M[2] * X_M[2];
        let mut best_score = -f32::MAX;
        let mut best = None;
        for i1 in 0..=BS_M {
            for i2 in i1..=BS_M {
                let (mut qx_p, mut qx_m, mut q2_p, mut q2_m) = ([0.0f32; 2], [0.0f32; 2], [0.0f32; 2], [0.0f32; 2]);
                for h in 0..2 {
                    let sx = px[h][i1] + px[h][i2];
                    qx_p[h] = txs[h] * p2 - sx;
                    qx_m[h] = txs[h] * m2 - sx;
                    q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                    q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                }
                let sumqx = [qx_p[0] + qx_p[1], qx_p[0] + qx_m[1], qx_m[0] + qx_p[1], qx_m[0] + qx_m[1]];
                let sumq2 = [q2_p[0] + q2_p[1], q2_p[0] + q2_m[1], q2_m[0] + q2_p[1], q2_m[0] + q2_m[1]];
                for k in 0..4 {
                    if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best_score * sumq2[k] {
                        let scale = sumqx[k] / sumq2[k];
                        best_score = scale * sumqx[k];
                        best = Some((scale, i1, i2, k as u8));
                    }
                }
            }
        }
        best
    }

    /// Sub-blocks of values with few mantissa bits (so many exact ties, in values and in scores), some zero
    /// weights and some all-equal blocks: every split search must pick the C's split, scale bits included.
    fn cases<const B: usize>(seed: u64, mut check: impl FnMut(&[f32; B], &[f32; B], &[u8; B])) {
        let mut next = crate::test_uniform(seed);
        for case in 0..4000 {
            let bits = [2u32, 3, 8, 23][case % 4];
            let round = |v: f32| {
                let drop = 23 - bits;
                f32::from_bits((v.to_bits() >> drop) << drop)
            };
            let xb: [f32; B] = std::array::from_fn(|_| if case % 17 == 5 { 0.25 } else { round(next()) });
            let w: [f32; B] = std::array::from_fn(|i| {
                let v = round(next().abs() + 0.01);
                if case % 5 == 0 && i % 3 == 0 {
                    0.0
                } else {
                    v
                }
            });
            check(&xb, &w, &ascending(&xb));
        }
    }

    fn bits<T>(r: Option<(f32, usize, usize, T)>) -> Option<(u32, usize, usize, T)> {
        r.map(|(s, i1, i2, k)| (s.to_bits(), i1, i2, k))
    }

    #[test]
    fn batched_split_searches_choose_as_the_c_loops() {
        cases::<BS_S>(1, |xb, w, order| assert_eq!(bits(split_s(xb, w, order)), bits(split_s_c(xb, w, order))));
        cases::<BS_M>(2, |xb, w, order| assert_eq!(bits(split_m(xb, w, order)), bits(split_m_c(xb, w, order))));
    }

    #[test]
    fn the_sort_is_stable() {
        let xb = [1.0f32, -0.0, 0.5, 0.0, 1.0, -2.0, 0.5, 0.0];
        assert_eq!(ascending(&xb), [5, 1, 3, 7, 2, 6, 0, 4]);
        // Against std's stable sort, on values with many ties.
        let mut next = crate::test_uniform(3);
        for _ in 0..1000 {
            let xb: [f32; 32] = std::array::from_fn(|_| (next() * 4.0).round() / 2.0);
            // total_cmp orders −0 before +0, which the C's comparison ties: sort with ±0 folded.
            let folded: [f32; 32] = std::array::from_fn(|i| if xb[i] == 0.0 { 0.0 } else { xb[i] });
            let mut want: Vec<u8> = (0..32).collect();
            want.sort_by(|&a, &b| folded[usize::from(a)].total_cmp(&folded[usize::from(b)]));
            assert_eq!(ascending(&xb).to_vec(), want, "{xb:?}");
        }
    }
}
