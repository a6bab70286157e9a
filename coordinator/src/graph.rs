//! The task graph of a release: which tasks exist (before and after planning), what each depends on, how costly
//! it is (for critical-path priorities), and the concrete task message a worker receives once its dependencies
//! have results.
//!
//! Task ids are structured keys (`gguf/2`, `quantize/Q8_0/2`, `verify/quantize/Q8_0/2`, …), parsed back into
//! [`TaskKey`], so the journal stores only ids and results and the messages are rebuilt the same way after a
//! restart. Output locations are content-addressed: a folder named by the sha256 of everything the output
//! depends on, so a task run twice writes (or finds) the same object.

use std::collections::HashMap;
use std::fmt;

use quantfarm_ggml::split::split_file_name;
use quantfarm_ggml::FileType;
use quantfarm_proto::{self as pb, task, task_result, verify_task};
use quantfarm_store::Location;
use sha2::{Digest, Sha256};

use crate::spec::{ImatrixSource, Peer, ReleaseSpec};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TaskKey {
    Plan,
    Gguf {
        shard: u32,
    },
    Quantize {
        level: FileType,
        shard: u32,
    },
    VerifyGguf {
        shard: u32,
    },
    VerifyQuantize {
        level: FileType,
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
        level: FileType,
    },
    /// Gathers every result, applies the gates and signs: run by the coordinator itself.
    Report,
}

/// A model measured against the reference: a GGUF quant level or an MLX checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EvalTarget {
    Quant(FileType),
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

    fn proto(self) -> pb::MergeCheckPart {
        match self {
            CheckPart::Lora => pb::MergeCheckPart::Lora,
            CheckPart::Base => pb::MergeCheckPart::Base,
            CheckPart::Merged => pb::MergeCheckPart::Merged,
        }
    }

    /// The GGUF file's name after the release's name.
    fn file_suffix(self) -> &'static str {
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
        FileType::from_name(s).filter(|f| f.name() == s).map(EvalTarget::Quant)
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
            TaskKey::Report => write!(f, "report"),
        }
    }
}

impl TaskKey {
    pub fn parse(id: &str) -> Option<TaskKey> {
        let parts: Vec<&str> = id.split('/').collect();
        let num = |s: &str| s.parse::<u32>().ok();
        let level = |s: &str| FileType::from_name(s).filter(|f| f.name() == s);
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
            TaskKey::Report => None,
        }
    }

    /// The runtime a worker must advertise to run the task (a peer tool), besides its kind.
    pub fn runtime(&self) -> Option<&'static str> {
        match self {
            TaskKey::PeerBase { peer } | TaskKey::PeerKld { peer, .. } => Some(peer.tool()),
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
            TaskKey::Report => "report".into(),
        }
    }
}

/// A task as the scheduler needs it: identity, dependencies, and an estimated cost (bytes handled).
#[derive(Clone, Debug)]
pub struct TaskDef {
    pub key: TaskKey,
    pub deps: Vec<TaskKey>,
    pub cost: u64,
}

/// What the graph needs to know about its release.
pub struct Ctx<'a> {
    pub spec: &'a ReleaseSpec,
    /// The source, resolved against the submitter's folder.
    pub source: &'a str,
    /// The importance matrix, or its calibration text when the farm computes it, resolved likewise ("" for none).
    pub imatrix: &'a str,
    /// The adapter merged into the source, resolved likewise ("" for none).
    pub adapter: &'a str,
    /// The evaluation's inputs, resolved likewise.
    pub eval: &'a EvalInputs,
    pub store: &'a Location,
}

/// The evaluation's input files, resolved against the submitter's folder ("" for none).
#[derive(Clone, Debug, Default)]
pub struct EvalInputs {
    pub text: String,
    pub prompts: String,
    pub probes: String,
}

/// The tasks a release starts with: the merge plan when there is an adapter, else planning (and the scheduler's
/// benchmark no-ops).
pub fn initial(ctx: &Ctx) -> Vec<TaskDef> {
    let mut out = Vec::new();
    if !ctx.adapter.is_empty() {
        out.push(TaskDef { key: TaskKey::MergePlan, deps: vec![], cost: 1 });
    } else if ctx.spec.converts() {
        out.push(TaskDef { key: TaskKey::Plan, deps: vec![], cost: 1 });
    }
    if let Some(noop) = &ctx.spec.outputs.noop {
        for n in 0..noop.tasks {
            out.push(TaskDef { key: TaskKey::Noop { n }, deps: vec![], cost: noop.sleep_ms as u64 + 1 });
        }
    }
    if !ctx.spec.converts() {
        let deps = out.iter().map(|t| t.key.clone()).collect();
        out.push(TaskDef { key: TaskKey::Report, deps, cost: 1 });
    }
    out
}

/// After the merge plan: one merge task per safetensors file and one for the side files, each with its
/// verification, then planning the conversions from the merged checkpoint; and, with prompts to check it on, the
/// merge check (link 1): its three GGUF inputs, then per prompt share the base with the adapter at run time and the
/// merge compared with it.
pub fn expand_merge(ctx: &Ctx, mp: &pb::MergePlanResult) -> Vec<TaskDef> {
    let mut out = Vec::new();
    let mut merges = Vec::new();
    for (file, bytes) in (0..mp.files.len() as u32).zip(mp.file_bytes.iter().copied().chain(std::iter::repeat(1))) {
        let m = TaskKey::Merge { file };
        out.push(TaskDef { key: m.clone(), deps: vec![TaskKey::MergePlan], cost: bytes });
        out.push(TaskDef { key: TaskKey::VerifyMerge { file }, deps: vec![m.clone()], cost: bytes });
        merges.push(m);
    }
    out.push(TaskDef { key: TaskKey::MergeSide, deps: vec![TaskKey::MergePlan], cost: 1 });
    out.push(TaskDef { key: TaskKey::VerifyMergeSide, deps: vec![TaskKey::MergeSide], cost: 1 });
    merges.push(TaskKey::MergeSide);
    out.push(TaskDef { key: TaskKey::Plan, deps: merges, cost: 1 });
    if let Some(e) = merge_checked(ctx, mp) {
        // F32 is twice the bytes of a bf16 base.
        let cost = 2 * mp.file_bytes.iter().sum::<u64>().max(1);
        for part in CheckPart::ALL {
            out.push(TaskDef { key: TaskKey::MergeCheck { part }, deps: vec![TaskKey::MergePlan], cost });
        }
        let part = |part| TaskKey::MergeCheck { part };
        for share in 0..e.prompt_shares {
            let reference = TaskKey::Greedy { subject: Subject::Adapter, share };
            out.push(TaskDef {
                key: reference.clone(),
                deps: vec![part(CheckPart::Lora), part(CheckPart::Base)],
                cost,
            });
            let key = TaskKey::Greedy { subject: Subject::MergedF32, share };
            out.push(TaskDef { key, deps: vec![reference, part(CheckPart::Merged)], cost });
        }
    }
    out
}

/// The evaluation settings when the release checks its merge: it has an adapter, prompts to check it on, and the
/// adapter is one llama.cpp can apply at run time — not an embedding LoRA on a base with tied embeddings (llama.cpp
/// would apply it to the output layer too; the merge unties them, `mp.untied`): then the report says why the check
/// was not made and the `merge` gate fails with that reason.
fn merge_checked<'a>(ctx: &Ctx<'a>, mp: &pb::MergePlanResult) -> Option<&'a crate::spec::Evaluation> {
    let e = ctx.spec.evaluation.as_ref()?;
    (!ctx.adapter.is_empty() && e.prompts.is_some() && !mp.untied).then_some(e)
}

/// The merge check's measurements, which the report waits for.
fn merge_check_measured(ctx: &Ctx, mp: &pb::MergePlanResult) -> Vec<TaskKey> {
    let shares = merge_checked(ctx, mp).map_or(0, |e| e.prompt_shares);
    (0..shares).map(|share| TaskKey::Greedy { subject: Subject::MergedF32, share }).collect()
}

/// Everything after planning, from the plan's inventory: per split file a conversion and its verification, per
/// (level, split file) a quantization and its verification, per MLX bit width a checkpoint and its verification,
/// then the report over all of them (and over the merge's verifications, when there was one).
pub fn expand(ctx: &Ctx, plan: &pb::PlanResult, results: &Results) -> Vec<TaskDef> {
    let shard_bytes: Vec<u64> = plan
        .shards
        .iter()
        .map(|r| plan.tensors[r.start as usize..r.end as usize].iter().map(|t| t.bytes).sum())
        .collect();
    let n = if ctx.spec.outputs.gguf.is_some() { shard_bytes.len() as u32 } else { 0 };
    let mut out = Vec::new();
    let mut verifies = Vec::new();
    if let Ok(mp) = merge_plan_of(results) {
        verifies.extend((0..mp.files.len() as u32).map(|file| TaskKey::VerifyMerge { file }));
        verifies.push(TaskKey::VerifyMergeSide);
        verifies.extend(merge_check_measured(ctx, mp));
    }
    for &bits in ctx.spec.mlx_bits() {
        let bytes = plan.source_bytes;
        out.push(TaskDef { key: TaskKey::Mlx { bits }, deps: vec![TaskKey::Plan], cost: bytes });
        out.push(TaskDef { key: TaskKey::VerifyMlx { bits }, deps: vec![TaskKey::Mlx { bits }], cost: bytes });
        verifies.push(TaskKey::VerifyMlx { bits });
    }
    let ggufs: Vec<TaskKey> = (0..n).map(|shard| TaskKey::Gguf { shard }).collect();
    for shard in 0..n {
        let bytes = shard_bytes[shard as usize];
        out.push(TaskDef { key: TaskKey::Gguf { shard }, deps: vec![TaskKey::Plan], cost: bytes });
        let v = TaskKey::VerifyGguf { shard };
        out.push(TaskDef { key: v.clone(), deps: vec![TaskKey::Gguf { shard }], cost: bytes });
        verifies.push(v);
    }
    let mut quant_deps = ggufs.clone();
    if computes_imatrix(ctx) && n > 0 {
        // The merge waits for the plan; the plan's result adds the chunk groups before it.
        out.push(TaskDef { key: TaskKey::ImatrixPlan, deps: ggufs.clone(), cost: plan.source_bytes });
        out.push(TaskDef { key: TaskKey::ImatrixMerge, deps: vec![TaskKey::ImatrixPlan], cost: 1 });
        quant_deps.push(TaskKey::ImatrixMerge);
    }
    for level in ctx.spec.quants() {
        for shard in 0..n {
            let bytes = shard_bytes[shard as usize] * 2;
            let q = TaskKey::Quantize { level: level.0, shard };
            out.push(TaskDef { key: q.clone(), deps: quant_deps.clone(), cost: bytes });
            let v = TaskKey::VerifyQuantize { level: level.0, shard };
            out.push(TaskDef { key: v.clone(), deps: vec![q], cost: bytes });
            verifies.push(v);
        }
    }
    if let (Some(e), true) = (&ctx.spec.evaluation, n > 0) {
        let cost = plan.source_bytes;
        if e.text.is_some() {
            // The report waits for the KL-divergence plan; the plan's result adds the chunk tasks before it.
            out.push(TaskDef { key: TaskKey::KldPlan, deps: ggufs.clone(), cost });
            verifies.push(TaskKey::KldPlan);
        }
        let targets = eval_targets(ctx);
        // The reference's continuations are only run for models to compare with them.
        if e.prompts.is_some() && !targets.is_empty() {
            for share in 0..e.prompt_shares {
                let reference = TaskKey::Greedy { subject: Subject::Reference, share };
                out.push(TaskDef { key: reference.clone(), deps: ggufs.clone(), cost });
                for &t in &targets {
                    let key = TaskKey::Greedy { subject: Subject::Model(t), share };
                    let mut deps = vec![reference.clone()];
                    deps.extend(model_tasks(t, n));
                    out.push(TaskDef { key: key.clone(), deps, cost });
                    verifies.push(key);
                }
            }
        }
        for &peer in &e.peers {
            // After the KL-divergence plan: its text checksum names the peer's base file.
            let base = TaskKey::PeerBase { peer };
            out.push(TaskDef { key: base.clone(), deps: vec![TaskKey::KldPlan], cost });
            for level in ctx.spec.quants().iter().filter(|l| ctx.spec.measures(l.0.name())) {
                let key = TaskKey::PeerKld { peer, level: level.0 };
                let mut deps = vec![base.clone()];
                deps.extend(model_tasks(EvalTarget::Quant(level.0), n));
                out.push(TaskDef { key: key.clone(), deps, cost });
                verifies.push(key);
            }
        }
        if e.probes.is_some() {
            let reference = TaskKey::Probe { subject: Subject::Reference };
            out.push(TaskDef { key: reference.clone(), deps: ggufs.clone(), cost });
            verifies.push(reference);
            for &t in &targets {
                let key = TaskKey::Probe { subject: Subject::Model(t) };
                out.push(TaskDef { key: key.clone(), deps: model_tasks(t, n), cost });
                verifies.push(key);
            }
        }
    }
    if let Some(noop) = &ctx.spec.outputs.noop {
        verifies.extend((0..noop.tasks).map(|n| TaskKey::Noop { n }));
    }
    out.push(TaskDef { key: TaskKey::Report, deps: verifies, cost: 1 });
    out
}

/// The tasks that make a measured model (every split file of a quant level, or the MLX checkpoint).
fn model_tasks(target: EvalTarget, n_shards: u32) -> Vec<TaskKey> {
    match target {
        EvalTarget::Quant(level) => (0..n_shards).map(|shard| TaskKey::Quantize { level, shard }).collect(),
        EvalTarget::Mlx { bits } => vec![TaskKey::Mlx { bits }],
    }
}

/// The models measured against the reference: every GGUF quant level, then every MLX checkpoint, less those the
/// release skips (`evaluation.skip`).
pub fn eval_targets(ctx: &Ctx) -> Vec<EvalTarget> {
    let quants = ctx.spec.quants().iter().map(|q| EvalTarget::Quant(q.0));
    quants
        .chain(ctx.spec.mlx_bits().iter().map(|&bits| EvalTarget::Mlx { bits }))
        .filter(|t| ctx.spec.measures(&t.to_string()))
        .collect()
}

/// Whether the farm computes the quants' importance matrix from a text.
fn computes_imatrix(ctx: &Ctx) -> bool {
    matches!(ctx.spec.imatrix(), Some(ImatrixSource::Text { .. }))
}

/// After the imatrix plan: one task per chunk group of the calibration text. Returns them, and the merge's new
/// dependencies.
pub fn expand_imatrix(kp: &pb::KldPlanResult, results: &Results) -> (Vec<TaskDef>, Vec<TaskKey>) {
    let cost = plan_of(results).map_or(1, |p| p.source_bytes);
    let groups: Vec<TaskKey> =
        (0..kp.n_chunks.div_ceil(kp.n_seq.max(1))).map(|group| TaskKey::Imatrix { group }).collect();
    let defs = groups.iter().map(|k| TaskDef { key: k.clone(), deps: vec![TaskKey::ImatrixPlan], cost }).collect();
    (defs, groups)
}

/// After the KL-divergence plan: per chunk group the reference's base logits, and per (model, group) its
/// statistics. Returns the tasks and the ones the report must wait for.
pub fn expand_kld(ctx: &Ctx, kp: &pb::KldPlanResult, results: &Results) -> (Vec<TaskDef>, Vec<TaskKey>) {
    let cost = plan_of(results).map_or(1, |p| p.source_bytes);
    let n_shards = plan_of(results).map_or(0, |p| p.shards.len() as u32);
    let groups = kp.n_chunks.div_ceil(kp.n_seq.max(1));
    let mut out = Vec::new();
    let mut measured = Vec::new();
    for group in 0..groups {
        out.push(TaskDef { key: TaskKey::KldBase { group }, deps: vec![TaskKey::KldPlan], cost });
    }
    for target in eval_targets(ctx) {
        let model = model_tasks(target, n_shards);
        for group in 0..groups {
            let key = TaskKey::Kld { target, group };
            let mut deps = vec![TaskKey::KldBase { group }];
            deps.extend(model.iter().cloned());
            out.push(TaskDef { key: key.clone(), deps, cost });
            measured.push(key);
        }
    }
    (out, measured)
}

/// Critical-path priorities: a task's cost plus the most expensive chain of tasks that wait on it, so the
/// scheduler starts the work that gates the release's end first.
pub fn priorities(tasks: &[TaskDef]) -> HashMap<TaskKey, u64> {
    let mut dependents: HashMap<&TaskKey, Vec<&TaskDef>> = HashMap::new();
    for t in tasks {
        for d in &t.deps {
            dependents.entry(d).or_default().push(t);
        }
    }
    let mut memo: HashMap<TaskKey, u64> = HashMap::new();
    fn visit<'a>(
        t: &'a TaskDef,
        dependents: &HashMap<&TaskKey, Vec<&'a TaskDef>>,
        memo: &mut HashMap<TaskKey, u64>,
    ) -> u64 {
        if let Some(&p) = memo.get(&t.key) {
            return p;
        }
        let tail =
            dependents.get(&t.key).map_or(0, |ds| ds.iter().map(|d| visit(d, dependents, memo)).max().unwrap_or(0));
        let p = t.cost.saturating_add(tail);
        memo.insert(t.key.clone(), p);
        p
    }
    for t in tasks {
        visit(t, &dependents, &mut memo);
    }
    memo
}

/// The output a task makes at a content-addressed URL, for the kinds that make one.
pub fn output_url(t: &pb::Task) -> Option<&str> {
    t.kind.as_ref()?.output()
}

/// For `synthetic:NAME` sources: the versioned name of the built-in model, or why NAME is unknown.
pub fn synthetic_name(source: &str) -> Option<Result<&'static str, String>> {
    let name = source.strip_prefix("synthetic:")?;
    Some(pb::synthetic_model(name).ok_or_else(|| {
        let known: Vec<&str> = pb::SYNTHETIC_MODELS.iter().map(|(n, _)| *n).collect();
        format!("unknown synthetic model {name:?} (known: {})", known.join(", "))
    }))
}

/// Where an output lives: `artifacts/HASH/NAME` in the store, `HASH` the short sha256 of `identity` (everything
/// the output's bytes depend on, led by a versioned tag of the recipe), so a task made twice writes or finds the
/// same object. The one place that names an artifact.
fn artifact(ctx: &Ctx, identity: &[&str], name: &str) -> Result<Location, String> {
    let folder = short_hash(identity);
    ctx.store.child(&format!("artifacts/{folder}/{name}")).map_err(|e| e.to_string())
}

fn short_hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update(b"\n");
    }
    quantfarm_store::hex(&h.finalize()[..16])
}

fn split_text(rule: &Option<pb::SplitRule>) -> String {
    match rule.as_ref().and_then(|r| r.rule.as_ref()) {
        None => "one file".into(),
        Some(pb::split_rule::Rule::MaxTensors(n)) => format!("max_tensors {n}"),
        Some(pb::split_rule::Rule::MaxBytes(n)) => format!("max_bytes {n}"),
    }
}

fn file_name(prefix: &str, shard: u32, n: u32) -> String {
    if n == 1 {
        format!("{prefix}.gguf")
    } else {
        split_file_name(prefix, shard as u16, n as u16)
    }
}

/// Looks up the results of finished tasks.
pub type Results<'a> = dyn Fn(&TaskKey) -> Option<&'a pb::TaskResult> + 'a;

fn plan_of<'a>(results: &Results<'a>) -> Result<&'a pb::PlanResult, String> {
    match results(&TaskKey::Plan).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::Plan(p)) => Ok(p),
        _ => Err("the plan task has no plan result".into()),
    }
}

fn merge_plan_of<'a>(results: &Results<'a>) -> Result<&'a pb::MergePlanResult, String> {
    match results(&TaskKey::MergePlan).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::MergePlan(p)) => Ok(p),
        _ => Err("the merge-plan task has no merge plan result".into()),
    }
}

/// The merged checkpoint's folder: content-addressed by the merge's inputs and plan.
fn merged_folder(ctx: &Ctx, results: &Results) -> Result<Location, String> {
    let mp = merge_plan_of(results)?;
    artifact(ctx, &["quantfarm merge v1", &mp.inputs_identity, &mp.plan_digest], &format!("{}-merged", ctx.spec.name))
}

/// The model the conversions read: the merged checkpoint when there is an adapter, else the source.
fn model_source(ctx: &Ctx, results: &Results) -> Result<String, String> {
    if ctx.adapter.is_empty() {
        Ok(ctx.source.to_string())
    } else {
        Ok(merged_folder(ctx, results)?.to_string())
    }
}

fn merge_task(ctx: &Ctx, results: &Results, file: Option<u32>) -> Result<pb::MergeTask, String> {
    let mp = merge_plan_of(results)?;
    let folder = merged_folder(ctx, results)?;
    let output = match file {
        Some(f) => {
            let name = mp.files.get(f as usize).ok_or_else(|| format!("the merge plan has no file {f}"))?;
            folder.child(name).map_err(|e| e.to_string())?
        }
        None => folder,
    };
    Ok(pb::MergeTask {
        base: ctx.source.to_string(),
        adapter: ctx.adapter.to_string(),
        base_name: ctx.spec.base_name.clone().unwrap_or_default(),
        plan_digest: mp.plan_digest.clone(),
        file: file.unwrap_or(0),
        side_files: file.is_none(),
        output: output.to_string(),
    })
}

fn mlx_task(ctx: &Ctx, results: &Results, bits: u32) -> Result<pb::MlxTask, String> {
    let plan = plan_of(results)?;
    let group_size = ctx.spec.outputs.mlx.as_ref().map_or(64, |m| m.group_size);
    let identity = ["quantfarm mlx v1", &bits.to_string(), &group_size.to_string(), &plan.source_identity];
    let output = artifact(ctx, &identity, &format!("{}-MLX-{bits}bit", ctx.spec.prefix()))?;
    Ok(pb::MlxTask { source: model_source(ctx, results)?, bits, group_size, output: output.to_string() })
}

fn artifact_of<'a>(results: &Results<'a>, key: &TaskKey) -> Result<&'a pb::Artifact, String> {
    match results(key).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::Artifact(a)) => a.artifact.as_ref().ok_or_else(|| format!("{key}: empty artifact")),
        _ => Err(format!("{key} has no artifact result")),
    }
}

fn gguf_task(ctx: &Ctx, results: &Results, shard: u32) -> Result<pb::GgufShardTask, String> {
    let plan = plan_of(results)?;
    let n = plan.shards.len() as u32;
    let split = ctx.spec.split_rule();
    let name = file_name(&format!("{}-BF16", ctx.spec.prefix()), shard, n);
    let output = artifact(
        ctx,
        &["quantfarm gguf-bf16 v1", &plan.source_identity, &plan.plan_digest, &split_text(&split)],
        &name,
    )?;
    Ok(pb::GgufShardTask {
        source: model_source(ctx, results)?,
        plan_digest: plan.plan_digest.clone(),
        split,
        shard,
        n_shards: n,
        output: output.to_string(),
    })
}

fn quantize_task(ctx: &Ctx, results: &Results, level: FileType, shard: u32) -> Result<pb::QuantizeTask, String> {
    let plan = plan_of(results)?;
    let n = plan.shards.len() as u32;
    let inputs: Vec<&pb::Artifact> =
        (0..n).map(|s| artifact_of(results, &TaskKey::Gguf { shard: s })).collect::<Result<_, _>>()?;
    let (imatrix, imatrix_sha256) = match ctx.spec.imatrix() {
        None => (String::new(), String::new()),
        Some(ImatrixSource::File(_)) => (ctx.imatrix.to_string(), plan.imatrix_sha256.clone()),
        Some(ImatrixSource::Text { .. }) => {
            let a = artifact_of(results, &TaskKey::ImatrixMerge)?;
            (a.url.clone(), a.sha256.clone())
        }
    };
    let mut parts = vec!["quantfarm quantize v1", level.name()];
    parts.extend(inputs.iter().map(|a| a.sha256.as_str()));
    if !imatrix.is_empty() {
        parts.push("imatrix");
        parts.push(&imatrix_sha256);
    }
    let name = file_name(&format!("{}-{}", ctx.spec.prefix(), level.name()), shard, n);
    let output = artifact(ctx, &parts, &name)?;
    Ok(pb::QuantizeTask {
        input: inputs[0].url.clone(),
        shard,
        n_shards: n,
        file_type: level.name().to_string(),
        output: output.to_string(),
        imatrix,
        imatrix_sha256,
    })
}

fn imatrix_settings(ctx: &Ctx) -> Result<pb::KldSettings, String> {
    match ctx.spec.imatrix() {
        Some(ImatrixSource::Text { chunks, ctx: c, batch, .. }) => Ok(pb::KldSettings {
            text: ctx.imatrix.to_string(),
            ctx: *c,
            batch: *batch,
            max_chunks: chunks.unwrap_or(0),
        }),
        _ => Err("the release computes no importance matrix".into()),
    }
}

fn imatrix_plan_of<'a>(results: &Results<'a>) -> Result<&'a pb::KldPlanResult, String> {
    match results(&TaskKey::ImatrixPlan).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::KldPlan(p)) => Ok(p),
        _ => Err("the imatrix/plan task has no plan".into()),
    }
}

/// The calibration text's name as recorded in the file (llama-imatrix records `-f` as given; the farm, the name).
fn imatrix_dataset(ctx: &Ctx) -> Result<String, String> {
    Ok(Location::parse(ctx.imatrix).map_err(|e| e.to_string())?.file_name().to_string())
}

fn imatrix_task(ctx: &Ctx, results: &Results, group: u32) -> Result<pb::ImatrixTask, String> {
    let kp = imatrix_plan_of(results)?;
    let settings = imatrix_settings(ctx)?;
    let first = group * kp.n_seq;
    if first >= kp.n_chunks {
        return Err(format!("imatrix chunk group {group} starts past the text's {} chunks", kp.n_chunks));
    }
    let n_chunks = kp.n_seq.min(kp.n_chunks - first);
    let reference = reference_of(results)?;
    let (ctx_s, batch_s, first_s, n_s) =
        (settings.ctx.to_string(), settings.batch.to_string(), first.to_string(), n_chunks.to_string());
    let dataset = imatrix_dataset(ctx)?;
    let name = format!("{}-imatrix-{first:05}-{n_chunks}.part.gguf", ctx.spec.prefix());
    let output = artifact(
        ctx,
        &[
            "quantfarm imatrix-part v1",
            &kp.text_sha256,
            &kp.tokens_sha256,
            &dataset,
            &ctx_s,
            &batch_s,
            &first_s,
            &n_s,
            &reference.sha256,
        ],
        &name,
    )?;
    Ok(pb::ImatrixTask {
        reference: reference.url.clone(),
        settings: Some(settings),
        first_chunk: first,
        n_chunks,
        tokens_sha256: kp.tokens_sha256.clone(),
        dataset,
        output: output.to_string(),
    })
}

fn imatrix_merge_task(ctx: &Ctx, results: &Results) -> Result<pb::ImatrixMergeTask, String> {
    let kp = imatrix_plan_of(results)?;
    let groups = kp.n_chunks.div_ceil(kp.n_seq.max(1));
    let parts: Vec<pb::Artifact> = (0..groups)
        .map(|group| artifact_of(results, &TaskKey::Imatrix { group }).cloned())
        .collect::<Result<_, _>>()?;
    let mut id = vec!["quantfarm imatrix v1"];
    id.extend(parts.iter().map(|a| a.sha256.as_str()));
    let name = format!("{}-imatrix.gguf", ctx.spec.prefix());
    let output = artifact(ctx, &id, &name)?;
    Ok(pb::ImatrixMergeTask { parts, output: output.to_string() })
}

fn kld_plan_of<'a>(results: &Results<'a>) -> Result<&'a pb::KldPlanResult, String> {
    match results(&TaskKey::KldPlan).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::KldPlan(p)) => Ok(p),
        _ => Err("the kld/plan task has no KL-divergence plan".into()),
    }
}

fn kld_settings(ctx: &Ctx) -> Result<pb::KldSettings, String> {
    let e = ctx.spec.evaluation.as_ref().ok_or("the release has no evaluation section")?;
    Ok(pb::KldSettings { text: ctx.eval.text.clone(), ctx: e.ctx, batch: e.batch, max_chunks: e.chunks.unwrap_or(0) })
}

/// The reference: the GGUF BF16's first file (llama.cpp finds the others beside it).
fn reference_of<'a>(results: &Results<'a>) -> Result<&'a pb::Artifact, String> {
    artifact_of(results, &TaskKey::Gguf { shard: 0 })
}

fn kld_base_task(ctx: &Ctx, results: &Results, group: u32) -> Result<pb::KldBaseTask, String> {
    let plan = plan_of(results)?;
    let kp = kld_plan_of(results)?;
    let settings = kld_settings(ctx)?;
    let first = group * kp.n_seq;
    if first >= kp.n_chunks {
        return Err(format!("chunk group {group} starts past the text's {} chunks", kp.n_chunks));
    }
    let n_chunks = kp.n_seq.min(kp.n_chunks - first);
    let refs: Vec<&pb::Artifact> = (0..plan.shards.len() as u32)
        .map(|shard| artifact_of(results, &TaskKey::Gguf { shard }))
        .collect::<Result<_, _>>()?;
    let (ctx_s, batch_s, first_s, n_s) =
        (settings.ctx.to_string(), settings.batch.to_string(), first.to_string(), n_chunks.to_string());
    let mut parts = vec!["quantfarm kld-base v1", &kp.text_sha256, &kp.tokens_sha256, &ctx_s, &batch_s, &first_s, &n_s];
    parts.extend(refs.iter().map(|a| a.sha256.as_str()));
    let name = format!("{}-BF16-kld-base-{first:05}-{n_chunks}.logits", ctx.spec.prefix());
    let output = artifact(ctx, &parts, &name)?;
    Ok(pb::KldBaseTask {
        reference: refs[0].url.clone(),
        settings: Some(settings),
        first_chunk: first,
        n_chunks,
        tokens_sha256: kp.tokens_sha256.clone(),
        output: output.to_string(),
    })
}

/// The artifact a subject runs: the GGUF BF16 (first file), a quant level's first file, an MLX folder, or one of
/// the merge check's F32 GGUFs.
fn model_of<'a>(results: &Results<'a>, subject: Subject) -> Result<&'a pb::Artifact, String> {
    match subject {
        Subject::Reference => reference_of(results),
        Subject::Adapter => artifact_of(results, &TaskKey::MergeCheck { part: CheckPart::Base }),
        Subject::MergedF32 => artifact_of(results, &TaskKey::MergeCheck { part: CheckPart::Merged }),
        Subject::Model(EvalTarget::Quant(level)) => artifact_of(results, &TaskKey::Quantize { level, shard: 0 }),
        Subject::Model(EvalTarget::Mlx { bits }) => artifact_of(results, &TaskKey::Mlx { bits }),
    }
}

fn greedy_task(ctx: &Ctx, results: &Results, subject: Subject, share: u32) -> Result<pb::GreedyTask, String> {
    let e = ctx.spec.evaluation.as_ref().ok_or("the release has no evaluation section")?;
    let reference = match subject.compared_with() {
        None => vec![],
        Some(reference) => {
            let key = TaskKey::Greedy { subject: reference, share };
            match results(&key).and_then(|r| r.kind.as_ref()) {
                Some(task_result::Kind::Greedy(g)) => g.continuations.clone(),
                _ => return Err(format!("{key} has no greedy result")),
            }
        }
    };
    let lora = match subject {
        Subject::Adapter => artifact_of(results, &TaskKey::MergeCheck { part: CheckPart::Lora })?.url.clone(),
        _ => String::new(),
    };
    Ok(pb::GreedyTask {
        model: model_of(results, subject)?.url.clone(),
        prompts: ctx.eval.prompts.clone(),
        share,
        n_shares: e.prompt_shares,
        max_tokens: e.max_tokens,
        ctx: e.context,
        reference,
        lora,
    })
}

fn merge_check_task(ctx: &Ctx, results: &Results, part: CheckPart) -> Result<pb::MergeCheckTask, String> {
    let mp = merge_plan_of(results)?;
    let name = format!("{}-{}", ctx.spec.name, part.file_suffix());
    let output =
        artifact(ctx, &["quantfarm merge-check v1", part.name(), &mp.inputs_identity, &mp.plan_digest], &name)?;
    Ok(pb::MergeCheckTask {
        base: ctx.source.to_string(),
        adapter: ctx.adapter.to_string(),
        base_name: ctx.spec.base_name.clone().unwrap_or_default(),
        part: part.proto() as i32,
        output: output.to_string(),
    })
}

fn peer_task(ctx: &Ctx, results: &Results, peer: Peer, level: Option<FileType>) -> Result<pb::PeerKldTask, String> {
    let settings = kld_settings(ctx)?;
    let Some(level) = level else {
        let kp = kld_plan_of(results)?;
        let plan = plan_of(results)?;
        let refs: Vec<&pb::Artifact> = (0..plan.shards.len() as u32)
            .map(|shard| artifact_of(results, &TaskKey::Gguf { shard }))
            .collect::<Result<_, _>>()?;
        let (c, b, m) = (settings.ctx.to_string(), settings.batch.to_string(), settings.max_chunks.to_string());
        let mut parts = vec!["quantfarm peer-base v1", peer.tool(), &kp.text_sha256, &c, &b, &m];
        parts.extend(refs.iter().map(|a| a.sha256.as_str()));
        let name = format!("{}-BF16-{}.logits", ctx.spec.prefix(), peer.tool());
        let output = artifact(ctx, &parts, &name)?;
        return Ok(pb::PeerKldTask {
            tool: peer.tool().into(),
            model: refs[0].url.clone(),
            settings: Some(settings),
            base: String::new(),
            base_sha256: String::new(),
            output: output.to_string(),
        });
    };
    let base = match results(&TaskKey::PeerBase { peer }).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::PeerKld(p)) => p.base.as_ref().ok_or("the peer's base run wrote no file")?,
        _ => return Err(format!("peer/{}/base has no result", peer.tool())),
    };
    Ok(pb::PeerKldTask {
        tool: peer.tool().into(),
        model: model_of(results, Subject::Model(EvalTarget::Quant(level)))?.url.clone(),
        settings: Some(settings),
        base: base.url.clone(),
        base_sha256: base.sha256.clone(),
        output: String::new(),
    })
}

fn kld_task(ctx: &Ctx, results: &Results, target: EvalTarget, group: u32) -> Result<pb::KldTask, String> {
    let kp = kld_plan_of(results)?;
    let base = artifact_of(results, &TaskKey::KldBase { group })?;
    Ok(pb::KldTask {
        model: model_of(results, Subject::Model(target))?.url.clone(),
        base: base.url.clone(),
        base_sha256: base.sha256.clone(),
        first_chunk: group * kp.n_seq,
        batch: kld_settings(ctx)?.batch,
    })
}

/// The message a worker gets for `key`, built from the results of its dependencies (all present).
pub fn build(ctx: &Ctx, key: &TaskKey, results: &Results) -> Result<pb::Task, String> {
    let kind = match key {
        TaskKey::Plan => task::Kind::Plan(pb::PlanTask {
            source: model_source(ctx, results)?,
            split: ctx.spec.split_rule(),
            // The plan checks and hashes a given file; a computed one is checked by its merge.
            imatrix: if computes_imatrix(ctx) { String::new() } else { ctx.imatrix.to_string() },
            synthetic: match synthetic_name(&ctx.spec.source) {
                Some(Ok(_)) => ctx.spec.source.trim_start_matches("synthetic:").to_string(),
                _ => String::new(),
            },
        }),
        TaskKey::Gguf { shard } => task::Kind::Gguf(gguf_task(ctx, results, *shard)?),
        TaskKey::Quantize { level, shard } => task::Kind::Quantize(quantize_task(ctx, results, *level, *shard)?),
        TaskKey::VerifyGguf { shard } => {
            let a = artifact_of(results, &TaskKey::Gguf { shard: *shard })?;
            let mut t = gguf_task(ctx, results, *shard)?;
            t.output = a.url.clone();
            task::Kind::Verify(pb::VerifyTask {
                what: Some(verify_task::What::Gguf(t)),
                expect_sha256: a.sha256.clone(),
            })
        }
        TaskKey::VerifyQuantize { level, shard } => {
            let a = artifact_of(results, &TaskKey::Quantize { level: *level, shard: *shard })?;
            let mut t = quantize_task(ctx, results, *level, *shard)?;
            t.output = a.url.clone();
            task::Kind::Verify(pb::VerifyTask {
                what: Some(verify_task::What::Quantize(t)),
                expect_sha256: a.sha256.clone(),
            })
        }
        TaskKey::MergePlan => task::Kind::MergePlan(pb::MergePlanTask {
            base: ctx.source.to_string(),
            adapter: ctx.adapter.to_string(),
            base_name: ctx.spec.base_name.clone().unwrap_or_default(),
        }),
        TaskKey::Merge { file } => task::Kind::Merge(merge_task(ctx, results, Some(*file))?),
        TaskKey::MergeSide => task::Kind::Merge(merge_task(ctx, results, None)?),
        TaskKey::MergeCheck { part } => task::Kind::MergeCheck(merge_check_task(ctx, results, *part)?),
        TaskKey::Mlx { bits } => task::Kind::Mlx(mlx_task(ctx, results, *bits)?),
        TaskKey::VerifyMerge { .. } | TaskKey::VerifyMergeSide | TaskKey::VerifyMlx { .. } => {
            let (producer, what) = match key {
                TaskKey::VerifyMerge { file } => {
                    (TaskKey::Merge { file: *file }, verify_task::What::Merge(merge_task(ctx, results, Some(*file))?))
                }
                TaskKey::VerifyMergeSide => {
                    (TaskKey::MergeSide, verify_task::What::Merge(merge_task(ctx, results, None)?))
                }
                TaskKey::VerifyMlx { bits } => {
                    (TaskKey::Mlx { bits: *bits }, verify_task::What::Mlx(mlx_task(ctx, results, *bits)?))
                }
                _ => unreachable!("matched above"),
            };
            let a = artifact_of(results, &producer)?;
            let what = match what {
                verify_task::What::Merge(mut t) => {
                    t.output = a.url.clone();
                    verify_task::What::Merge(t)
                }
                verify_task::What::Mlx(mut t) => {
                    t.output = a.url.clone();
                    verify_task::What::Mlx(t)
                }
                other => other,
            };
            task::Kind::Verify(pb::VerifyTask { what: Some(what), expect_sha256: a.sha256.clone() })
        }
        TaskKey::Noop { .. } => {
            task::Kind::Noop(pb::NoopTask { sleep_ms: ctx.spec.outputs.noop.as_ref().map_or(0, |n| n.sleep_ms) })
        }
        TaskKey::KldPlan => task::Kind::KldPlan(pb::KldPlanTask {
            reference: reference_of(results)?.url.clone(),
            settings: Some(kld_settings(ctx)?),
        }),
        TaskKey::KldBase { group } => task::Kind::KldBase(kld_base_task(ctx, results, *group)?),
        TaskKey::ImatrixPlan => task::Kind::KldPlan(pb::KldPlanTask {
            reference: reference_of(results)?.url.clone(),
            settings: Some(imatrix_settings(ctx)?),
        }),
        TaskKey::Imatrix { group } => task::Kind::Imatrix(imatrix_task(ctx, results, *group)?),
        TaskKey::ImatrixMerge => task::Kind::ImatrixMerge(imatrix_merge_task(ctx, results)?),
        TaskKey::Kld { target, group } => task::Kind::Kld(kld_task(ctx, results, *target, *group)?),
        TaskKey::Greedy { subject, share } => task::Kind::Greedy(greedy_task(ctx, results, *subject, *share)?),
        TaskKey::PeerBase { peer } => task::Kind::PeerKld(peer_task(ctx, results, *peer, None)?),
        TaskKey::PeerKld { peer, level } => task::Kind::PeerKld(peer_task(ctx, results, *peer, Some(*level))?),
        TaskKey::Probe { subject } => task::Kind::Probe(pb::ProbeTask {
            model: model_of(results, *subject)?.url.clone(),
            suite: ctx.eval.probes.clone(),
            ctx: ctx.spec.evaluation.as_ref().map_or(4096, |e| e.context),
        }),
        TaskKey::Report => return Err("the report is the coordinator's own task".into()),
    };
    Ok(pb::Task { kind: Some(kind), known_output_sha256: String::new() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_merge_check_is_not_scheduled_for_an_embedding_lora_on_a_tied_base() {
        let yaml =
            "name: r\nsource: ./m\nadapter: ./a\noutputs:\n  gguf: {quants: [Q8_0]}\nevaluation: {prompts: p.json}\n";
        let spec = ReleaseSpec::parse(yaml, "r.yaml").unwrap();
        let eval = EvalInputs { text: String::new(), prompts: "/p.json".into(), probes: String::new() };
        let store = Location::local("/tmp/store");
        let ctx = Ctx { spec: &spec, source: "/m", imatrix: "", adapter: "/a", eval: &eval, store: &store };
        let checks = |untied| {
            let mp = pb::MergePlanResult { files: vec!["model.safetensors".into()], untied, ..Default::default() };
            expand_merge(&ctx, &mp).iter().filter(|t| matches!(t.key, TaskKey::MergeCheck { .. })).count()
        };
        assert_eq!(checks(false), 3, "lora, base and merged GGUFs for the check");
        assert_eq!(checks(true), 0, "llama.cpp cannot apply the adapter at run time: no check to schedule");
    }

    #[test]
    fn keys_round_trip() {
        for k in [
            TaskKey::Plan,
            TaskKey::Report,
            TaskKey::Gguf { shard: 3 },
            TaskKey::Noop { n: 7 },
            TaskKey::Quantize { level: FileType::Q4_K_M, shard: 0 },
            TaskKey::VerifyGguf { shard: 1 },
            TaskKey::VerifyQuantize { level: FileType::Q8_0, shard: 2 },
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
            TaskKey::Kld { target: EvalTarget::Quant(FileType::Q4_K_M), group: 3 },
            TaskKey::Kld { target: EvalTarget::Mlx { bits: 4 }, group: 0 },
            TaskKey::Greedy { subject: Subject::Reference, share: 1 },
            TaskKey::Greedy { subject: Subject::Model(EvalTarget::Quant(FileType::Q8_0)), share: 0 },
            TaskKey::Probe { subject: Subject::Model(EvalTarget::Mlx { bits: 8 }) },
            TaskKey::Probe { subject: Subject::Reference },
            TaskKey::PeerBase { peer: Peer::LlamaPerplexity },
            TaskKey::PeerKld { peer: Peer::LlamaPerplexity, level: FileType::Q6_K },
        ] {
            assert_eq!(TaskKey::parse(&k.to_string()), Some(k.clone()), "{k}");
        }
        assert_eq!(TaskKey::parse("quantize/q8_0/1"), None);
        assert_eq!(TaskKey::parse("gguf/x"), None);
    }

    #[test]
    fn critical_path_prefers_long_chains() {
        let t = |key: TaskKey, deps: Vec<TaskKey>, cost| TaskDef { key, deps, cost };
        let tasks = vec![
            t(TaskKey::Gguf { shard: 0 }, vec![], 10),
            t(TaskKey::Gguf { shard: 1 }, vec![], 10),
            t(TaskKey::Quantize { level: FileType::Q8_0, shard: 0 }, vec![TaskKey::Gguf { shard: 0 }], 100),
            t(
                TaskKey::Report,
                vec![TaskKey::Quantize { level: FileType::Q8_0, shard: 0 }, TaskKey::Gguf { shard: 1 }],
                1,
            ),
        ];
        let p = priorities(&tasks);
        assert_eq!(p[&TaskKey::Report], 1);
        assert_eq!(p[&TaskKey::Gguf { shard: 0 }], 111);
        assert_eq!(p[&TaskKey::Gguf { shard: 1 }], 11);
    }
}
