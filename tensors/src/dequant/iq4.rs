//! IQ4_NL and IQ4_XS: 4-bit codes into a non-linear 16-level grid (`quantfarm_ggml::tables::KVALUES_IQ4NL`).
//!
//! Arithmetic: ggml's `dequantize_row_iq4_nl` / `dequantize_row_iq4_xs` (`ggml/src/ggml-quants.c`, llama.cpp
//! 0c1e570), which gguf-py's `IQ4_NL`/`IQ4_XS.dequantize_blocks` reproduce bit for bit: IQ4_NL `d · v`, IQ4_XS
//! `(d · (ls − 32)) · v`. Byte `j` of each 16-byte group holds element `j` (low nibble) and `j + 16` (high).

use quantfarm_ggml::blocks::{BlockIQ4NL, BlockIQ4XS, QK};
use quantfarm_ggml::tables::KVALUES_IQ4NL as KV;
use quantfarm_ggml::QK_K;

use super::each;
use super::float::f16_bits_to_f32 as f16;

/// 16 bytes of nibbles scaled by `d` into 32 values.
#[inline]
fn nibbles(d: f32, qs: &[u8], o: &mut [f32]) {
    for (j, &q) in qs.iter().enumerate() {
        o[j] = d * f32::from(KV[usize::from(q & 0x0f)]);
        o[j + QK / 2] = d * f32::from(KV[usize::from(q >> 4)]);
    }
}

pub(super) fn iq4_nl(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockIQ4NL, o: &mut [f32; QK]| nibbles(f16(b.d), &b.qs, o));
}

pub(super) fn iq4_xs(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockIQ4XS, o: &mut [f32; QK_K]| {
        let d = f16(b.d);
        for (ib, (qs, o)) in b.qs.chunks_exact(16).zip(o.chunks_exact_mut(QK)).enumerate() {
            let low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
            let high = ((b.scales_h >> (2 * ib)) & 3) as u8;
            let ls = i32::from(low | (high << 4));
            nibbles(d * (ls - 32) as f32, qs, o);
        }
    });
}
