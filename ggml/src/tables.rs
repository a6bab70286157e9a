//! Value tables and small-float scale codes, each used both ways: the quantizer searches them, the dequantizer
//! reads them. From llama.cpp 0c1e570: `ggml/src/ggml-common.h` (`kvalues_iq4nl`, `kvalues_mxfp4`) and
//! `ggml/src/ggml-impl.h` (`ggml_e8m0_to_fp32_half`, `ggml_ue4m3_to_fp32`, `ggml_fp32_to_ue4m3`).

/// IQ4_NL's and IQ4_XS's 16 levels, ascending (a non-linear 4-bit grid).
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// MXFP4's and NVFP4's E2M1 values, doubled so they are integers (the scales are halved to match).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An E8M0 exponent's value halved, `2^(e − 128)` (`ggml_e8m0_to_fp32_half`): subnormal for `e < 2`. Exact.
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { u32::from(e - 1) << 23 };
    f32::from_bits(bits)
}

/// A UE4M3 scale's value halved (`ggml_ue4m3_to_fp32`): 0 and 0x7F are 0; exponent 0 is subnormal
/// (`man · 2^−9`); otherwise `(1 + man/8) · 2^(exp − 7)`. Every step is exact.
#[inline]
pub fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let (exp, man) = (i32::from((x >> 3) & 0xF), f32::from(x & 7));
    let raw = if exp == 0 { man * 2f32.powi(-9) } else { (1.0 + man / 8.0) * 2f32.powi(exp - 7) };
    raw * 0.5
}

/// The UE4M3 code of `x` (`ggml_fp32_to_ue4m3`): 0 for `x ≤ 0` or NaN; `x` clamped to 448; the mantissa's top 3
/// bits rounded half up on the next bit alone (lower bits ignored), carrying into the exponent; 0x7E (448) at the
/// top, so every `x ≥ 256` gives 0x7E.
pub fn ue4m3_code(x: f32) -> u8 {
    // `!(x > 0)` also catches NaN.
    if x.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return 0;
    }
    let x = if x > 448.0 { 448.0 } else { x };
    let bits = x.to_bits();
    let exp = ((bits >> 23) & 0xFF) as i32 - 127 + 7;
    if exp <= 0 {
        // Subnormal: man · 2^−9, man = (int)(x · 512 + 0.5), at most 7.
        let man = ((x * 512.0 + 0.5) as i32).min(7);
        return if man < 1 { 0 } else { man as u8 };
    }
    if exp >= 15 {
        return 0x7E;
    }
    let mut man = ((bits >> 20) & 7) as i32 + ((bits >> 19) & 1) as i32;
    let mut exp = exp;
    if man > 7 {
        man = 0;
        exp += 1;
        if exp >= 15 {
            return 0x7E;
        }
    }
    ((exp << 3) | man) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_codes() {
        assert_eq!(f64::from(e8m0_half(0)), 2f64.powi(-128));
        assert_eq!(f64::from(e8m0_half(1)), 2f64.powi(-127));
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(130), 4.0);
        assert_eq!(ue4m3_half(0x38), 0.5, "1.0 · 2^0, halved");
        assert_eq!(ue4m3_half(0x7E), 224.0, "448 halved");
        assert_eq!(ue4m3_half(0x01), 2f32.powi(-10), "the smallest subnormal, halved");
        // Every code below exponent 15 round-trips; those of exponent 15 (256 and up) all encode as 0x7E, ggml's
        // quirk.
        for code in 1u8..0x78 {
            assert_eq!(ue4m3_code(2.0 * ue4m3_half(code)), code, "{code:#x}");
        }
        for code in 0x78u8..=0x7E {
            assert_eq!(ue4m3_code(2.0 * ue4m3_half(code)), 0x7E, "{code:#x}");
        }
        assert_eq!(ue4m3_code(300.0), 0x7E);
        assert_eq!(ue4m3_code(-1.0), 0);
        assert_eq!(ue4m3_code(f32::NAN), 0);
    }
}
