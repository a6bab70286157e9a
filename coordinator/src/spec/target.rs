//! A rung of the ladder as measured: a GGUF quant level, an MLX checkpoint or a vLLM one. The one identity of a measured
//! output; its name (`Q4_K_M`, `Q4_K_XL`, `MLX-4bit`, `MLX-mixed_4_6`) is what task ids, file names, `evaluation.skip`, gates and
//! the report's `file_type` say.

use std::fmt;

pub use quantfarm_quant::mlx_recipe::MixedRecipe;

use super::{Level, VllmRung};

/// An MLX affine checkpoint: every module at `bits` (`mlx_lm.convert -q --q-bits`), or by one of mlx-lm's mixed
/// recipes (`--quant-predicate mixed_4_6`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MlxRung {
    Bits(u32),
    Mixed(MixedRecipe),
}

impl MlxRung {
    /// `config.json`'s global bits: the rung's, or mlx-lm's default (4) for a recipe made without `--q-bits`.
    pub fn bits(self) -> u32 {
        match self {
            MlxRung::Bits(b) => b,
            MlxRung::Mixed(_) => 4,
        }
    }

    /// The recipe, if any.
    pub fn recipe(self) -> Option<MixedRecipe> {
        match self {
            MlxRung::Bits(_) => None,
            MlxRung::Mixed(r) => Some(r),
        }
    }

    /// The inverse of `Display` (`4bit`, `mixed_4_6`).
    pub fn parse(s: &str) -> Option<MlxRung> {
        match s.strip_suffix("bit") {
            Some(b) => b.parse().ok().map(MlxRung::Bits),
            None => MixedRecipe::parse(s).map(MlxRung::Mixed),
        }
    }
}

impl fmt::Display for MlxRung {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MlxRung::Bits(b) => write!(f, "{b}bit"),
            MlxRung::Mixed(r) => write!(f, "{r}"),
        }
    }
}

/// A model measured against the reference: a GGUF quant level, an MLX checkpoint or a vLLM checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EvalTarget {
    Quant(Level),
    Mlx(MlxRung),
    /// A compressed-tensors checkpoint for vLLM (`vLLM-FP8_DYNAMIC`).
    Vllm(VllmRung),
}

impl fmt::Display for EvalTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvalTarget::Quant(level) => write!(f, "{level}"),
            EvalTarget::Mlx(rung) => write!(f, "MLX-{rung}"),
            EvalTarget::Vllm(rung) => write!(f, "vLLM-{rung}"),
        }
    }
}

impl EvalTarget {
    /// The inverse of `Display` (also the report's artifact `file_type`).
    pub fn parse(s: &str) -> Option<EvalTarget> {
        if let Some(r) = s.strip_prefix("MLX-") {
            return MlxRung::parse(r).map(EvalTarget::Mlx);
        }
        if let Some(r) = s.strip_prefix("vLLM-") {
            return VllmRung::parse(r).map(EvalTarget::Vllm);
        }
        Level::parse(s).map(EvalTarget::Quant)
    }
}
