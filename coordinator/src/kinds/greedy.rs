//! `greedy`: greedy continuations of one share of the prompt set in llama.cpp, at temperature 0: the reference's
//! (the GGUF BF16), or a model's compared with them token by token; and for the merge check, the base with the
//! adapter at run time and the merge compared with it.

use std::fmt;

use quantfarm_proto::{self as pb, task};

use super::expand::{eval_targets, merge_checked, merged, model_tasks, runs_greedy};
use super::lookup::{artifact_of, greedy_continuations, model_of};
use super::merge_check::check_cost;
use super::subjects::{CheckPart, Subject};
use super::{num, Done, Family, Folded, Grown, MergeCheck, Results, Stage, TaskKey, MERGE_CHECK};
use crate::graph::Ctx;

/// One share of the prompts, run on one subject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Greedy {
    pub subject: Subject,
    pub share: u32,
}

impl Family for Greedy {
    const NAME: &'static str = "greedy";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}/{}", self.subject, self.share)
    }

    fn parse(rest: &[&str]) -> Option<Greedy> {
        match rest {
            [t, n] => Some(Greedy { subject: Subject::parse(t)?, share: num(n)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Greedy)
    }

    fn stage(&self) -> String {
        format!("greedy {}", self.subject)
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        let Greedy { subject, share } = *self;
        let e = ctx.spec.evaluation.as_ref().ok_or("the release has no evaluation section")?;
        let reference = match subject.compared_with() {
            None => vec![],
            Some(reference) => greedy_continuations(results, &Greedy { subject: reference, share }.into())?,
        };
        let lora = match subject {
            Subject::Adapter => artifact_of(results, &MergeCheck { part: CheckPart::Lora }.into())?.url.clone(),
            Subject::Reference | Subject::Model(_) | Subject::MergedF32 => String::new(),
        };
        Ok(task::Kind::Greedy(pb::GreedyTask {
            model: model_of(results, subject)?.url.clone(),
            prompts: ctx.eval.prompts.clone().ok_or("the release's evaluation has no prompts")?,
            share,
            n_shares: e.prompt_shares,
            max_tokens: e.max_tokens,
            ctx: e.context,
            reference,
            lora,
        }))
    }

    /// A reference's continuations are counted (a comparison is complete when it covers them all); a model's
    /// agreements are gathered under its `file_type`, the merge's under [`MERGE_CHECK`].
    fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>) {
        let Some(g) = done.result.and_then(pb::TaskResult::greedy) else { return };
        let key = match self.subject {
            Subject::Reference | Subject::Adapter => {
                *into.greedy_references.entry(self.subject.to_string()).or_default() += g.continuations.len();
                return;
            }
            Subject::Model(target) => target.to_string(),
            Subject::MergedF32 => MERGE_CHECK.to_string(),
        };
        into.greedy.entry(key).or_insert_with(|| (self.subject, Vec::new())).1.extend(&g.agreements);
    }

    /// After the merge plan, when the release checks its merge: per prompt share the base with the adapter at run
    /// time, then the merge compared with it. After the plan, when there are prompts and models: per share the
    /// reference's continuations, then each measured model's compared with them. The report waits for the
    /// comparisons.
    fn grow(stage: Stage, ctx: &Ctx, results: &Results, out: &mut Grown) {
        match stage {
            Stage::Merged(mp) => {
                let Some(e) = merge_checked(ctx, mp) else { return };
                let part = |part| -> TaskKey { MergeCheck { part }.into() };
                for share in 0..e.prompt_shares {
                    let reference = Greedy { subject: Subject::Adapter, share };
                    let deps = vec![part(CheckPart::Lora), part(CheckPart::Base)];
                    out.add(reference, deps, check_cost(mp));
                    let deps = vec![reference.into(), part(CheckPart::Merged)];
                    out.add(Greedy { subject: Subject::MergedF32, share }, deps, check_cost(mp));
                }
            }
            Stage::Planned(inv) => {
                // The merge check's comparisons, made before the report existed.
                if let Some(e) = merged(results).and_then(|mp| merge_checked(ctx, mp)) {
                    let shares = 0..e.prompt_shares;
                    out.measured.extend(shares.map(|share| Greedy { subject: Subject::MergedF32, share }.into()));
                }
                let Some(e) = inv.evaluated(ctx).filter(|e| runs_greedy(ctx, e)) else { return };
                let cost = inv.plan.source_bytes;
                for share in 0..e.prompt_shares {
                    let reference = Greedy { subject: Subject::Reference, share };
                    out.add(reference, inv.ggufs(), cost);
                    for target in eval_targets(ctx) {
                        let mut deps = vec![reference.into()];
                        deps.extend(model_tasks(target, inv.n));
                        out.add_measured(Greedy { subject: Subject::Model(target), share }, deps, cost);
                    }
                }
            }
            Stage::Start
            | Stage::Calibrated(_)
            | Stage::TextPlanned(_)
            | Stage::Measured(_)
            | Stage::Looked(_)
            | Stage::Sensed => {}
        }
    }
}
