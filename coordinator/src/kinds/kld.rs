//! `kld`: each level's loss as KL divergence against the reference, by llama-perplexity's procedure (link 3). The
//! plan tokenizes the evaluation text with the reference and counts its chunks; each (model, chunk group) task
//! scores the model's logits against the reference's base logits of that group (`kld-base`).
//!
//! With `evaluation.stop` a rung's groups enter the graph in the rule's seeded order ([`Sequential`]): the first
//! look's groups at once, then one at a time, each only when the look over every group measured so far has not
//! stopped the rung (`quantfarm_parity::sequential`). A stopped rung's remaining groups never exist, so nothing is
//! leased, decoded or fetched for them, and a base-logits group no rung reaches is never made.

use std::fmt;

use quantfarm_parity::sequential::{unit_order, Look, StopReason, StopRule};
use quantfarm_parity::ChunkStats;
use quantfarm_proto::{self as pb, task};

use super::expand::{chunked, eval_targets, model_cost, model_tasks};
use super::lookup::plan_of;
use super::lookup::{artifact_of, kld_plan_of, kld_settings, model_of, reference_of};
use super::subjects::{EvalTarget, Subject};
use super::{num, Done, Family, Folded, Grown, KldBase, Opens, Results, Stage};
use crate::graph::Ctx;
use crate::spec::ReleaseSpec;

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

    /// The plan's result opens the evaluation text's stage (its chunk groups are known); a group measured opens
    /// its rung's next look.
    fn opens<'r>(&self, result: &'r pb::TaskResult) -> Result<Opens<'r>, String> {
        match *self {
            Kld::Plan => {
                Ok(chunked(result, "kld/plan: the evaluation text")?.map_or(Opens::Nothing, Opens::TextPlanned))
            }
            Kld::Measure { target, .. } => Ok(Opens::Measured(target)),
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
                let groups: Vec<u32> = match Sequential::of(ctx.spec, kp) {
                    Some(seq) => seq.order[..seq.first].to_vec(),
                    None => (0..n_groups(kp)).collect(),
                };
                for target in eval_targets(ctx) {
                    for &group in &groups {
                        add_group(target, group, results, out);
                    }
                }
            }
            Stage::Measured(target) => {
                let Ok(kp) = kld_plan_of(results) else { return };
                let Some(seq) = Sequential::of(ctx.spec, kp) else { return };
                let Some(look) = seq.look(ctx.spec, target, results) else { return };
                if look.stop.is_none() {
                    let group = seq.order[look.measured];
                    // Its base logits, unless another rung got this far first (adding a task twice adds it once).
                    out.add(KldBase { group }, vec![Kld::Plan.into()], model_cost(results));
                    add_group(target, group, results, out);
                }
            }
            Stage::Start | Stage::Merged(_) | Stage::Calibrated(_) | Stage::Looked(_) | Stage::Sensed => {}
        }
    }
}

/// The text's chunk groups (the chunks llama-perplexity decodes together).
pub(super) fn n_groups(kp: &pb::KldPlanResult) -> u32 {
    kp.n_chunks.div_ceil(kp.n_seq.max(1))
}

/// `target`'s task on `group`, after the group's base logits and the model.
fn add_group(target: EvalTarget, group: u32, results: &Results, out: &mut Grown) {
    let n_shards = plan_of(results).map_or(0, |p| p.shards.len() as u32);
    let mut deps = vec![KldBase { group }.into()];
    deps.extend(model_tasks(target, n_shards));
    out.add_measured(Kld::Measure { target, group }, deps, model_cost(results));
}

/// `evaluation.stop` over the evaluation text: the rule, the order every rung measures the chunk groups in (seeded
/// by the text's tokens, so the same text gives the same order on any farm) and the groups of the first look.
#[derive(Clone, Debug)]
pub struct Sequential {
    pub rule: StopRule,
    pub order: Vec<u32>,
    pub first: usize,
    pub n_seq: u32,
}

impl Sequential {
    /// The release's rule, if it has `evaluation.stop`.
    pub fn of(spec: &ReleaseSpec, kp: &pb::KldPlanResult) -> Option<Sequential> {
        let stop = spec.evaluation.as_ref()?.stop?;
        let rule = stop.rule(kp.n_seq);
        let n = n_groups(kp) as usize;
        let first = rule.first_look(n);
        let seed = kp.tokens_sha256.get(..16).and_then(|h| u64::from_str_radix(h, 16).ok()).unwrap_or(0);
        let order = unit_order(n, first, seed).into_iter().map(|g| g as u32).collect();
        Some(Sequential { rule, order, first, n_seq: kp.n_seq })
    }

    /// The values of `target`'s mean KLD at which a gate's verdict changes, or the gate the rule cannot foresee.
    pub fn thresholds(spec: &ReleaseSpec, target: EvalTarget) -> Result<Vec<f64>, String> {
        let levels: Vec<String> = spec.levels().iter().map(EvalTarget::to_string).collect();
        crate::gates::kld_mean_thresholds(&spec.gates, &target.to_string(), &levels)
    }

    /// The look over `target`'s groups measured so far, once every group it was given is measured (`None` while
    /// one still runs): they are then the order's first `measured`.
    pub fn look(&self, spec: &ReleaseSpec, target: EvalTarget, results: &Results) -> Option<Look> {
        let mut units = Vec::new();
        for &group in &self.order {
            let Some(k) = results(&Kld::Measure { target, group }.into()).and_then(pb::TaskResult::kld) else { break };
            units.push(k.chunks.iter().fold((0.0, 0.0), |(s, n), c| (s + c.sum_kld, n + c.count as f64)));
        }
        if units.len() < self.first {
            return None;
        }
        match Sequential::thresholds(spec, target) {
            Ok(thresholds) => Some(self.rule.look(&units, self.order.len(), &thresholds)),
            // A gate reads a figure only the whole text gives: no early stop, not even a precise one.
            Err(_) => {
                let look = self.rule.look(&units, self.order.len(), &[]);
                let complete = look.stop == Some(StopReason::Complete);
                Some(Look { stop: if complete { look.stop } else { None }, ..look })
            }
        }
    }
}
