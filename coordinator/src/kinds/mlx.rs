//! `mlx`: an MLX affine checkpoint of `bits` bits, converted from the source (or the merge).

use std::fmt;

use quantfarm_proto::{self as pb, task};

use super::lookup::{model_source, plan_of};
use super::{num, Done, Family, Folded, Grown, Results, Slot, Stage, TaskKey};
use crate::graph::naming::artifact;
use crate::graph::Ctx;
use crate::spec::EvalTarget;

/// The MLX rung of `bits` bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mlx {
    pub bits: u32,
}

impl Mlx {
    /// The message that makes the checkpoint (its verification recomputes it with the same one).
    pub(super) fn task(self, ctx: &Ctx, results: &Results) -> Result<pb::MlxTask, String> {
        let bits = self.bits;
        let plan = plan_of(results)?;
        let group_size = ctx.spec.outputs.mlx.as_ref().map_or(64, |m| m.group_size);
        let identity = ["quantfarm mlx v1", &bits.to_string(), &group_size.to_string(), &plan.source_identity];
        let output = artifact(ctx, &identity, &format!("{}-{}", ctx.spec.prefix(), EvalTarget::Mlx { bits }))?;
        Ok(pb::MlxTask { source: model_source(ctx, results)?, bits, group_size, output: output.to_string() })
    }
}

impl Family for Mlx {
    const NAME: &'static str = "mlx";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}", self.bits)
    }

    fn parse(rest: &[&str]) -> Option<Mlx> {
        match rest {
            [b] => Some(Mlx { bits: num(b)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Mlx)
    }

    fn stage(&self) -> String {
        format!("mlx {}-bit", self.bits)
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        Ok(task::Kind::Mlx(self.task(ctx, results)?))
    }

    fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>) {
        into.makes(Slot::Rung(EvalTarget::Mlx { bits: self.bits }), done);
    }

    /// After the plan: one per bit width.
    fn grow(stage: Stage, ctx: &Ctx, _: &Results, out: &mut Grown) {
        let Stage::Planned(inv) = stage else { return };
        for &bits in ctx.spec.mlx_bits() {
            out.add(Mlx { bits }, vec![TaskKey::PLAN], inv.plan.source_bytes);
        }
    }
}
