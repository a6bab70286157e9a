//! TQ1_0 and TQ2_0: ternary weights `(t − 1) · d` (BitNet b1.58 style), base-3 packed (TQ1_0, see
//! `quantfarm_ggml::blocks::trits`) or 2 bits each (TQ2_0).
//!
//! Arithmetic: ggml's `dequantize_row_tq1_0` / `dequantize_row_tq2_0` (`ggml/src/ggml-quants.c`, llama.cpp
//! 0c1e570): `(float)(t − 1) · d`.

use quantfarm_ggml::blocks::{trits, BlockTQ1_0, BlockTQ2_0};
use quantfarm_ggml::QK_K;

use super::each;
use super::float::f16_bits_to_f32 as f16;

pub(super) fn tq1_0(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockTQ1_0, o: &mut [f32; QK_K]| {
        let d = f16(b.d);
        let value = |t: u8| (i32::from(t) - 1) as f32 * d;
        let mut y = 0;
        // Groups of bytes, each read trit by trit: 32 bytes × 5 trits, 16 × 5, then `qh`'s 4 × 4.
        for (bytes, n_trits) in [(&b.qs[..32], 5), (&b.qs[32..], 5), (&b.qh[..], 4)] {
            for n in 0..n_trits {
                for &byte in bytes {
                    o[y] = value(trits::get(byte, n));
                    y += 1;
                }
            }
        }
    });
}

pub(super) fn tq2_0(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockTQ2_0, o: &mut [f32; QK_K]| {
        let d = f16(b.d);
        for (c, bytes) in b.qs.chunks_exact(32).enumerate() {
            for n in 0..4 {
                for (m, &q) in bytes.iter().enumerate() {
                    o[128 * c + 32 * n + m] = (i32::from((q >> (2 * n)) & 3) - 1) as f32 * d;
                }
            }
        }
    });
}
