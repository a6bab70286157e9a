//! A rung of the ladder as measured: a GGUF quant level, an MLX checkpoint or a vLLM one. The one identity of a measured
//! output; its name (`Q4_K_M`, `Q4_K_XL`, `MLX-4bit`) is what task ids, file names, `evaluation.skip`, gates and
//! the report's `file_type` say.

use std::fmt;

use super::{Level, VllmRung};

/// A model measured against the reference: a GGUF quant level, an MLX checkpoint or a vLLM checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EvalTarget {
    Quant(Level),
    Mlx {
        bits: u32,
    },
    /// A compressed-tensors checkpoint for vLLM (`vLLM-FP8_DYNAMIC`).
    Vllm(VllmRung),
}

impl fmt::Display for EvalTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvalTarget::Quant(level) => write!(f, "{level}"),
            EvalTarget::Mlx { bits } => write!(f, "MLX-{bits}bit"),
            EvalTarget::Vllm(rung) => write!(f, "vLLM-{rung}"),
        }
    }
}

impl EvalTarget {
    /// The inverse of `Display` (also the report's artifact `file_type`).
    pub fn parse(s: &str) -> Option<EvalTarget> {
        if let Some(b) = s.strip_prefix("MLX-").and_then(|r| r.strip_suffix("bit")) {
            return Some(EvalTarget::Mlx { bits: b.parse().ok()? });
        }
        if let Some(r) = s.strip_prefix("vLLM-") {
            return VllmRung::parse(r).map(EvalTarget::Vllm);
        }
        Level::parse(s).map(EvalTarget::Quant)
    }
}
