//! The concrete task message a worker receives once the task's dependencies have results: built from the release's
//! spec and those results alone, so it is rebuilt the same way after a restart.

use quantfarm_proto::{self as pb, task, task_result, verify_task};
use quantfarm_store::Location;

use super::expand::computes_imatrix;
use super::keys::{CheckPart, EvalTarget, MlxSubject, Subject, TaskKey};
use super::naming::{artifact, file_name, split_text, synthetic_name};
use super::{Ctx, Results};
use crate::spec::{ImatrixSource, Level, Peer};

pub(super) fn plan_of<'a>(results: &Results<'a>) -> Result<&'a pb::PlanResult, String> {
    match results(&TaskKey::Plan).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::Plan(p)) => Ok(p),
        _ => Err("the plan task has no plan result".into()),
    }
}

pub(super) fn merge_plan_of<'a>(results: &Results<'a>) -> Result<&'a pb::MergePlanResult, String> {
    match results(&TaskKey::MergePlan).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::MergePlan(p)) => Ok(p),
        _ => Err("the merge-plan task has no merge plan result".into()),
    }
}

/// The merged checkpoint's folder: content-addressed by the merge's inputs and plan.
fn merged_folder(ctx: &Ctx, results: &Results) -> Result<Location, String> {
    let mp = merge_plan_of(results)?;
    artifact(ctx, &["quantfarm merge v1", &mp.inputs_identity, &mp.plan_digest], &format!("{}-merged", ctx.spec.name))
}

/// The model the conversions read: the merged checkpoint when there is an adapter, else the source.
fn model_source(ctx: &Ctx, results: &Results) -> Result<String, String> {
    if ctx.adapter.is_empty() {
        Ok(ctx.source.to_string())
    } else {
        Ok(merged_folder(ctx, results)?.to_string())
    }
}

fn merge_task(ctx: &Ctx, results: &Results, file: Option<u32>) -> Result<pb::MergeTask, String> {
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
        adapter: ctx.adapter.to_string(),
        base_name: ctx.spec.base_name.clone().unwrap_or_default(),
        plan_digest: mp.plan_digest.clone(),
        file: file.unwrap_or(0),
        side_files: file.is_none(),
        output: output.to_string(),
    })
}

fn mlx_task(ctx: &Ctx, results: &Results, bits: u32) -> Result<pb::MlxTask, String> {
    let plan = plan_of(results)?;
    let group_size = ctx.spec.outputs.mlx.as_ref().map_or(64, |m| m.group_size);
    let identity = ["quantfarm mlx v1", &bits.to_string(), &group_size.to_string(), &plan.source_identity];
    let output = artifact(ctx, &identity, &format!("{}-MLX-{bits}bit", ctx.spec.prefix()))?;
    Ok(pb::MlxTask { source: model_source(ctx, results)?, bits, group_size, output: output.to_string() })
}

fn artifact_of<'a>(results: &Results<'a>, key: &TaskKey) -> Result<&'a pb::Artifact, String> {
    match results(key).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::Artifact(a)) => a.artifact.as_ref().ok_or_else(|| format!("{key}: empty artifact")),
        _ => Err(format!("{key} has no artifact result")),
    }
}

fn gguf_task(ctx: &Ctx, results: &Results, shard: u32) -> Result<pb::GgufShardTask, String> {
    let plan = plan_of(results)?;
    let n = plan.shards.len() as u32;
    let split = ctx.spec.split_rule();
    let name = file_name(&format!("{}-BF16", ctx.spec.prefix()), shard, n);
    let output = artifact(
        ctx,
        &["quantfarm gguf-bf16 v1", &plan.source_identity, &plan.plan_digest, &split_text(&split)],
        &name,
    )?;
    Ok(pb::GgufShardTask {
        source: model_source(ctx, results)?,
        plan_digest: plan.plan_digest.clone(),
        split,
        shard,
        n_shards: n,
        output: output.to_string(),
    })
}

fn quantize_task(ctx: &Ctx, results: &Results, level: Level, shard: u32) -> Result<pb::QuantizeTask, String> {
    let plan = plan_of(results)?;
    let n = plan.shards.len() as u32;
    let rung = ctx.spec.rung(level).ok_or_else(|| format!("{level} is not a rung of this release"))?;
    let inputs: Vec<&pb::Artifact> =
        (0..n).map(|s| artifact_of(results, &TaskKey::Gguf { shard: s })).collect::<Result<_, _>>()?;
    let (imatrix, imatrix_sha256) = match ctx.spec.imatrix() {
        None => (String::new(), String::new()),
        Some(ImatrixSource::File(_)) => (ctx.imatrix.to_string(), plan.imatrix_sha256.clone()),
        Some(ImatrixSource::Text { .. }) => {
            let a = artifact_of(results, &TaskKey::ImatrixMerge)?;
            (a.url.clone(), a.sha256.clone())
        }
    };
    let recipe = rung.recipe();
    let tensor_types: Vec<String> = recipe.map_or(vec![], |r| r.tensor_types.iter().map(|t| t.arg()).collect());
    let type_name = |t: Option<quantfarm_ggml::GgmlType>| t.map_or(String::new(), |t| t.name().to_string());
    let output_tensor_type = type_name(recipe.and_then(|r| r.output_tensor_type));
    let token_embedding_type = type_name(recipe.and_then(|r| r.token_embedding_type));
    // A plain file type's identity is as it always was; a recipe's adds its flags (its name changes no byte).
    let mut parts = vec!["quantfarm quantize v1", rung.base().name()];
    if recipe.is_some() {
        parts.push("recipe");
        parts.extend(tensor_types.iter().map(|t| t.as_str()));
        parts.extend(["output", &output_tensor_type, "token_embd", &token_embedding_type]);
    }
    parts.extend(inputs.iter().map(|a| a.sha256.as_str()));
    if !imatrix.is_empty() {
        parts.push("imatrix");
        parts.push(&imatrix_sha256);
    }
    let name = file_name(&format!("{}-{level}", ctx.spec.prefix()), shard, n);
    let output = artifact(ctx, &parts, &name)?;
    Ok(pb::QuantizeTask {
        input: inputs[0].url.clone(),
        shard,
        n_shards: n,
        file_type: rung.base().name().to_string(),
        output: output.to_string(),
        imatrix,
        imatrix_sha256,
        tensor_types,
        output_tensor_type,
        token_embedding_type,
    })
}

fn imatrix_settings(ctx: &Ctx) -> Result<pb::KldSettings, String> {
    match ctx.spec.imatrix() {
        Some(ImatrixSource::Text { chunks, ctx: c, batch, .. }) => Ok(pb::KldSettings {
            text: ctx.imatrix.to_string(),
            ctx: *c,
            batch: *batch,
            max_chunks: chunks.unwrap_or(0),
            section: "imatrix".into(),
        }),
        _ => Err("the release computes no importance matrix".into()),
    }
}

fn imatrix_plan_of<'a>(results: &Results<'a>) -> Result<&'a pb::KldPlanResult, String> {
    match results(&TaskKey::ImatrixPlan).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::KldPlan(p)) => Ok(p),
        _ => Err("the imatrix/plan task has no plan".into()),
    }
}

/// The calibration text's name as recorded in the file (llama-imatrix records `-f` as given; the farm, the name).
fn imatrix_dataset(ctx: &Ctx) -> Result<String, String> {
    Ok(Location::parse(ctx.imatrix).map_err(|e| e.to_string())?.file_name().to_string())
}

fn imatrix_task(ctx: &Ctx, results: &Results, group: u32) -> Result<pb::ImatrixTask, String> {
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
    let dataset = imatrix_dataset(ctx)?;
    let name = format!("{}-imatrix-{first:05}-{n_chunks}.part.gguf", ctx.spec.prefix());
    let output = artifact(
        ctx,
        &[
            "quantfarm imatrix-part v1",
            &kp.text_sha256,
            &kp.tokens_sha256,
            &dataset,
            &ctx_s,
            &batch_s,
            &first_s,
            &n_s,
            &reference.sha256,
        ],
        &name,
    )?;
    Ok(pb::ImatrixTask {
        reference: reference.url.clone(),
        settings: Some(settings),
        first_chunk: first,
        n_chunks,
        tokens_sha256: kp.tokens_sha256.clone(),
        dataset,
        output: output.to_string(),
    })
}

fn imatrix_merge_task(ctx: &Ctx, results: &Results) -> Result<pb::ImatrixMergeTask, String> {
    let kp = imatrix_plan_of(results)?;
    let groups = kp.n_chunks.div_ceil(kp.n_seq.max(1));
    let parts: Vec<pb::Artifact> = (0..groups)
        .map(|group| artifact_of(results, &TaskKey::Imatrix { group }).cloned())
        .collect::<Result<_, _>>()?;
    let mut id = vec!["quantfarm imatrix v1"];
    id.extend(parts.iter().map(|a| a.sha256.as_str()));
    let name = format!("{}-imatrix.gguf", ctx.spec.prefix());
    let output = artifact(ctx, &id, &name)?;
    Ok(pb::ImatrixMergeTask { parts, output: output.to_string() })
}

fn kld_plan_of<'a>(results: &Results<'a>) -> Result<&'a pb::KldPlanResult, String> {
    match results(&TaskKey::KldPlan).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::KldPlan(p)) => Ok(p),
        _ => Err("the kld/plan task has no KL-divergence plan".into()),
    }
}

fn kld_settings(ctx: &Ctx) -> Result<pb::KldSettings, String> {
    let e = ctx.spec.evaluation.as_ref().ok_or("the release has no evaluation section")?;
    Ok(pb::KldSettings {
        text: ctx.eval.text.clone(),
        ctx: e.ctx,
        batch: e.batch,
        max_chunks: e.chunks.unwrap_or(0),
        section: "evaluation".into(),
    })
}

/// The reference: the GGUF BF16's first file (llama.cpp finds the others beside it).
fn reference_of<'a>(results: &Results<'a>) -> Result<&'a pb::Artifact, String> {
    artifact_of(results, &TaskKey::Gguf { shard: 0 })
}

fn kld_base_task(ctx: &Ctx, results: &Results, group: u32) -> Result<pb::KldBaseTask, String> {
    let plan = plan_of(results)?;
    let kp = kld_plan_of(results)?;
    let settings = kld_settings(ctx)?;
    let first = group * kp.n_seq;
    if first >= kp.n_chunks {
        return Err(format!("chunk group {group} starts past the text's {} chunks", kp.n_chunks));
    }
    let n_chunks = kp.n_seq.min(kp.n_chunks - first);
    let refs: Vec<&pb::Artifact> = (0..plan.shards.len() as u32)
        .map(|shard| artifact_of(results, &TaskKey::Gguf { shard }))
        .collect::<Result<_, _>>()?;
    let (ctx_s, batch_s, first_s, n_s) =
        (settings.ctx.to_string(), settings.batch.to_string(), first.to_string(), n_chunks.to_string());
    let mut parts = vec!["quantfarm kld-base v1", &kp.text_sha256, &kp.tokens_sha256, &ctx_s, &batch_s, &first_s, &n_s];
    parts.extend(refs.iter().map(|a| a.sha256.as_str()));
    let name = format!("{}-BF16-kld-base-{first:05}-{n_chunks}.logits", ctx.spec.prefix());
    let output = artifact(ctx, &parts, &name)?;
    Ok(pb::KldBaseTask {
        reference: refs[0].url.clone(),
        settings: Some(settings),
        first_chunk: first,
        n_chunks,
        tokens_sha256: kp.tokens_sha256.clone(),
        output: output.to_string(),
    })
}

/// The artifact a subject runs: the GGUF BF16 (first file), a quant level's first file, an MLX folder, or one of
/// the merge check's F32 GGUFs.
fn model_of<'a>(results: &Results<'a>, subject: Subject) -> Result<&'a pb::Artifact, String> {
    match subject {
        Subject::Reference => reference_of(results),
        Subject::Adapter => artifact_of(results, &TaskKey::MergeCheck { part: CheckPart::Base }),
        Subject::MergedF32 => artifact_of(results, &TaskKey::MergeCheck { part: CheckPart::Merged }),
        Subject::Model(EvalTarget::Quant(level)) => artifact_of(results, &TaskKey::Quantize { level, shard: 0 }),
        Subject::Model(EvalTarget::Mlx { bits }) => artifact_of(results, &TaskKey::Mlx { bits }),
    }
}

fn greedy_task(ctx: &Ctx, results: &Results, subject: Subject, share: u32) -> Result<pb::GreedyTask, String> {
    let e = ctx.spec.evaluation.as_ref().ok_or("the release has no evaluation section")?;
    let reference = match subject.compared_with() {
        None => vec![],
        Some(reference) => greedy_continuations(results, &TaskKey::Greedy { subject: reference, share })?,
    };
    let lora = match subject {
        Subject::Adapter => artifact_of(results, &TaskKey::MergeCheck { part: CheckPart::Lora })?.url.clone(),
        _ => String::new(),
    };
    Ok(pb::GreedyTask {
        model: model_of(results, subject)?.url.clone(),
        prompts: ctx.eval.prompts.clone(),
        share,
        n_shares: e.prompt_shares,
        max_tokens: e.max_tokens,
        ctx: e.context,
        reference,
        lora,
    })
}

fn merge_check_task(ctx: &Ctx, results: &Results, part: CheckPart) -> Result<pb::MergeCheckTask, String> {
    let mp = merge_plan_of(results)?;
    let name = format!("{}-{}", ctx.spec.name, part.file_suffix());
    let output =
        artifact(ctx, &["quantfarm merge-check v1", part.name(), &mp.inputs_identity, &mp.plan_digest], &name)?;
    Ok(pb::MergeCheckTask {
        base: ctx.source.to_string(),
        adapter: ctx.adapter.to_string(),
        base_name: ctx.spec.base_name.clone().unwrap_or_default(),
        part: part.proto() as i32,
        output: output.to_string(),
    })
}

fn peer_task(ctx: &Ctx, results: &Results, peer: Peer, level: Option<Level>) -> Result<pb::PeerKldTask, String> {
    let settings = kld_settings(ctx)?;
    let Some(level) = level else {
        let kp = kld_plan_of(results)?;
        let plan = plan_of(results)?;
        let refs: Vec<&pb::Artifact> = (0..plan.shards.len() as u32)
            .map(|shard| artifact_of(results, &TaskKey::Gguf { shard }))
            .collect::<Result<_, _>>()?;
        let (c, b, m) = (settings.ctx.to_string(), settings.batch.to_string(), settings.max_chunks.to_string());
        let mut parts = vec!["quantfarm peer-base v1", peer.tool(), &kp.text_sha256, &c, &b, &m];
        parts.extend(refs.iter().map(|a| a.sha256.as_str()));
        let name = format!("{}-BF16-{}.logits", ctx.spec.prefix(), peer.tool());
        let output = artifact(ctx, &parts, &name)?;
        return Ok(pb::PeerKldTask {
            tool: peer.tool().into(),
            model: refs[0].url.clone(),
            settings: Some(settings),
            base: String::new(),
            base_sha256: String::new(),
            output: output.to_string(),
        });
    };
    let base = match results(&TaskKey::PeerBase { peer }).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::PeerKld(p)) => p.base.as_ref().ok_or("the peer's base run wrote no file")?,
        _ => return Err(format!("peer/{}/base has no result", peer.tool())),
    };
    Ok(pb::PeerKldTask {
        tool: peer.tool().into(),
        model: model_of(results, Subject::Model(EvalTarget::Quant(level)))?.url.clone(),
        settings: Some(settings),
        base: base.url.clone(),
        base_sha256: base.sha256.clone(),
        output: String::new(),
    })
}

fn kld_task(ctx: &Ctx, results: &Results, target: EvalTarget, group: u32) -> Result<pb::KldTask, String> {
    let kp = kld_plan_of(results)?;
    let base = artifact_of(results, &TaskKey::KldBase { group })?;
    Ok(pb::KldTask {
        model: model_of(results, Subject::Model(target))?.url.clone(),
        base: base.url.clone(),
        base_sha256: base.sha256.clone(),
        first_chunk: group * kp.n_seq,
        batch: kld_settings(ctx)?.batch,
    })
}

/// What mlx-lm loads for a subject: the HF checkpoint the GGUF BF16 was converted from (the source, or the merge),
/// or an MLX rung's folder.
fn mlx_lm_model(ctx: &Ctx, results: &Results, subject: MlxSubject) -> Result<String, String> {
    match subject {
        MlxSubject::Bf16 => model_source(ctx, results),
        MlxSubject::Rung { bits } => Ok(artifact_of(results, &TaskKey::Mlx { bits })?.url.clone()),
    }
}

fn greedy_continuations(results: &Results, key: &TaskKey) -> Result<Vec<pb::GreedyContinuation>, String> {
    match results(key).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::Greedy(g)) => Ok(g.continuations.clone()),
        _ => Err(format!("{key} has no greedy result")),
    }
}

fn mlx_lm_greedy_task(
    ctx: &Ctx,
    results: &Results,
    subject: MlxSubject,
    share: u32,
) -> Result<pb::MlxLmGreedyTask, String> {
    let e = ctx.spec.evaluation.as_ref().ok_or("the release has no evaluation section")?;
    let compared_with = match subject {
        MlxSubject::Bf16 => TaskKey::Greedy { subject: Subject::Reference, share },
        MlxSubject::Rung { .. } => TaskKey::MlxLmGreedy { subject: MlxSubject::Bf16, share },
    };
    Ok(pb::MlxLmGreedyTask {
        model: mlx_lm_model(ctx, results, subject)?,
        reference: greedy_continuations(results, &compared_with)?,
        max_tokens: e.max_tokens,
        keep_continuations: subject == MlxSubject::Bf16,
    })
}

fn mlx_lm_kld_task(ctx: &Ctx, results: &Results, subject: MlxSubject, group: u32) -> Result<pb::MlxLmKldTask, String> {
    let kp = kld_plan_of(results)?;
    let bos = kp.bos.ok_or(
        "the kld/plan result predates the token id of the chunks' BOS (made by an older worker): run the release again",
    )?;
    let base = artifact_of(results, &TaskKey::KldBase { group })?;
    Ok(pb::MlxLmKldTask {
        model: mlx_lm_model(ctx, results, subject)?,
        base: base.url.clone(),
        base_sha256: base.sha256.clone(),
        first_chunk: group * kp.n_seq,
        bos,
    })
}

/// A verify task for the output `producer` made: `what` is the producer's message, aimed at the stored output's URL
/// (the verifier recomputes it into scratch and compares the two).
fn verify(
    ctx: &Ctx,
    results: &Results,
    producer: &TaskKey,
    what: impl FnOnce(String) -> Result<verify_task::What, String>,
) -> Result<task::Kind, String> {
    let a = artifact_of(results, producer)?;
    Ok(task::Kind::Verify(pb::VerifyTask {
        what: Some(what(a.url.clone())?),
        expect_sha256: a.sha256.clone(),
        stored_checked_by: stored_checker(ctx, producer).map(|k| k.to_string()).unwrap_or_default(),
    }))
}

/// The task of the release that reads `producer`'s stored GGUF file whole and checks it against its recorded digest
/// as it fetches it, if any: then the file's verify task need not read it again (`VerifyTask.stored_checked_by`).
/// Only on a remote store (a worker reads a local store's files in place, unfetched), and for a GGUF file of the
/// reference (read by the KL-divergence plan) or of a level an evaluation task loads.
fn stored_checker(ctx: &Ctx, producer: &TaskKey) -> Option<TaskKey> {
    if ctx.store.local_path().is_some() {
        return None;
    }
    let e = ctx.spec.evaluation.as_ref()?;
    match producer {
        TaskKey::Gguf { .. } => e.text.is_some().then_some(TaskKey::KldPlan),
        TaskKey::Quantize { level, .. } => {
            let target = EvalTarget::Quant(*level);
            if !ctx.spec.measures(&target.to_string()) {
                None
            } else if e.text.is_some() {
                Some(TaskKey::Kld { target, group: 0 })
            } else if e.probes.is_some() {
                Some(TaskKey::Probe { subject: Subject::Model(target) })
            } else if e.prompts.is_some() {
                Some(TaskKey::Greedy { subject: Subject::Model(target), share: 0 })
            } else {
                None
            }
        }
        _ => None,
    }
}

/// The message a worker gets for `key`, built from the results of its dependencies (all present).
pub fn build(ctx: &Ctx, key: &TaskKey, results: &Results) -> Result<pb::Task, String> {
    let kind = match key {
        TaskKey::Plan => task::Kind::Plan(pb::PlanTask {
            source: model_source(ctx, results)?,
            split: ctx.spec.split_rule(),
            // The plan checks and hashes a given file; a computed one is checked by its merge.
            imatrix: if computes_imatrix(ctx) { String::new() } else { ctx.imatrix.to_string() },
            synthetic: match synthetic_name(&ctx.spec.source) {
                Some(Ok(_)) => ctx.spec.source.trim_start_matches("synthetic:").to_string(),
                _ => String::new(),
            },
        }),
        TaskKey::Gguf { shard } => task::Kind::Gguf(gguf_task(ctx, results, *shard)?),
        TaskKey::Quantize { level, shard } => task::Kind::Quantize(quantize_task(ctx, results, *level, *shard)?),
        TaskKey::VerifyGguf { shard } => verify(ctx, results, &TaskKey::Gguf { shard: *shard }, |output| {
            Ok(verify_task::What::Gguf(pb::GgufShardTask { output, ..gguf_task(ctx, results, *shard)? }))
        })?,
        TaskKey::VerifyQuantize { level, shard } => {
            verify(ctx, results, &TaskKey::Quantize { level: *level, shard: *shard }, |output| {
                let t = quantize_task(ctx, results, *level, *shard)?;
                Ok(verify_task::What::Quantize(pb::QuantizeTask { output, ..t }))
            })?
        }
        TaskKey::MergePlan => task::Kind::MergePlan(pb::MergePlanTask {
            base: ctx.source.to_string(),
            adapter: ctx.adapter.to_string(),
            base_name: ctx.spec.base_name.clone().unwrap_or_default(),
        }),
        TaskKey::Merge { file } => task::Kind::Merge(merge_task(ctx, results, Some(*file))?),
        TaskKey::MergeSide => task::Kind::Merge(merge_task(ctx, results, None)?),
        TaskKey::MergeCheck { part } => task::Kind::MergeCheck(merge_check_task(ctx, results, *part)?),
        TaskKey::Mlx { bits } => task::Kind::Mlx(mlx_task(ctx, results, *bits)?),
        TaskKey::VerifyMerge { file } => verify(ctx, results, &TaskKey::Merge { file: *file }, |output| {
            Ok(verify_task::What::Merge(pb::MergeTask { output, ..merge_task(ctx, results, Some(*file))? }))
        })?,
        TaskKey::VerifyMergeSide => verify(ctx, results, &TaskKey::MergeSide, |output| {
            Ok(verify_task::What::Merge(pb::MergeTask { output, ..merge_task(ctx, results, None)? }))
        })?,
        TaskKey::VerifyMlx { bits } => verify(ctx, results, &TaskKey::Mlx { bits: *bits }, |output| {
            Ok(verify_task::What::Mlx(pb::MlxTask { output, ..mlx_task(ctx, results, *bits)? }))
        })?,
        TaskKey::Noop { .. } => {
            task::Kind::Noop(pb::NoopTask { sleep_ms: ctx.spec.outputs.noop.as_ref().map_or(0, |n| n.sleep_ms) })
        }
        TaskKey::KldPlan => task::Kind::KldPlan(pb::KldPlanTask {
            reference: reference_of(results)?.url.clone(),
            settings: Some(kld_settings(ctx)?),
        }),
        TaskKey::KldBase { group } => task::Kind::KldBase(kld_base_task(ctx, results, *group)?),
        TaskKey::ImatrixPlan => task::Kind::KldPlan(pb::KldPlanTask {
            reference: reference_of(results)?.url.clone(),
            settings: Some(imatrix_settings(ctx)?),
        }),
        TaskKey::Imatrix { group } => task::Kind::Imatrix(imatrix_task(ctx, results, *group)?),
        TaskKey::ImatrixMerge => task::Kind::ImatrixMerge(imatrix_merge_task(ctx, results)?),
        TaskKey::Kld { target, group } => task::Kind::Kld(kld_task(ctx, results, *target, *group)?),
        TaskKey::Greedy { subject, share } => task::Kind::Greedy(greedy_task(ctx, results, *subject, *share)?),
        TaskKey::PeerBase { peer } => task::Kind::PeerKld(peer_task(ctx, results, *peer, None)?),
        TaskKey::PeerKld { peer, level } => task::Kind::PeerKld(peer_task(ctx, results, *peer, Some(*level))?),
        TaskKey::Probe { subject } => task::Kind::Probe(pb::ProbeTask {
            model: model_of(results, *subject)?.url.clone(),
            suite: ctx.eval.probes.clone(),
            ctx: ctx.spec.evaluation.as_ref().map_or(4096, |e| e.context),
        }),
        TaskKey::MlxLmGreedy { subject, share } => {
            task::Kind::MlxLmGreedy(mlx_lm_greedy_task(ctx, results, *subject, *share)?)
        }
        TaskKey::MlxLmKld { subject, group } => task::Kind::MlxLmKld(mlx_lm_kld_task(ctx, results, *subject, *group)?),
        TaskKey::MlxLmProbe { subject } => task::Kind::MlxLmProbe(pb::MlxLmProbeTask {
            model: mlx_lm_model(ctx, results, *subject)?,
            suite: ctx.eval.probes.clone(),
        }),
        TaskKey::Report => return Err("the report is the coordinator's own task".into()),
    };
    Ok(pb::Task { kind: Some(kind), known_output_sha256: String::new(), inputs: Vec::new() })
}
