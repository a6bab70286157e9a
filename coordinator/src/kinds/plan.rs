//! `plan`: the source's (or the merge's) inventory, split plan and identity, which the conversions expand from.

use std::fmt;

use quantfarm_proto::{self as pb, task};

use super::expand::{check_plan, merge_files};
use super::lookup::{computes_imatrix, model_source};
use super::{Done, Family, Folded, Grown, Merge, Opens, Results, Stage, TaskKey};
use crate::graph::{synthetic_name, Ctx};

/// The one plan of a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Plan;

impl Family for Plan {
    const NAME: &'static str = "plan";

    fn write_rest(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ok(())
    }

    fn parse(rest: &[&str]) -> Option<Plan> {
        rest.is_empty().then_some(Plan)
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Plan)
    }

    fn stage(&self) -> String {
        "plan".into()
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        Ok(task::Kind::Plan(pb::PlanTask {
            source: model_source(ctx, results)?,
            split: ctx.spec.split_rule(),
            // The plan checks and hashes a given file; a computed one is checked by its merge.
            imatrix: if computes_imatrix(ctx) { String::new() } else { ctx.imatrix.unwrap_or_default().to_string() },
            vllm: ctx
                .spec
                .outputs
                .vllm
                .as_ref()
                .map_or_else(Vec::new, |v| v.schemes.iter().map(|&r| v.proto(r)).collect()),
            synthetic: match synthetic_name(&ctx.spec.source) {
                Some(Ok(_)) => ctx.spec.source.trim_start_matches("synthetic:").to_string(),
                _ => String::new(),
            },
        }))
    }

    /// The report reads the plan's result by its key (the source's identity, the imatrix's digest).
    fn fold<'a>(&self, _: Done<'a>, _: &mut Folded<'a>) {}

    /// Its result opens the plan's stage (the tensors and split files are known), once checked.
    fn opens<'r>(&self, result: &'r pb::TaskResult) -> Result<Opens<'r>, String> {
        let Some(plan) = result.plan() else { return Ok(Opens::Nothing) };
        check_plan(plan).map_err(|e| format!("plan: {e}"))?;
        Ok(Opens::Planned(plan))
    }

    /// At the start when there is no adapter to merge first (and something to convert); after the merge plan,
    /// waiting for the merge's files.
    fn grow(stage: Stage, ctx: &Ctx, _: &Results, out: &mut Grown) {
        match stage {
            Stage::Start => {
                if ctx.adapter.is_none() && ctx.spec.converts() {
                    out.add(Plan, vec![], 1);
                }
            }
            Stage::Merged(mp) => {
                let mut deps: Vec<TaskKey> = merge_files(mp).map(|(file, _)| Merge::File { file }.into()).collect();
                deps.push(Merge::Side.into());
                out.add(Plan, deps, 1);
            }
            Stage::Planned(_)
            | Stage::Calibrated(_)
            | Stage::TextPlanned(_)
            | Stage::Measured(_)
            | Stage::Looked(_)
            | Stage::Sensed => {}
        }
    }
}
