//! `mlx-lm`: link 2 across runtimes. The source's bf16 weights (the GGUF BF16's twin) and each MLX rung, run in
//! mlx-lm on the workers' helper, fed the token ids llama.cpp was fed: greedy continuations (the bf16 weights
//! compared with llama.cpp's reference, each rung with mlx-lm's bf16), logits of each chunk group scored against
//! llama.cpp's base logits, and the probe suite on the model served by `mlx_lm.server`.

use std::fmt;

use quantfarm_parity::ChunkStats;
use quantfarm_proto::{self as pb, task};
use quantfarm_report::model::MlxLmRuntime;

use super::expand::{mlx_lm_subjects, model_cost, runs_greedy};
use super::lookup::{artifact_of, greedy_continuations, kld_plan_of, mlx_lm_model};
use super::subjects::{MlxSubject, Subject, MLX_LM_RUNTIME};
use super::{num, Done, Family, Folded, Greedy, Grown, KldBase, Mlx, Results, Stage, TaskKey};
use crate::graph::Ctx;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MlxLm {
    /// Greedy continuations of one share of the prompts, compared with llama.cpp's reference (for the bf16
    /// weights) or with mlx-lm's bf16 run (for an MLX rung).
    Greedy { subject: MlxSubject, share: u32 },
    /// mlx-lm's logits of one chunk group, scored against llama.cpp's base logits of the same group.
    Kld { subject: MlxSubject, group: u32 },
    /// The probe suite on the model served by `mlx_lm.server`.
    Probe { subject: MlxSubject },
}

impl MlxLm {
    fn subject(self) -> MlxSubject {
        match self {
            MlxLm::Greedy { subject, .. } | MlxLm::Kld { subject, .. } | MlxLm::Probe { subject } => subject,
        }
    }
}

impl Family for MlxLm {
    const NAME: &'static str = "mlx-lm";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MlxLm::Greedy { subject, share } => write!(f, "/greedy/{subject}/{share}"),
            MlxLm::Kld { subject, group } => write!(f, "/kld/{subject}/{group}"),
            MlxLm::Probe { subject } => write!(f, "/probe/{subject}"),
        }
    }

    fn parse(rest: &[&str]) -> Option<MlxLm> {
        Some(match rest {
            ["greedy", t, n] => MlxLm::Greedy { subject: MlxSubject::parse(t)?, share: num(n)? },
            ["kld", t, g] => MlxLm::Kld { subject: MlxSubject::parse(t)?, group: num(g)? },
            ["probe", t] => MlxLm::Probe { subject: MlxSubject::parse(t)? },
            _ => return None,
        })
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::MlxLm)
    }

    fn runtime(&self) -> Option<&'static str> {
        Some(MLX_LM_RUNTIME)
    }

    fn stage(&self) -> String {
        match self {
            MlxLm::Greedy { subject, .. } => format!("mlx-lm greedy {subject}"),
            MlxLm::Kld { subject, .. } => format!("mlx-lm kld {subject}"),
            MlxLm::Probe { subject } => format!("mlx-lm probe {subject}"),
        }
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        Ok(match *self {
            MlxLm::Greedy { subject, share } => {
                let e = ctx.spec.evaluation.as_ref().ok_or("the release has no evaluation section")?;
                let compared_with = match subject {
                    MlxSubject::Bf16 => Greedy { subject: Subject::Reference, share }.into(),
                    MlxSubject::Rung { .. } => MlxLm::Greedy { subject: MlxSubject::Bf16, share }.into(),
                };
                task::Kind::MlxLmGreedy(pb::MlxLmGreedyTask {
                    model: mlx_lm_model(ctx, results, subject)?,
                    reference: greedy_continuations(results, &compared_with)?,
                    max_tokens: e.max_tokens,
                    keep_continuations: subject == MlxSubject::Bf16,
                })
            }
            MlxLm::Kld { subject, group } => {
                let kp = kld_plan_of(results)?;
                let bos = kp.bos.ok_or(
                    "the kld/plan result predates the token id of the chunks' BOS (made by an older worker): run the \
                     release again",
                )?;
                let base = artifact_of(results, &KldBase { group }.into())?;
                task::Kind::MlxLmKld(pb::MlxLmKldTask {
                    model: mlx_lm_model(ctx, results, subject)?,
                    base: base.url.clone(),
                    base_sha256: base.sha256.clone(),
                    first_chunk: group * kp.n_seq,
                    bos,
                })
            }
            MlxLm::Probe { subject } => task::Kind::MlxLmProbe(pb::MlxLmProbeTask {
                model: mlx_lm_model(ctx, results, subject)?,
                suite: ctx.eval.probes.clone().ok_or("the release's evaluation has no probes")?,
            }),
        })
    }

    /// Per subject: its chunk statistics, its prompts' agreements, its probe results and how mlx-lm loaded it (a
    /// load error is what the subject's record says, whichever task met it); and every runtime that loaded a model.
    fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>) {
        let subject = self.subject();
        let result = done.result;
        let (greedy, probe, run) = match self {
            MlxLm::Kld { .. } => {
                let list = into.mlx_lm_kld.entry(subject.to_string()).or_default();
                let k = result.and_then(pb::TaskResult::kld);
                if let Some(k) = k {
                    list.extend(k.chunks.iter().map(ChunkStats::from));
                }
                (None, None, k.and_then(|k| k.mlx_lm.as_ref()))
            }
            MlxLm::Greedy { .. } => {
                let g = result.and_then(pb::TaskResult::greedy);
                (g, None, g.and_then(|g| g.mlx_lm.as_ref()))
            }
            MlxLm::Probe { .. } => {
                let p = result.and_then(pb::TaskResult::probe);
                (None, p, p.and_then(|p| p.mlx_lm.as_ref()))
            }
        };
        if subject == MlxSubject::Bf16 && into.mlx_lm_model.is_none() {
            if let Some(
                task::Kind::MlxLmKld(pb::MlxLmKldTask { model, .. })
                | task::Kind::MlxLmGreedy(pb::MlxLmGreedyTask { model, .. }),
            ) = done.task.and_then(|t| t.kind.as_ref())
            {
                into.mlx_lm_model = Some(model.clone());
            }
        }
        let acc = into.mlx_lm.entry(subject).or_default();
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
                into.mlx_lm_runtimes.insert(MlxLmRuntime {
                    mlx: r.mlx.clone(),
                    mlx_lm: r.mlx_lm.clone(),
                    device: r.device.clone(),
                    device_name: r.device_name.clone(),
                });
            }
            if acc.run.is_none_or(|a| a.load_error.is_empty()) {
                acc.run = Some(r);
            }
        }
    }

    /// After the plan: per prompt share each subject's continuations (the bf16 weights after llama.cpp's
    /// reference, a rung after mlx-lm's bf16 and the rung), and each subject's probes; after the evaluation text's
    /// plan, per (subject, chunk group) its logits scored against the group's base logits. The report waits for
    /// them all.
    fn grow(stage: Stage, ctx: &Ctx, results: &Results, out: &mut Grown) {
        match stage {
            Stage::Planned(inv) => {
                let Some(e) = inv.evaluated(ctx) else { return };
                let cost = inv.plan.source_bytes;
                if runs_greedy(ctx, e) {
                    for share in 0..e.prompt_shares {
                        for subject in mlx_lm_subjects(ctx) {
                            let deps = match subject {
                                MlxSubject::Bf16 => vec![Greedy { subject: Subject::Reference, share }.into()],
                                MlxSubject::Rung { rung } => {
                                    vec![MlxLm::Greedy { subject: MlxSubject::Bf16, share }.into(), Mlx { rung }.into()]
                                }
                            };
                            out.add_measured(MlxLm::Greedy { subject, share }, deps, cost);
                        }
                    }
                }
                if e.probes.is_some() {
                    for subject in mlx_lm_subjects(ctx) {
                        let deps = match subject {
                            MlxSubject::Bf16 => vec![TaskKey::PLAN],
                            MlxSubject::Rung { rung } => vec![Mlx { rung }.into()],
                        };
                        out.add_measured(MlxLm::Probe { subject }, deps, cost);
                    }
                }
            }
            Stage::TextPlanned(kp) => {
                for subject in mlx_lm_subjects(ctx) {
                    for group in 0..kp.n_chunks.div_ceil(kp.n_seq.max(1)) {
                        let mut deps = vec![KldBase { group }.into()];
                        if let MlxSubject::Rung { rung } = subject {
                            deps.push(Mlx { rung }.into());
                        }
                        out.add_measured(MlxLm::Kld { subject, group }, deps, model_cost(results));
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
