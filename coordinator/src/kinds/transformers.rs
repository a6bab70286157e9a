//! `transformers`: the vLLM rungs measured where fine-tunes are trained, the HF bf16 checkpoint across runtimes, and
//! a PEFT adapter's merge (link 1) as the method states it. The source's bf16 checkpoint (the GGUF BF16's twin: with an
//! adapter, the merge), the base with the PEFT adapter applied at run time, unmerged, and each vLLM rung, run in
//! Hugging Face transformers on the workers' helper (with compressed-tensors: FP8_DYNAMIC with its inputs quantized per
//! token as vLLM's W8A8 path does, emulated, and weight-only), fed the token ids llama.cpp was fed: greedy
//! continuations (the bf16 checkpoint compared with llama.cpp's reference, the merge with the base and the adapter,
//! both in f32, and each rung with transformers' bf16) and logits of each chunk group scored against llama.cpp's base
//! logits.

use std::fmt;

use quantfarm_parity::ChunkStats;
use quantfarm_proto::{self as pb, task};
use quantfarm_report::model::TransformersRuntime;

use super::expand::{model_cost, runs_greedy, tf_subjects};
use super::lookup::{artifact_of, greedy_continuations, kld_plan_of, model_source};
use super::subjects::{Subject, TfSubject, TRANSFORMERS_RUNTIME};
use super::{num, Done, Family, Folded, Greedy, Grown, KldBase, Results, Stage, TaskKey, Vllm};
use crate::graph::Ctx;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transformers {
    /// Greedy continuations of one share of the prompts, compared with llama.cpp's reference (for the bf16
    /// checkpoint) or with transformers' bf16 run (for a rung).
    Greedy { subject: TfSubject, share: u32 },
    /// transformers' logits of one chunk group, scored against llama.cpp's base logits of the same group.
    Kld { subject: TfSubject, group: u32 },
    /// The release's probe suite, each chat rendered by the checkpoint's own template.
    Probe { subject: TfSubject },
}

impl Transformers {
    fn subject(self) -> TfSubject {
        match self {
            Transformers::Greedy { subject, .. }
            | Transformers::Kld { subject, .. }
            | Transformers::Probe { subject } => subject,
        }
    }
}

/// What transformers loads for a subject: the HF checkpoint the GGUF BF16 was converted from (the source, or the
/// merge), the base (the source) with the adapter folder, or a vLLM rung's folder.
fn model(ctx: &Ctx, results: &Results, subject: TfSubject) -> Result<(String, String), String> {
    Ok(match subject {
        TfSubject::Bf16 | TfSubject::MergedF32 => (model_source(ctx, results)?, String::new()),
        TfSubject::Adapter => {
            let adapter = ctx.adapter.ok_or("the release has no adapter")?;
            (ctx.source.to_string(), adapter.to_string())
        }
        TfSubject::Rung { rung, .. } => (artifact_of(results, &Vllm { rung }.into())?.url.clone(), String::new()),
    })
}

/// What a rung's tasks wait for besides their inputs: the rung itself.
fn made(subject: TfSubject) -> Option<TaskKey> {
    match subject {
        TfSubject::Bf16 | TfSubject::Adapter | TfSubject::MergedF32 => None,
        TfSubject::Rung { rung, .. } => Some(Vllm { rung }.into()),
    }
}

/// The greedy run a subject's continuations are compared with: llama.cpp's reference for the bf16 checkpoint and
/// for the base with the adapter (across runtimes and precisions: shown, never gated), the base with the adapter
/// for the merge in f32 (link 1), transformers' bf16 checkpoint for a rung.
fn compared_with(subject: TfSubject, share: u32) -> TaskKey {
    match subject {
        TfSubject::Bf16 | TfSubject::Adapter => Greedy { subject: Subject::Reference, share }.into(),
        TfSubject::MergedF32 => Transformers::Greedy { subject: TfSubject::Adapter, share }.into(),
        TfSubject::Rung { .. } => Transformers::Greedy { subject: TfSubject::Bf16, share }.into(),
    }
}

/// Whether a subject's continuations are kept: the runs others are compared with.
fn compared_against(subject: TfSubject) -> bool {
    match subject {
        TfSubject::Bf16 | TfSubject::Adapter => true,
        TfSubject::MergedF32 | TfSubject::Rung { .. } => false,
    }
}

impl Family for Transformers {
    const NAME: &'static str = "transformers";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transformers::Greedy { subject, share } => write!(f, "/greedy/{subject}/{share}"),
            Transformers::Kld { subject, group } => write!(f, "/kld/{subject}/{group}"),
            Transformers::Probe { subject } => write!(f, "/probe/{subject}"),
        }
    }

    fn parse(rest: &[&str]) -> Option<Transformers> {
        Some(match rest {
            ["greedy", t, n] => Transformers::Greedy { subject: TfSubject::parse(t)?, share: num(n)? },
            ["kld", t, g] => {
                Transformers::Kld { subject: TfSubject::parse(t).filter(|s| s.measured_alone())?, group: num(g)? }
            }
            ["probe", t] => Transformers::Probe { subject: TfSubject::parse(t).filter(|s| s.runs_probes())? },
            _ => return None,
        })
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Transformers)
    }

    fn runtime(&self) -> Option<&'static str> {
        Some(TRANSFORMERS_RUNTIME)
    }

    fn stage(&self) -> String {
        match self {
            Transformers::Greedy { subject, .. } => format!("transformers greedy {subject}"),
            Transformers::Kld { subject, .. } => format!("transformers kld {subject}"),
            Transformers::Probe { subject } => format!("transformers probe {subject}"),
        }
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        Ok(match *self {
            Transformers::Greedy { subject, share } => {
                let e = ctx.spec.evaluation.as_ref().ok_or("the release has no evaluation section")?;
                let (model, adapter) = model(ctx, results, subject)?;
                task::Kind::TransformersGreedy(pb::TransformersGreedyTask {
                    model,
                    reference: greedy_continuations(results, &compared_with(subject, share))?,
                    max_tokens: e.max_tokens,
                    keep_continuations: compared_against(subject),
                    activations: subject.activations().to_string(),
                    adapter,
                    dtype: subject.dtype().to_string(),
                })
            }
            Transformers::Kld { subject, group } => {
                let kp = kld_plan_of(results)?;
                let bos = kp.bos.ok_or(
                    "the kld/plan result predates the token id of the chunks' BOS (made by an older worker): run the \
                     release again",
                )?;
                let base = artifact_of(results, &KldBase { group }.into())?;
                let (model, adapter) = model(ctx, results, subject)?;
                task::Kind::TransformersKld(pb::TransformersKldTask {
                    model,
                    base: base.url.clone(),
                    base_sha256: base.sha256.clone(),
                    first_chunk: group * kp.n_seq,
                    bos,
                    activations: subject.activations().to_string(),
                    adapter,
                    dtype: subject.dtype().to_string(),
                })
            }
            Transformers::Probe { subject } => {
                let (model, _) = model(ctx, results, subject)?;
                task::Kind::TransformersProbe(pb::TransformersProbeTask {
                    model,
                    activations: subject.activations().to_string(),
                    dtype: subject.dtype().to_string(),
                    suite: ctx.eval.probes.clone().ok_or("the release's evaluation has no probes")?,
                })
            }
        })
    }

    /// Per subject: its chunk statistics, its prompts' agreements and how transformers loaded it (a load error is
    /// what the subject's record says, whichever task met it); and every runtime that loaded a model.
    fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>) {
        let subject = self.subject();
        let result = done.result;
        let (greedy, probe, run) = match self {
            Transformers::Kld { .. } => {
                let list: &mut Vec<ChunkStats> = into.transformers_kld.entry(subject).or_default();
                let k = result.and_then(pb::TaskResult::kld);
                if let Some(k) = k {
                    list.extend(k.chunks.iter().map(ChunkStats::from));
                }
                (None, None, k.and_then(|k| k.transformers.as_ref()))
            }
            Transformers::Greedy { .. } => {
                let g = result.and_then(pb::TaskResult::greedy);
                (g, None, g.and_then(|g| g.transformers.as_ref()))
            }
            Transformers::Probe { .. } => {
                let p = result.and_then(pb::TaskResult::probe);
                (None, p, p.and_then(|p| p.transformers.as_ref()))
            }
        };
        if subject == TfSubject::Bf16 && into.transformers_model.is_none() {
            if let Some(
                task::Kind::TransformersKld(pb::TransformersKldTask { model, .. })
                | task::Kind::TransformersGreedy(pb::TransformersGreedyTask { model, .. }),
            ) = done.task.and_then(|t| t.kind.as_ref())
            {
                into.transformers_model = Some(model.clone());
            }
        }
        let acc = into.transformers.entry(subject).or_default();
        if let Some(g) = greedy {
            acc.agreements.extend(&g.agreements);
            acc.continuations += g.continuations.len();
            acc.ran_greedy = true;
        }
        if let Some(p) = probe.filter(|_| run.is_none_or(|r| r.load_error.is_empty())) {
            acc.probe = Some(p);
        }
        if let Some(r) = run {
            if r.load_error.is_empty() {
                into.transformers_runtimes.insert(TransformersRuntime {
                    torch: r.torch.clone(),
                    transformers: r.transformers.clone(),
                    compressed_tensors: r.compressed_tensors.clone(),
                    peft: r.peft.clone(),
                    device: r.device.clone(),
                    device_name: r.device_name.clone(),
                });
            }
            if acc.run.is_none_or(|a| a.load_error.is_empty()) {
                acc.run = Some(r);
            }
        }
    }

    /// After the plan: per prompt share each subject's continuations (the bf16 checkpoint and the base with the
    /// adapter after llama.cpp's reference, the merge in f32 after the base with the adapter, a rung after
    /// transformers' bf16 and the rung), and the probes of the bf16 checkpoint (after the plan) and of each rung as
    /// saved (after it is made); after the evaluation text's plan, per (subject, chunk group) its logits scored against
    /// the group's base logits (not the merge check's pair). The report waits for them all.
    fn grow(stage: Stage, ctx: &Ctx, results: &Results, out: &mut Grown) {
        match stage {
            Stage::Planned(inv) => {
                let Some(e) = inv.evaluated(ctx) else { return };
                let cost = inv.plan.source_bytes;
                if runs_greedy(ctx, e) {
                    for share in 0..e.prompt_shares {
                        for subject in tf_subjects(ctx, results) {
                            let deps = std::iter::once(compared_with(subject, share)).chain(made(subject)).collect();
                            out.add_measured(Transformers::Greedy { subject, share }, deps, cost);
                        }
                    }
                }
                if e.probes.is_some() {
                    for subject in tf_subjects(ctx, results).into_iter().filter(|s| s.runs_probes()) {
                        let deps = vec![made(subject).unwrap_or(TaskKey::PLAN)];
                        out.add_measured(Transformers::Probe { subject }, deps, cost);
                    }
                }
            }
            Stage::TextPlanned(kp) => {
                for subject in tf_subjects(ctx, results).into_iter().filter(|s| s.measured_alone()) {
                    for group in 0..kp.n_chunks.div_ceil(kp.n_seq.max(1)) {
                        let deps = std::iter::once(KldBase { group }.into()).chain(made(subject)).collect();
                        out.add_measured(Transformers::Kld { subject, group }, deps, model_cost(results));
                    }
                }
            }
            Stage::Start
            | Stage::Merged(_)
            | Stage::Calibrated(_)
            | Stage::Measured(_)
            | Stage::Looked(_)
            | Stage::Sensed => {}
        }
    }
}
