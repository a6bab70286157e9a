//! The K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-element super-blocks with sub-block scales) and Q8_K.
//!
//! Layouts: `quantfarm_ggml::blocks` (ggml-common.h `block_q*_K`), with their scale packings. Arithmetic: gguf-py
//! quants.py `Q*_K.dequantize_blocks`, whose order is kept exactly: the sub-block scale is formed first (`d · sc`
//! as f32, `dmin · m` as f32) and then applied (`dl · q − ml`). ggml's `dequantize_row_q*_K` computes the same
//! products.

use quantfarm_ggml::blocks::{
    k4_scales, q3_scales, two_bit, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K,
};
use quantfarm_ggml::QK_K;

use super::each;
use super::float::f16_bits_to_f32 as f16;

/// Same decoding as gguf-py `Q2_K.dequantize_blocks` / ggml `dequantize_row_q2_K`:
/// `dl = d · (sc & 0xF)`, `ml = dmin · (sc >> 4)`, `x = dl · q − ml`, 16 sub-blocks of 16.
pub(super) fn q2_k(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockQ2K, o: &mut [f32; QK_K]| {
        let (d, dmin) = (f16(b.d), f16(b.dmin));
        for (sub, o) in o.chunks_exact_mut(16).enumerate() {
            let dl = d * f32::from(b.scales[sub] & 0x0f);
            let ml = dmin * f32::from(b.scales[sub] >> 4);
            for (i, x) in o.iter_mut().enumerate() {
                *x = dl * f32::from(two_bit::get(&b.qs, 16 * sub + i)) - ml;
            }
        }
    });
}

/// Same decoding as gguf-py `Q3_K.dequantize_blocks` / ggml `dequantize_row_q3_K`: `dl = d · (sc − 32)`,
/// `q = low2 − 4·(1 − hbit)` with the high bit of element `e` at `hmask[e % 32]` bit `e / 32`, `x = dl · q`.
pub(super) fn q3_k(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockQ3K, o: &mut [f32; QK_K]| {
        let scales = q3_scales::unpack(&b.scales);
        let d = f16(b.d);
        for (sub, o) in o.chunks_exact_mut(16).enumerate() {
            let dl = d * f32::from(scales[sub]);
            for (i, x) in o.iter_mut().enumerate() {
                let e = 16 * sub + i;
                let hbit = (b.hmask[e % 32] >> (e / 32)) & 1;
                let q = two_bit::get(&b.qs, e) as i8 - ((hbit ^ 1) << 2) as i8;
                *x = dl * f32::from(q);
            }
        }
    });
}

/// Shared Q4_K/Q5_K decoding over 8 sub-blocks of 32: `dl = d · sc`, `ml = dmin · m`, `x = dl · q − ml`, where
/// `q(e)` supplies the code of element `e`.
#[inline]
fn k4_like(d: u16, dmin: u16, scales: &[u8; 12], o: &mut [f32; QK_K], q: impl Fn(usize) -> u8) {
    let (d, dmin) = (f16(d), f16(dmin));
    let (sc, m) = k4_scales::unpack(scales);
    for (sub, o) in o.chunks_exact_mut(32).enumerate() {
        let dl = d * f32::from(sc[sub]);
        let ml = dmin * f32::from(m[sub]);
        for (l, x) in o.iter_mut().enumerate() {
            *x = dl * f32::from(q(32 * sub + l)) - ml;
        }
    }
}

/// The 4-bit code of element `e` in Q4_K/Q5_K `qs`: byte `32c + l` holds element `64c + l` in its low nibble and
/// `64c + 32 + l` in its high nibble.
#[inline]
fn nibble(qs: &[u8; QK_K / 2], e: usize) -> u8 {
    (qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 0x0f
}

/// Same decoding as gguf-py `Q4_K.dequantize_blocks` / ggml `dequantize_row_q4_K`.
pub(super) fn q4_k(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockQ4K, o: &mut [f32; QK_K]| {
        k4_like(b.d, b.dmin, &b.scales, o, |e| nibble(&b.qs, e));
    });
}

/// Same decoding as gguf-py `Q5_K.dequantize_blocks` / ggml `dequantize_row_q5_K`: Q4_K plus bit 4 of element
/// `e` at `qh[e % 32]` bit `e / 32`.
pub(super) fn q5_k(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockQ5K, o: &mut [f32; QK_K]| {
        k4_like(b.d, b.dmin, &b.scales, o, |e| nibble(&b.qs, e) | (((b.qh[e % 32] >> (e / 32)) & 1) << 4));
    });
}

/// Same decoding as gguf-py `Q6_K.dequantize_blocks` / ggml `dequantize_row_q6_K`: `dl = d · scales[e / 16]`
/// (int8 scales), `x = dl · (q − 32)`. In half h, element `128h + 64s + l` (l < 64) has its low 4 bits in nibble s
/// of `ql[64h + l]`, and element `128h + 32t + l` (l < 32) its high 2 bits at bits `2t` of `qh[32h + l]`.
pub(super) fn q6_k(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockQ6K, o: &mut [f32; QK_K]| {
        let (ql, qh) = (&b.ql, &b.qh);
        let d = f16(b.d);
        for (sub, o) in o.chunks_exact_mut(16).enumerate() {
            let dl = d * f32::from(b.scales[sub]);
            for (i, x) in o.iter_mut().enumerate() {
                let e = 16 * sub + i;
                let (h, r) = (e / 128, e % 128);
                let low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
                let high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
                *x = dl * f32::from(((low | (high << 4)) as i8) - 32);
            }
        }
    });
}

/// Q8_K (`d` f32, `qs[256]` i8, `bsums[16]` i16): same decoding as ggml `dequantize_row_q8_K`, `x = d · q`
/// (gguf-py has no Q8_K; it is an intermediate type, so the golden vectors have none either).
pub(super) fn q8_k(data: &[u8], out: &mut [f32]) {
    each(data, out, |b: &BlockQ8K, o: &mut [f32; QK_K]| {
        let d = b.d;
        for (x, &q) in o.iter_mut().zip(&b.qs) {
            *x = d * f32::from(q);
        }
    });
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // tests index by element number, as the layouts are described
mod tests {
    use super::*;

    const ONE: [u8; 2] = [0x00, 0x3c]; // fp16 1.0
    const HALF: [u8; 2] = [0x00, 0x38]; // fp16 0.5
    const QUARTER: [u8; 2] = [0x00, 0x34]; // fp16 0.25

    fn decode(f: fn(&[u8], &mut [f32]), block: &[u8]) -> Vec<f32> {
        let mut out = vec![f32::NAN; QK_K];
        f(block, &mut out);
        out
    }

    /// Packs 256 2-bit codes in the 128-half packing (as `quantize_row_q2_K_ref` does).
    fn pack_two_bits(codes: &[u8]) -> Vec<u8> {
        let mut qs = vec![0u8; 64];
        for (e, &c) in codes.iter().enumerate() {
            qs[32 * (e / 128) + e % 32] |= c << (2 * ((e % 128) / 32));
        }
        qs
    }

    #[test]
    fn q2_k_block() {
        let codes: Vec<u8> = (0..256).map(|e| (e % 4) as u8).collect();
        let scales: Vec<u8> = (0..16).map(|s| (s as u8) | (((15 - s) as u8) << 4)).collect();
        let block = [&scales[..], &pack_two_bits(&codes), &HALF, &QUARTER].concat();
        let out = decode(q2_k, &block);
        for e in 0..256 {
            let s = e / 16;
            let want = 0.5 * s as f32 * (e % 4) as f32 - 0.25 * (15 - s) as f32;
            assert_eq!(out[e], want, "{e}");
        }
    }

    #[test]
    fn q3_k_block_with_negative_scale() {
        // Scale levels l_j = 4j + 1 (stored), so sub-block j has scale 4j − 31: negative below j = 8.
        let mut scales = [0u8; 12];
        for j in 0..16 {
            let l = (4 * j + 1) as u8;
            if j < 8 {
                scales[j] = l & 0x0f;
            } else {
                scales[j - 8] |= (l & 0x0f) << 4;
            }
            scales[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
        }
        assert_eq!(q3_scales::unpack(&scales)[0], -31);
        // Element e: low 2 bits e % 4, high bit set when (e / 4) is even.
        let codes: Vec<u8> = (0..256).map(|e| (e % 4) as u8).collect();
        let mut hmask = [0u8; 32];
        for e in 0..256 {
            if (e / 4) % 2 == 0 {
                hmask[e % 32] |= 1 << (e / 32);
            }
        }
        let block = [&hmask[..], &pack_two_bits(&codes), &scales, &HALF].concat();
        let out = decode(q3_k, &block);
        for e in 0..256 {
            let q = (e % 4) as f32 - if (e / 4) % 2 == 0 { 0.0 } else { 4.0 };
            let want = 0.5 * (4 * (e / 16) as i32 - 31) as f32 * q;
            assert_eq!(out[e], want, "{e}");
        }
        assert_eq!(out[5], 0.5 * -31.0 * -3.0); // negative scale times negative code
    }

    fn pack_k4(ls: [u8; 8], lm: [u8; 8]) -> [u8; 12] {
        k4_scales::pack(&ls, &lm)
    }

    const LS: [u8; 8] = [1, 63, 17, 32, 48, 5, 63, 33];
    const LM: [u8; 8] = [0, 2, 63, 40, 16, 49, 1, 62];

    #[test]
    fn k4_scales_round_trip() {
        assert_eq!(k4_scales::unpack(&pack_k4(LS, LM)), (LS, LM));
    }

    fn expected_k4(e: usize, q: u8) -> f32 {
        let s = e / 32;
        1.0 * LS[s] as f32 * q as f32 - 0.5 * LM[s] as f32
    }

    #[test]
    fn q4_k_block() {
        // qs byte 32c + l = (l % 16) | ((15 − l % 16) << 4).
        let qs: Vec<u8> = (0..128).map(|i| ((i % 16) | ((15 - i % 16) << 4)) as u8).collect();
        let block = [&ONE[..], &HALF, &pack_k4(LS, LM), &qs].concat();
        let out = decode(q4_k, &block);
        for e in 0..256 {
            let l = (e % 32) % 16;
            let q = if (e / 32) % 2 == 0 { l } else { 15 - l } as u8;
            assert_eq!(out[e], expected_k4(e, q), "{e}");
        }
    }

    #[test]
    fn q5_k_block() {
        let qs = vec![0x21u8; 128]; // low nibble 1, high nibble 2
        let mut qh = [0u8; 32];
        qh[7] = 0b1000_0001; // elements 7 and 7 + 224 get bit 4
        let block = [&ONE[..], &HALF, &pack_k4(LS, LM), &qh, &qs].concat();
        let out = decode(q5_k, &block);
        for e in 0..256 {
            let base = if (e / 32) % 2 == 0 { 1 } else { 2 };
            let q = base + if e == 7 || e == 231 { 16 } else { 0 };
            assert_eq!(out[e], expected_k4(e, q), "{e}");
        }
    }

    #[test]
    fn q6_k_block() {
        // Encode codes (e % 64) the way quantize_row_q6_K_ref does, with scales s − 8 (some negative).
        let codes: Vec<u8> = (0..256).map(|e| (e % 64) as u8).collect();
        let (mut ql, mut qh) = (vec![0u8; 128], vec![0u8; 64]);
        for h in 0..2 {
            for l in 0..32 {
                let c = |k: usize| codes[128 * h + l + 32 * k];
                ql[64 * h + l] = (c(0) & 0xf) | ((c(2) & 0xf) << 4);
                ql[64 * h + l + 32] = (c(1) & 0xf) | ((c(3) & 0xf) << 4);
                qh[32 * h + l] = (c(0) >> 4) | ((c(1) >> 4) << 2) | ((c(2) >> 4) << 4) | ((c(3) >> 4) << 6);
            }
        }
        let scales: Vec<u8> = (0..16).map(|s| (s as i8 - 8) as u8).collect();
        let block = [&ql[..], &qh, &scales, &QUARTER].concat();
        let out = decode(q6_k, &block);
        for e in 0..256 {
            let want = 0.25 * ((e / 16) as f32 - 8.0) * ((e % 64) as f32 - 32.0);
            assert_eq!(out[e], want, "{e}");
        }
    }

    #[test]
    fn q8_k_block() {
        let qs: Vec<u8> = (0..256).map(|j| (j as u8).wrapping_sub(128)).collect();
        let block = [&(-0.5f32).to_le_bytes()[..], &qs, &[0u8; 32]].concat();
        let out = decode(q8_k, &block);
        for j in 0..256 {
            assert_eq!(out[j], -0.5 * (j as f32 - 128.0), "{j}");
        }
    }
}
