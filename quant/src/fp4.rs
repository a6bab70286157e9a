//! MXFP4 (32 values under an E8M0 power of two) and NVFP4 (4 × 16 values under UE4M3 scales): E2M1 codes, as
//! `quantize_row_mxfp4_ref` and `quantize_row_nvfp4_ref` (`ggml/src/ggml-quants.c`, llama.cpp 0c1e570) make them.
//! Neither reads an importance matrix.

use quantfarm_ggml::blocks::{BlockMXFP4, BlockNVFP4, QK};
use quantfarm_ggml::tables::{e8m0_half, ue4m3_code, ue4m3_half, KVALUES_MXFP4 as KV};

use crate::helpers::c_trunc_i32;

/// `best_index_mxfp4(x, e)`: the first code minimising `|kv · e − x|` (strictly smaller wins, so a tie goes to the
/// smaller magnitude and code 8, −0, is never chosen).
#[inline(always)]
fn best_index(x: f32, e: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (f32::from(KV[0]) * e - x).abs();
    for (i, &v) in KV.iter().enumerate().skip(1) {
        let err = (f32::from(v) * e - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// The largest magnitude (`amax < |x|` updates, from 0).
#[inline(always)]
fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |a, v| if a < v.abs() { v.abs() } else { a })
}

/// `⌊log2 a⌋` as glibc's `floorf(log2f(a))` gives it: computed in f64 and rounded to f32 first, which agrees with
/// glibc's correctly rounded `log2f` where `a` lies a few ULPs below a power of two and the f32 logarithm rounds
/// up to the integer (`a = 16·(1 − 2^−24)` gives 4, not 3).
#[inline(always)]
fn floor_log2(a: f32) -> f32 {
    ((f64::from(a)).log2() as f32).floor()
}

/// `quantize_row_mxfp4_ref` on one block.
#[inline(always)]
pub(crate) fn mxfp4(x: &[f32; QK]) -> BlockMXFP4 {
    let a = amax(x);
    // `(uint8_t)(floorf(log2f(amax)) − 2 + 127)`: GCC converts through a 32-bit integer and keeps the low byte,
    // which only matters below 2^−125, where llama-quantize rejects the row anyway.
    let e = if a > 0.0 { c_trunc_i32(floor_log2(a) - 2.0 + 127.0) as u8 } else { 0 };
    let d = e8m0_half(e);
    let mut qs = [0u8; QK / 2];
    for (j, q) in qs.iter_mut().enumerate() {
        *q = best_index(x[j], d) | (best_index(x[j + QK / 2], d) << 4);
    }
    BlockMXFP4 { e, qs }
}

/// `quantize_row_nvfp4_ref` on one block.
#[inline(always)]
pub(crate) fn nvfp4(x: &[f32; 64]) -> BlockNVFP4 {
    let mut b = BlockNVFP4 { d: [0; 4], qs: [0; 32] };
    for (s, xb) in x.chunks_exact(16).enumerate() {
        let ue = ue4m3_code(amax(xb) / 6.0);
        b.d[s] = ue;
        let d = ue4m3_half(ue);
        for j in 0..8 {
            b.qs[8 * s + j] = best_index(xb[j], d) | (best_index(xb[j + 8], d) << 4);
        }
    }
    b
}
