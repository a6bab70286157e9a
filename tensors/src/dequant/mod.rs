//! Dequantization to f32, bit-exact with the reference tools.
//!
//! * ggml types follow gguf-py `gguf/quants.py` (gguf 0.19.0) `dequantize`: the same float32 operations in the same
//!   order and association, so results equal numpy's bit for bit (neither Rust nor numpy fuses multiply-adds).
//!   Types gguf-py lacks (Q8_1, Q8_K, F64, integers) follow ggml's `dequantize_row_*` / numpy's `astype(float32)`.
//! * MLX affine follows `mx.dequantize` (`scale·q + bias` in f32), see [`dequantize_mlx_affine`].
//!
//! Everything works block by block straight into the caller's `out`, so whole models can be streamed through a
//! fixed buffer.
//!
//! Files: `float.rs` (F32, F16, BF16, F64, integers), `legacy.rs` (the 32-element formats), `kquants.rs`
//! (Q2_K…Q8_K), `iq1.rs` (IQ1_S, IQ1_M), `iq2.rs` (IQ2_XXS, IQ2_XS, IQ2_S), `iq3.rs` (IQ3_XXS, IQ3_S), `iq4.rs`
//! (IQ4_NL, IQ4_XS), `fp4.rs` (MXFP4, NVFP4), `ternary.rs` (TQ1_0, TQ2_0), `low_bit.rs` (Q1_0, Q2_0), `mlx.rs` (MLX
//! affine), `mlx_fp.rs` (MLX's mxfp4, nvfp4, mxfp8). The block layouts are `quantfarm_ggml::blocks`, shared with the
//! quantizer; the grids of the i-quants are `quantfarm_ggml::grids`.

mod float;
mod fp4;
mod iq1;
mod iq2;
mod iq3;
mod iq4;
mod kquants;
mod legacy;
mod low_bit;
mod mlx;
mod mlx_fp;
mod ternary;

pub use float::{bf16_bits_to_f32, bf16_to_f32, f16_bits_to_f32, f16_to_f32, float_values, float_values_into};
pub use mlx::{dequantize_mlx_affine, dequantize_mlx_affine_as};
pub use mlx_fp::{dequantize_fp, dequantize_fp_into, mlx_from_fp8, FpMode, E2M1};

use quantfarm_ggml::blocks::Block;

use crate::GgmlType;

/// Why a buffer could not be dequantized. Nothing is partially trusted: on error `out` may hold partial output.
#[derive(Debug, thiserror::Error)]
pub enum DequantError {
    #[error("{ty} data is {len} bytes, not a whole number of {type_size}-byte blocks")]
    PartialBlock { ty: GgmlType, len: usize, type_size: usize },
    #[error("output has room for {got} elements but the input holds {expected}")]
    OutLen { expected: usize, got: usize },
    #[error("MLX affine quantization with {bits} bits and group size {group_size} is not supported (bits 2, 3, 4, 5, 6, 8; groups 32, 64, 128)")]
    MlxUnsupported { bits: u32, group_size: usize },
    #[error("MLX affine output of {elements} elements is not a whole number of {group_size}-element groups")]
    MlxPartialGroup { elements: usize, group_size: usize },
    #[error("MLX affine {what} has {got} entries, expected {expected}")]
    MlxLength { what: &'static str, expected: usize, got: usize },
}

/// One decoder over a whole, already length-checked buffer of blocks.
type Decoder = fn(&[u8], &mut [f32]);

/// The decoder for `ty`: every ggml type has one (the match is exhaustive, so a new type must add its own).
fn decoder(ty: GgmlType) -> Decoder {
    use GgmlType::*;
    match ty {
        F32 => float::f32_le,
        F16 => f16_to_f32,
        BF16 => bf16_to_f32,
        F64 => float::f64_le,
        I8 => float::i8_le,
        I16 => float::i16_le,
        I32 => float::i32_le,
        I64 => float::i64_le,
        Q4_0 => legacy::q4_0,
        Q4_1 => legacy::q4_1,
        Q5_0 => legacy::q5_0,
        Q5_1 => legacy::q5_1,
        Q8_0 => legacy::q8_0,
        Q8_1 => legacy::q8_1,
        Q2_K => kquants::q2_k,
        Q3_K => kquants::q3_k,
        Q4_K => kquants::q4_k,
        Q5_K => kquants::q5_k,
        Q6_K => kquants::q6_k,
        Q8_K => kquants::q8_k,
        IQ2_XXS => iq2::iq2_xxs,
        IQ2_XS => iq2::iq2_xs,
        IQ2_S => iq2::iq2_s,
        IQ4_NL => iq4::iq4_nl,
        IQ4_XS => iq4::iq4_xs,
        IQ3_XXS => iq3::iq3_xxs,
        IQ3_S => iq3::iq3_s,
        IQ1_S => iq1::iq1_s,
        IQ1_M => iq1::iq1_m,
        MXFP4 => fp4::mxfp4,
        NVFP4 => fp4::nvfp4,
        TQ1_0 => ternary::tq1_0,
        TQ2_0 => ternary::tq2_0,
        Q1_0 => low_bit::q1_0,
        Q2_0 => low_bit::q2_0,
    }
}

/// Dequantizes whole blocks of `ty` in `data` into `out`; `out.len()` must equal the number of elements in `data`.
///
/// Rows need not be known: blocks never straddle rows, so any run of whole blocks decodes the same way.
pub fn dequantize_ggml(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), DequantError> {
    let decode = decoder(ty);
    let type_size = ty.type_size();
    if !data.len().is_multiple_of(type_size) {
        return Err(DequantError::PartialBlock { ty, len: data.len(), type_size });
    }
    let expected = data.len() / type_size * ty.block_size();
    if out.len() != expected {
        return Err(DequantError::OutLen { expected, got: out.len() });
    }
    decode(data, out);
    Ok(())
}

/// Runs `f` on each block of a buffer whose lengths the caller has checked (`data` = k·`B::SIZE` bytes, `out` =
/// k·`BS` elements), the block read into its struct (`quantfarm_ggml::blocks`, the quantizer's own layouts).
///
/// A fixed-size output array lets the decoders index without bounds checks; `BS` is checked against the block.
fn each<B: Block, const BS: usize>(data: &[u8], out: &mut [f32], f: impl Fn(&B, &mut [f32; BS])) {
    debug_assert_eq!(B::ELEMENTS, BS);
    debug_assert_eq!(data.len() / B::SIZE * BS, out.len());
    for (block, o) in data.chunks_exact(B::SIZE).zip(out.chunks_exact_mut(BS)) {
        // chunks_exact yields exactly BS items, so this conversion cannot fail.
        if let Ok(o) = <&mut [f32; BS]>::try_from(o) {
            f(&B::read(block), o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each decoder's compile-time block geometry must match ggml's, or blocks would be misaligned: decoding two
    /// blocks of zeros must fill exactly the expected elements (a wrong TS/BS leaves some untouched or panics).
    #[test]
    fn decoder_geometry_matches_ggml_type() {
        for &ty in GgmlType::ALL {
            let data = vec![0u8; 2 * ty.type_size()];
            let mut out = vec![f32::NAN; 2 * ty.block_size()];
            dequantize_ggml(ty, &data, &mut out).unwrap();
            assert!(out.iter().all(|x| *x == 0.0), "{ty}: {out:?}");
        }
    }

    #[test]
    fn partial_block_and_wrong_out_len_are_errors() {
        let err = dequantize_ggml(GgmlType::Q4_0, &[0; 19], &mut [0.0; 32]).unwrap_err();
        assert!(matches!(err, DequantError::PartialBlock { len: 19, type_size: 18, .. }), "{err}");
        let err = dequantize_ggml(GgmlType::Q4_0, &[0; 36], &mut [0.0; 32]).unwrap_err();
        assert!(matches!(err, DequantError::OutLen { expected: 64, got: 32 }), "{err}");
        let err = dequantize_ggml(GgmlType::F32, &[0; 6], &mut [0.0; 1]).unwrap_err();
        assert!(matches!(err, DequantError::PartialBlock { .. }), "{err}");
    }

    #[test]
    fn empty_input_is_fine() {
        dequantize_ggml(GgmlType::Q6_K, &[], &mut []).unwrap();
    }
}
