//! IQ1_S and IQ1_M: 8-element groups coded as points of the ternary grid `quantfarm_ggml::grids::Grid8::Iq1s`
//! (bytes −1, 0, +1), shifted by ±0.125 per sub-block (IQ1_S) or per group (IQ1_M).
//!
//! Arithmetic: ggml's `dequantize_row_iq1_s` / `dequantize_row_iq1_m` (`ggml/src/ggml-quants.c`, llama.cpp
//! 0c1e570), which gguf-py's `IQ1_S`/`IQ1_M.dequantize_blocks` reproduce bit for bit: `dl = d · (2s + 1)`, then
//! `dl · (grid + delta)`. IQ1_M has no `d` field: its fp16 bits are the top nibbles of the four scale words.

use quantfarm_ggml::blocks::{BlockIQ1M, BlockIQ1S};
use quantfarm_ggml::grids::Grid8;
use quantfarm_ggml::QK_K;

use super::each;
use super::float::f16_bits_to_f32 as f16;

/// `IQ1S_DELTA`.
const DELTA: f32 = 0.125;

/// Grid point `index` scaled: `dl · (grid + delta)` into 8 values.
#[inline]
fn group(index: u16, dl: f32, delta: f32, o: &mut [f32]) {
    let g = &Grid8::Iq1s.values()[usize::from(index)];
    for (o, &q) in o.iter_mut().zip(g) {
        *o = dl * (f32::from(q) + delta);
    }
}

/// `−delta` when `negative`, else `delta`.
#[inline]
fn delta(negative: bool) -> f32 {
    if negative {
        -DELTA
    } else {
        DELTA
    }
}

pub(super) fn iq1_s(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockIQ1S, o: &mut [f32; QK_K]| {
        let d = f16(b.d);
        for (ib, o) in o.chunks_exact_mut(32).enumerate() {
            let qh = b.qh[ib];
            let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
            let delta = delta(qh & 0x8000 != 0);
            for (l, o) in o.chunks_exact_mut(8).enumerate() {
                let index = u16::from(b.qs[4 * ib + l]) | (((qh >> (3 * l)) & 7) << 8);
                group(index, dl, delta, o);
            }
        }
    });
}

pub(super) fn iq1_m(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockIQ1M, o: &mut [f32; QK_K]| {
        let sc: [u16; 4] = std::array::from_fn(|i| u16::from_le_bytes([b.scales[2 * i], b.scales[2 * i + 1]]));
        let d = f16((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
        // 16-element sub-block `ib`: its 3-bit scale at bits `3(ib % 4)` of `sc[ib / 4]`, its two groups' index
        // bits 8..10 and shift signs in `qh[ib]` (bits 0..2 and 3 for the first, 4..6 and 7 for the second).
        for (ib, o) in o.chunks_exact_mut(16).enumerate() {
            let s = (sc[ib / 4] >> (3 * (ib % 4))) & 7;
            let dl = d * (2 * s + 1) as f32;
            let qh = b.qh[ib];
            for (k, o) in o.chunks_exact_mut(8).enumerate() {
                let index = u16::from(b.qs[2 * ib + k]) | ((u16::from(qh) << (8 - 4 * k)) & 0x700);
                group(index, dl, delta(qh & (0x08 << (4 * k)) != 0), o);
            }
        }
    });
}
