//! fp32 → fp16 / bf16 conversion exactly as ggml rounds it.
//!
//! ggml-quants.c and `ggml_fp32_to_fp16_row` use a software conversion, not F16C or `__fp16`, so the rounding and
//! above all the NaN encoding (always `0x7E00 | sign`) are ggml's own. Crates such as `half` keep NaN payloads, so
//! they would write different bytes for NaN; everything else agrees (checked in the tests below).

/// fp32 → fp16 bits, round to nearest even, overflow → ±inf, any NaN → `0x7E00 | sign`.
///
/// Port of `ggml-impl.h::ggml_compute_fp32_to_fp16` (Maratyszcza's FP16 bit trick). The two multiplications push
/// the value to the fp16 precision, and the addition of a power of two makes the FPU do the rounding, so this is
/// only exact in plain IEEE fp32 arithmetic, which Rust guarantees (no flush-to-zero, no fusing).
#[inline]
pub fn f32_to_f16_bits(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000);
    let scale_to_zero = f32::from_bits(0x0880_0000);
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;

    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let mut bias = shl1_w & 0xFF00_0000;
    if bias < 0x7100_0000 {
        bias = 0x7100_0000;
    }

    // C: `base = fp32_from_bits((bias >> 1) + 0x07800000) + base`; IEEE addition is commutative.
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7C00;
    let mantissa_bits = bits & 0x0000_0FFF;
    let nonsign = exp_bits + mantissa_bits;
    // C returns a uint16_t: the truncation of the OR is part of the algorithm.
    ((sign >> 16) | if shl1_w > 0xFF00_0000 { 0x7E00 } else { nonsign }) as u16
}

/// fp32 → bf16 bits, round to nearest even; NaN keeps its top half with the quiet bit (`0x40`) set.
///
/// Port of `ggml-impl.h::ggml_compute_fp32_to_bf16` (as used by `ggml_fp32_to_bf16_row_ref`). Infinities pass
/// through; finite values too large round to ±inf, as RNE requires.
#[inline]
pub fn f32_to_bf16_bits(f: f32) -> u16 {
    let bits = f.to_bits();
    if (bits & 0x7FFF_FFFF) > 0x7F80_0000 {
        return ((bits >> 16) | 64) as u16;
    }
    (bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16) as u16
}

/// `ggml_fp32_to_fp16_row`: little-endian fp16 into `dst` (2 bytes per element, checked by the caller).
pub(crate) fn f16_row(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.iter().zip(dst.chunks_exact_mut(2)) {
        out.copy_from_slice(&f32_to_f16_bits(*x).to_le_bytes());
    }
}

/// `ggml_fp32_to_bf16_row_ref`: little-endian bf16 into `dst` (2 bytes per element, checked by the caller).
pub(crate) fn bf16_row(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.iter().zip(dst.chunks_exact_mut(2)) {
        out.copy_from_slice(&f32_to_bf16_bits(*x).to_le_bytes());
    }
}

/// F32 "quantization" is a copy (`memcpy` in `ggml_quantize_chunk`), little-endian.
pub(crate) fn f32_row(src: &[f32], dst: &mut [u8]) {
    for (x, out) in src.iter().zip(dst.chunks_exact_mut(4)) {
        out.copy_from_slice(&x.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_special_values() {
        assert_eq!(f32_to_f16_bits(0.0), 0x0000);
        assert_eq!(f32_to_f16_bits(-0.0), 0x8000);
        assert_eq!(f32_to_f16_bits(1.0), 0x3C00);
        assert_eq!(f32_to_f16_bits(-2.0), 0xC000);
        assert_eq!(f32_to_f16_bits(65504.0), 0x7BFF);
        // Overflow: 65520 is the first value that rounds up past the largest finite fp16.
        assert_eq!(f32_to_f16_bits(65519.996), 0x7BFF);
        assert_eq!(f32_to_f16_bits(65520.0), 0x7C00);
        assert_eq!(f32_to_f16_bits(1e10), 0x7C00);
        assert_eq!(f32_to_f16_bits(-1e10), 0xFC00);
        assert_eq!(f32_to_f16_bits(f32::INFINITY), 0x7C00);
        assert_eq!(f32_to_f16_bits(f32::NEG_INFINITY), 0xFC00);
        // Every NaN, whatever its payload, becomes the canonical quiet NaN with the sign kept.
        assert_eq!(f32_to_f16_bits(f32::NAN), 0x7E00);
        assert_eq!(f32_to_f16_bits(f32::from_bits(0x7F80_0001)), 0x7E00);
        assert_eq!(f32_to_f16_bits(f32::from_bits(0xFFC1_2345)), 0xFE00);
    }

    #[test]
    fn f16_subnormals_round_to_even() {
        let tiny = 2f32.powi(-24); // smallest fp16 subnormal
        assert_eq!(f32_to_f16_bits(tiny), 0x0001);
        assert_eq!(f32_to_f16_bits(-tiny), 0x8001);
        assert_eq!(f32_to_f16_bits(tiny * 0.5), 0x0000); // tie → even (0)
        assert_eq!(f32_to_f16_bits(tiny * 1.5), 0x0002); // tie → even (2)
        assert_eq!(f32_to_f16_bits(tiny * 2.5), 0x0002); // tie → even (2)
        assert_eq!(f32_to_f16_bits(tiny * 0.5000001), 0x0001);
        assert_eq!(f32_to_f16_bits(2f32.powi(-14)), 0x0400); // smallest normal
        assert_eq!(f32_to_f16_bits(1.0 + 2f32.powi(-11)), 0x3C00); // tie in the normal range → even
        assert_eq!(f32_to_f16_bits(1.0 + 3.0 * 2f32.powi(-11)), 0x3C02);
    }

    /// The `half` crate rounds the same way; only NaN encodings differ. Sweeps a stride of all bit patterns.
    #[test]
    fn f16_matches_half_for_non_nan() {
        let mut bits: u32 = 0;
        loop {
            let f = f32::from_bits(bits);
            if !f.is_nan() {
                assert_eq!(f32_to_f16_bits(f), half::f16::from_f32(f).to_bits(), "input bits {bits:#010x}");
            }
            match bits.checked_add(4093) {
                Some(next) => bits = next,
                None => break,
            }
        }
    }

    #[test]
    fn bf16_rounding_and_nan() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3F80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F80_8000)), 0x3F80); // tie → even
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F81_8000)), 0x3F82); // tie → even
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3F80_8001)), 0x3F81);
        assert_eq!(f32_to_bf16_bits(f32::INFINITY), 0x7F80);
        assert_eq!(f32_to_bf16_bits(f32::MAX), 0x7F80); // rounds to inf
        assert_eq!(f32_to_bf16_bits(f32::NAN), 0x7FC0);
        // A signalling NaN whose payload lives only in the low half would become inf without the quiet bit.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7F80_0001)), 0x7FC0);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0xFF81_0000)), 0xFFC1);
    }
}
