//! MLX's floating-point quantization modes as `mx.dequantize` reads them back: `mxfp4` (e2m1 values, an e8m0
//! power-of-two scale per 32), `nvfp4` (e2m1 values, an e4m3 scale per 16) and `mxfp8` (e4m3 values, an e8m0 scale
//! per 32). Each value is a table or e4m3 value times its scale, exact in f32 (and in bf16). The quantizer is
//! `quantfarm_quant::mlx_fp`.

use super::float::f16_bits_to_f32;

/// One of MLX's floating-point modes (named in YAML and JSON as `mx.quantize` names them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
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
    let bytes: Vec<u8> = packed.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut out = vec![0f32; packed.len() * 32 / mode.bits() as usize];
    dequantize_fp_into(&bytes, scales, mode, &mut out);
    out
}

/// [`dequantize_fp`] of the codes as the little-endian bytes a safetensors file holds, into `out` (whose length
/// says how many values: `codes` holds at least `out.len() · bits / 8` bytes, `scales` one per group).
pub fn dequantize_fp_into(codes: &[u8], scales: &[u8], mode: FpMode, out: &mut [f32]) {
    let g = mode.group_size();
    for ((group, scale), vals) in out.chunks_mut(g).zip(scales).zip(codes.chunks(g * mode.bits() as usize / 8)) {
        let scale = match mode {
            FpMode::Nvfp4 => mlx_from_fp8(*scale),
            FpMode::Mxfp4 | FpMode::Mxfp8 => 2f32.powi(i32::from(*scale) - 127),
        };
        match mode {
            FpMode::Mxfp8 => group.iter_mut().zip(vals).for_each(|(o, &b)| *o = mlx_from_fp8(b) * scale),
            FpMode::Mxfp4 | FpMode::Nvfp4 => {
                for (pair, &b) in group.chunks_mut(2).zip(vals) {
                    pair[0] = E2M1[usize::from(b & 0xF)] * scale;
                    if let Some(hi) = pair.get_mut(1) {
                        *hi = E2M1[usize::from(b >> 4)] * scale;
                    }
                }
            }
        }
    }
}
