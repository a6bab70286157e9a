//! Q1_0 (a sign bit per element, `±d` with `d` the mean magnitude of 128) and Q2_0 (2 bits, `(q − 1) · d` with `d`
//! the largest magnitude of 64), as `quantize_row_q1_0_ref` and `quantize_row_q2_0_ref` (`ggml/src/ggml-quants.c`,
//! llama.cpp 0c1e570) make them. Neither reads an importance matrix.

use quantfarm_ggml::blocks::{BlockQ1_0, BlockQ2_0};

use crate::float::f32_to_f16_bits;

/// `quantize_row_q1_0_ref` on one block.
#[inline(always)]
pub(crate) fn q1_0(x: &[f32; 128]) -> BlockQ1_0 {
    let mut sum_abs = 0.0f32;
    for v in x {
        sum_abs += v.abs();
    }
    let mut qs = [0u8; 16];
    for (j, &v) in x.iter().enumerate() {
        // `x >= 0`: −0.0 counts as non-negative.
        if v >= 0.0 {
            qs[j / 8] |= 1 << (j % 8);
        }
    }
    BlockQ1_0 { d: f32_to_f16_bits(sum_abs / 128.0), qs }
}

/// `quantize_row_q2_0_ref` on one block.
#[inline(always)]
pub(crate) fn q2_0(x: &[f32; 64]) -> BlockQ2_0 {
    let d = x.iter().fold(0.0f32, |a, v| if v.abs() > a { v.abs() } else { a });
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; 16];
    for (j, &v) in x.iter().enumerate() {
        // `(int)roundf(x · id) + 1`, clamped to 0..=3 (3 is never reached: |x · id| ≤ 1).
        let q = ((v * id).round() as i32 + 1).clamp(0, 3) as u8;
        qs[j / 4] |= q << (2 * (j % 4));
    }
    BlockQ2_0 { d: f32_to_f16_bits(d), qs }
}
