//! The 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
//!
//! Layouts: `quantfarm_ggml::blocks` (ggml-common.h `block_q*`). Arithmetic: gguf-py quants.py
//! `Q*.dequantize_blocks`, one f32 multiply (plus one add for the `_1` types, after the multiply), as in ggml's
//! `dequantize_row_q*`. In every format byte `j` of `qs` holds element `j` in its low nibble and `j + 16` in its high.

use quantfarm_ggml::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK};

use super::each;
use super::float::f16_bits_to_f32 as f16;

/// Same decoding as gguf-py `Q4_0.dequantize_blocks` / ggml `dequantize_row_q4_0`: `d · (q − 8)`.
pub(super) fn q4_0(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockQ4_0, o: &mut [f32; QK]| {
        let d = f16(b.d);
        for (j, &q) in b.qs.iter().enumerate() {
            o[j] = d * (i32::from(q & 0x0f) - 8) as f32;
            o[j + QK / 2] = d * (i32::from(q >> 4) - 8) as f32;
        }
    });
}

/// Same decoding as gguf-py `Q4_1.dequantize_blocks` / ggml `dequantize_row_q4_1`: `(d · q) + m`.
pub(super) fn q4_1(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockQ4_1, o: &mut [f32; QK]| {
        let (d, m) = (f16(b.d), f16(b.m));
        for (j, &q) in b.qs.iter().enumerate() {
            o[j] = d * f32::from(q & 0x0f) + m;
            o[j + QK / 2] = d * f32::from(q >> 4) + m;
        }
    });
}

/// The 5-bit code of element `j` (and of `j + 16`): the nibble of `qs[j]` plus bit `j` (`j + 16`) of `qh` as bit 4.
#[inline]
fn q5_codes(qs: u8, qh: u32, j: usize) -> (u8, u8) {
    let lo = (qs & 0x0f) | (((qh >> j) & 1) as u8) << 4;
    let hi = (qs >> 4) | (((qh >> (j + QK / 2)) & 1) as u8) << 4;
    (lo, hi)
}

/// Same decoding as gguf-py `Q5_0.dequantize_blocks` / ggml `dequantize_row_q5_0`: `d · (q − 16)`.
pub(super) fn q5_0(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockQ5_0, o: &mut [f32; QK]| {
        let (d, qh) = (f16(b.d), u32::from_le_bytes(b.qh));
        for (j, &q) in b.qs.iter().enumerate() {
            let (lo, hi) = q5_codes(q, qh, j);
            o[j] = d * (i32::from(lo) - 16) as f32;
            o[j + QK / 2] = d * (i32::from(hi) - 16) as f32;
        }
    });
}

/// Same decoding as gguf-py `Q5_1.dequantize_blocks` / ggml `dequantize_row_q5_1`: `(d · q) + m`.
pub(super) fn q5_1(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockQ5_1, o: &mut [f32; QK]| {
        let (d, m, qh) = (f16(b.d), f16(b.m), u32::from_le_bytes(b.qh));
        for (j, &q) in b.qs.iter().enumerate() {
            let (lo, hi) = q5_codes(q, qh, j);
            o[j] = d * f32::from(lo) + m;
            o[j + QK / 2] = d * f32::from(hi) + m;
        }
    });
}

/// Same decoding as gguf-py `Q8_0.dequantize_blocks` / ggml `dequantize_row_q8_0`: `q · d`.
pub(super) fn q8_0(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockQ8_0, o: &mut [f32; QK]| {
        let d = f16(b.d);
        for (x, &q) in o.iter_mut().zip(&b.qs) {
            *x = f32::from(q) * d;
        }
    });
}

/// Q8_1 (`d` f16, `s` = d·Σq f16, `qs[32]` i8): `q · d`. Neither gguf-py nor ggml's CPU backend dequantizes Q8_1
/// (it is only a matmul operand), so this is the format's definition, matching Q8_0; `s` is redundant.
pub(super) fn q8_1(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockQ8_1, o: &mut [f32; QK]| {
        let d = f16(b.d);
        for (x, &q) in o.iter_mut().zip(&b.qs) {
            *x = f32::from(q) * d;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: [u8; 2] = [0x00, 0x3c]; // fp16 1.0
    const HALF: [u8; 2] = [0x00, 0x38]; // fp16 0.5
    const MINUS_TWO: [u8; 2] = [0x00, 0xc0]; // fp16 -2.0

    fn decode(f: fn(&[u8], &mut [f32]), block: &[u8]) -> [f32; 32] {
        let mut out = [f32::NAN; 32];
        f(block, &mut out);
        out
    }

    /// qs byte j = (j & 0xf) | ((15 − j) << 4): element j has code j, element j + 16 has code 15 − j.
    fn nibbles() -> Vec<u8> {
        (0..16u8).map(|j| j | ((15 - j) << 4)).collect()
    }

    #[test]
    fn q4_0_block() {
        let block = [&HALF[..], &nibbles()].concat();
        let out = decode(q4_0, &block);
        for j in 0..16 {
            assert_eq!(out[j], 0.5 * (j as f32 - 8.0), "{j}");
            assert_eq!(out[j + 16], 0.5 * (7.0 - j as f32), "{}", j + 16);
        }
    }

    #[test]
    fn q4_1_block() {
        let block = [&MINUS_TWO[..], &HALF, &nibbles()].concat();
        let out = decode(q4_1, &block);
        assert_eq!(out[0], 0.5);
        assert_eq!(out[3], -5.5);
        assert_eq!(out[16], -29.5); // code 15
        assert_eq!(out[31], 0.5); // code 0
    }

    #[test]
    fn q5_0_block_uses_the_fifth_bit() {
        // qh: bit 3 (element 3) and bit 20 (element 20 = high nibble of byte 4) set.
        let qh = (1u32 << 3) | (1 << 20);
        let block = [&ONE[..], &qh.to_le_bytes(), &nibbles()].concat();
        let out = decode(q5_0, &block);
        assert_eq!(out[2], 2.0 - 16.0);
        assert_eq!(out[3], (3.0 + 16.0) - 16.0);
        assert_eq!(out[19], 12.0 - 16.0); // high nibble of byte 3 = 12, bit 19 clear
        assert_eq!(out[20], (11.0 + 16.0) - 16.0);
        assert_eq!(out[0], -16.0);
    }

    #[test]
    fn q5_1_block() {
        let qh = 1u32 << 31;
        let block = [&HALF[..], &MINUS_TWO, &qh.to_le_bytes(), &nibbles()].concat();
        let out = decode(q5_1, &block);
        assert_eq!(out[31], 0.5 * 16.0 - 2.0); // code 0 | 16
        assert_eq!(out[16], 0.5 * 15.0 - 2.0);
        assert_eq!(out[5], 0.5 * 5.0 - 2.0);
    }

    #[test]
    fn q8_blocks_are_signed() {
        let qs: Vec<u8> = (0..32).map(|j: i32| (j * 8 - 128) as i8 as u8).collect();
        let out = decode(q8_0, &[&MINUS_TWO[..], &qs].concat());
        assert_eq!(out[0], 256.0);
        assert_eq!(out[31], -2.0 * 120.0);
        let out1 = decode(q8_1, &[&MINUS_TWO[..], &[0xff, 0x7b], &qs].concat());
        assert_eq!(out, out1);
    }
}
