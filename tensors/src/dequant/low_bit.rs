//! Q1_0 and Q2_0: one sign bit per element (`±d`), or 2 bits (`(q − 1) · d`).
//!
//! Arithmetic: ggml's `dequantize_row_q1_0` / `dequantize_row_q2_0` (`ggml/src/ggml-quants.c`, llama.cpp
//! 0c1e570). gguf-py 0.19.0 has neither type.

use quantfarm_ggml::blocks::{BlockQ1_0, BlockQ2_0};

use super::each;
use super::float::f16_bits_to_f32 as f16;

pub(super) fn q1_0(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockQ1_0, o: &mut [f32; 128]| {
        let d = f16(b.d);
        for (j, o) in o.iter_mut().enumerate() {
            *o = if (b.qs[j / 8] >> (j % 8)) & 1 == 1 { d } else { -d };
        }
    });
}

pub(super) fn q2_0(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockQ2_0, o: &mut [f32; 64]| {
        let d = f16(b.d);
        for (j, o) in o.iter_mut().enumerate() {
            let q = (b.qs[j / 4] >> (2 * (j % 4))) & 3;
            *o = (i32::from(q) - 1) as f32 * d;
        }
    });
}
