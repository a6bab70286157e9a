//! `kld`: each level's loss as KL divergence against the reference, by llama-perplexity's procedure (link 3). The
//! plan tokenizes the evaluation text with the reference and counts its chunks; each (model, chunk group) task
//! scores the model's logits against the reference's base logits of that group (`kld-base`).

use std::fmt;

use quantfarm_parity::ChunkStats;
use quantfarm_proto::{self as pb, task};

use super::expand::{chunked, eval_targets, model_cost, model_tasks};
use super::lookup::plan_of;
use super::lookup::{artifact_of, kld_plan_of, kld_settings, model_of, reference_of};
use super::subjects::{EvalTarget, Subject};
use super::{num, Done, Family, Folded, Grown, KldBase, Opens, Results, Stage};
use crate::graph::Ctx;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kld {
    /// Tokenizes the evaluation text with the reference (GGUF BF16) and counts its chunks.
    Plan,
    /// One model's KL-divergence statistics on one chunk group.
    Measure { target: EvalTarget, group: u32 },
}

impl Family for Kld {
    const NAME: &'static str = "kld";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kld::Plan => write!(f, "/plan"),
            Kld::Measure { target, group } => write!(f, "/{target}/{group}"),
        }
    }

    fn parse(rest: &[&str]) -> Option<Kld> {
        match rest {
            ["plan"] => Some(Kld::Plan),
            [t, g] => Some(Kld::Measure { target: EvalTarget::parse(t)?, group: num(g)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Kld)
    }

    fn stage(&self) -> String {
        match self {
            Kld::Plan => "kld reference".into(),
            Kld::Measure { target, .. } => format!("kld {target}"),
        }
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        Ok(match *self {
            Kld::Plan => task::Kind::KldPlan(pb::KldPlanTask {
                reference: reference_of(results)?.url.clone(),
                settings: Some(kld_settings(ctx)?),
            }),
            Kld::Measure { target, group } => {
                let kp = kld_plan_of(results)?;
                let base = artifact_of(results, &KldBase { group }.into())?;
                task::Kind::Kld(pb::KldTask {
                    model: model_of(results, Subject::Model(target))?.url.clone(),
                    base: base.url.clone(),
                    base_sha256: base.sha256.clone(),
                    first_chunk: group * kp.n_seq,
                    batch: kld_settings(ctx)?.batch,
                    describe: false,
                })
            }
        })
    }

    /// A model's chunk statistics, merged per model by the report; the report reads the plan by its key.
    fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>) {
        let Kld::Measure { target, .. } = self else { return };
        let list = into.kld.entry(target.to_string()).or_default();
        if let Some(k) = done.result.and_then(pb::TaskResult::kld) {
            list.extend(k.chunks.iter().map(ChunkStats::from));
        }
    }

    /// The plan's result opens the evaluation text's stage (its chunk groups are known).
    fn opens<'r>(&self, result: &'r pb::TaskResult) -> Result<Opens<'r>, String> {
        match self {
            Kld::Plan => {
                Ok(chunked(result, "kld/plan: the evaluation text")?.map_or(Opens::Nothing, Opens::TextPlanned))
            }
            Kld::Measure { .. } => Ok(Opens::Nothing),
        }
    }

    /// The plan after the plan, over the GGUF BF16, when the release has an evaluation text; after it, per
    /// (measured model, chunk group) a task after the group's base logits and the model. The report waits for them.
    fn grow(stage: Stage, ctx: &Ctx, results: &Results, out: &mut Grown) {
        match stage {
            Stage::Planned(inv) => {
                if inv.evaluated(ctx).is_some_and(|e| e.text.is_some()) {
                    out.add_measured(Kld::Plan, inv.ggufs(), inv.plan.source_bytes);
                }
            }
            Stage::TextPlanned(kp) => {
                let n_shards = plan_of(results).map_or(0, |p| p.shards.len() as u32);
                for target in eval_targets(ctx) {
                    let model = model_tasks(target, n_shards);
                    for group in 0..kp.n_chunks.div_ceil(kp.n_seq.max(1)) {
                        let mut deps = vec![KldBase { group }.into()];
                        deps.extend(model.iter().cloned());
                        out.add_measured(Kld::Measure { target, group }, deps, model_cost(results));
                    }
                }
            }
            Stage::Start | Stage::Merged(_) | Stage::Calibrated(_) => {}
        }
    }
}
