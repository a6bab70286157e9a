//! `merge`: an adapter merged into its base exactly (link 1). The plan checks the adapter against the base and
//! lists the merged checkpoint's files; then one task per safetensors file, and one for the side files (config,
//! tokenizer, index).

use std::fmt;

use quantfarm_proto::{self as pb, task};

use super::expand::merge_files;
use super::lookup::{merge_plan_of, merged_folder};
use super::{num, Done, Family, Folded, Grown, Opens, Results, Slot, Stage};
use crate::graph::Ctx;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Merge {
    /// Checks the adapter against the base and lists the merged checkpoint's files.
    Plan,
    /// One safetensors file of the merged checkpoint.
    File { file: u32 },
    /// The merged checkpoint's config.json, tokenizer files and index.
    Side,
}

impl Merge {
    /// The file it writes (`None` for the side files).
    fn file(self) -> Option<u32> {
        match self {
            Merge::Plan | Merge::Side => None,
            Merge::File { file } => Some(file),
        }
    }
}

/// The message that writes one file of the merge (`None`: the side files); its verification recomputes it with the
/// same one.
pub(super) fn merge_task(ctx: &Ctx, results: &Results, file: Option<u32>) -> Result<pb::MergeTask, String> {
    let mp = merge_plan_of(results)?;
    let folder = merged_folder(ctx, results)?;
    let output = match file {
        Some(f) => {
            let name = mp.files.get(f as usize).ok_or_else(|| format!("the merge plan has no file {f}"))?;
            folder.child(name).map_err(|e| e.to_string())?
        }
        None => folder,
    };
    Ok(pb::MergeTask {
        base: ctx.source.to_string(),
        adapter: ctx.adapter.unwrap_or_default().to_string(),
        base_name: ctx.spec.base_name.clone().unwrap_or_default(),
        plan_digest: mp.plan_digest.clone(),
        file: file.unwrap_or(0),
        side_files: file.is_none(),
        output: output.to_string(),
    })
}

impl Family for Merge {
    const NAME: &'static str = "merge";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Merge::Plan => write!(f, "/plan"),
            Merge::File { file } => write!(f, "/{file}"),
            Merge::Side => write!(f, "/side"),
        }
    }

    fn parse(rest: &[&str]) -> Option<Merge> {
        match rest {
            ["plan"] => Some(Merge::Plan),
            ["side"] => Some(Merge::Side),
            [f] => Some(Merge::File { file: num(f)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Merge)
    }

    fn stage(&self) -> String {
        "merge".into()
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        Ok(match self {
            Merge::Plan => task::Kind::MergePlan(pb::MergePlanTask {
                base: ctx.source.to_string(),
                adapter: ctx.adapter.unwrap_or_default().to_string(),
                base_name: ctx.spec.base_name.clone().unwrap_or_default(),
            }),
            Merge::File { .. } | Merge::Side => task::Kind::Merge(merge_task(ctx, results, self.file())?),
        })
    }

    /// The files are the merged checkpoint's; the report reads the plan by its key.
    fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>) {
        match self {
            Merge::Plan => {}
            Merge::File { .. } | Merge::Side => into.makes(Slot::Merged, done),
        }
    }

    /// The merge plan opens the merge's stage (its files are known).
    fn opens<'r>(&self, result: &'r pb::TaskResult) -> Result<Opens<'r>, String> {
        match (self, result.merge_plan()) {
            (Merge::Plan, Some(mp)) if mp.files.is_empty() => {
                Err("merge plan: the base has no safetensors files".into())
            }
            (Merge::Plan, Some(mp)) => Ok(Opens::Merged(mp)),
            (Merge::Plan | Merge::File { .. } | Merge::Side, _) => Ok(Opens::Nothing),
        }
    }

    /// The plan at the start of a release with an adapter; after it, one task per safetensors file and one for the
    /// side files.
    fn grow(stage: Stage, ctx: &Ctx, _: &Results, out: &mut Grown) {
        match stage {
            Stage::Start => {
                if ctx.adapter.is_some() {
                    out.add(Merge::Plan, vec![], 1);
                }
            }
            Stage::Merged(mp) => {
                for (file, bytes) in merge_files(mp) {
                    out.add(Merge::File { file }, vec![Merge::Plan.into()], bytes);
                }
                out.add(Merge::Side, vec![Merge::Plan.into()], 1);
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
