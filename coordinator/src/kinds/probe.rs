//! `probe`: the probe suite (task probes, link 4) run in llama.cpp on the reference or a measured model.

use std::fmt;

use quantfarm_proto::{self as pb, task};

use super::expand::{eval_targets, model_tasks};
use super::lookup::model_of;
use super::subjects::Subject;
use super::{Done, Family, Folded, Grown, Results, Stage};
use crate::graph::Ctx;

/// The probe suite on one subject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Probe {
    pub subject: Subject,
}

impl Family for Probe {
    const NAME: &'static str = "probe";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}", self.subject)
    }

    fn parse(rest: &[&str]) -> Option<Probe> {
        match rest {
            [t] => Some(Probe { subject: Subject::parse(t)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Probe)
    }

    fn stage(&self) -> String {
        format!("probe {}", self.subject)
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        Ok(task::Kind::Probe(pb::ProbeTask {
            model: model_of(results, self.subject)?.url.clone(),
            suite: ctx.eval.probes.clone().ok_or("the release's evaluation has no probes")?,
            ctx: ctx.spec.evaluation.as_ref().map_or(4096, |e| e.context),
        }))
    }

    fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>) {
        if let Some(p) = done.result.and_then(pb::TaskResult::probe) {
            into.probes.push((self.subject, p));
        }
    }

    /// After the plan, when there are probes: on the reference, and on each measured model after it is made. The
    /// report waits for them.
    fn grow(stage: Stage, ctx: &Ctx, _: &Results, out: &mut Grown) {
        let Stage::Planned(inv) = stage else { return };
        if inv.evaluated(ctx).is_none_or(|e| e.probes.is_none()) {
            return;
        }
        let cost = inv.plan.source_bytes;
        out.add_measured(Probe { subject: Subject::Reference }, inv.ggufs(), cost);
        for target in eval_targets(ctx) {
            out.add_measured(Probe { subject: Subject::Model(target) }, model_tasks(target, inv.n), cost);
        }
    }
}
