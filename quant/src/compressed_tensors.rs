//! The round-to-nearest schemes llm-compressor writes for vLLM in the compressed-tensors format, computed as its
//! eager torch path computes them (compressed-tensors 0.19/0.20, `quantization/utils/helpers.py::calculate_qparams`,
//! `quantization/lifecycle/forward_helpers.py::_quantize`, `quant_args.py::round_to_quantized_type_args`,
//! `compressors/pack_quantized/helpers.py::pack_to_int32`), so the bytes are theirs:
//!
//! - **FP8_DYNAMIC** (`float-quantized`): per output row, `scale = bf16(amax / 448)` (a zero scale becomes bf16's
//!   eps, 2⁻⁷), then each weight `fp8_e4m3fn(clamp(bf16(w / scale), -448, 448))`: two roundings, f32 → bf16 (round
//!   to nearest even) and bf16 → e4m3fn (c10's `fp8e4m3fn_from_fp32_value`: nearest even, with subnormals).
//! - **W4A16** (`pack-quantized`, symmetric int4 per group of `g` columns): `scale = bf16(amax / 7.5)` (zero → 2⁻⁷),
//!   `q = round_half_even(clamp(bf16(w / scale), -8, 7))`, stored as `q + 8` in 4-bit nibbles, 8 to a little-endian
//!   i32 word, the row's first element in the lowest nibble, each row padded with zeros to a multiple of 32.
//!
//! Every quotient is bf16 ÷ bf16 as torch computes it on a CPU: the f32 quotient of the two values, rounded to bf16.
//! Inputs are bf16 weights (a checkpoint's dtype); a NaN or infinite weight is refused by the caller.

/// bf16's machine epsilon (`torch.finfo(torch.bfloat16).eps`), the scale of an all-zero row or group.
pub const BF16_EPS: f32 = 0.0078125;

/// The largest finite e4m3fn value, the clamp of FP8's scaled weights.
pub const FP8_MAX: f32 = 448.0;

/// The value of bf16 bits.
#[inline]
pub fn bf16_value(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// f32 → bf16 bits as torch rounds it (c10's `round_to_nearest_even`; any NaN → `0x7FC0`).
#[inline]
pub fn bf16_bits(x: f32) -> u16 {
    // The rounding is ggml's too (`float::f32_to_bf16_bits`); only NaN's encoding differs.
    if x.is_nan() {
        return 0x7FC0;
    }
    crate::float::f32_to_bf16_bits(x)
}

/// `a / b` for two bf16 values, as torch computes it: the f32 quotient rounded to bf16 (returned as its value).
#[inline]
pub fn bf16_div(a: f32, b: f32) -> f32 {
    bf16_value(bf16_bits(a / b))
}

/// f32 → float8 e4m3fn bits: c10's `fp8e4m3fn_from_fp32_value` (torch's `.to(torch.float8_e4m3fn)`), round to
/// nearest even with subnormals; anything of magnitude 480 or more, and NaN, becomes NaN (`0x7F | sign`): the cast
/// does not saturate, which is why the scheme clamps first.
#[inline]
pub fn fp8_e4m3fn_bits(f: f32) -> u8 {
    // 480.0: the first magnitude e4m3fn cannot hold.
    const FP8_MAX_BITS: u32 = 1087 << 20;
    // ((127 - 7) + (23 - 3) + 1) << 23: adding it moves a value below 2^-6 into subnormal position.
    const DENORM_MASK: u32 = 141 << 23;
    let mut bits = f.to_bits();
    let sign = bits & 0x8000_0000;
    bits ^= sign;
    let result = if bits >= FP8_MAX_BITS {
        0x7F
    } else if bits < (121 << 23) {
        // Below 2^-6, the smallest normal: the FPU's addition does the rounding.
        let b = (f32::from_bits(bits) + f32::from_bits(DENORM_MASK)).to_bits();
        b.wrapping_sub(DENORM_MASK) as u8
    } else {
        let mant_odd = (bits >> 20) & 1;
        bits = bits.wrapping_add(((7u32.wrapping_sub(127)) << 23).wrapping_add(0x7FFFF));
        bits = bits.wrapping_add(mant_odd);
        (bits >> 20) as u8
    };
    result | (sign >> 24) as u8
}

/// e4m3fn bits → their value (NaN for `0x7F`/`0xFF`).
pub fn fp8_e4m3fn_value(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((b >> 3) & 0x0F);
    let mant = f32::from(b & 0x07);
    if exp == 0x0F && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * mant * 2f32.powi(-9)
    } else {
        sign * (1.0 + mant / 8.0) * 2f32.powi(exp - 7)
    }
}

/// The largest magnitude among `row` (bf16 values; exact, as torch's amin/amax in bf16).
fn amax(row: &[f32]) -> f32 {
    row.iter().fold(0.0f32, |m, &x| m.max(x.abs()))
}

/// A symmetric scale: `bf16(amax / half_range)`, a zero one replaced by bf16's eps.
fn symmetric_scale(amax: f32, half_range: f32) -> f32 {
    let s = bf16_div(amax, half_range);
    if s == 0.0 {
        BF16_EPS
    } else {
        s
    }
}

/// FP8_DYNAMIC's channel scale of one weight row (bf16 values): `bf16(amax / 448)`.
pub fn fp8_row_scale(row: &[f32]) -> f32 {
    symmetric_scale(amax(row), FP8_MAX)
}

/// One weight row (bf16 values) quantized to e4m3fn bits with its scale (`fp8_row_scale`), into `out`.
pub fn fp8_row(row: &[f32], scale: f32, out: &mut [u8]) {
    for (w, o) in row.iter().zip(out.iter_mut()) {
        *o = fp8_e4m3fn_bits(bf16_div(*w, scale).clamp(-FP8_MAX, FP8_MAX));
    }
}

/// W4A16's scale of one group of weights (bf16 values): `bf16(amax / 7.5)`.
pub fn int4_group_scale(group: &[f32]) -> f32 {
    symmetric_scale(amax(group), 7.5)
}

/// One weight (a bf16 value) as symmetric int4 with its group's scale: `round_half_even(clamp(bf16(w / s), -8, 7))`.
#[inline]
pub fn int4_value(w: f32, scale: f32) -> i8 {
    bf16_div(w, scale).clamp(-8.0, 7.0).round_ties_even() as i8
}

/// Packs one row of int4 values (-8..=7) as compressed-tensors does: `q + 8` in nibbles, element `i` at bit `4i` of
/// the row's stream of little-endian i32 words, the row padded with zeros to a multiple of 32 elements; `out` holds
/// `ceil(len / 8)` words.
pub fn pack_int4_row(q: &[i8], out: &mut [i32]) {
    out.fill(0);
    for (i, &v) in q.iter().enumerate() {
        let u = ((i32::from(v) + 8) & 0xF) as u32;
        let w = &mut out[i / 8];
        *w = (*w as u32 | (u << (4 * (i % 8)))) as i32;
    }
}

/// The i32 words of one packed row of `cols` int4 values.
pub fn packed_words(cols: usize) -> usize {
    cols.div_ceil(8)
}

/// Unpacks one row of `cols` int4 values from its words ([`pack_int4_row`]'s inverse).
pub fn unpack_int4_row(words: &[i32], cols: usize, out: &mut [i8]) {
    for (i, o) in out.iter_mut().enumerate().take(cols) {
        *o = ((words[i / 8] as u32 >> (4 * (i % 8))) & 0xF) as i8 - 8;
    }
}

/// FP8_DYNAMIC's dequantization as compressed-tensors does it (`_dequantize`): the e4m3fn value in bf16 (exact)
/// times the row's bf16 scale, the f32 product rounded to bf16; bf16 bits.
pub fn fp8_dequant(b: u8, scale: f32) -> u16 {
    bf16_bits(fp8_e4m3fn_value(b) * scale)
}

/// W4A16's dequantization: the int in bf16 times its group's bf16 scale, rounded to bf16; bf16 bits.
pub fn int4_dequant(q: i8, scale: f32) -> u16 {
    bf16_bits(f32::from(q) * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_known_values() {
        assert_eq!(fp8_e4m3fn_bits(0.0), 0x00);
        assert_eq!(fp8_e4m3fn_bits(-0.0), 0x80);
        assert_eq!(fp8_e4m3fn_bits(1.0), 0x38);
        assert_eq!(fp8_e4m3fn_bits(448.0), 0x7E);
        assert_eq!(fp8_e4m3fn_bits(-448.0), 0xFE);
        assert_eq!(fp8_e4m3fn_bits(480.0), 0x7F, "not saturating: NaN");
        assert_eq!(fp8_e4m3fn_bits(2f32.powi(-9)), 0x01, "the smallest subnormal");
        for b in 0u8..=255 {
            let v = fp8_e4m3fn_value(b);
            if !v.is_nan() {
                assert_eq!(fp8_e4m3fn_bits(v), b, "{b:#04x} = {v}");
            }
        }
    }

    #[test]
    fn packing_puts_the_first_element_in_the_low_nibble() {
        let q: Vec<i8> = vec![-8, -7, 0, 7, 1, 2, 3, 4, 5];
        let mut out = vec![0i32; packed_words(q.len())];
        pack_int4_row(&q, &mut out);
        assert_eq!(out[0] as u32, 0xCBA9_F810);
        assert_eq!(out[1], 0xD);
        let mut back = vec![0i8; q.len()];
        unpack_int4_row(&out, q.len(), &mut back);
        assert_eq!(back, q);
    }
}
