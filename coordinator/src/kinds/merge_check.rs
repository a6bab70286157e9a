//! `merge-check`: the merge check's inputs (link 1), each a GGUF file made from the base and the adapter: the
//! adapter as a GGUF LoRA, the base widened to F32, and the merge rounded to f32. Greedy tasks then compare the
//! merge with the base plus the adapter at run time.

use std::fmt;

use quantfarm_proto::{self as pb, task};

use super::expand::merge_checked;
use super::lookup::merge_plan_of;
use super::subjects::CheckPart;
use super::{Done, Family, Folded, Grown, Merge, Results, Stage};
use crate::graph::naming::artifact;
use crate::graph::Ctx;

/// One input of the merge check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MergeCheck {
    pub part: CheckPart,
}

/// The cost of a task over the merge check's F32 files: twice the bytes of a bf16 base.
pub(super) fn check_cost(mp: &pb::MergePlanResult) -> u64 {
    2 * mp.file_bytes.iter().sum::<u64>().max(1)
}

impl Family for MergeCheck {
    const NAME: &'static str = "merge-check";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}", self.part.name())
    }

    fn parse(rest: &[&str]) -> Option<MergeCheck> {
        match rest {
            [p] => Some(MergeCheck { part: CheckPart::parse(p)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Merge)
    }

    fn stage(&self) -> String {
        "merge check".into()
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        let part = self.part;
        let mp = merge_plan_of(results)?;
        let name = format!("{}-{}", ctx.spec.name, part.file_suffix());
        let output =
            artifact(ctx, &["quantfarm merge-check v1", part.name(), &mp.inputs_identity, &mp.plan_digest], &name)?;
        Ok(task::Kind::MergeCheck(pb::MergeCheckTask {
            base: ctx.source.to_string(),
            adapter: ctx.adapter.unwrap_or_default().to_string(),
            base_name: ctx.spec.base_name.clone().unwrap_or_default(),
            part: part.proto() as i32,
            output: output.to_string(),
        }))
    }

    /// The report reads each input's file by its key (`merge_check`).
    fn fold<'a>(&self, _: Done<'a>, _: &mut Folded<'a>) {}

    /// After the merge plan, when the release checks its merge (`expand::merge_checked`).
    fn grow(stage: Stage, ctx: &Ctx, _: &Results, out: &mut Grown) {
        let Stage::Merged(mp) = stage else { return };
        if merge_checked(ctx, mp).is_some() {
            for part in CheckPart::ALL {
                out.add(MergeCheck { part }, vec![Merge::Plan.into()], check_cost(mp));
            }
        }
    }
}
