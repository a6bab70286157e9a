//! MLX affine dequantization (`mx.dequantize(w, scales, biases, group_size, bits)`, mode "affine").
//!
//! Sources: `mlx/ops.cpp::affine_dequantize` and `mlx/backend/cpu/quantized.cpp` (mlx 0.32), `docs/formats.md` §2.
//! Code `i` of a row occupies bits `[i·b, (i+1)·b)` of the row's little-endian bitstream (bit `k` = bit `k mod 32`
//! of uint32 word `k / 32`), so at 3, 5 and 6 bits codes cross word boundaries. Every group starts on a word
//! boundary (`g·b` is a multiple of 32 for all supported pairs), so a buffer of several rows is just a run of
//! groups. Each element is `scale · q + bias` in f32 (not fused), with `scale` possibly negative (MLX anchors the
//! larger-magnitude extreme).

use super::DequantError;

/// Bit widths `mx.quantize` accepts in affine mode.
const BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];
/// Group sizes `mx.quantize` accepts in affine mode.
const GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// Dequantizes MLX affine-quantized rows.
///
/// `packed` is the little-endian bytes of the uint32 words of one or more rows; `scales` and `biases` (already f32)
/// hold one value per group in the same row-major order; `out` receives every element, so its length fixes the
/// number of groups (`out.len() / group_size`) and everything else is checked against it.
pub fn dequantize_mlx_affine(
    bits: u32,
    group_size: usize,
    packed: &[u8],
    scales: &[f32],
    biases: &[f32],
    out: &mut [f32],
) -> Result<(), DequantError> {
    if !BITS.contains(&bits) || !GROUP_SIZES.contains(&group_size) {
        return Err(DequantError::MlxUnsupported { bits, group_size });
    }
    if !out.len().is_multiple_of(group_size) {
        return Err(DequantError::MlxPartialGroup { elements: out.len(), group_size });
    }
    let groups = out.len() / group_size;
    let group_bytes = group_size * bits as usize / 8;
    let check = |what, expected, got| {
        if expected == got {
            Ok(())
        } else {
            Err(DequantError::MlxLength { what, expected, got })
        }
    };
    check("packed bytes", groups * group_bytes, packed.len())?;
    check("scales", groups, scales.len())?;
    check("biases", groups, biases.len())?;

    let groups = packed.chunks_exact(group_bytes).zip(out.chunks_exact_mut(group_size)).zip(scales.iter().zip(biases));
    for ((words, o), (&scale, &bias)) in groups {
        decode_group(bits, words, o, scale, bias);
    }
    Ok(())
}

/// Decodes one group: reads the LSB-first bitstream a byte at a time (bytes of little-endian words are the stream
/// in order), which handles codes that cross word boundaries without special cases.
#[inline]
fn decode_group(bits: u32, bytes: &[u8], out: &mut [f32], scale: f32, bias: f32) {
    let mask = (1u32 << bits) - 1;
    let (mut acc, mut have, mut next) = (0u32, 0u32, 0usize);
    for x in out.iter_mut() {
        while have < bits {
            acc |= u32::from(bytes[next]) << have;
            next += 1;
            have += 8;
        }
        let q = acc & mask;
        acc >>= bits;
        have -= bits;
        *x = scale * q as f32 + bias;
    }
}

/// `mx.dequantize` with scales and biases stored as `dtype` (little-endian bytes) and the result in `dtype`, appended
/// to `out`. In bf16 and f16 mlx rounds `scale·q` to the dtype and then `+ bias` again (its half types widen to f32
/// for each operation and round back), which is not the f32 result rounded once; in f32 it is `scale·q + bias`.
pub fn dequantize_mlx_affine_as(
    bits: u32,
    group_size: usize,
    packed: &[u8],
    scales: &[u8],
    biases: &[u8],
    dtype: crate::dtype::Dtype,
    out: &mut Vec<u8>,
) -> Result<(), DequantError> {
    use crate::convert::transform::{f32_to_bf16_bits, f32_to_f16_bits};
    use crate::dtype::Dtype;
    let size = dtype.size();
    let groups = scales.len() / size.max(1);
    let (s, b) = (super::float_values(scales, dtype), super::float_values(biases, dtype));
    // The codes, as floats.
    let mut q = vec![0f32; groups * group_size];
    dequantize_mlx_affine(bits, group_size, packed, &vec![1.0; groups], &vec![0.0; groups], &mut q)?;
    out.reserve(q.len() * size);
    for (g, codes) in q.chunks_exact(group_size).enumerate() {
        for &c in codes {
            match dtype {
                Dtype::BF16 => {
                    let round = |x: f32| f32::from_bits(u32::from(f32_to_bf16_bits(x)) << 16);
                    out.extend_from_slice(&f32_to_bf16_bits(round(s[g] * c) + b[g]).to_le_bytes());
                }
                Dtype::F16 => {
                    let round = |x: f32| super::f16_bits_to_f32(f32_to_f16_bits(x));
                    out.extend_from_slice(&f32_to_f16_bits(round(s[g] * c) + b[g]).to_le_bytes());
                }
                _ => out.extend_from_slice(&(s[g] * c + b[g]).to_le_bytes()),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packs codes into a little-endian LSB-first bitstream of `bits` per code (what `mx.quantize` stores).
    fn pack(bits: u32, codes: &[u32]) -> Vec<u8> {
        let mut words = vec![0u32; (codes.len() * bits as usize).div_ceil(32)];
        for (i, &c) in codes.iter().enumerate() {
            for k in 0..bits as usize {
                let bit = i * bits as usize + k;
                words[bit / 32] |= ((c >> k) & 1) << (bit % 32);
            }
        }
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn three_bit_code_crosses_a_word() {
        // Code 10 of a 3-bit row uses bits 30..33: bits 30-31 of word 0 and bit 0 of word 1.
        let mut codes = vec![0u32; 32];
        codes[10] = 0b101;
        let packed = pack(3, &codes);
        assert_eq!(u32::from_le_bytes(packed[0..4].try_into().unwrap()), 1 << 30);
        assert_eq!(u32::from_le_bytes(packed[4..8].try_into().unwrap()), 1);
        let mut out = [0.0f32; 32];
        dequantize_mlx_affine(3, 32, &packed, &[1.0], &[0.0], &mut out).unwrap();
        assert_eq!(out[10], 5.0);
        assert_eq!(out.iter().filter(|x| **x != 0.0).count(), 1);
    }

    #[test]
    fn every_width_and_group_round_trips_codes_with_signed_scales() {
        for bits in BITS {
            for g in GROUP_SIZES {
                let rows = 3;
                let codes: Vec<u32> = (0..rows * g as u32).map(|i| (i * 7 + i / 5) % (1 << bits)).collect();
                let groups = codes.len() / g;
                let scales: Vec<f32> = (0..groups).map(|k| if k % 2 == 0 { 0.5 } else { -0.25 }).collect();
                let biases: Vec<f32> = (0..groups).map(|k| k as f32 - 1.0).collect();
                let mut out = vec![f32::NAN; codes.len()];
                dequantize_mlx_affine(bits, g, &pack(bits, &codes), &scales, &biases, &mut out).unwrap();
                for (i, (&x, &c)) in out.iter().zip(&codes).enumerate() {
                    assert_eq!(x, scales[i / g] * c as f32 + biases[i / g], "bits {bits} g {g} i {i}");
                }
            }
        }
    }

    #[test]
    fn bad_geometry_is_an_error() {
        let mut out = [0.0f32; 64];
        let err = dequantize_mlx_affine(7, 64, &[], &[], &[], &mut out).unwrap_err();
        assert!(matches!(err, DequantError::MlxUnsupported { bits: 7, .. }), "{err}");
        let err = dequantize_mlx_affine(4, 16, &[], &[], &[], &mut out).unwrap_err();
        assert!(matches!(err, DequantError::MlxUnsupported { group_size: 16, .. }), "{err}");
        let err = dequantize_mlx_affine(4, 64, &[0; 32], &[1.0], &[0.0], &mut out[..40]).unwrap_err();
        assert!(matches!(err, DequantError::MlxPartialGroup { elements: 40, .. }), "{err}");
        let err = dequantize_mlx_affine(4, 64, &[0; 31], &[1.0], &[0.0], &mut out).unwrap_err();
        assert!(matches!(err, DequantError::MlxLength { what: "packed bytes", expected: 32, got: 31 }), "{err}");
        let err = dequantize_mlx_affine(4, 64, &[0; 32], &[1.0, 2.0], &[0.0], &mut out).unwrap_err();
        assert!(matches!(err, DequantError::MlxLength { what: "scales", .. }), "{err}");
        let err = dequantize_mlx_affine(4, 64, &[0; 32], &[1.0], &[], &mut out).unwrap_err();
        assert!(matches!(err, DequantError::MlxLength { what: "biases", .. }), "{err}");
    }
}
