//! `noop`: a task that sleeps and succeeds, for benchmarking the scheduler (`outputs.noop`).

use std::fmt;

use quantfarm_proto::{self as pb, task};

use super::{num, Done, Family, Folded, Grown, Results, Stage};
use crate::graph::Ctx;

/// The `n`th no-op of a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Noop {
    pub n: u32,
}

impl Family for Noop {
    const NAME: &'static str = "noop";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}", self.n)
    }

    fn parse(rest: &[&str]) -> Option<Noop> {
        match rest {
            [n] => Some(Noop { n: num(n)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Noop)
    }

    fn stage(&self) -> String {
        "noop".into()
    }

    fn message(&self, ctx: &Ctx, _: &Results) -> Result<task::Kind, String> {
        Ok(task::Kind::Noop(pb::NoopTask { sleep_ms: ctx.spec.outputs.noop.as_ref().map_or(0, |n| n.sleep_ms) }))
    }

    /// Nothing but its task record.
    fn fold<'a>(&self, _: Done<'a>, _: &mut Folded<'a>) {}

    /// At the start, none waiting; the report waits for them.
    fn grow(stage: Stage, ctx: &Ctx, _: &Results, out: &mut Grown) {
        let Some(noop) = &ctx.spec.outputs.noop else { return };
        match stage {
            Stage::Start => {
                for n in 0..noop.tasks {
                    out.add(Noop { n }, vec![], noop.sleep_ms as u64 + 1);
                }
            }
            // Made at the start, before the report existed.
            Stage::Planned(_) => out.measured.extend((0..noop.tasks).map(|n| Noop { n }.into())),
            Stage::Merged(_)
            | Stage::Calibrated(_)
            | Stage::TextPlanned(_)
            | Stage::Measured(_)
            | Stage::Looked(_)
            | Stage::Sensed => {}
        }
    }
}
