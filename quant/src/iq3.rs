//! IQ3_XXS and IQ3_S: 256-element super-blocks of 8 sub-blocks of 32, each 4-element group a point of a grid of
//! 3-bit level patterns (`quantfarm_ggml::grids::Grid4`), as `quantize_row_iq3_xxs_impl` and
//! `quantize_row_iq3_s_impl` (`ggml/src/ggml-quants.c`, llama.cpp 0c1e570) make them, with or without an
//! importance matrix.
//!
//! Per sub-block: weights `qw · √(σ² + x²)` (σ² = 2·Σx²/256 over the super-block) or `x²`; magnitudes and signs
//! (IQ3_XXS stores 7 sign bits per 8 elements and forces an even count of negatives by flipping the least
//! important element, see [`quantfarm_ggml::grids::parity_signs`]); then a scan of candidate inverse scales, each
//! group rounded to levels and moved to the nearest listed grid point when its pattern is off the grid
//! (`crate::iq_grid`), accepted on strict improvement of `(Σwxq)²/Σwq²`; the off-grid groups re-fitted at the
//! chosen scale and the scale refit by least squares. The 8 sub-block scales are then quantized to 4 bits against
//! the largest.

use quantfarm_ggml::blocks::{BlockIQ3S, BlockIQ3XXS};
use quantfarm_ggml::grids::Grid4;
use quantfarm_ggml::QK_K;

use crate::float::f32_to_f16_bits;
use crate::helpers::{nearest_int, sub};
use crate::iq_grid::{search4, Lookup, Search};

/// Levels per element (0..=7, value `2L + 1`).
const K_MAX_Q: i32 = 8;

/// What differs between the two types' sub-block searches.
struct Variant {
    grid: Grid4,
    /// 7 stored sign bits per 8 elements with even parity (IQ3_XXS), or all 8 (IQ3_S).
    parity: bool,
    /// Candidates `is ∈ −range..=range`.
    range: i32,
    /// A sub-block whose largest magnitude is below this is all zero (IQ3_S: only an exact 0 is).
    zero_below: Option<f32>,
    /// Refit every group after the scan, not only those that were off the grid (IQ3_S, whose "skip on-grid
    /// groups" line is commented out in ggml; its groups also start flagged off the grid).
    refit_all: bool,
}

const IQ3_XXS: Variant =
    Variant { grid: Grid4::Iq3xxs, parity: true, range: 15, zero_below: Some(1e-8), refit_all: false };
const IQ3_S: Variant = Variant { grid: Grid4::Iq3s, parity: false, range: 9, zero_below: None, refit_all: true };

/// One quantized 32-element sub-block: its scale, the grid index of each 4-element group and the signs of each
/// 8 elements.
struct SubBlock {
    scale: f32,
    index: [u16; 8],
    signs: [u8; 4],
}

/// `Σ (w·x)·q` and `Σ (w·q)·q` with `q = 2L + 1`.
#[inline(always)]
fn sums(w: &[f32; 32], xval: &[f32; 32], l: &[[u8; 4]; 8]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for i in 0..32 {
        let q = f32::from(2 * l[i / 4][i % 4] + 1);
        sumqx += w[i] * xval[i] * q;
        sumq2 += w[i] * q * q;
    }
    (sumqx, sumq2)
}

/// The levels `clamp(nearest_int(0.5·(id·x − 1)), 0, 7)` of one group.
#[inline(always)]
fn levels(id: f32, x: &[f32; 4]) -> [u8; 4] {
    // A loop, not `map`: that generic is compiled out of line, for the baseline CPU.
    let mut l = [0u8; 4];
    for i in 0..4 {
        l[i] = nearest_int(0.5 * (id * x[i] - 1.0)).clamp(0, K_MAX_Q - 1) as u8;
    }
    l
}

/// Puts group `l` on the grid: itself if it is a grid point, else the listed neighbour nearest `x` at `scale`
/// (which rewrites `l`). Returns its index, and whether it was on the grid.
#[inline(always)]
fn on_grid(s: &Search<4>, l: &mut [u8; 4], x: &[f32; 4], waux: &[f32; 4], scale: f32) -> (u16, bool) {
    match s.lookup(l) {
        Lookup::On(k) => (k, true),
        Lookup::Off(list) => (s.best_neighbour(list, x, waux, scale, l), false),
    }
}

/// One sub-block, or `None` when it is all zero (ggml then writes nothing for it).
#[inline(always)]
fn sub_block(v: &Variant, xb: &[f32; 32], qw: Option<&[f32; 32]>, sigma2: f32) -> Option<SubBlock> {
    let s = search4(v.grid);
    let weight: [f32; 32] = match qw {
        Some(qw) => std::array::from_fn(|i| qw[i] * (sigma2 + xb[i] * xb[i]).sqrt()),
        None => xb.map(|x| x * x),
    };
    let waux = weight.map(f32::sqrt);
    let mut xval = [0.0f32; 32];
    let mut signs = [0u8; 4];
    for k in 0..4 {
        let mut sign = 0u8;
        let mut flips = 0;
        for i in 0..8 {
            let x = xb[8 * k + i];
            // `x >= 0` keeps −0.0 as it is.
            if x >= 0.0 {
                xval[8 * k + i] = x;
            } else {
                xval[8 * k + i] = -x;
                flips += 1;
                sign |= 1 << i;
            }
        }
        if v.parity && flips % 2 == 1 {
            // The least important element takes the other sign (first on ties).
            let importance = |i: usize| weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
            let (mut imin, mut min) = (0, importance(0));
            for i in 1..8 {
                if importance(i) < min {
                    (imin, min) = (i, importance(i));
                }
            }
            xval[8 * k + imin] = -xval[8 * k + imin];
            sign ^= 1 << imin;
        }
        signs[k] = if v.parity { sign & 127 } else { sign };
    }
    // ggml's `MAX(a, b)`: `a > b ? a : b`.
    let max = xval[1..].iter().fold(xval[0], |m, &x| if m > x { m } else { x });
    let zero = match v.zero_below {
        Some(eps) => max < eps,
        None => max == 0.0,
    };
    if zero {
        return None;
    }
    let group = |a: &[f32; 32], k: usize| -> [f32; 4] { sub(a, 4 * k) };
    let mut best = 0.0f32;
    let mut scale = max / (2 * K_MAX_Q - 1) as f32;
    let mut l = [[0u8; 4]; 8];
    let mut flagged = [v.refit_all; 8];
    for is in -v.range..=v.range {
        let id = ((2 * K_MAX_Q - 1) as f32 + is as f32 * 0.2) / max;
        let this_scale = 1.0 / id;
        let mut laux = [[0u8; 4]; 8];
        for (k, l) in laux.iter_mut().enumerate() {
            *l = levels(id, &group(&xval, k));
        }
        // Every group's map entry first: independent loads, in flight together.
        let found = s.lookup_all(&laux);
        let mut off = [false; 8];
        for (k, found) in found.into_iter().enumerate() {
            if let Lookup::Off(list) = found {
                s.best_neighbour(list, &group(&xval, k), &group(&waux, k), this_scale, &mut laux[k]);
                off[k] = true;
            }
        }
        let (sumqx, sumq2) = sums(&weight, &xval, &laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            l = laux;
            flagged = off;
        }
    }
    if flagged.iter().any(|&f| f) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..8 {
            if !v.refit_all && !flagged[k] {
                continue;
            }
            let mut lk = levels(id, &group(&xval, k));
            let (index, _) = on_grid(s, &mut lk, &group(&xval, k), &group(&waux, k), scale);
            s.levels_of(index, &mut l[k]);
        }
        let (sumqx, sumq2) = sums(&weight, &xval, &l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    if scale < 0.0 {
        // "Should never happen" (ggml): a positive scale with the signs inverted.
        scale = -scale;
        for s in &mut signs {
            *s = if v.parity { !*s & 127 } else { !*s };
        }
    }
    // Every group is a grid point now (the scan keeps only grid points, and the zero pattern is one).
    let index = std::array::from_fn(|k| match s.lookup(&l[k]) {
        Lookup::On(i) => i,
        Lookup::Off(list) => {
            debug_assert!(false, "group {k} of a sub-block is off the grid");
            s.first(list)
        }
    });
    Some(SubBlock { scale, index, signs })
}

/// The 8 sub-blocks of a super-block, σ² taken over all 256 values.
#[inline(always)]
fn sub_blocks(v: &Variant, x: &[f32; QK_K], qw: Option<&[f32; QK_K]>) -> [Option<SubBlock>; 8] {
    let mut sumx2 = 0.0f32;
    for &x in x {
        sumx2 += x * x;
    }
    let sigma2 = 2.0 * sumx2 / QK_K as f32;
    // A loop, not `array::from_fn`: its closure would be compiled out of line, for the baseline CPU.
    let mut subs = [const { None }; 8];
    for (ib, out) in subs.iter_mut().enumerate() {
        let qw: Option<[f32; 32]> = qw.map(|qw| sub(qw, 32 * ib));
        *out = sub_block(v, &sub(x, 32 * ib), qw.as_ref(), sigma2);
    }
    subs
}

/// The super-block scale `d = max/31` (fp16 of `d · fudge` stored) and each sub-block's 4-bit level
/// `clamp(nearest_int(0.5·(scale/d − 1)), 0, 15)`; `None` when every sub-block is zero.
#[inline(always)]
fn scale_levels(subs: &[Option<SubBlock>; 8], fudge: f32) -> Option<(u16, [u8; 8])> {
    let scale = |ib: usize| subs[ib].as_ref().map_or(0.0, |s| s.scale);
    let max_scale = (0..8).fold(0.0f32, |m, ib| if m > scale(ib) { m } else { scale(ib) });
    if max_scale == 0.0 {
        return None;
    }
    let d = max_scale / 31.0;
    let id = 1.0 / d;
    let levels = std::array::from_fn(|ib| nearest_int(0.5 * (id * scale(ib) - 1.0)).clamp(0, 15) as u8);
    Some((f32_to_f16_bits(d * fudge), levels))
}

/// IQ3_XXS (`quantize_row_iq3_xxs_impl(256, …)`; fudge 1.0125 on the stored scale).
#[inline(always)]
pub(crate) fn iq3_xxs(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>) -> BlockIQ3XXS {
    let subs = sub_blocks(&IQ3_XXS, x, qw);
    let mut out = BlockIQ3XXS { d: 0, qs: [0; 3 * QK_K / 8] };
    let Some((d, levels)) = scale_levels(&subs, 1.0125) else { return out };
    out.d = d;
    for (ib, sb) in subs.iter().enumerate() {
        let mut word = 0u32;
        if let Some(sb) = sb {
            for (k, &i) in sb.index.iter().enumerate() {
                // 256 points: the index is one byte.
                out.qs[8 * ib + k] = i as u8;
            }
            word = sb.signs.iter().enumerate().fold(0, |w, (k, &s)| w | u32::from(s) << (7 * k));
        }
        word |= u32::from(levels[ib]) << 28;
        out.qs[QK_K / 4 + 4 * ib..QK_K / 4 + 4 * ib + 4].copy_from_slice(&word.to_le_bytes());
    }
    out
}

/// IQ3_S (`quantize_row_iq3_s_impl(32, …)`; fudge 1.033 on the stored scale).
///
/// ggml advances its `qs` and `signs` write positions only past sub-blocks it quantized, so the groups and signs of
/// the sub-blocks after an all-zero one land one slot early, and the last slots stay zero (`qh` is indexed by
/// sub-block and is not shifted). Reproduced, since the files must be ggml's.
#[inline(always)]
pub(crate) fn iq3_s(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>) -> BlockIQ3S {
    let subs = sub_blocks(&IQ3_S, x, qw);
    let mut out =
        BlockIQ3S { d: 0, qs: [0; QK_K / 4], qh: [0; QK_K / 32], signs: [0; QK_K / 8], scales: [0; QK_K / 64] };
    let mut slot = 0;
    for (ib, sb) in subs.iter().enumerate() {
        let Some(sb) = sb else { continue };
        for (k, &i) in sb.index.iter().enumerate() {
            out.qs[8 * slot + k] = (i & 255) as u8;
            out.qh[ib] |= ((i >> 8) as u8) << k;
        }
        out.signs[4 * slot..4 * slot + 4].copy_from_slice(&sb.signs);
        slot += 1;
    }
    let Some((d, levels)) = scale_levels(&subs, 1.033) else { return out };
    out.d = d;
    for p in 0..4 {
        out.scales[p] = levels[2 * p] | (levels[2 * p + 1] << 4);
    }
    out
}
