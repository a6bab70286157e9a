//! `imatrix`: the importance matrix computed from a calibration text, as llama-imatrix collects it. The plan
//! tokenizes the text with the reference (the GGUF BF16) and counts its chunks; each chunk group's statistics are a
//! part (F64 sums); the merge adds the parts in chunk order into llama.cpp's GGUF imatrix, which the quantize tasks
//! use.

use std::fmt;

use quantfarm_proto::{self as pb, task};
use quantfarm_store::Location;

use super::expand::{chunked, model_cost};
use super::lookup::computes_imatrix;
use super::lookup::{artifact_of, imatrix_all_experts, imatrix_plan_of, imatrix_settings, reference_of};
use super::{num, Done, Family, Folded, Grown, Opens, Results, Stage, TaskKey};
use crate::graph::naming::artifact;
use crate::graph::Ctx;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Imatrix {
    /// Tokenizes the calibration text with the reference and counts its chunks (a KL-divergence plan's message).
    Plan,
    /// The importance statistics of one chunk group of the calibration text (a part, F64 sums).
    Group { group: u32 },
    /// The parts added in chunk order into llama.cpp's GGUF imatrix.
    Merge,
}

/// The calibration text's name as recorded in the file (llama-imatrix records `-f` as given; the farm, the name).
fn dataset(ctx: &Ctx) -> Result<String, String> {
    let text = ctx.imatrix.ok_or("the release computes no importance matrix")?;
    Ok(Location::parse(text).map_err(|e| e.to_string())?.file_name().to_string())
}

fn group_task(ctx: &Ctx, results: &Results, group: u32) -> Result<pb::ImatrixTask, String> {
    let kp = imatrix_plan_of(results)?;
    let settings = imatrix_settings(ctx)?;
    let first = group * kp.n_seq;
    if first >= kp.n_chunks {
        return Err(format!("imatrix chunk group {group} starts past the text's {} chunks", kp.n_chunks));
    }
    let n_chunks = kp.n_seq.min(kp.n_chunks - first);
    let reference = reference_of(results)?;
    let (ctx_s, batch_s, first_s, n_s) =
        (settings.ctx.to_string(), settings.batch.to_string(), first.to_string(), n_chunks.to_string());
    let dataset = dataset(ctx)?;
    let name = format!("{}-imatrix-{first:05}-{n_chunks}.part.gguf", ctx.spec.prefix());
    let all_experts = imatrix_all_experts(ctx);
    let mut id = vec![
        "quantfarm imatrix-part v1",
        &kp.text_sha256,
        &kp.tokens_sha256,
        &dataset,
        &ctx_s,
        &batch_s,
        &first_s,
        &n_s,
        &reference.sha256,
    ];
    // (Only when set: the parts of a release without it keep their identities.)
    if all_experts {
        id.push("all experts");
    }
    let output = artifact(ctx, &id, &name)?;
    Ok(pb::ImatrixTask {
        reference: reference.url.clone(),
        settings: Some(settings),
        first_chunk: first,
        n_chunks,
        tokens_sha256: kp.tokens_sha256.clone(),
        dataset,
        output: output.to_string(),
        all_experts,
    })
}

fn merge_task(ctx: &Ctx, results: &Results) -> Result<pb::ImatrixMergeTask, String> {
    let kp = imatrix_plan_of(results)?;
    let groups = kp.n_chunks.div_ceil(kp.n_seq.max(1));
    let parts: Vec<pb::Artifact> = (0..groups)
        .map(|group| artifact_of(results, &Imatrix::Group { group }.into()).cloned())
        .collect::<Result<_, _>>()?;
    let mut id = vec!["quantfarm imatrix v1"];
    id.extend(parts.iter().map(|a| a.sha256.as_str()));
    let name = format!("{}-imatrix.gguf", ctx.spec.prefix());
    let output = artifact(ctx, &id, &name)?;
    Ok(pb::ImatrixMergeTask { parts, output: output.to_string() })
}

impl Family for Imatrix {
    const NAME: &'static str = "imatrix";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Imatrix::Plan => write!(f, "/plan"),
            Imatrix::Group { group } => write!(f, "/{group}"),
            Imatrix::Merge => write!(f, "/merge"),
        }
    }

    fn parse(rest: &[&str]) -> Option<Imatrix> {
        match rest {
            ["plan"] => Some(Imatrix::Plan),
            ["merge"] => Some(Imatrix::Merge),
            [g] => Some(Imatrix::Group { group: num(g)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        match self {
            // A KldPlan task over the calibration text.
            Imatrix::Plan => Some(pb::WorkerKind::Kld),
            Imatrix::Group { .. } | Imatrix::Merge => Some(pb::WorkerKind::Imatrix),
        }
    }

    fn stage(&self) -> String {
        "imatrix".into()
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        Ok(match self {
            Imatrix::Plan => task::Kind::KldPlan(pb::KldPlanTask {
                reference: reference_of(results)?.url.clone(),
                settings: Some(imatrix_settings(ctx)?),
            }),
            Imatrix::Group { group } => task::Kind::Imatrix(group_task(ctx, results, *group)?),
            Imatrix::Merge => task::Kind::ImatrixMerge(merge_task(ctx, results)?),
        })
    }

    /// The report reads the plan's and the merge's results by their keys (`imatrix`).
    fn fold<'a>(&self, _: Done<'a>, _: &mut Folded<'a>) {}

    /// The plan's result opens the calibration text's stage (its chunk groups are known).
    fn opens<'r>(&self, result: &'r pb::TaskResult) -> Result<Opens<'r>, String> {
        match self {
            Imatrix::Plan => {
                Ok(chunked(result, "imatrix/plan: the calibration text")?.map_or(Opens::Nothing, Opens::Calibrated))
            }
            Imatrix::Group { .. } | Imatrix::Merge => Ok(Opens::Nothing),
        }
    }

    /// After the plan, when the release computes its importance matrix: the plan over the GGUF BF16, and the merge
    /// after it; after the calibration text's plan, its chunk groups, which the merge then waits for.
    fn grow(stage: Stage, ctx: &Ctx, results: &Results, out: &mut Grown) {
        match stage {
            Stage::Planned(inv) => {
                if computes_imatrix(ctx) && inv.n > 0 {
                    out.add(Imatrix::Plan, inv.ggufs(), inv.plan.source_bytes);
                    out.add(Imatrix::Merge, vec![Imatrix::Plan.into()], 1);
                }
            }
            Stage::Calibrated(kp) => {
                let groups: Vec<TaskKey> =
                    (0..kp.n_chunks.div_ceil(kp.n_seq.max(1))).map(|group| Imatrix::Group { group }.into()).collect();
                for group in &groups {
                    out.add(group.clone(), vec![Imatrix::Plan.into()], model_cost(results));
                }
                out.waits.push((Imatrix::Merge.into(), groups));
            }
            Stage::Start
            | Stage::Merged(_)
            | Stage::TextPlanned(_)
            | Stage::Measured(_)
            | Stage::Looked(_)
            | Stage::Sensed => {}
        }
    }
}
