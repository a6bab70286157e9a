//! MXFP4 and NVFP4: E2M1 codes (`quantfarm_ggml::tables::KVALUES_MXFP4`, doubled) under a power-of-two E8M0
//! exponent per 32 (MXFP4) or a UE4M3 scale per 16 (NVFP4), both halved to match the doubled codes.
//!
//! Arithmetic: ggml's `dequantize_row_mxfp4` / `dequantize_row_nvfp4` (`ggml/src/ggml-quants.c`, llama.cpp
//! 0c1e570): `(float)v · d`, one product.

use quantfarm_ggml::blocks::{BlockMXFP4, BlockNVFP4, QK};
use quantfarm_ggml::tables::{e8m0_half, ue4m3_half, KVALUES_MXFP4 as KV};

use super::each;

/// Bytes of nibbles scaled by `d`: byte `j` holds element `j` (low nibble) and `j + qs.len()` (high).
#[inline]
fn nibbles(d: f32, qs: &[u8], o: &mut [f32]) {
    let half = qs.len();
    for (j, &q) in qs.iter().enumerate() {
        o[j] = f32::from(KV[usize::from(q & 0x0f)]) * d;
        o[j + half] = f32::from(KV[usize::from(q >> 4)]) * d;
    }
}

pub(super) fn mxfp4(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockMXFP4, o: &mut [f32; QK]| nibbles(e8m0_half(b.e), &b.qs, o));
}

pub(super) fn nvfp4(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockNVFP4, o: &mut [f32; 64]| {
        for (s, (qs, o)) in b.qs.chunks_exact(8).zip(o.chunks_exact_mut(16)).enumerate() {
            nibbles(ue4m3_half(b.d[s]), qs, o);
        }
    });
}
