//! What a measuring task runs: a GGUF quant level, an MLX or a vLLM rung ([`EvalTarget`], the spec's), the reference
//! or a model ([`Subject`]), what mlx-lm loads ([`MlxSubject`]), what transformers loads ([`TfSubject`]), and the merge
//! check's inputs ([`CheckPart`]); each printed as it appears in task ids and parsed back.

use std::fmt;

use quantfarm_proto as pb;

pub use crate::spec::EvalTarget;
use crate::spec::{MlxRung, VllmRung};

/// What mlx-lm runs: the source's bf16 weights as an HF checkpoint (the GGUF BF16's twin: the same weights, another
/// runtime), or an MLX rung. Ordered as the report lists them: the bf16 weights, then the rungs by width.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MlxSubject {
    Bf16,
    Rung { rung: MlxRung },
}

impl fmt::Display for MlxSubject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MlxSubject::Bf16 => write!(f, "BF16"),
            MlxSubject::Rung { rung } => write!(f, "{}", EvalTarget::Mlx(*rung)),
        }
    }
}

impl MlxSubject {
    pub fn parse(s: &str) -> Option<MlxSubject> {
        match s {
            "BF16" => Some(MlxSubject::Bf16),
            _ => match EvalTarget::parse(s)? {
                EvalTarget::Mlx(rung) => Some(MlxSubject::Rung { rung }),
                EvalTarget::Quant(_) | EvalTarget::Vllm(_) => None,
            },
        }
    }
}

/// What transformers runs: the source's bf16 checkpoint (the GGUF BF16's twin: with an adapter, the merge), the merge
/// check's pair (link 1 in transformers, both in f32 as llama.cpp's check: the base with a PEFT adapter applied at run
/// time, unmerged, and the merge), or a vLLM rung with the activations it runs with. Ordered as the report lists
/// them: the bf16 checkpoint, the merge check's pair, then the rungs by scheme, each as saved before weight-only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TfSubject {
    Bf16,
    /// The base with the PEFT adapter at run time, in f32: the merge check's reference.
    Adapter,
    /// The merge in f32 (its bf16 weights widened exactly), compared with [`TfSubject::Adapter`].
    MergedF32,
    Rung {
        rung: VllmRung,
        weight_only: bool,
    },
}

impl fmt::Display for TfSubject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TfSubject::Bf16 => write!(f, "BF16"),
            TfSubject::Adapter => write!(f, "adapter"),
            TfSubject::MergedF32 => write!(f, "merged-f32"),
            TfSubject::Rung { rung, weight_only: false } => write!(f, "{}", EvalTarget::Vllm(*rung)),
            TfSubject::Rung { rung, weight_only: true } => write!(f, "{}-weight-only", EvalTarget::Vllm(*rung)),
        }
    }
}

impl TfSubject {
    pub fn parse(s: &str) -> Option<TfSubject> {
        match s {
            "BF16" => return Some(TfSubject::Bf16),
            "adapter" => return Some(TfSubject::Adapter),
            "merged-f32" => return Some(TfSubject::MergedF32),
            _ => {}
        }
        let (name, weight_only) = match s.strip_suffix("-weight-only") {
            Some(n) => (n, true),
            None => (s, false),
        };
        match EvalTarget::parse(name)? {
            EvalTarget::Vllm(rung) if !weight_only || rung.quantizes_activations() => {
                Some(TfSubject::Rung { rung, weight_only })
            }
            EvalTarget::Vllm(_) | EvalTarget::Quant(_) | EvalTarget::Mlx { .. } => None,
        }
    }

    /// The activations the helper loads the model with.
    pub fn activations(self) -> &'static str {
        match self {
            TfSubject::Rung { weight_only: true, .. } => "weight-only",
            TfSubject::Bf16
            | TfSubject::Adapter
            | TfSubject::MergedF32
            | TfSubject::Rung { weight_only: false, .. } => "as-saved",
        }
    }

    /// The dtype the helper loads the model in: f32 for the merge check's pair (the bf16 weights widened exactly, so
    /// the comparison sees the merge, not bf16 arithmetic: an adapter applied at run time in bf16 rounds on its own
    /// path), bf16 otherwise.
    pub fn dtype(self) -> &'static str {
        match self {
            TfSubject::Adapter | TfSubject::MergedF32 => "float32",
            TfSubject::Bf16 | TfSubject::Rung { .. } => "bfloat16",
        }
    }

    /// Whether its probes run: the bf16 checkpoint and each rung as saved (a weight-only twin differs from it by
    /// its inputs' rounding alone, which its KL divergence measures; each probe task costs a helper's start).
    pub fn runs_probes(self) -> bool {
        match self {
            TfSubject::Bf16 | TfSubject::Rung { weight_only: false, .. } => true,
            TfSubject::Adapter | TfSubject::MergedF32 | TfSubject::Rung { weight_only: true, .. } => false,
        }
    }

    /// Whether it is measured as a model (its logits scored against llama.cpp's base logits); the merge check's pair
    /// is compared by its greedy continuations only, as llama.cpp's.
    pub fn measured_alone(self) -> bool {
        match self {
            TfSubject::Bf16 | TfSubject::Rung { .. } => true,
            TfSubject::Adapter | TfSubject::MergedF32 => false,
        }
    }
}

/// The runtime name workers advertise when the transformers helper answers its handshake.
pub const TRANSFORMERS_RUNTIME: &str = "transformers";

/// The runtime name workers advertise when the mlx-lm helper answers its handshake.
pub const MLX_LM_RUNTIME: &str = "mlx_lm";

/// What a greedy or probe task runs: the reference (the GGUF BF16) or a measured model; or, for the merge check,
/// the base with the adapter at run time and the merge it is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    Reference,
    Model(EvalTarget),
    /// The merge check's reference: the base (F32) with the adapter applied at run time, unmerged.
    Adapter,
    /// The merge check's model: the merge rounded to f32.
    MergedF32,
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Reference => write!(f, "reference"),
            Subject::Model(t) => write!(f, "{t}"),
            Subject::Adapter => write!(f, "adapter"),
            Subject::MergedF32 => write!(f, "merged-f32"),
        }
    }
}

impl Subject {
    pub fn parse(s: &str) -> Option<Subject> {
        match s {
            "reference" => Some(Subject::Reference),
            "adapter" => Some(Subject::Adapter),
            "merged-f32" => Some(Subject::MergedF32),
            _ => EvalTarget::parse(s).map(Subject::Model),
        }
    }

    /// The subject whose continuations this one's are compared with (none for a reference).
    pub fn compared_with(self) -> Option<Subject> {
        match self {
            Subject::Reference | Subject::Adapter => None,
            Subject::Model(_) => Some(Subject::Reference),
            Subject::MergedF32 => Some(Subject::Adapter),
        }
    }
}

/// The merge check's inputs, each a GGUF file made from the base and the adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CheckPart {
    /// The adapter as a GGUF LoRA.
    Lora,
    /// The base widened to F32.
    Base,
    /// The merge rounded to f32.
    Merged,
}

impl CheckPart {
    pub const ALL: [CheckPart; 3] = [CheckPart::Lora, CheckPart::Base, CheckPart::Merged];

    pub fn name(self) -> &'static str {
        match self {
            CheckPart::Lora => "lora",
            CheckPart::Base => "base",
            CheckPart::Merged => "merged",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<CheckPart> {
        CheckPart::ALL.into_iter().find(|p| p.name() == s)
    }

    pub(crate) fn proto(self) -> pb::MergeCheckPart {
        match self {
            CheckPart::Lora => pb::MergeCheckPart::Lora,
            CheckPart::Base => pb::MergeCheckPart::Base,
            CheckPart::Merged => pb::MergeCheckPart::Merged,
        }
    }

    /// The GGUF file's name after the release's name.
    pub(crate) fn file_suffix(self) -> &'static str {
        match self {
            CheckPart::Lora => "adapter-lora.gguf",
            CheckPart::Base => "base-F32.gguf",
            CheckPart::Merged => "merged-F32.gguf",
        }
    }
}
