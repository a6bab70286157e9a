//! MLX's floating-point quantization modes as `mx.dequantize` reads them back: `mxfp4` (e2m1 values, an e8m0
//! power-of-two scale per 32), `nvfp4` (e2m1 values, an e4m3 scale per 16) and `mxfp8` (e4m3 values, an e8m0 scale
//! per 32). Each value is a table or e4m3 value times its scale, exact in f32 (and in bf16). The quantizer is
//! `quantfarm_quant::mlx_fp`.

use super::float::f16_bits_to_f32;

/// One of MLX's floating-point modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FpMode {
    Mxfp4,
    Nvfp4,
    Mxfp8,
}

impl FpMode {
    pub const ALL: [FpMode; 3] = [FpMode::Mxfp4, FpMode::Nvfp4, FpMode::Mxfp8];

    /// The name `mx.quantize(mode=)` and `config.json` use.
    pub fn name(self) -> &'static str {
        match self {
            FpMode::Mxfp4 => "mxfp4",
            FpMode::Nvfp4 => "nvfp4",
            FpMode::Mxfp8 => "mxfp8",
        }
    }

    pub fn parse(s: &str) -> Option<FpMode> {
        FpMode::ALL.into_iter().find(|m| m.name() == s)
    }

    /// The only group size mlx accepts for the mode.
    pub fn group_size(self) -> usize {
        match self {
            FpMode::Nvfp4 => 16,
            FpMode::Mxfp4 | FpMode::Mxfp8 => 32,
        }
    }

    /// The only bit width mlx accepts for the mode.
    pub fn bits(self) -> u32 {
        match self {
            FpMode::Mxfp4 | FpMode::Nvfp4 => 4,
            FpMode::Mxfp8 => 8,
        }
    }
}

/// The e2m1 values in code order, mlx's lookup table.
pub const E2M1: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// An e4m3 byte's value as mlx reads it (`mlx/backend/cpu/unary_ops.h::FromFP8`): the seven low bits shifted into
/// an fp16's exponent and mantissa, times 256, with the sign bit applied (so 0x7F reads 480: no NaN).
pub fn mlx_from_fp8(b: u8) -> f32 {
    let v = f16_bits_to_f32(u16::from(b & 0x7F) << 7) * 256.0;
    if b & 0x80 != 0 {
        -v
    } else {
        v
    }
}

/// The values `mx.dequantize(w, scales, mode=MODE)` gives back, as f32 (exact: each is a table value times a power
/// of two or an e4m3 scale).
pub fn dequantize_fp(packed: &[u32], scales: &[u8], mode: FpMode) -> Vec<f32> {
    let g = mode.group_size();
    let per_word = 32 / mode.bits() as usize;
    let mut out = Vec::with_capacity(packed.len() * per_word);
    for (i, &word) in packed.iter().enumerate() {
        let scale = match mode {
            FpMode::Nvfp4 => mlx_from_fp8(scales[i * per_word / g]),
            FpMode::Mxfp4 | FpMode::Mxfp8 => 2f32.powi(i32::from(scales[i * per_word / g]) - 127),
        };
        for k in 0..per_word {
            let v = match mode {
                FpMode::Mxfp8 => mlx_from_fp8((word >> (8 * k)) as u8),
                FpMode::Mxfp4 | FpMode::Nvfp4 => E2M1[((word >> (4 * k)) & 0xF) as usize],
            };
            out.push(v * scale);
        }
    }
    out
}
