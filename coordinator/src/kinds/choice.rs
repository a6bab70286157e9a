//! `choice`: the release's multiple-choice tasks (`evaluation.choices`) scored in llama.cpp on the reference and on
//! each measured model, as `llama-perplexity --multiple-choice` scores them; the report sets each model's choices
//! beside the reference's.

use std::fmt;

use quantfarm_proto::{self as pb, task};

use super::expand::{eval_targets, model_tasks};
use super::lookup::model_of;
use super::subjects::Subject;
use super::{Done, Family, Folded, Grown, Results, Stage};
use crate::graph::Ctx;

/// The multiple-choice tasks on one subject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Choice {
    pub subject: Subject,
}

impl Family for Choice {
    const NAME: &'static str = "choice";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}", self.subject)
    }

    fn parse(rest: &[&str]) -> Option<Choice> {
        match rest {
            [t] => Some(Choice { subject: Subject::parse(t)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Probe)
    }

    fn stage(&self) -> String {
        format!("choice {}", self.subject)
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        Ok(task::Kind::Choice(pb::ChoiceTask {
            model: model_of(results, self.subject)?.url.clone(),
            tasks: ctx.eval.choices.clone().ok_or("the release's evaluation has no choices")?,
            ctx: 512,
        }))
    }

    fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>) {
        if let Some(c) = done.result.and_then(pb::TaskResult::choice) {
            into.choices.push((self.subject, c));
        }
    }

    /// After the plan, with choices: on the reference, and on each measured model after it is made. The report waits
    /// for them.
    fn grow(stage: Stage, ctx: &Ctx, _: &Results, out: &mut Grown) {
        let Stage::Planned(inv) = stage else { return };
        if inv.evaluated(ctx).is_none_or(|e| e.choices.is_none()) {
            return;
        }
        let cost = inv.plan.source_bytes;
        out.add_measured(Choice { subject: Subject::Reference }, inv.ggufs(), cost);
        for target in eval_targets(ctx) {
            out.add_measured(Choice { subject: Subject::Model(target) }, model_tasks(target, inv.n), cost);
        }
    }
}
