//! Element conversions and the q/k row permutation, applied to row chunks so a tensor never has to fit in memory.

use crate::dequant::{bf16_bits_to_f32, f16_bits_to_f32};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::GgmlType;

/// `ggml_compute_fp32_to_bf16` (and gguf-py's `BF16.quantize_blocks`): round to nearest even, NaN forced quiet.
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// An f64 rounded once to bf16 (nearest, ties to even; NaN quiet): through f32 with round-to-odd, which keeps the
/// two roundings equal to one since f32 has more than 8 + 2 significant bits.
pub fn f64_to_bf16_bits(x: f64) -> u16 {
    let f = x as f32;
    let f = if f64::from(f) == x || !x.is_finite() {
        f
    } else {
        // The f32 truncation of x (toward zero; f32::MAX for an overflow), its last bit set: round to odd.
        let toward_zero = if f64::from(f).abs() > x.abs() { f32::from_bits(f.to_bits() - 1) } else { f };
        f32::from_bits(toward_zero.to_bits() | 1)
    };
    f32_to_bf16_bits(f)
}

/// The source row that output row `r` of a permuted tensor comes from: within each head of `hd` rows,
/// new_row[h·hd + 2i + j] = old_row[h·hd + j·(hd/2) + i] — same as convert_hf_to_gguf's `LlamaModel.permute`
/// (reshape to (heads, 2, hd/2, …), swap axes 1 and 2).
pub fn permuted_source_row(r: u64, hd: u64) -> u64 {
    let (h, k) = (r / hd, r % hd);
    let (i, j) = (k / 2, k % 2);
    h * hd + j * (hd / 2) + i
}

/// numpy's `astype(np.float16)` of an f32 (what gguf-py writes for F16): round to nearest even, overflow to
/// infinity.
pub fn f32_to_f16_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// Appends `vals` rounded to a float `dtype` (round to nearest even), little-endian.
pub fn encode_f32(vals: &[f32], dtype: Dtype, out: &mut Vec<u8>) {
    match dtype {
        Dtype::BF16 => out.extend(vals.iter().flat_map(|&x| f32_to_bf16_bits(x).to_le_bytes())),
        Dtype::F16 => out.extend(vals.iter().flat_map(|&x| f32_to_f16_bits(x).to_le_bytes())),
        _ => out.extend(vals.iter().flat_map(|x| x.to_le_bytes())),
    }
}

/// gguf-py's `Q8_0.quantize_blocks`, which is ggml's `quantize_row_q8_0_ref`: per block of 32, `d = amax / 127`,
/// codes `roundf(x · (1/d))` (half away from zero; 0 when d is 0), `d` stored as f16. `values` is whole blocks.
/// (The quant crate has the same blocks in its SIMD pipeline; both are checked against ggml's golden vectors.)
pub fn q8_0_blocks(values: &[f32], out: &mut Vec<u8>) {
    for block in values.chunks_exact(32) {
        let d = block.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&f32_to_f16_bits(d).to_le_bytes());
        out.extend(block.iter().map(|x| (x * id).round() as i8 as u8));
    }
}

/// Converts little-endian elements of `src` (dtype `from`) into `to`, appending to `out`, adding `offset` in f32
/// first when set. Without an offset, same-type conversions are byte copies; widening is exact; narrowing rounds
/// as gguf-py does (bf16: ggml's round to nearest even; f16: numpy's).
pub fn convert_elements(
    from: Dtype,
    to: GgmlType,
    src: &[u8],
    out: &mut Vec<u8>,
    tensor: &str,
    offset: Option<f32>,
) -> Result<()> {
    let value = |b: &[u8]| -> f32 {
        match from {
            Dtype::BF16 => bf16_bits_to_f32(u16::from_le_bytes([b[0], b[1]])),
            Dtype::F16 => f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]])),
            _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        }
    };
    if !matches!(from, Dtype::BF16 | Dtype::F16 | Dtype::F32)
        || !matches!(to, GgmlType::BF16 | GgmlType::F16 | GgmlType::F32 | GgmlType::Q8_0)
    {
        return Err(Error::format(
            tensor,
            "dtype",
            format!("converting {from} to {to} is not supported (BF16, F16 or F32 to BF16, F16 or F32)"),
        ));
    }
    if to == GgmlType::Q8_0 {
        let vals: Vec<f32> = src.chunks_exact(from.size()).map(|b| value(b) + offset.unwrap_or(0.0)).collect();
        if !vals.len().is_multiple_of(32) {
            return Err(Error::format(tensor, "Q8_0", format!("{} values are not whole 32-value blocks", vals.len())));
        }
        q8_0_blocks(&vals, out);
        return Ok(());
    }
    if let Some(o) = offset {
        for b in src.chunks_exact(from.size()) {
            let v = value(b) + o;
            match to {
                GgmlType::BF16 => out.extend_from_slice(&f32_to_bf16_bits(v).to_le_bytes()),
                GgmlType::F16 => out.extend_from_slice(&f32_to_f16_bits(v).to_le_bytes()),
                _ => out.extend_from_slice(&v.to_le_bytes()),
            }
        }
        return Ok(());
    }
    match (from, to) {
        (Dtype::BF16, GgmlType::BF16) | (Dtype::F32, GgmlType::F32) | (Dtype::F16, GgmlType::F16) => {
            out.extend_from_slice(src)
        }
        (Dtype::BF16 | Dtype::F32, GgmlType::F16) => {
            for b in src.chunks_exact(from.size()) {
                out.extend_from_slice(&f32_to_f16_bits(value(b)).to_le_bytes());
            }
        }
        (Dtype::BF16 | Dtype::F16, GgmlType::F32) => {
            for b in src.chunks_exact(from.size()) {
                out.extend_from_slice(&value(b).to_le_bytes());
            }
        }
        (Dtype::F16 | Dtype::F32, GgmlType::BF16) => {
            for b in src.chunks_exact(from.size()) {
                out.extend_from_slice(&f32_to_bf16_bits(value(b)).to_le_bytes());
            }
        }
        _ => {
            return Err(Error::format(
                tensor,
                "dtype",
                format!("converting {from} to {to} is not supported (sources are BF16, F16 or F32)"),
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_is_ggml_rne_with_quiet_nan() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
        // Exactly halfway: ties to even (down for 0x3f80, up for 0x3f81).
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8001)), 0x3f81);
        // A signalling NaN whose payload is only in the low half stays a NaN.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(f32_to_bf16_bits(f32::INFINITY), 0x7f80);
    }

    /// The permutation on a small example, against the reshape/swapaxes definition written out by hand:
    /// 2 heads of 4 rows: rows (a0 a1 b0 b1) of each head become (a0 b0 a1 b1).
    #[test]
    fn qk_permutation_small_example() {
        let hd = 4;
        let order: Vec<u64> = (0..8).map(|r| permuted_source_row(r, hd)).collect();
        assert_eq!(order, [0, 2, 1, 3, 4, 6, 5, 7]);
        // hd = 6: (H, 2, 3) swapped to (H, 3, 2).
        let order: Vec<u64> = (0..6).map(|r| permuted_source_row(r, 6)).collect();
        assert_eq!(order, [0, 3, 1, 4, 2, 5]);
    }

    #[test]
    fn f64_rounds_once_to_bf16() {
        // 1 + 2^-8 is a bf16 tie (even: 1.0); a hair above it must round up, though as f32 it is the tie itself.
        assert_eq!(f64_to_bf16_bits(1.0 + 2f64.powi(-8)), 0x3f80);
        assert_eq!(f64_to_bf16_bits(1.0 + 2f64.powi(-8) + 2f64.powi(-40)), 0x3f81);
        assert_eq!(f64_to_bf16_bits(-(1.0 + 2f64.powi(-8) + 2f64.powi(-40))), 0xbf81);
        assert_eq!(f64_to_bf16_bits(1.0 + 3.0 * 2f64.powi(-8)), 0x3f82, "tie to even upward");
        assert_eq!(f64_to_bf16_bits(1e300), 0x7f80);
        assert_eq!(f64_to_bf16_bits(-1e300), 0xff80);
        assert_eq!(f64_to_bf16_bits(1e-300), 0x0000);
        assert_eq!(f64_to_bf16_bits(f64::NAN) & 0x7fc0, 0x7fc0);
        // Exhaustive over a range of f32 values: an exact f32 gives what f32 → bf16 gives.
        for bits in (0x3f00_0000u32..0x4000_0000).step_by(977) {
            let x = f32::from_bits(bits);
            assert_eq!(f64_to_bf16_bits(f64::from(x)), f32_to_bf16_bits(x), "{x}");
        }
    }

    /// ggml's own Q8_0 output for the golden input (../shared/fixtures/ggml-golden).
    #[test]
    fn q8_0_equals_ggml_golden_vectors() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/ggml-golden");
        let input = std::fs::read(dir.join("input.f32")).expect("golden input");
        let want = std::fs::read(dir.join("q8_0.bin")).expect("golden q8_0");
        let mut out = Vec::new();
        convert_elements(Dtype::F32, GgmlType::Q8_0, &input, &mut out, "golden", None).unwrap();
        assert_eq!(out, want);
    }

    #[test]
    fn conversions() {
        let mut out = Vec::new();
        convert_elements(Dtype::BF16, GgmlType::F32, &[0x80, 0x3f], &mut out, "t", None).unwrap();
        assert_eq!(out, 1.0f32.to_le_bytes());
        out.clear();
        convert_elements(Dtype::F32, GgmlType::BF16, &1.5f32.to_le_bytes(), &mut out, "t", None).unwrap();
        assert_eq!(out, [0xc0, 0x3f]);
        out.clear();
        // 1 + 2^-11 is halfway between two f16 values: ties to even (1.0).
        convert_elements(Dtype::F32, GgmlType::F16, &(1.0f32 + 2f32.powi(-11)).to_le_bytes(), &mut out, "t", None)
            .unwrap();
        assert_eq!(out, 0x3c00u16.to_le_bytes());
        out.clear();
        convert_elements(Dtype::F32, GgmlType::F16, &1e6f32.to_le_bytes(), &mut out, "t", None).unwrap();
        assert_eq!(out, 0x7c00u16.to_le_bytes(), "overflow to infinity");
        out.clear();
        // Offsets are added in f32: bf16 0.5 + 1 = 1.5.
        convert_elements(Dtype::BF16, GgmlType::F32, &[0x00, 0x3f], &mut out, "t", Some(1.0)).unwrap();
        assert_eq!(out, 1.5f32.to_le_bytes());
        assert!(convert_elements(Dtype::I32, GgmlType::BF16, &[0; 4], &mut out, "t", None).is_err());
    }
}
