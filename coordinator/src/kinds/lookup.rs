//! The earlier results a task's message reads, each looked up by the key of the task that gave it, and the
//! settings several families share. An error names the task whose result is missing.

use quantfarm_proto::{self as pb, task_result};
use quantfarm_store::Location;

use super::subjects::{CheckPart, EvalTarget, MlxSubject, Subject};
use super::{Gguf, Imatrix, Kld, MergeCheck, Mlx, Quantize, Results, TaskKey, Vllm};
use crate::graph::naming::artifact;
use crate::graph::Ctx;
use crate::spec::ImatrixSource;

pub(super) fn plan_of<'a>(results: &Results<'a>) -> Result<&'a pb::PlanResult, String> {
    match results(&TaskKey::PLAN).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::Plan(p)) => Ok(p),
        _ => Err("the plan task has no plan result".into()),
    }
}

pub(super) fn merge_plan_of<'a>(results: &Results<'a>) -> Result<&'a pb::MergePlanResult, String> {
    match results(&super::Merge::Plan.into()).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::MergePlan(p)) => Ok(p),
        _ => Err("the merge-plan task has no merge plan result".into()),
    }
}

pub(super) fn imatrix_plan_of<'a>(results: &Results<'a>) -> Result<&'a pb::KldPlanResult, String> {
    match results(&Imatrix::Plan.into()).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::KldPlan(p)) => Ok(p),
        _ => Err("the imatrix/plan task has no plan".into()),
    }
}

pub(super) fn kld_plan_of<'a>(results: &Results<'a>) -> Result<&'a pb::KldPlanResult, String> {
    match results(&Kld::Plan.into()).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::KldPlan(p)) => Ok(p),
        _ => Err("the kld/plan task has no KL-divergence plan".into()),
    }
}

pub(super) fn artifact_of<'a>(results: &Results<'a>, key: &TaskKey) -> Result<&'a pb::Artifact, String> {
    match results(key).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::Artifact(a)) => a.artifact.as_ref().ok_or_else(|| format!("{key}: empty artifact")),
        _ => Err(format!("{key} has no artifact result")),
    }
}

pub(super) fn greedy_continuations(results: &Results, key: &TaskKey) -> Result<Vec<pb::GreedyContinuation>, String> {
    match results(key).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::Greedy(g)) => Ok(g.continuations.clone()),
        _ => Err(format!("{key} has no greedy result")),
    }
}

/// The merged checkpoint's folder: content-addressed by the merge's inputs and plan.
pub(super) fn merged_folder(ctx: &Ctx, results: &Results) -> Result<Location, String> {
    let mp = merge_plan_of(results)?;
    artifact(ctx, &["quantfarm merge v1", &mp.inputs_identity, &mp.plan_digest], &format!("{}-merged", ctx.spec.name))
}

/// The model the conversions read: the merged checkpoint when there is an adapter, else the source.
pub(super) fn model_source(ctx: &Ctx, results: &Results) -> Result<String, String> {
    match ctx.adapter {
        None => Ok(ctx.source.to_string()),
        Some(_) => Ok(merged_folder(ctx, results)?.to_string()),
    }
}

/// The reference: the GGUF BF16's first file (llama.cpp finds the others beside it).
pub(super) fn reference_of<'a>(results: &Results<'a>) -> Result<&'a pb::Artifact, String> {
    artifact_of(results, &Gguf { shard: 0 }.into())
}

/// Every file of the GGUF BF16, in order.
pub(super) fn reference_files<'a>(results: &Results<'a>) -> Result<Vec<&'a pb::Artifact>, String> {
    let plan = plan_of(results)?;
    (0..plan.shards.len() as u32).map(|shard| artifact_of(results, &Gguf { shard }.into())).collect()
}

/// The artifact a subject runs: the GGUF BF16 (first file), a quant level's first file, an MLX folder, or one of
/// the merge check's F32 GGUFs.
pub(super) fn model_of<'a>(results: &Results<'a>, subject: Subject) -> Result<&'a pb::Artifact, String> {
    match subject {
        Subject::Reference => reference_of(results),
        Subject::Adapter => artifact_of(results, &MergeCheck { part: CheckPart::Base }.into()),
        Subject::MergedF32 => artifact_of(results, &MergeCheck { part: CheckPart::Merged }.into()),
        Subject::Model(EvalTarget::Quant(level)) => artifact_of(results, &Quantize { level, shard: 0 }.into()),
        Subject::Model(EvalTarget::Mlx(rung)) => artifact_of(results, &Mlx { rung }.into()),
        Subject::Model(EvalTarget::Vllm(rung)) => artifact_of(results, &Vllm { rung }.into()),
    }
}

/// What mlx-lm loads for a subject: the HF checkpoint the GGUF BF16 was converted from (the source, or the merge),
/// or an MLX rung's folder.
pub(super) fn mlx_lm_model(ctx: &Ctx, results: &Results, subject: MlxSubject) -> Result<String, String> {
    match subject {
        MlxSubject::Bf16 => model_source(ctx, results),
        MlxSubject::Rung { rung } => Ok(artifact_of(results, &Mlx { rung }.into())?.url.clone()),
    }
}

/// The evaluation text's settings, for the KL-divergence tasks.
pub(super) fn kld_settings(ctx: &Ctx) -> Result<pb::KldSettings, String> {
    let e = ctx.spec.evaluation.as_ref().ok_or("the release has no evaluation section")?;
    Ok(pb::KldSettings {
        text: ctx.eval.text.clone().ok_or("the release's evaluation has no text")?,
        ctx: e.ctx,
        batch: e.batch,
        max_chunks: e.chunks.unwrap_or(0),
        section: "evaluation".into(),
    })
}

/// The calibration text's settings, for the importance-matrix tasks.
pub(super) fn imatrix_settings(ctx: &Ctx) -> Result<pb::KldSettings, String> {
    match ctx.spec.imatrix() {
        Some(ImatrixSource::Text { chunks, ctx: c, batch, .. }) => Ok(pb::KldSettings {
            text: ctx.imatrix.ok_or("the release computes no importance matrix")?.to_string(),
            ctx: *c,
            batch: *batch,
            max_chunks: chunks.unwrap_or(0),
            section: "imatrix".into(),
        }),
        _ => Err("the release computes no importance matrix".into()),
    }
}

/// Whether the computed importance matrix credits every expert on every token (`imatrix.all_experts`).
pub(super) fn imatrix_all_experts(ctx: &Ctx) -> bool {
    matches!(ctx.spec.imatrix(), Some(ImatrixSource::Text { all_experts: true, .. }))
}

/// Whether the farm computes the quants' importance matrix from a text.
pub(super) fn computes_imatrix(ctx: &Ctx) -> bool {
    matches!(ctx.spec.imatrix(), Some(ImatrixSource::Text { .. }))
}
