//! `vllm`: a compressed-tensors checkpoint for vLLM, FP8_DYNAMIC or W4A16 as llm-compressor writes it, made from the
//! source (or the merge). The plan ran its pre-flight on the source (`PlanTask.vllm`), so a scheme that cannot be
//! made was refused before any of these started.

use std::fmt;

use quantfarm_proto::{self as pb, task};

use super::lookup::{model_source, plan_of};
use super::{Done, Family, Folded, Grown, Results, Slot, Stage, TaskKey};
use crate::graph::naming::artifact;
use crate::graph::Ctx;
use crate::spec::{EvalTarget, VllmRung};

/// The vLLM rung of one scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Vllm {
    pub rung: VllmRung,
}

impl Vllm {
    /// The message that makes the checkpoint (its verification recomputes it with the same one).
    pub(super) fn task(self, ctx: &Ctx, results: &Results) -> Result<pb::VllmTask, String> {
        let outputs = ctx.spec.outputs.vllm.as_ref().ok_or("the release has no outputs.vllm")?;
        let scheme = outputs.proto(self.rung);
        let plan = plan_of(results)?;
        let group_size = scheme.group_size.to_string();
        let mut identity = vec!["quantfarm vllm v1", &scheme.scheme, &group_size, &scheme.like];
        identity.extend(scheme.ignore.iter().map(String::as_str));
        identity.push(&plan.source_identity);
        let name = format!("{}-{}", ctx.spec.prefix(), EvalTarget::Vllm(self.rung));
        let output = artifact(ctx, &identity, &name)?;
        Ok(pb::VllmTask { source: model_source(ctx, results)?, scheme: Some(scheme), output: output.to_string() })
    }
}

impl Family for Vllm {
    const NAME: &'static str = "vllm";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}", self.rung)
    }

    fn parse(rest: &[&str]) -> Option<Vllm> {
        match rest {
            [r] => Some(Vllm { rung: VllmRung::parse(r)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Vllm)
    }

    fn stage(&self) -> String {
        format!("vllm {}", self.rung)
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        Ok(task::Kind::Vllm(self.task(ctx, results)?))
    }

    fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>) {
        into.makes(Slot::Rung(EvalTarget::Vllm(self.rung)), done);
    }

    /// After the plan: one per scheme.
    fn grow(stage: Stage, ctx: &Ctx, _: &Results, out: &mut Grown) {
        let Stage::Planned(inv) = stage else { return };
        for &rung in ctx.spec.vllm_rungs() {
            out.add(Vllm { rung }, vec![TaskKey::PLAN], inv.plan.source_bytes);
        }
    }
}
