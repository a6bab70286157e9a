//! A rung of the ladder as measured: a GGUF quant level or an MLX checkpoint. The one identity of a measured
//! output; its name (`Q4_K_M`, `Q4_K_XL`, `MLX-4bit`) is what task ids, file names, `evaluation.skip`, gates and
//! the report's `file_type` say.

use std::fmt;

use super::Level;

/// A model measured against the reference: a GGUF quant level or an MLX checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EvalTarget {
    Quant(Level),
    Mlx { bits: u32 },
}

impl fmt::Display for EvalTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvalTarget::Quant(level) => write!(f, "{level}"),
            EvalTarget::Mlx { bits } => write!(f, "MLX-{bits}bit"),
        }
    }
}

impl EvalTarget {
    /// The inverse of `Display` (also the report's artifact `file_type`).
    pub fn parse(s: &str) -> Option<EvalTarget> {
        if let Some(b) = s.strip_prefix("MLX-").and_then(|r| r.strip_suffix("bit")) {
            return Some(EvalTarget::Mlx { bits: b.parse().ok()? });
        }
        Level::parse(s).map(EvalTarget::Quant)
    }
}
