//! MLX's floating-point quantization modes, byte-identical to `mlx.core.quantize(w, mode=...)` on CPU:
//! `mxfp4` (groups of 32, e2m1 values, an e8m0 power-of-two scale), `nvfp4` (groups of 16, e2m1 values, an e4m3
//! scale) and `mxfp8` (groups of 32, e4m3 values, an e8m0 scale). These are what `mlx_lm.convert -q --q-mode MODE`
//! writes: `P.weight` (uint32 words) and `P.scales` (uint8), no biases.
//!
//! On CPU mlx computes them with the generic op graph of `mlx/ops.cpp::fp_quantize` (its `fallback`), each op in
//! the weight's dtype `D` (bf16, f16 or f32) and rounded to it (every unary and binary op of mlx's CPU backend on
//! x86 works on one element at a time: the value widened to f32, the f32 result rounded to `D`). Per group:
//!
//! 1. `s = D(amax / m)` with `m` = 6 (4 bits) or 448 (8 bits); `amax` is exact.
//! 2. nvfp4: the scale byte is `to_fp8(f32(s))` (`detail::ToFP8`: round to nearest even with subnormals, saturating
//!    at 448, `0x7E`, from 464 up and for NaN), and `q = D(w / D(e4m3(byte)))`, widened to f32 (`* scale_encode`,
//!    an f32 1.0). A scale that rounds to zero divides by zero: ±inf or NaN, which the search below maps to code 0.
//! 3. mxfp4 / mxfp8: `2^e` is the smallest power of two at least `s` (`e = ⌈log2 s⌉`; 0 where `s` is 0),
//!    `q = D(w / D(2^e))`, the scale byte `e + 127`. An exponent outside [-127, 127] is refused here (mlx wraps it
//!    into a byte regardless). mlx 0.32.4, the pinned build, rounds the scale up so that the group's largest values
//!    stay inside the element range (its Metal kernels' `mx_scale_round_up`, "matches the CUDA backend, which rounds
//!    up via cutlass ue8m0"); 0.32.1's `fp_quantize` fallback rounded `log2 s` to nearest, which the oracle test
//!    (`tests/tests/mlx_fp.rs`) tells apart on every bf16 scale.
//! 4. 4 bits: the code is the first index of the smallest `|q − lut[k]|` over the e2m1 table (`+0, 0.5, 1, 1.5, 2,
//!    3, 4, 6, −0, −0.5, …, −6`) in `q`'s type (D for the mx modes, f32 for nvfp4), mlx's `argmin` (a strict `<`:
//!    a tie keeps the lower index, so −0 is never chosen and a NaN or infinite `q` gives 0); 8 codes per word, the
//!    first in the low nibble. 8 bits: `to_fp8(f32(q))`, 4 bytes per word, little-endian.

pub use quantfarm_tensors::dequant::{dequantize_fp, mlx_from_fp8, FpMode, E2M1};
use quantfarm_tensors::Dtype;

use crate::compressed_tensors::fp8_e4m3fn_bits;
use crate::mlx::round_value as round_to;

/// Why a floating-point quantization was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FpQuantError {
    #[error("rows of {cols} elements are not a whole number of {group_size}-element groups")]
    PartialGroup { cols: usize, group_size: usize },
    #[error("{mode} takes F32, F16 or BF16 values, not {dtype:?}")]
    Dtype { mode: &'static str, dtype: Dtype },
    #[error("input value {value} at row {row}, column {col} is not finite")]
    NonFinite { row: usize, col: usize, value: f32 },
    #[error(
        "row {row}, group {group}: scale exponent {exponent} is outside e8m0's [-127, 127] (largest magnitude {amax})"
    )]
    Exponent { row: usize, group: usize, exponent: i32, amax: f32 },
}

impl FpQuantError {
    /// The error with its row counted from `first` rows earlier (the input was a piece of a tensor from that row).
    pub fn from_row(self, first: usize) -> FpQuantError {
        match self {
            FpQuantError::NonFinite { row, col, value } => FpQuantError::NonFinite { row: row + first, col, value },
            FpQuantError::Exponent { row, group, exponent, amax } => {
                FpQuantError::Exponent { row: row + first, group, exponent, amax }
            }
            e => e,
        }
    }
}

/// What `mx.quantize` returns for one of the floating-point modes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FpQuantized {
    /// `rows × cols·bits/32` words (`P.weight`).
    pub packed: Vec<u32>,
    /// `rows × cols/group_size` scale bytes (`P.scales`).
    pub scales: Vec<u8>,
}

/// `⌈log2 s⌉` for a positive finite `s`, exactly: the exponent of the smallest power of two at least `s`.
fn ceil_log2(s: f32) -> i32 {
    let x = f64::from(s);
    let mut e = x.log2().ceil() as i32;
    while 2f64.powi(e) < x {
        e += 1;
    }
    while 2f64.powi(e - 1) >= x {
        e -= 1;
    }
    e
}

/// mlx's `detail::ToFP8`: e4m3 with round to nearest even, saturating to ±448 from 464 up (and for NaN).
pub fn mlx_to_fp8(f: f32) -> u8 {
    // 543 << 21 is 464.0's bit pattern.
    if f.to_bits() & 0x7FFF_FFFF >= 543 << 21 {
        return 0x7E | ((f.to_bits() >> 24) as u8 & 0x80);
    }
    fp8_e4m3fn_bits(f)
}

/// Quantizes `w` (whole rows of `cols` values, each exactly a `dtype` value, row-major) as `mx.quantize(w,
/// mode=MODE)` does on CPU. Rows are independent, so the bytes do not depend on how the input is split.
pub fn quantize_fp(w: &[f32], cols: usize, mode: FpMode, dtype: Dtype) -> Result<FpQuantized, FpQuantError> {
    let g = mode.group_size();
    if !matches!(dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
        return Err(FpQuantError::Dtype { mode: mode.name(), dtype });
    }
    if cols == 0 || !cols.is_multiple_of(g) {
        return Err(FpQuantError::PartialGroup { cols, group_size: g });
    }
    let mut out = FpQuantized::default();
    let lut: Vec<f32> = E2M1.iter().map(|&v| round_to(v, dtype)).collect();
    let mut q = vec![0f32; g];
    for (i, group) in w.chunks(g).enumerate() {
        let (row, group_index) = (i * g / cols, i % (cols / g));
        if let Some(j) = group.iter().position(|v| !v.is_finite()) {
            return Err(FpQuantError::NonFinite { row, col: group_index * g + j, value: group[j] });
        }
        let amax = group.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = round_to(amax / if mode.bits() == 4 { 6.0 } else { 448.0 }, dtype);
        match mode {
            FpMode::Nvfp4 => {
                let byte = mlx_to_fp8(s);
                let sd = round_to(mlx_from_fp8(byte), dtype);
                for (qj, &wj) in q.iter_mut().zip(group) {
                    *qj = round_to(wj / sd, dtype);
                }
                out.scales.push(byte);
            }
            FpMode::Mxfp4 | FpMode::Mxfp8 => {
                let e = if s == 0.0 { 0 } else { ceil_log2(s) };
                if !(-127..=127).contains(&e) {
                    return Err(FpQuantError::Exponent { row, group: group_index, exponent: e, amax });
                }
                let p = round_to(2f64.powi(e) as f32, dtype);
                for (qj, &wj) in q.iter_mut().zip(group) {
                    *qj = round_to(wj / p, dtype);
                }
                out.scales.push((e + 127) as u8);
            }
        }
        match mode {
            FpMode::Mxfp8 => {
                for word in q.chunks(4) {
                    let b: Vec<u8> = word.iter().map(|&x| mlx_to_fp8(x)).collect();
                    out.packed.push(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                }
            }
            FpMode::Mxfp4 | FpMode::Nvfp4 => {
                // nvfp4's q is f32 (multiplied by the f32 scale_encode), so its distances are f32's; mxfp4's are D's.
                let dist_type = if mode == FpMode::Nvfp4 { Dtype::F32 } else { dtype };
                for word in q.chunks(8) {
                    let mut packed = 0u32;
                    for (k, &x) in word.iter().enumerate() {
                        let mut best = (0u32, round_to(x - lut[0], dist_type).abs());
                        for (c, &l) in lut.iter().enumerate().skip(1) {
                            let d = round_to(x - l, dist_type).abs();
                            if d < best.1 {
                                best = (c as u32, d);
                            }
                        }
                        packed |= best.0 << (4 * k);
                    }
                    out.packed.push(packed);
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_shapes() {
        for m in FpMode::ALL {
            assert_eq!(FpMode::parse(m.name()), Some(m));
        }
        assert_eq!((FpMode::Nvfp4.group_size(), FpMode::Mxfp8.bits()), (16, 8));
        assert!(matches!(
            quantize_fp(&[0.0; 24], 24, FpMode::Mxfp4, Dtype::BF16),
            Err(FpQuantError::PartialGroup { cols: 24, group_size: 32 })
        ));
    }

    /// A group whose largest magnitude is 6 has scale 2^0 in mxfp4: every table value is its own code, and ties
    /// between two table values (0.25, 1.25, 2.5, 5) keep the lower code; −0.25 goes to +0.
    #[test]
    fn mxfp4_codes_and_ties() {
        let mut w = vec![0f32; 32];
        let vals = [6.0, 0.25, 1.25, 2.5, 5.0, -0.25, -6.0, 3.0, -1.5];
        w[..vals.len()].copy_from_slice(&vals);
        let q = quantize_fp(&w, 32, FpMode::Mxfp4, Dtype::BF16).unwrap();
        assert_eq!(q.scales[0], 127);
        let codes: Vec<u32> = (0..9).map(|k| (q.packed[k / 8] >> (4 * (k % 8))) & 0xF).collect();
        assert_eq!(codes, [7, 0, 2, 4, 6, 0, 15, 5, 11]);
        let back = dequantize_fp(&q.packed, &q.scales, FpMode::Mxfp4);
        assert_eq!(&back[..9], &[6.0, 0.0, 1.0, 2.0, 4.0, 0.0, -6.0, 3.0, -1.5]);
    }

    #[test]
    fn fp8_saturates_as_mlx() {
        assert_eq!(mlx_to_fp8(448.0), 0x7E);
        assert_eq!(mlx_to_fp8(470.0), 0x7E);
        assert_eq!(mlx_to_fp8(-1e9), 0xFE);
        assert_eq!(mlx_to_fp8(f32::NAN), 0x7E);
        assert_eq!(mlx_from_fp8(0x7E), 448.0);
    }
}
