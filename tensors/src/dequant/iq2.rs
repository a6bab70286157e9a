//! IQ2_XXS, IQ2_XS and IQ2_S: groups of 8 values taken from a grid ([`Grid8`]: bytes 8, 25, 43) with a sign mask,
//! scaled per 32 (IQ2_XXS) or 16 elements by a 4-bit `s` against the super-block's `d`.
//!
//! Arithmetic: ggml's `dequantize_row_iq2_xxs` / `_iq2_xs` / `_iq2_s` (`ggml/src/ggml-quants.c`, llama.cpp 0c1e570),
//! which gguf-py's `IQ2_XXS`/`IQ2_XS`/`IQ2_S.dequantize_blocks` reproduce bit for bit: `db = (d · (0.5 + s)) · 0.25`,
//! then `(db · grid) · ±1`. IQ2_XXS and IQ2_XS store 7 sign bits per group, the 8th implied by an even count of
//! negatives ([`parity_signs`]); IQ2_S stores all 8.

use quantfarm_ggml::blocks::{BlockIQ2S, BlockIQ2XS, BlockIQ2XXS};
use quantfarm_ggml::grids::{parity_signs, Grid8};
use quantfarm_ggml::QK_K;

use super::each;
use super::float::f16_bits_to_f32 as f16;

/// The sub-block scale `(d · (0.5 + s)) · 0.25`.
#[inline]
fn sub_scale(d: f32, s: u32) -> f32 {
    d * (0.5 + s as f32) * 0.25
}

/// One group: grid point `point` scaled by `db`, element `j` negated where bit `j` of `signs` is set.
///
/// The reference multiplies by −1.0, which on x86 keeps a NaN's sign (the NaN operand is returned); LLVM would
/// turn that product into a sign flip, so the negation skips NaN explicitly.
#[inline]
fn group(db: f32, point: &[i8; 8], signs: u8, o: &mut [f32]) {
    for j in 0..8 {
        let v = db * f32::from(point[j]);
        o[j] = if signs & (1 << j) != 0 && !v.is_nan() { -v } else { v };
    }
}

pub(super) fn iq2_xxs(data: &[u8], out: &mut [f32]) {
    let grid = Grid8::Iq2xxs.values();
    each(data, out, |b: &BlockIQ2XXS, o: &mut [f32; QK_K]| {
        let d = f16(b.d);
        for (ib, o) in o.chunks_exact_mut(32).enumerate() {
            // Two little-endian u32 words per 32 elements: the 4 grid indices, then 4 × 7 sign bits and `s`.
            let a = u32::from(b.qs[4 * ib]) | (u32::from(b.qs[4 * ib + 1]) << 16);
            let w = u32::from(b.qs[4 * ib + 2]) | (u32::from(b.qs[4 * ib + 3]) << 16);
            let db = sub_scale(d, w >> 28);
            for (l, o) in o.chunks_exact_mut(8).enumerate() {
                let index = (a >> (8 * l)) & 255;
                let signs = parity_signs(((w >> (7 * l)) & 127) as u8);
                group(db, &grid[index as usize], signs, o);
            }
        }
    });
}

pub(super) fn iq2_xs(data: &[u8], out: &mut [f32]) {
    let grid = Grid8::Iq2xs.values();
    each(data, out, |b: &BlockIQ2XS, o: &mut [f32; QK_K]| {
        let d = f16(b.d);
        for (g, o) in o.chunks_exact_mut(8).enumerate() {
            let s = (b.scales[g / 4] >> (4 * (g / 2 % 2))) & 15;
            let q = b.qs[g];
            group(sub_scale(d, u32::from(s)), &grid[usize::from(q & 511)], parity_signs((q >> 9) as u8), o);
        }
    });
}

pub(super) fn iq2_s(data: &[u8], out: &mut [f32]) {
    let grid = Grid8::Iq2s.values();
    each(data, out, |b: &BlockIQ2S, o: &mut [f32; QK_K]| {
        let d = f16(b.d);
        for (g, o) in o.chunks_exact_mut(8).enumerate() {
            let s = (b.scales[g / 4] >> (4 * (g / 2 % 2))) & 15;
            let high = (usize::from(b.qh[g / 4]) << (8 - 2 * (g % 4))) & 0x300;
            let index = usize::from(b.qs[g]) | high;
            group(sub_scale(d, u32::from(s)), &grid[index], b.qs[QK_K / 8 + g], o);
        }
    });
}
