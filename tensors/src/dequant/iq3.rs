//! IQ3_XXS and IQ3_S: each 4-element group a point of a grid (`quantfarm_ggml::grids::Grid4`), scaled per
//! 32-element sub-block and signed per element.
//!
//! Arithmetic: ggml's `dequantize_row_iq3_xxs` / `dequantize_row_iq3_s` (`ggml/src/ggml-quants.c`, llama.cpp
//! 0c1e570), which gguf-py's `IQ3_XXS`/`IQ3_S.dequantize_blocks` reproduce bit for bit: IQ3_XXS
//! `((d · (0.5 + s)) · 0.5) · grid · ±1` with the 8th sign of each 8 implied by even parity, IQ3_S
//! `(d · (1 + 2s)) · grid · ±1` with every sign stored.

use quantfarm_ggml::blocks::{BlockIQ3S, BlockIQ3XXS};
use quantfarm_ggml::grids::{parity_signs, Grid4};
use quantfarm_ggml::QK_K;

use super::each;
use super::float::f16_bits_to_f32 as f16;

/// 8 elements from two grid points, `db · grid · ±1` (sign bit `j` set: negative). The reference multiplies by
/// −1.0, which on x86 keeps a NaN's sign (the NaN operand is returned); LLVM would turn that product into a sign
/// flip, so the negation skips NaN.
#[inline(always)]
fn eight(db: f32, g1: &[i8; 4], g2: &[i8; 4], signs: u8, o: &mut [f32]) {
    let signed = |v: f32, j: usize| if signs & (1 << j) != 0 && !v.is_nan() { -v } else { v };
    for j in 0..4 {
        o[j] = signed(db * f32::from(g1[j]), j);
        o[j + 4] = signed(db * f32::from(g2[j]), j + 4);
    }
}

pub(super) fn iq3_xxs(data: &[u8], out: &mut [f32]) {
    let grid = Grid4::Iq3xxs.values();
    each(data, out, |b: &BlockIQ3XXS, o: &mut [f32; QK_K]| {
        let d = f16(b.d);
        for (ib, o) in o.chunks_exact_mut(32).enumerate() {
            let at = QK_K / 4 + 4 * ib;
            let word = u32::from_le_bytes([b.qs[at], b.qs[at + 1], b.qs[at + 2], b.qs[at + 3]]);
            let db = d * (0.5 + (word >> 28) as f32) * 0.5;
            for (l, o) in o.chunks_exact_mut(8).enumerate() {
                let signs = parity_signs(((word >> (7 * l)) & 127) as u8);
                let (g1, g2) = (usize::from(b.qs[8 * ib + 2 * l]), usize::from(b.qs[8 * ib + 2 * l + 1]));
                eight(db, &grid[g1], &grid[g2], signs, o);
            }
        }
    });
}

pub(super) fn iq3_s(data: &[u8], out: &mut [f32]) {
    let grid = Grid4::Iq3s.values();
    each(data, out, |b: &BlockIQ3S, o: &mut [f32; QK_K]| {
        let d = f16(b.d);
        for (ib, o) in o.chunks_exact_mut(32).enumerate() {
            let s = (b.scales[ib / 2] >> (4 * (ib % 2))) & 0x0f;
            let db = d * (1 + 2 * i32::from(s)) as f32;
            let qh = usize::from(b.qh[ib]);
            for (l, o) in o.chunks_exact_mut(8).enumerate() {
                let index = |k: usize| usize::from(b.qs[8 * ib + k]) | (((qh >> k) & 1) << 8);
                eight(db, &grid[index(2 * l)], &grid[index(2 * l + 1)], b.signs[4 * ib + l], o);
            }
        }
    });
}
