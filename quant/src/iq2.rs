//! IQ2_XXS, IQ2_XS and IQ2_S: 256-element super-blocks whose groups of 8 magnitudes are points of a 2-bit grid
//! (levels 0..2, value `2L + 1` in the search), as `quantize_iq2_xxs`, `quantize_iq2_xs` and `quantize_iq2_s`
//! (`ggml/src/ggml-quants.c`, llama.cpp 0c1e570) make them through `quantize_row_iq2_xxs_impl`,
//! `quantize_row_iq2_xs_impl` and `quantize_row_iq2_s_impl`.
//!
//! Per sub-block (32 elements for IQ2_XXS, 16 for the others) the signs are folded out, a scale is searched over the
//! grid (`iq_search`), and the sub-block scales are then quantized to 4 bits against the largest.
//! - IQ2_XXS and IQ2_XS store 7 sign bits per group and imply the 8th (an even count of negatives): a group with an
//!   odd count instead flips its element of least `w·x²`, whose magnitude then enters the search negated. Both
//!   need an importance matrix (ggml aborts without one).
//! - IQ2_XXS seeds its search with `make_qp_quants` over the sub-block, spreads its candidates over that scale,
//!   and refines every group.
//! - IQ2_S stores full sign masks, takes an importance matrix or not, and stores `d` scaled by 0.9875.
//!
//! The weights are `qw · √(σ² + x²)` with `σ²` over the super-block (`Σx²/256`; twice that for IQ2_S), and
//! `σ²/4 + x²` for IQ2_S without an imatrix.

use quantfarm_ggml::blocks::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS};
use quantfarm_ggml::grids::Grid8;
use quantfarm_ggml::QK_K;

use crate::float::f32_to_f16_bits;
use crate::helpers::{make_qp_quants, nearest_int, GROUP_MAX_EPS};
use crate::iq_grid::search8;
use crate::iq_search::{search, Scan, SubBlock};

/// Levels per element.
const KMAXQ: i32 = 3;
/// IQ2_S's all-zero threshold (`GROUP_MAX_EPS_IQ2_S`).
const GROUP_MAX_EPS_IQ2_S: f32 = 1e-8;
/// IQ2_S's stored `d` is the search's `d` times this.
const IQ2_S_FUDGE: f32 = 0.9875;

/// The all-zero blocks: what a super-block whose every scale is 0 quantizes to.
pub(crate) const ZERO_XXS: BlockIQ2XXS = BlockIQ2XXS { d: 0, qs: [0; QK_K / 8] };
pub(crate) const ZERO_XS: BlockIQ2XS = BlockIQ2XS { d: 0, qs: [0; QK_K / 8], scales: [0; QK_K / 32] };

/// How the 8 signs of a group are kept.
#[derive(Clone, Copy, PartialEq)]
enum Signs {
    /// 7 bits, the 8th implied by an even count of negatives (IQ2_XXS, IQ2_XS).
    Parity,
    /// All 8 bits (IQ2_S).
    Full,
}

/// A group's magnitudes and sign mask (bit i: element i negative). With [`Signs::Parity`] an odd count of negatives
/// is made even by flipping the element of least `(w·x)·x` (the first on ties), whose magnitude becomes `−|x|`, and
/// the mask keeps its low 7 bits.
#[inline(always)]
fn fold_signs(x: &[f32], w: &[f32; 8], signs: Signs) -> ([f32; 8], u8) {
    let mut xval = [0.0f32; 8];
    let mut s = 0u8;
    for i in 0..8 {
        // `x >= 0` keeps −0.0 as it is.
        if x[i] >= 0.0 {
            xval[i] = x[i];
        } else {
            xval[i] = -x[i];
            s |= 1 << i;
        }
    }
    if signs == Signs::Full {
        return (xval, s);
    }
    if s.count_ones() % 2 == 1 {
        let mut imin = 0;
        let mut min = w[0] * x[0] * x[0];
        for i in 1..8 {
            let ax = w[i] * x[i] * x[i];
            if ax < min {
                min = ax;
                imin = i;
            }
        }
        xval[imin] = -xval[imin];
        s ^= 1 << imin;
    }
    (xval, s & 127)
}

/// Prepares the sub-block `xb` (`8·G` values) for the search: weights from `weight(i, x)` (element `i` of the
/// sub-block), their square roots, and the folded signs. Also returns the largest magnitude (`MAX` from the first,
/// so the first wins ties and a flipped element counts with its negated magnitude).
#[inline(always)]
fn prepare<const G: usize>(
    xb: &[f32],
    weight: impl Fn(usize, f32) -> f32,
    signs: Signs,
) -> (SubBlock<8, G>, [u8; G], f32) {
    let mut b = SubBlock { xval: [[0.0; 8]; G], w: [[0.0; 8]; G], waux: [[0.0; 8]; G] };
    let mut masks = [0u8; G];
    for (k, x) in xb.chunks_exact(8).take(G).enumerate() {
        for (i, &v) in x.iter().enumerate() {
            b.w[k][i] = weight(8 * k + i, v);
            b.waux[k][i] = b.w[k][i].sqrt();
        }
        (b.xval[k], masks[k]) = fold_signs(x, &b.w[k], signs);
    }
    let mut max = b.xval[0][0];
    for &v in b.xval.iter().flatten() {
        max = if max > v { max } else { v };
    }
    (b, masks, max)
}

/// `Σ x²` over the super-block, in order.
#[inline(always)]
fn sum_x2(x: &[f32; QK_K]) -> f32 {
    let mut sumx2 = 0.0f32;
    for &v in x {
        sumx2 += v * v;
    }
    sumx2
}

/// Inverts the signs after a negative scale ("should never happen" in the C, kept as it is): the parity types keep
/// 7 bits.
#[inline(always)]
fn flip<const G: usize>(scale: &mut f32, masks: &mut [u8; G], signs: Signs) {
    if *scale < 0.0 {
        *scale = -*scale;
        for m in masks.iter_mut() {
            *m = match signs {
                Signs::Parity => !*m & 127,
                Signs::Full => !*m,
            };
        }
    }
}

/// The super-block scale `d = max_scale/31` and each sub-block's 4-bit scale `clamp(nearest_int(0.5·(s/d − 1)),
/// 0, 15)` (with `1/d` from the unfudged f32 `d`).
#[inline(always)]
fn scale_nibbles<const M: usize>(scales: &[f32; M], max_scale: f32) -> (f32, [u8; M]) {
    let d = max_scale / 31.0;
    let id = 1.0 / d;
    (d, std::array::from_fn(|ib| nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15) as u8))
}

/// Two nibbles per byte, the even sub-block's low.
#[inline(always)]
fn pack_nibbles(l: &[u8; QK_K / 16]) -> [u8; QK_K / 32] {
    std::array::from_fn(|p| l[2 * p] | (l[2 * p + 1] << 4))
}

/// `quantize_row_iq2_xxs_impl` on one super-block with its columns' importance `qw`.
/// [`iq2_xxs`] where there is an importance matrix, all-zero blocks where there is none (`quantize` refuses
/// IQ2_XXS without one, as ggml aborts there, so that case does not occur). A function rather than a closure at the
/// dispatch, so that it is inlined into the AVX2 build of `crate::quantize_chunk` (a closure is compiled on its own,
/// for the baseline CPU).
#[inline(always)]
pub(crate) fn iq2_xxs_or_zero(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>) -> BlockIQ2XXS {
    match qw {
        Some(qw) => iq2_xxs(x, qw),
        None => ZERO_XXS,
    }
}

/// [`iq2_xs`], or all-zero blocks without an importance matrix (as [`iq2_xxs_or_zero`]).
#[inline(always)]
pub(crate) fn iq2_xs_or_zero(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>) -> BlockIQ2XS {
    match qw {
        Some(qw) => iq2_xs(x, qw),
        None => ZERO_XS,
    }
}

#[inline(always)]
pub(crate) fn iq2_xxs(x: &[f32; QK_K], qw: &[f32; QK_K]) -> BlockIQ2XXS {
    let grid = search8(Grid8::Iq2xxs);
    let scan = Scan { kmaxq: KMAXQ, n: 6, refine_all: true };
    let sigma2 = sum_x2(x) / QK_K as f32;
    let mut q2 = [0u32; QK_K / 16];
    let mut scales = [0.0f32; QK_K / 32];
    let mut max_scale = 0.0f32;
    for ib in 0..QK_K / 32 {
        let xb = &x[32 * ib..32 * (ib + 1)];
        let weight = |i: usize, v: f32| qw[32 * ib + i] * (sigma2 + v * v).sqrt();
        let (b, mut masks, max) = prepare::<4>(xb, weight, Signs::Parity);
        if max < GROUP_MAX_EPS {
            continue;
        }
        let xflat: [f32; 32] = std::array::from_fn(|i| b.xval[i / 8][i % 8]);
        let wflat: [f32; 32] = std::array::from_fn(|i| b.w[i / 8][i % 8]);
        // Only the scale is used: the search below replaces every level (`scale > 0` here refines every group).
        let mut lq = [0u8; 32];
        let scale = make_qp_quants(KMAXQ + 1, &xflat, &mut lq, &wflat);
        let eff_max = scale * KMAXQ as f32;
        if eff_max <= 0.0 {
            continue;
        }
        let (mut scale, index) = search(grid, &b, &scan, eff_max, scale);
        flip(&mut scale, &mut masks, Signs::Parity);
        for k in 0..4 {
            q2[2 * ib] |= u32::from(index[k]) << (8 * k);
            q2[2 * ib + 1] |= u32::from(masks[k]) << (7 * k);
        }
        scales[ib] = scale;
        max_scale = if max_scale > scale { max_scale } else { scale };
    }
    if max_scale == 0.0 {
        return ZERO_XXS;
    }
    let (d, l) = scale_nibbles(&scales, max_scale);
    for ib in 0..QK_K / 32 {
        q2[2 * ib + 1] |= u32::from(l[ib]) << 28;
    }
    // The words as the C's `uint16_t` array holds them (little-endian halves).
    let qs = std::array::from_fn(|j| (q2[j / 2] >> (16 * (j % 2))) as u16);
    BlockIQ2XXS { d: f32_to_f16_bits(d), qs }
}

/// What IQ2_XS's and IQ2_S's search gives per super-block.
struct Searched16 {
    /// Each 16-element sub-block's scale (0 for a skipped one).
    scales: [f32; QK_K / 16],
    /// Each group's grid index and sign mask (0 and 0 in a skipped sub-block).
    groups: [(u16, u8); QK_K / 8],
    /// The largest scale.
    max_scale: f32,
}

/// The 16-element sub-block search IQ2_XS and IQ2_S share.
#[inline(always)]
fn search16(grid: Grid8, x: &[f32; QK_K], weight: impl Fn(usize, f32) -> f32, signs: Signs, eps: f32) -> Searched16 {
    let grid = search8(grid);
    let scan = Scan { kmaxq: KMAXQ, n: 9, refine_all: false };
    let mut scales = [0.0f32; QK_K / 16];
    let mut groups = [(0u16, 0u8); QK_K / 8];
    let mut max_scale = 0.0f32;
    for ib in 0..QK_K / 16 {
        let xb = &x[16 * ib..16 * (ib + 1)];
        let (b, mut masks, max) = prepare::<2>(xb, |i, v| weight(16 * ib + i, v), signs);
        if max < eps {
            continue;
        }
        let (mut scale, index) = search(grid, &b, &scan, max, max / (2 * KMAXQ - 1) as f32);
        flip(&mut scale, &mut masks, signs);
        groups[2 * ib] = (index[0], masks[0]);
        groups[2 * ib + 1] = (index[1], masks[1]);
        scales[ib] = scale;
        max_scale = if max_scale > scale { max_scale } else { scale };
    }
    Searched16 { scales, groups, max_scale }
}

/// `quantize_row_iq2_xs_impl` on one super-block with its columns' importance `qw`.
#[inline(always)]
pub(crate) fn iq2_xs(x: &[f32; QK_K], qw: &[f32; QK_K]) -> BlockIQ2XS {
    let sigma2 = sum_x2(x) / QK_K as f32;
    let weight = |i: usize, v: f32| qw[i] * (sigma2 + v * v).sqrt();
    let found = search16(Grid8::Iq2xs, x, weight, Signs::Parity, GROUP_MAX_EPS);
    if found.max_scale == 0.0 {
        return ZERO_XS;
    }
    let (d, l) = scale_nibbles(&found.scales, found.max_scale);
    let qs = std::array::from_fn(|g| {
        let (index, mask) = found.groups[g];
        index | (u16::from(mask) << 9)
    });
    BlockIQ2XS { d: f32_to_f16_bits(d), qs, scales: pack_nibbles(&l) }
}

/// `quantize_row_iq2_s_impl` on one super-block, with its columns' importance if there is an imatrix.
#[inline(always)]
pub(crate) fn iq2_s(x: &[f32; QK_K], qw: Option<&[f32; QK_K]>) -> BlockIQ2S {
    let sigma2 = 2.0 * sum_x2(x) / QK_K as f32;
    let weight = |i: usize, v: f32| match qw {
        Some(qw) => qw[i] * (sigma2 + v * v).sqrt(),
        None => 0.25 * sigma2 + v * v,
    };
    let found = search16(Grid8::Iq2s, x, weight, Signs::Full, GROUP_MAX_EPS_IQ2_S);
    let mut b = BlockIQ2S { d: 0, qs: [0; QK_K / 4], qh: [0; QK_K / 32], scales: [0; QK_K / 32] };
    // Written whatever the scales (the C zeroes the block first and returns early only after these).
    for (g, &(index, mask)) in found.groups.iter().enumerate() {
        b.qs[g] = (index & 255) as u8;
        b.qh[g / 4] |= ((index >> 8) as u8) << (2 * (g % 4));
        b.qs[QK_K / 8 + g] = mask;
    }
    if found.max_scale == 0.0 {
        return b;
    }
    let (d, l) = scale_nibbles(&found.scales, found.max_scale);
    b.d = f32_to_f16_bits(d * IQ2_S_FUDGE);
    b.scales = pack_nibbles(&l);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_odd_count_of_negatives_flips_the_least_weighted_element() {
        let x = [1.0, -2.0, 0.5, 3.0, -0.25, -1.0, 2.0, 0.75];
        let w = [1.0; 8];
        // Three negatives: −0.25 has the least w·x² and is kept positive in the mask, its magnitude negated.
        let (xval, s) = fold_signs(&x, &w, Signs::Parity);
        assert_eq!(s, 0b0010_0010);
        assert_eq!(xval[4], -0.25);
        assert_eq!(xval[1], 2.0);
        let (xval, s) = fold_signs(&x, &w, Signs::Full);
        assert_eq!(s, 0b0011_0010);
        assert_eq!(xval[4], 0.25);
    }

    #[test]
    fn an_all_zero_super_block_is_an_all_zero_block() {
        let (x, qw) = ([0.0f32; QK_K], [1.0f32; QK_K]);
        assert_eq!(iq2_xxs(&x, &qw), ZERO_XXS);
        assert_eq!(iq2_xs(&x, &qw), ZERO_XS);
        let zero_s = BlockIQ2S { d: 0, qs: [0; QK_K / 4], qh: [0; QK_K / 32], scales: [0; QK_K / 32] };
        assert_eq!(iq2_s(&x, Some(&qw)), zero_s);
        assert_eq!(iq2_s(&x, None), zero_s);
    }

    #[test]
    fn a_zero_imatrix_sub_block_is_skipped_by_iq2_xxs() {
        // make_qp_quants gives scale 0 on all-zero weights, so the sub-block keeps index 0, no signs and nibble 0.
        let x: [f32; QK_K] = std::array::from_fn(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0);
        let mut qw = [1.0f32; QK_K];
        qw[..32].fill(0.0);
        let b = iq2_xxs(&x, &qw);
        assert_eq!(b.qs[..4], [0; 4]);
        assert_ne!(b.d, 0);
        assert_ne!(b.qs[4..8], [0; 4]);
    }
}
