//! `report`: the coordinator's own last task, which gathers every result, applies the gates and signs
//! (`crate::report`).

use std::fmt;

use quantfarm_proto::{self as pb, task};

use super::{Done, Family, Folded, Grown, Results, Stage};
use crate::graph::Ctx;

/// The one report of a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Report;

impl Family for Report {
    const NAME: &'static str = "report";

    fn write_rest(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ok(())
    }

    fn parse(rest: &[&str]) -> Option<Report> {
        rest.is_empty().then_some(Report)
    }

    /// Run by the coordinator itself, never leased.
    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        None
    }

    fn stage(&self) -> String {
        "report".into()
    }

    fn message(&self, _: &Ctx, _: &Results) -> Result<task::Kind, String> {
        Err("the report is the coordinator's own task".into())
    }

    /// The report is what the others fold into.
    fn fold<'a>(&self, _: Done<'a>, _: &mut Folded<'a>) {}

    /// Last of the table: at the start of a release that converts nothing, after what the start made; after the
    /// plan, after everything the other families made it wait for.
    fn grow(stage: Stage, ctx: &Ctx, _: &Results, out: &mut Grown) {
        match stage {
            Stage::Start => {
                if !ctx.spec.converts() {
                    let deps = out.tasks.iter().map(|t| t.key.clone()).collect();
                    out.add(Report, deps, 1);
                }
            }
            Stage::Planned(_) => {
                let deps = std::mem::take(&mut out.measured);
                out.add(Report, deps, 1);
            }
            Stage::Merged(_)
            | Stage::Calibrated(_)
            | Stage::TextPlanned(_)
            | Stage::Measured(_)
            | Stage::Looked(_)
            | Stage::Sensed => {}
        }
    }
}
