//! safetensors element types, and the one tensor type every format maps into for listings and budgets.

use std::fmt;

use crate::dequant::FpMode;
use crate::GgmlType;

/// A safetensors `dtype` string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bool,
    U8,
    I8,
    F8E5M2,
    F8E4M3,
    F8E8M0,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    F64,
    I64,
    U64,
}

impl Dtype {
    const NAMES: [(Dtype, &'static str, usize); 16] = [
        (Dtype::Bool, "BOOL", 1),
        (Dtype::U8, "U8", 1),
        (Dtype::I8, "I8", 1),
        (Dtype::F8E5M2, "F8_E5M2", 1),
        (Dtype::F8E4M3, "F8_E4M3", 1),
        (Dtype::F8E8M0, "F8_E8M0", 1),
        (Dtype::I16, "I16", 2),
        (Dtype::U16, "U16", 2),
        (Dtype::F16, "F16", 2),
        (Dtype::BF16, "BF16", 2),
        (Dtype::I32, "I32", 4),
        (Dtype::U32, "U32", 4),
        (Dtype::F32, "F32", 4),
        (Dtype::F64, "F64", 8),
        (Dtype::I64, "I64", 8),
        (Dtype::U64, "U64", 8),
    ];

    pub fn from_name(s: &str) -> Option<Dtype> {
        Self::NAMES.iter().find(|(_, n, _)| *n == s).map(|(d, _, _)| *d)
    }

    pub fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(d, _, _)| *d == self).map(|(_, n, _)| *n).unwrap_or("?")
    }

    pub fn size(self) -> usize {
        Self::NAMES.iter().find(|(d, _, _)| *d == self).map(|(_, _, s)| *s).unwrap_or(1)
    }
}

impl Dtype {
    /// The ggml type with the same element encoding, for the dtypes that have one.
    /// The float dtype a GGUF tensor of type `g` is stored as (F32, F16 or BF16); `None` for block-quantized and
    /// integer types.
    pub fn from_ggml(g: GgmlType) -> Option<Dtype> {
        match g {
            GgmlType::F32 => Some(Dtype::F32),
            GgmlType::F16 => Some(Dtype::F16),
            GgmlType::BF16 => Some(Dtype::BF16),
            _ => None,
        }
    }

    pub fn as_ggml(self) -> Option<GgmlType> {
        Some(match self {
            Dtype::F32 => GgmlType::F32,
            Dtype::F16 => GgmlType::F16,
            Dtype::BF16 => GgmlType::BF16,
            Dtype::F64 => GgmlType::F64,
            Dtype::I8 => GgmlType::I8,
            Dtype::I16 => GgmlType::I16,
            Dtype::I32 => GgmlType::I32,
            Dtype::I64 => GgmlType::I64,
            _ => return None,
        })
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The element type of a tensor in any supported format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorType {
    Ggml(GgmlType),
    Dtype(Dtype),
    /// An MLX affine-quantized weight: packed uint32 codes plus per-group scales and biases of `scale_dtype`.
    MlxAffine {
        bits: u8,
        group_size: u32,
        scale_dtype: Dtype,
    },
    /// An MLX weight in a floating-point mode (`mxfp4`, `nvfp4`, `mxfp8`): packed uint32 codes plus a uint8 scale
    /// per group.
    MlxFp {
        mode: FpMode,
    },
}

impl TensorType {
    /// Bits per weight, counting scales and biases for MLX affine (4-bit, group 64, bf16: 4.5).
    pub fn bits_per_weight(self) -> f64 {
        match self {
            TensorType::Ggml(t) => t.bits_per_weight(),
            TensorType::Dtype(d) => (d.size() * 8) as f64,
            TensorType::MlxAffine { bits, group_size, scale_dtype } => {
                f64::from(bits) + (2 * scale_dtype.size() * 8) as f64 / f64::from(group_size)
            }
            TensorType::MlxFp { mode } => f64::from(mode.bits()) + 8.0 / mode.group_size() as f64,
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorType::Ggml(t) => write!(f, "{t}"),
            TensorType::Dtype(d) => write!(f, "{d}"),
            TensorType::MlxAffine { bits, group_size, .. } => write!(f, "MLX_Q{bits}_G{group_size}"),
            TensorType::MlxFp { mode } => write!(f, "MLX_{}", mode.name().to_uppercase()),
        }
    }
}
