//! TQ1_0 and TQ2_0: ternary weights `{−d, 0, +d}` with `d` the super-block's largest magnitude, as
//! `quantize_row_tq1_0_ref` and `quantize_row_tq2_0_ref` (`ggml/src/ggml-quants.c`, llama.cpp 0c1e570) make them.
//! Neither reads an importance matrix.

use quantfarm_ggml::blocks::{trits, BlockTQ1_0, BlockTQ2_0};
use quantfarm_ggml::QK_K;

use crate::float::f32_to_f16_bits;

/// `d = MAX(amax, |x|)` over the super-block, and its inverse (0 for an all-zero one).
#[inline(always)]
fn scale(x: &[f32; QK_K]) -> (f32, f32) {
    let d = x.iter().fold(0.0f32, |a, v| if a > v.abs() { a } else { v.abs() });
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

/// The trit of `x`: `lroundf(x · id) + 1` (half away from zero), in 0..=2.
#[inline(always)]
fn trit(x: f32, id: f32) -> u8 {
    ((x * id).round() as i32 + 1) as u8
}

/// `quantize_row_tq1_0_ref` on one super-block.
#[inline(always)]
pub(crate) fn tq1_0(x: &[f32; QK_K]) -> BlockTQ1_0 {
    let (d, id) = scale(x);
    let t = |e: usize| trit(x[e], id);
    let mut b = BlockTQ1_0 { qs: [0; 48], qh: [0; 4], d: f32_to_f16_bits(d) };
    for m in 0..32 {
        b.qs[m] = trits::pack5(std::array::from_fn(|n| t(32 * n + m)));
    }
    for m in 0..16 {
        b.qs[32 + m] = trits::pack5(std::array::from_fn(|n| t(160 + 16 * n + m)));
    }
    for m in 0..4 {
        b.qh[m] = trits::pack4(std::array::from_fn(|n| t(240 + 4 * n + m)));
    }
    b
}

/// `quantize_row_tq2_0_ref` on one super-block.
#[inline(always)]
pub(crate) fn tq2_0(x: &[f32; QK_K]) -> BlockTQ2_0 {
    let (d, id) = scale(x);
    let mut b = BlockTQ2_0 { qs: [0; QK_K / 4], d: f32_to_f16_bits(d) };
    for c in 0..2 {
        for m in 0..32 {
            for n in 0..4 {
                b.qs[32 * c + m] |= (trit(x[128 * c + 32 * n + m], id) & 3) << (2 * n);
            }
        }
    }
    b
}
