//! Plain element types: F32, F16, BF16, F64 and the integers, widened or narrowed to f32.
//!
//! F16 and BF16 are exact and keep NaN payloads bit for bit, as numpy does (`float16.astype(float32)` uses
//! `npy_halfbits_to_floatbits`, which does not quiet signalling NaNs; the `half` crate and F16C do quiet them, so
//! neither is used). F64 and I32/I64 round to nearest even, like numpy's `astype(np.float32)` and Rust's `as`.

/// Converts one fp16 bit pattern to f32 exactly (numpy `npy_halfbits_to_floatbits`; NaN payload kept).
#[inline]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x03ff);
    let bits = match exp {
        0 if man == 0 => sign,
        0 => {
            // Subnormal man·2^-24: shift the leading one up to bit 10 (the implicit bit) and lower the exponent.
            let shift = man.leading_zeros() - 21;
            sign | ((113 - shift) << 23) | (((man << shift) & 0x03ff) << 13)
        }
        0x1f => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// Converts one bf16 bit pattern to f32 exactly (bf16 is the top half of an f32; gguf-py `BF16.dequantize_blocks`).
#[inline]
pub fn bf16_bits_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// Converts little-endian f16 values to f32, exactly.
///
/// # Panics
/// If `data.len() != 2 * out.len()` (a caller bug, like `copy_from_slice`).
pub fn f16_to_f32(data: &[u8], out: &mut [f32]) {
    convert::<2>(data, out, |b| f16_bits_to_f32(u16::from_le_bytes(b)));
}

/// Converts little-endian bf16 values to f32, exactly.
///
/// # Panics
/// If `data.len() != 2 * out.len()` (a caller bug, like `copy_from_slice`).
pub fn bf16_to_f32(data: &[u8], out: &mut [f32]) {
    convert::<2>(data, out, |b| bf16_bits_to_f32(u16::from_le_bytes(b)));
}

/// Little-endian values of a float `dtype` (BF16, F16, F32) widened to f32, exactly.
pub fn float_values(bytes: &[u8], dtype: crate::dtype::Dtype) -> Vec<f32> {
    let mut out = vec![0f32; bytes.len() / dtype.size().max(1)];
    float_values_into(bytes, dtype, &mut out);
    out
}

/// [`float_values`] into `out` (`bytes.len() / dtype.size()` values).
pub fn float_values_into(bytes: &[u8], dtype: crate::dtype::Dtype, out: &mut [f32]) {
    use crate::dtype::Dtype;
    match dtype {
        Dtype::BF16 => bf16_to_f32(bytes, out),
        Dtype::F16 => f16_to_f32(bytes, out),
        _ => f32_le(bytes, out),
    }
}

pub(super) fn f32_le(data: &[u8], out: &mut [f32]) {
    convert::<4>(data, out, f32::from_le_bytes);
}

pub(super) fn f64_le(data: &[u8], out: &mut [f32]) {
    convert::<8>(data, out, |b| f64::from_le_bytes(b) as f32);
}

pub(super) fn i8_le(data: &[u8], out: &mut [f32]) {
    convert::<1>(data, out, |b| f32::from(i8::from_le_bytes(b)));
}

pub(super) fn i16_le(data: &[u8], out: &mut [f32]) {
    convert::<2>(data, out, |b| f32::from(i16::from_le_bytes(b)));
}

pub(super) fn i32_le(data: &[u8], out: &mut [f32]) {
    convert::<4>(data, out, |b| i32::from_le_bytes(b) as f32);
}

pub(super) fn i64_le(data: &[u8], out: &mut [f32]) {
    convert::<8>(data, out, |b| i64::from_le_bytes(b) as f32);
}

/// Applies `f` to each `N`-byte element of `data`, writing `out`.
fn convert<const N: usize>(data: &[u8], out: &mut [f32], f: impl Fn([u8; N]) -> f32) {
    assert_eq!(data.len(), N * out.len(), "{} bytes of {N}-byte elements into {} outputs", data.len(), out.len());
    for (b, o) in data.chunks_exact(N).zip(out.iter_mut()) {
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        *o = f(a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_known_values() {
        let cases: &[(u16, u32)] = &[
            (0x0000, 0x0000_0000),
            (0x8000, 0x8000_0000),
            (0x3c00, 1.0f32.to_bits()),
            (0xc000, (-2.0f32).to_bits()),
            (0x7bff, 65504.0f32.to_bits()),
            (0x0400, 2f32.powi(-14).to_bits()), // smallest normal
            (0x0001, 2f32.powi(-24).to_bits()), // smallest subnormal
            (0x03ff, (1023.0 * 2f32.powi(-24)).to_bits()),
            (0x8200, (-512.0 * 2f32.powi(-24)).to_bits()),
            (0x7c00, 0x7f80_0000), // +inf
            (0xfc00, 0xff80_0000), // -inf
            (0x7e00, 0x7fc0_0000), // quiet NaN
            (0x7c01, 0x7f80_2000), // signalling NaN stays signalling, payload kept
            (0xfd55, 0xffaa_a000),
        ];
        for &(h, f) in cases {
            assert_eq!(f16_bits_to_f32(h).to_bits(), f, "{h:#06x}");
        }
    }

    #[test]
    fn f16_round_trips_through_f32_for_every_non_nan() {
        for h in 0..=u16::MAX {
            let f = f16_bits_to_f32(h);
            if !f.is_nan() {
                assert_eq!(half::f16::from_f32(f).to_bits(), h, "{h:#06x}");
            }
        }
    }

    #[test]
    fn row_converters() {
        let mut out = [0.0f32; 2];
        f16_to_f32(&[0x00, 0x3c, 0x00, 0xc0], &mut out);
        assert_eq!(out, [1.0, -2.0]);
        bf16_to_f32(&[0x80, 0x3f, 0x49, 0x40], &mut out);
        assert_eq!(out, [1.0, f32::from_bits(0x4049_0000)]);
        assert_eq!(bf16_bits_to_f32(0xffc1).to_bits(), 0xffc1_0000);
    }

    #[test]
    fn plain_types() {
        let mut out = [0.0f32; 2];
        f32_le(&[0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0], &mut out);
        assert_eq!(out, [1.0, -2.0]);
        f64_le(&[(0.1f64).to_le_bytes(), (-3.5f64).to_le_bytes()].concat(), &mut out);
        assert_eq!(out, [0.1f32, -3.5]);
        i8_le(&[0x80, 0x7f], &mut out);
        assert_eq!(out, [-128.0, 127.0]);
        i16_le(&[0x00, 0x80, 0xff, 0xff], &mut out);
        assert_eq!(out, [-32768.0, -1.0]);
        // 2^24 + 1 is not representable: ties to even gives 2^24.
        i32_le(&[16_777_217i32.to_le_bytes(), (-7i32).to_le_bytes()].concat(), &mut out);
        assert_eq!(out, [16_777_216.0, -7.0]);
        i64_le(&[(1i64 << 40).to_le_bytes(), (-1i64).to_le_bytes()].concat(), &mut out);
        assert_eq!(out, [2f32.powi(40), -1.0]);
    }

    #[test]
    #[should_panic]
    fn mismatched_lengths_panic() {
        f16_to_f32(&[0; 3], &mut [0.0; 1]);
    }
}
