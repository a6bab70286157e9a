//! A rung of the ladder as measured: a GGUF quant level, an MLX checkpoint or a vLLM one. The one identity of a measured
//! output; its name (`Q4_K_M`, `Q4_K_XL`, `MLX-4bit`, `MLX-mixed_4_6`) is what task ids, file names, `evaluation.skip`, gates and
//! the report's `file_type` say.

use std::fmt;

pub use quantfarm_quant::mlx_fp::FpMode;
pub use quantfarm_quant::mlx_recipe::MixedRecipe;

use super::{Level, VllmRung};

/// An MLX checkpoint: every module affine at `bits` (`mlx_lm.convert -q --q-bits`), by one of mlx-lm's mixed
/// recipes (`--quant-predicate mixed_4_6`), or in one of mlx's floating-point modes (`--q-mode mxfp4`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MlxRung {
    Bits(u32),
    Mixed(MixedRecipe),
    Mode(FpMode),
}

impl MlxRung {
    /// `config.json`'s global bits: the rung's, or mlx-lm's default (4) for a recipe made without `--q-bits`.
    pub fn bits(self) -> u32 {
        match self {
            MlxRung::Bits(b) => b,
            MlxRung::Mixed(_) => 4,
            MlxRung::Mode(m) => m.bits(),
        }
    }

    /// The recipe, if any.
    pub fn recipe(self) -> Option<MixedRecipe> {
        match self {
            MlxRung::Bits(_) | MlxRung::Mode(_) => None,
            MlxRung::Mixed(r) => Some(r),
        }
    }

    /// The floating-point mode, if any.
    pub fn mode(self) -> Option<FpMode> {
        match self {
            MlxRung::Bits(_) | MlxRung::Mixed(_) => None,
            MlxRung::Mode(m) => Some(m),
        }
    }

    /// The inverse of `Display` (`4bit`, `mixed_4_6`, `mxfp4`).
    pub fn parse(s: &str) -> Option<MlxRung> {
        match s.strip_suffix("bit") {
            Some(b) => b.parse().ok().map(MlxRung::Bits),
            None => MixedRecipe::parse(s).map(MlxRung::Mixed).or_else(|| FpMode::parse(s).map(MlxRung::Mode)),
        }
    }
}

impl fmt::Display for MlxRung {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MlxRung::Bits(b) => write!(f, "{b}bit"),
            MlxRung::Mixed(r) => write!(f, "{r}"),
            MlxRung::Mode(m) => f.write_str(m.name()),
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
