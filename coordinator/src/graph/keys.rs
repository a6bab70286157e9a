//! Task ids as structured keys (`gguf/2`, `quantize/Q8_0/2`, `verify/quantize/Q8_0/2`, …), parsed back into
//! [`TaskKey`], so the journal stores only ids and results and the messages are rebuilt the same way after a
//! restart.

use std::fmt;

use quantfarm_proto as pb;

use crate::spec::{Level, Peer};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TaskKey {
    Plan,
    Gguf {
        shard: u32,
    },
    Quantize {
        level: Level,
        shard: u32,
    },
    VerifyGguf {
        shard: u32,
    },
    VerifyQuantize {
        level: Level,
        shard: u32,
    },
    Noop {
        n: u32,
    },
    /// Checks the adapter against the base and lists the merged checkpoint's files.
    MergePlan,
    /// One safetensors file of the merged checkpoint.
    Merge {
        file: u32,
    },
    /// The merged checkpoint's config.json, tokenizer files and index.
    MergeSide,
    VerifyMerge {
        file: u32,
    },
    VerifyMergeSide,
    /// One input of the merge check (link 1), as a GGUF file.
    MergeCheck {
        part: CheckPart,
    },
    /// An MLX affine checkpoint of `bits` bits.
    Mlx {
        bits: u32,
    },
    VerifyMlx {
        bits: u32,
    },
    /// Tokenizes the imatrix's calibration text with the reference (GGUF BF16) and counts its chunks.
    ImatrixPlan,
    /// The importance statistics of one chunk group of the calibration text (a part, F64 sums).
    Imatrix {
        group: u32,
    },
    /// The parts added in chunk order into llama.cpp's GGUF imatrix, which the quantize tasks use.
    ImatrixMerge,
    /// Tokenizes the evaluation text with the reference (GGUF BF16) and counts its chunks.
    KldPlan,
    /// The reference's base logits for one chunk group (the chunks llama-perplexity decodes together).
    KldBase {
        group: u32,
    },
    /// One model's KL-divergence statistics on one chunk group.
    Kld {
        target: EvalTarget,
        group: u32,
    },
    /// Greedy continuations of one share of the prompt set (the reference's, or a model's compared with them).
    Greedy {
        subject: Subject,
        share: u32,
    },
    /// The probe suite on the reference or a model.
    Probe {
        subject: Subject,
    },
    /// A peer tool's own base run on the reference (its base-logits file).
    PeerBase {
        peer: Peer,
    },
    /// A peer tool's own KL-divergence run on one quant level.
    PeerKld {
        peer: Peer,
        level: Level,
    },
    /// Greedy continuations of one share of the prompts in mlx-lm, compared with llama.cpp's reference (for the
    /// bf16 weights) or with mlx-lm's bf16 run (for an MLX rung).
    MlxLmGreedy {
        subject: MlxSubject,
        share: u32,
    },
    /// mlx-lm's logits of one chunk group, scored against llama.cpp's base logits of the same group.
    MlxLmKld {
        subject: MlxSubject,
        group: u32,
    },
    /// The probe suite on the model served by `mlx_lm.server`.
    MlxLmProbe {
        subject: MlxSubject,
    },
    /// Gathers every result, applies the gates and signs: run by the coordinator itself.
    Report,
}

/// What mlx-lm runs: the source's bf16 weights as an HF checkpoint (the GGUF BF16's twin: the same weights, another
/// runtime), or an MLX rung. Ordered as the report lists them: the bf16 weights, then the rungs by width.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MlxSubject {
    Bf16,
    Rung { bits: u32 },
}

impl fmt::Display for MlxSubject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MlxSubject::Bf16 => write!(f, "BF16"),
            MlxSubject::Rung { bits } => write!(f, "{}", EvalTarget::Mlx { bits: *bits }),
        }
    }
}

impl MlxSubject {
    pub fn parse(s: &str) -> Option<MlxSubject> {
        match s {
            "BF16" => Some(MlxSubject::Bf16),
            _ => match EvalTarget::parse(s)? {
                EvalTarget::Mlx { bits } => Some(MlxSubject::Rung { bits }),
                EvalTarget::Quant(_) => None,
            },
        }
    }
}

/// The runtime name workers advertise when the mlx-lm helper answers its handshake.
pub const MLX_LM_RUNTIME: &str = "mlx_lm";

/// A model measured against the reference: a GGUF quant level or an MLX checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EvalTarget {
    Quant(Level),
    Mlx { bits: u32 },
}

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

    fn parse(s: &str) -> Option<CheckPart> {
        CheckPart::ALL.into_iter().find(|p| p.name() == s)
    }

    pub(super) fn proto(self) -> pb::MergeCheckPart {
        match self {
            CheckPart::Lora => pb::MergeCheckPart::Lora,
            CheckPart::Base => pb::MergeCheckPart::Base,
            CheckPart::Merged => pb::MergeCheckPart::Merged,
        }
    }

    /// The GGUF file's name after the release's name.
    pub(super) fn file_suffix(self) -> &'static str {
        match self {
            CheckPart::Lora => "adapter-lora.gguf",
            CheckPart::Base => "base-F32.gguf",
            CheckPart::Merged => "merged-F32.gguf",
        }
    }
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

impl fmt::Display for TaskKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskKey::Plan => write!(f, "plan"),
            TaskKey::Gguf { shard } => write!(f, "gguf/{shard}"),
            TaskKey::Quantize { level, shard } => write!(f, "quantize/{level}/{shard}"),
            TaskKey::VerifyGguf { shard } => write!(f, "verify/gguf/{shard}"),
            TaskKey::VerifyQuantize { level, shard } => write!(f, "verify/quantize/{level}/{shard}"),
            TaskKey::Noop { n } => write!(f, "noop/{n}"),
            TaskKey::MergePlan => write!(f, "merge/plan"),
            TaskKey::Merge { file } => write!(f, "merge/{file}"),
            TaskKey::MergeSide => write!(f, "merge/side"),
            TaskKey::VerifyMerge { file } => write!(f, "verify/merge/{file}"),
            TaskKey::VerifyMergeSide => write!(f, "verify/merge/side"),
            TaskKey::MergeCheck { part } => write!(f, "merge-check/{}", part.name()),
            TaskKey::Mlx { bits } => write!(f, "mlx/{bits}"),
            TaskKey::VerifyMlx { bits } => write!(f, "verify/mlx/{bits}"),
            TaskKey::ImatrixPlan => write!(f, "imatrix/plan"),
            TaskKey::Imatrix { group } => write!(f, "imatrix/{group}"),
            TaskKey::ImatrixMerge => write!(f, "imatrix/merge"),
            TaskKey::KldPlan => write!(f, "kld/plan"),
            TaskKey::KldBase { group } => write!(f, "kld-base/{group}"),
            TaskKey::Kld { target, group } => write!(f, "kld/{target}/{group}"),
            TaskKey::Greedy { subject, share } => write!(f, "greedy/{subject}/{share}"),
            TaskKey::Probe { subject } => write!(f, "probe/{subject}"),
            TaskKey::PeerBase { peer } => write!(f, "peer/{}/base", peer.tool()),
            TaskKey::PeerKld { peer, level } => write!(f, "peer/{}/{level}", peer.tool()),
            TaskKey::MlxLmGreedy { subject, share } => write!(f, "mlx-lm/greedy/{subject}/{share}"),
            TaskKey::MlxLmKld { subject, group } => write!(f, "mlx-lm/kld/{subject}/{group}"),
            TaskKey::MlxLmProbe { subject } => write!(f, "mlx-lm/probe/{subject}"),
            TaskKey::Report => write!(f, "report"),
        }
    }
}

impl TaskKey {
    /// The task's family: the first segment of its id (`quantize/Q8_0/0` → `quantize`), the label the metrics page
    /// groups run times by.
    pub fn family(&self) -> &'static str {
        match self {
            TaskKey::Plan => "plan",
            TaskKey::Gguf { .. } => "gguf",
            TaskKey::Quantize { .. } => "quantize",
            TaskKey::VerifyGguf { .. }
            | TaskKey::VerifyQuantize { .. }
            | TaskKey::VerifyMerge { .. }
            | TaskKey::VerifyMergeSide
            | TaskKey::VerifyMlx { .. } => "verify",
            TaskKey::Noop { .. } => "noop",
            TaskKey::MergePlan | TaskKey::Merge { .. } | TaskKey::MergeSide => "merge",
            TaskKey::MergeCheck { .. } => "merge-check",
            TaskKey::Mlx { .. } => "mlx",
            TaskKey::ImatrixPlan | TaskKey::Imatrix { .. } | TaskKey::ImatrixMerge => "imatrix",
            TaskKey::KldPlan | TaskKey::Kld { .. } => "kld",
            TaskKey::KldBase { .. } => "kld-base",
            TaskKey::Greedy { .. } => "greedy",
            TaskKey::Probe { .. } => "probe",
            TaskKey::PeerBase { .. } | TaskKey::PeerKld { .. } => "peer",
            TaskKey::MlxLmGreedy { .. } | TaskKey::MlxLmKld { .. } | TaskKey::MlxLmProbe { .. } => "mlx-lm",
            TaskKey::Report => "report",
        }
    }

    pub fn parse(id: &str) -> Option<TaskKey> {
        let parts: Vec<&str> = id.split('/').collect();
        let num = |s: &str| s.parse::<u32>().ok();
        let level = Level::parse;
        Some(match parts.as_slice() {
            ["plan"] => TaskKey::Plan,
            ["report"] => TaskKey::Report,
            ["gguf", s] => TaskKey::Gguf { shard: num(s)? },
            ["noop", n] => TaskKey::Noop { n: num(n)? },
            ["quantize", l, s] => TaskKey::Quantize { level: level(l)?, shard: num(s)? },
            ["verify", "gguf", s] => TaskKey::VerifyGguf { shard: num(s)? },
            ["verify", "quantize", l, s] => TaskKey::VerifyQuantize { level: level(l)?, shard: num(s)? },
            ["merge", "plan"] => TaskKey::MergePlan,
            ["merge", "side"] => TaskKey::MergeSide,
            ["merge", f] => TaskKey::Merge { file: num(f)? },
            ["verify", "merge", "side"] => TaskKey::VerifyMergeSide,
            ["verify", "merge", f] => TaskKey::VerifyMerge { file: num(f)? },
            ["merge-check", p] => TaskKey::MergeCheck { part: CheckPart::parse(p)? },
            ["mlx", b] => TaskKey::Mlx { bits: num(b)? },
            ["verify", "mlx", b] => TaskKey::VerifyMlx { bits: num(b)? },
            ["imatrix", "plan"] => TaskKey::ImatrixPlan,
            ["imatrix", "merge"] => TaskKey::ImatrixMerge,
            ["imatrix", g] => TaskKey::Imatrix { group: num(g)? },
            ["kld", "plan"] => TaskKey::KldPlan,
            ["kld-base", g] => TaskKey::KldBase { group: num(g)? },
            ["kld", t, g] => TaskKey::Kld { target: EvalTarget::parse(t)?, group: num(g)? },
            ["greedy", t, n] => TaskKey::Greedy { subject: Subject::parse(t)?, share: num(n)? },
            ["probe", t] => TaskKey::Probe { subject: Subject::parse(t)? },
            ["peer", p, "base"] => TaskKey::PeerBase { peer: Peer::parse(p)? },
            ["peer", p, l] => TaskKey::PeerKld { peer: Peer::parse(p)?, level: level(l)? },
            ["mlx-lm", "greedy", t, n] => TaskKey::MlxLmGreedy { subject: MlxSubject::parse(t)?, share: num(n)? },
            ["mlx-lm", "kld", t, g] => TaskKey::MlxLmKld { subject: MlxSubject::parse(t)?, group: num(g)? },
            ["mlx-lm", "probe", t] => TaskKey::MlxLmProbe { subject: MlxSubject::parse(t)? },
            _ => return None,
        })
    }

    /// The worker kind that runs the task (what workers advertise), or `None` for the coordinator's own tasks.
    /// A test checks it against the kind of the message [`build`] makes for the key.
    pub fn worker_kind(&self) -> Option<pb::WorkerKind> {
        use pb::WorkerKind as W;
        match self {
            TaskKey::Plan => Some(W::Plan),
            TaskKey::Gguf { .. } => Some(W::Gguf),
            TaskKey::Quantize { .. } => Some(W::Quantize),
            TaskKey::MergePlan | TaskKey::Merge { .. } | TaskKey::MergeSide | TaskKey::MergeCheck { .. } => {
                Some(W::Merge)
            }
            TaskKey::Mlx { .. } => Some(W::Mlx),
            TaskKey::VerifyGguf { .. }
            | TaskKey::VerifyQuantize { .. }
            | TaskKey::VerifyMerge { .. }
            | TaskKey::VerifyMergeSide
            | TaskKey::VerifyMlx { .. } => Some(W::Verify),
            TaskKey::Noop { .. } => Some(W::Noop),
            TaskKey::Imatrix { .. } | TaskKey::ImatrixMerge => Some(W::Imatrix),
            // A KldPlan task over the calibration text.
            TaskKey::ImatrixPlan | TaskKey::KldPlan | TaskKey::KldBase { .. } | TaskKey::Kld { .. } => Some(W::Kld),
            TaskKey::Greedy { .. } => Some(W::Greedy),
            TaskKey::Probe { .. } => Some(W::Probe),
            TaskKey::PeerBase { .. } | TaskKey::PeerKld { .. } => Some(W::Peer),
            TaskKey::MlxLmGreedy { .. } | TaskKey::MlxLmKld { .. } | TaskKey::MlxLmProbe { .. } => Some(W::MlxLm),
            TaskKey::Report => None,
        }
    }

    /// The runtime a worker must advertise to run the task (a peer tool, mlx-lm), besides its kind.
    pub fn runtime(&self) -> Option<&'static str> {
        match self {
            TaskKey::PeerBase { peer } | TaskKey::PeerKld { peer, .. } => Some(peer.tool()),
            TaskKey::MlxLmGreedy { .. } | TaskKey::MlxLmKld { .. } | TaskKey::MlxLmProbe { .. } => Some(MLX_LM_RUNTIME),
            TaskKey::Plan
            | TaskKey::Gguf { .. }
            | TaskKey::Quantize { .. }
            | TaskKey::VerifyGguf { .. }
            | TaskKey::VerifyQuantize { .. }
            | TaskKey::Noop { .. }
            | TaskKey::MergePlan
            | TaskKey::Merge { .. }
            | TaskKey::MergeSide
            | TaskKey::VerifyMerge { .. }
            | TaskKey::VerifyMergeSide
            | TaskKey::MergeCheck { .. }
            | TaskKey::Mlx { .. }
            | TaskKey::VerifyMlx { .. }
            | TaskKey::ImatrixPlan
            | TaskKey::Imatrix { .. }
            | TaskKey::ImatrixMerge
            | TaskKey::KldPlan
            | TaskKey::KldBase { .. }
            | TaskKey::Kld { .. }
            | TaskKey::Greedy { .. }
            | TaskKey::Probe { .. }
            | TaskKey::Report => None,
        }
    }

    /// The progress stage the task counts towards.
    pub fn stage(&self) -> String {
        match self {
            TaskKey::Plan => "plan".into(),
            TaskKey::Gguf { .. } => "gguf BF16".into(),
            TaskKey::Quantize { level, .. } => format!("quantize {level}"),
            TaskKey::MergePlan | TaskKey::Merge { .. } | TaskKey::MergeSide => "merge".into(),
            TaskKey::MergeCheck { .. } => "merge check".into(),
            TaskKey::Mlx { bits } => format!("mlx {bits}-bit"),
            TaskKey::VerifyGguf { .. }
            | TaskKey::VerifyQuantize { .. }
            | TaskKey::VerifyMerge { .. }
            | TaskKey::VerifyMergeSide
            | TaskKey::VerifyMlx { .. } => "verify".into(),
            TaskKey::Noop { .. } => "noop".into(),
            TaskKey::ImatrixPlan | TaskKey::Imatrix { .. } | TaskKey::ImatrixMerge => "imatrix".into(),
            TaskKey::KldPlan | TaskKey::KldBase { .. } => "kld reference".into(),
            TaskKey::Kld { target, .. } => format!("kld {target}"),
            TaskKey::Greedy { subject, .. } => format!("greedy {subject}"),
            TaskKey::Probe { subject } => format!("probe {subject}"),
            TaskKey::PeerBase { peer } | TaskKey::PeerKld { peer, .. } => peer.tool().to_string(),
            TaskKey::MlxLmGreedy { subject, .. } => format!("mlx-lm greedy {subject}"),
            TaskKey::MlxLmKld { subject, .. } => format!("mlx-lm kld {subject}"),
            TaskKey::MlxLmProbe { subject } => format!("mlx-lm probe {subject}"),
            TaskKey::Report => "report".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use quantfarm_ggml::FileType;

    use super::*;
    use crate::spec::RecipeName;

    fn q(f: FileType) -> Level {
        Level::File(f)
    }

    #[test]
    fn keys_round_trip() {
        const VARIANTS: usize = 28;
        fn variant(k: &TaskKey) -> usize {
            match k {
                TaskKey::Plan => 0,
                TaskKey::Report => 1,
                TaskKey::Gguf { .. } => 2,
                TaskKey::Noop { .. } => 3,
                TaskKey::Quantize { .. } => 4,
                TaskKey::VerifyGguf { .. } => 5,
                TaskKey::VerifyQuantize { .. } => 6,
                TaskKey::MergePlan => 7,
                TaskKey::Merge { .. } => 8,
                TaskKey::MergeSide => 9,
                TaskKey::VerifyMerge { .. } => 10,
                TaskKey::VerifyMergeSide => 11,
                TaskKey::MergeCheck { .. } => 12,
                TaskKey::Mlx { .. } => 13,
                TaskKey::VerifyMlx { .. } => 14,
                TaskKey::ImatrixPlan => 15,
                TaskKey::Imatrix { .. } => 16,
                TaskKey::ImatrixMerge => 17,
                TaskKey::KldPlan => 18,
                TaskKey::KldBase { .. } => 19,
                TaskKey::Kld { .. } => 20,
                TaskKey::Greedy { .. } => 21,
                TaskKey::Probe { .. } => 22,
                TaskKey::PeerBase { .. } => 23,
                TaskKey::PeerKld { .. } => 24,
                TaskKey::MlxLmGreedy { .. } => 25,
                TaskKey::MlxLmKld { .. } => 26,
                TaskKey::MlxLmProbe { .. } => 27,
            }
        }
        let mut covered = std::collections::BTreeSet::new();
        for k in [
            TaskKey::Plan,
            TaskKey::Report,
            TaskKey::Gguf { shard: 3 },
            TaskKey::Noop { n: 7 },
            TaskKey::Quantize { level: q(FileType::Q4_K_M), shard: 0 },
            TaskKey::VerifyGguf { shard: 1 },
            TaskKey::VerifyQuantize { level: q(FileType::Q8_0), shard: 2 },
            TaskKey::MergePlan,
            TaskKey::Merge { file: 1 },
            TaskKey::MergeSide,
            TaskKey::VerifyMerge { file: 0 },
            TaskKey::VerifyMergeSide,
            TaskKey::MergeCheck { part: CheckPart::Lora },
            TaskKey::MergeCheck { part: CheckPart::Merged },
            TaskKey::Greedy { subject: Subject::Adapter, share: 0 },
            TaskKey::Greedy { subject: Subject::MergedF32, share: 1 },
            TaskKey::Mlx { bits: 4 },
            TaskKey::VerifyMlx { bits: 8 },
            TaskKey::KldPlan,
            TaskKey::KldBase { group: 2 },
            TaskKey::Kld { target: EvalTarget::Quant(q(FileType::Q4_K_M)), group: 3 },
            TaskKey::Kld { target: EvalTarget::Mlx { bits: 4 }, group: 0 },
            TaskKey::Greedy { subject: Subject::Reference, share: 1 },
            TaskKey::Greedy { subject: Subject::Model(EvalTarget::Quant(q(FileType::Q8_0))), share: 0 },
            TaskKey::Probe { subject: Subject::Model(EvalTarget::Mlx { bits: 8 }) },
            TaskKey::Probe { subject: Subject::Reference },
            TaskKey::PeerBase { peer: Peer::LlamaPerplexity },
            TaskKey::Quantize { level: Level::Recipe(RecipeName::new("Q4_K_XL").unwrap()), shard: 1 },
            TaskKey::Kld { target: EvalTarget::Quant(Level::Recipe(RecipeName::new("UD-IQ2").unwrap())), group: 0 },
            TaskKey::PeerKld { peer: Peer::LlamaPerplexity, level: q(FileType::Q6_K) },
            TaskKey::ImatrixPlan,
            TaskKey::Imatrix { group: 4 },
            TaskKey::ImatrixMerge,
            TaskKey::MlxLmGreedy { subject: MlxSubject::Bf16, share: 1 },
            TaskKey::MlxLmGreedy { subject: MlxSubject::Rung { bits: 4 }, share: 0 },
            TaskKey::MlxLmKld { subject: MlxSubject::Rung { bits: 8 }, group: 2 },
            TaskKey::MlxLmKld { subject: MlxSubject::Bf16, group: 0 },
            TaskKey::MlxLmProbe { subject: MlxSubject::Rung { bits: 6 } },
            TaskKey::MlxLmProbe { subject: MlxSubject::Bf16 },
        ] {
            assert_eq!(TaskKey::parse(&k.to_string()), Some(k.clone()), "{k}");
            // The family is the id's first segment, by its own match rather than by splitting the string.
            assert_eq!(k.to_string().split('/').next(), Some(k.family()), "{k}");
            covered.insert(variant(&k));
        }
        // `parse` is a match on strings, which the compiler cannot check against the keys: `variant` is, so a new
        // kind stops this test compiling until it has a number there, and fails it until it has an example above.
        assert_eq!(covered, (0..VARIANTS).collect(), "every kind of key has an example");
        assert_eq!(TaskKey::parse("quantize/q8_0/1"), None);
        assert_eq!(TaskKey::parse("gguf/x"), None);
        assert_eq!(TaskKey::parse("mlx-lm/kld/Q8_0/0"), None, "mlx-lm runs BF16 and MLX rungs only");
    }
}
