//! `mlx`: an MLX checkpoint (every module at `bits` bits, by an mlx-lm mixed recipe, or in a floating-point mode),
//! converted from the source (or the merge).

use std::fmt;

use quantfarm_proto::{self as pb, task};

use super::lookup::{model_source, plan_of};
use super::{num, Done, Family, Folded, Grown, Results, Slot, Stage, TaskKey};
use crate::graph::naming::artifact;
use crate::graph::Ctx;
use crate::spec::{EvalTarget, MlxRung};

/// An MLX rung.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mlx {
    pub rung: MlxRung,
}

impl Mlx {
    /// The message that makes the checkpoint (its verification recomputes it with the same one).
    pub(super) fn task(self, ctx: &Ctx, results: &Results) -> Result<pb::MlxTask, String> {
        let (rung, bits) = (self.rung, self.rung.bits());
        let plan = plan_of(results)?;
        let group_size = ctx.spec.outputs.mlx.as_ref().map_or(64, |m| m.group_size);
        // A uniform rung's identity is its bits (as before recipes existed, so its cached artifacts still count).
        let what = match rung {
            MlxRung::Bits(_) => bits.to_string(),
            MlxRung::Mixed(r) => r.to_string(),
            MlxRung::Mode(m) => m.name().to_string(),
        };
        let identity = ["quantfarm mlx v1", &what, &group_size.to_string(), &plan.source_identity];
        let output = artifact(ctx, &identity, &format!("{}-{}", ctx.spec.prefix(), EvalTarget::Mlx(rung)))?;
        let recipe = rung.recipe().map(|r| r.to_string()).unwrap_or_default();
        let mode = rung.mode().map(|m| m.name().to_string()).unwrap_or_default();
        // A mode has its own group size.
        let group_size = rung.mode().map_or(group_size, |m| m.group_size() as u32);
        let source = model_source(ctx, results)?;
        Ok(pb::MlxTask { source, bits, group_size, output: output.to_string(), recipe, mode })
    }
}

impl Family for Mlx {
    const NAME: &'static str = "mlx";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}", MlxKey(self.rung))
    }

    fn parse(rest: &[&str]) -> Option<Mlx> {
        match rest {
            [r] => Some(Mlx { rung: MlxKey::parse(r)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Mlx)
    }

    fn stage(&self) -> String {
        match self.rung {
            MlxRung::Bits(b) => format!("mlx {b}-bit"),
            MlxRung::Mixed(r) => format!("mlx {r}"),
            MlxRung::Mode(m) => format!("mlx {}", m.name()),
        }
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        Ok(task::Kind::Mlx(self.task(ctx, results)?))
    }

    fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>) {
        into.makes(Slot::Rung(EvalTarget::Mlx(self.rung)), done);
    }

    /// After the plan: one per bit width.
    fn grow(stage: Stage, ctx: &Ctx, _: &Results, out: &mut Grown) {
        let Stage::Planned(inv) = stage else { return };
        for rung in ctx.spec.mlx_rungs() {
            out.add(Mlx { rung }, vec![TaskKey::PLAN], inv.plan.source_bytes);
        }
    }
}

/// How a rung shows in task keys: its bits (`mlx/4`, as before recipes existed), or the recipe's name
/// (`mlx/mixed_4_6`).
pub(super) struct MlxKey(pub MlxRung);

impl fmt::Display for MlxKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            MlxRung::Bits(b) => write!(f, "{b}"),
            MlxRung::Mixed(r) => write!(f, "{r}"),
            MlxRung::Mode(m) => f.write_str(m.name()),
        }
    }
}

impl MlxKey {
    pub(super) fn parse(s: &str) -> Option<MlxRung> {
        match (crate::spec::MixedRecipe::parse(s), crate::spec::FpMode::parse(s)) {
            (Some(r), _) => Some(MlxRung::Mixed(r)),
            (None, Some(m)) => Some(MlxRung::Mode(m)),
            (None, None) => num(s).map(MlxRung::Bits),
        }
    }
}
