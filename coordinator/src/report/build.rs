//! Builds a release's [`Report`] from its finished tasks: merges each level's KL-divergence chunk groups and greedy
//! shares, joins probe results with the reference's, gathers artifacts into slots in report order, and evaluates the
//! gates over the figures measured.

use std::collections::{BTreeMap, HashMap};

use quantfarm_proto as pb;

use super::figures::{cross_runtime_figures, measured};
use super::model::*;
use super::tasks;
use crate::gates;
use crate::kinds::{
    CheckPart, Done, Folded, Gguf, Imatrix as ImatrixKey, Kld as KldKey, Merge as MergeKey,
    MergeCheck as MergeCheckKey, MlxSubject, Slot, SlotAcc, Subject, TaskKey, MERGE_CHECK,
};
use crate::sched::{Release, WorkerRec};
use crate::spec::{EvalTarget, MlxRung};
use quantfarm_parity::{ChunkStats, KldSummary};

fn artifact_result(r: Option<&pb::TaskResult>) -> Option<&pb::Artifact> {
    r?.artifact()
}

fn file_ref(a: &pb::Artifact) -> FileRef {
    FileRef { url: a.url.clone(), sha256: a.sha256.clone(), bytes: a.bytes }
}

fn kld_plan_result(rel: &Release) -> Option<&pb::KldPlanResult> {
    rel.result(&KldKey::Plan.into())?.kld_plan()
}

/// Each subject's chunk statistics merged (by the subject's name), or why they cannot be: a chunk missing or given
/// twice.
pub(super) fn merge_chunks(
    rel: &Release,
    chunks: &BTreeMap<String, Vec<ChunkStats>>,
) -> BTreeMap<String, Result<KldSummary, String>> {
    chunks.iter().map(|(target, list)| (target.clone(), merge_whole(rel, list))).collect()
}

/// Each rung's chunk statistics merged: the whole text, or the chunks the stop rule (`evaluation.stop`) stopped it
/// at; else why they cannot be.
fn merge_rungs(
    rel: &Release,
    chunks: &BTreeMap<String, Vec<ChunkStats>>,
) -> BTreeMap<String, Result<KldSummary, String>> {
    let merge = |target: &str, list: &[ChunkStats]| {
        if super::sequential::stopped_early(rel, target) {
            KldSummary::merge(list).map_err(|e| e.to_string())
        } else {
            merge_whole(rel, list)
        }
    };
    chunks.iter().map(|(target, list)| (target.clone(), merge(target, list))).collect()
}

/// One model's chunk statistics merged, or why they cannot be: a chunk missing or given twice.
pub(super) fn merge_whole(rel: &Release, list: &[ChunkStats]) -> Result<KldSummary, String> {
    let expected = kld_plan_result(rel).map_or(0, |k| k.n_chunks as u64);
    KldSummary::merge(list).map_err(|e| e.to_string()).and_then(|s| {
        if s.n_chunks == expected {
            Ok(s)
        } else {
            Err(format!("{} of the text's {expected} chunks were measured", s.n_chunks))
        }
    })
}

/// Each model's greedy agreement with its reference (keyed by its artifact `file_type`, the merge check's as
/// [`MERGE_CHECK`]), its shares joined in prompt order: k of N byte-identical, the mean common-prefix fraction, and
/// every disagreement with where it starts and the reference's top-2 margin there.
fn greedy_summaries(folded: &Folded) -> BTreeMap<String, GreedySummary> {
    folded
        .greedy
        .iter()
        .map(|(target, (subject, list))| {
            let n_reference = subject
                .compared_with()
                .and_then(|r| folded.greedy_references.get(&r.to_string()).copied())
                .unwrap_or(0);
            (target.clone(), greedy_summary(list.clone(), n_reference))
        })
        .collect()
}

/// How many continuations llama.cpp's reference gave: the prompts the evaluation ran.
pub(super) fn n_reference_prompts(folded: &Folded) -> usize {
    folded.greedy_references.get(&Subject::Reference.to_string()).copied().unwrap_or(0)
}

/// One model's greedy summary from its prompts' agreements (any order) and the count of reference continuations
/// they should cover.
pub(super) fn greedy_summary(mut list: Vec<&pb::PromptAgreement>, n_reference: usize) -> GreedySummary {
    list.sort_by_key(|a| a.index);
    let n = list.len();
    let identical = list.iter().filter(|a| a.identical).count();
    let mean_prefix = if n == 0 { 0.0 } else { list.iter().map(|a| a.prefix_fraction).sum::<f64>() / n as f64 };
    let disagreements = list
        .iter()
        .filter(|a| !a.identical)
        .map(|a| Disagreement {
            index: a.index,
            first_difference: a.first_difference,
            reference_margin: f64::from(a.reference_margin),
            common_prefix: a.common_prefix,
            reference_tokens: a.reference_tokens,
            model_tokens: a.model_tokens,
            reference_text: a.reference_text.clone(),
            model_text: a.model_text.clone(),
        })
        .collect();
    GreedySummary {
        n: n as u64,
        identical: identical as u64,
        agree: if n == 0 { 0.0 } else { identical as f64 / n as f64 },
        mean_prefix_fraction: mean_prefix,
        complete: n == n_reference,
        disagreements,
    }
}

/// Link 2 across runtimes, from the mlx-lm tasks (`None` for a release that runs none and has no MLX output or no
/// evaluation; why not, when it turned them off).
fn cross_runtime(rel: &Release, folded: &Folded) -> Option<CrossRuntime> {
    let spec = &rel.spec;
    let e = spec.evaluation.as_ref()?;
    if spec.outputs.mlx.is_none() || spec.outputs.gguf.is_none() {
        return None;
    }
    if !e.mlx_lm {
        return Some(CrossRuntime::Unmeasured {
            error: "not measured: evaluation.mlx_lm is false, so no model ran in mlx-lm".into(),
        });
    }
    let mut klds = merge_chunks(rel, &folded.mlx_lm_kld);
    let subjects = &folded.mlx_lm;
    let n_llama_reference = n_reference_prompts(folded);
    let n_mlx_bf16 = subjects.get(&MlxSubject::Bf16).map_or(0, |a| a.continuations);
    let bf16_probe = subjects.get(&MlxSubject::Bf16).and_then(|a| a.probe);
    let mut bf16 = None;
    let mut rungs = Vec::new();
    for (&subject, acc) in subjects {
        let name = subject.to_string();
        let load_error = acc.run.map(|r| r.load_error.clone()).filter(|e| !e.is_empty());
        let n_reference = match subject {
            MlxSubject::Bf16 => n_llama_reference,
            MlxSubject::Rung { .. } => n_mlx_bf16,
        };
        let kld = klds.remove(&name).map(|k| match (&load_error, k) {
            (Some(e), _) => Kld::Unmeasured { error: format!("not measured: {e}") },
            (None, k) => kld_record(k),
        });
        let record = MlxLmSubject {
            file_type: name,
            quantized: acc.run.filter(|_| load_error.is_none()).map(|r| r.quantized),
            upcast: acc.run.filter(|_| load_error.is_none()).map(|r| r.upcast),
            converted: acc.run.map(|r| r.converted.clone()).filter(|c| !c.is_empty()),
            // Nothing to compare with (mlx-lm could not load the bf16 weights a rung is compared with): not
            // measured, rather than 0 of 0 prompts.
            greedy: (acc.ran_greedy && load_error.is_none() && n_reference > 0)
                .then(|| greedy_summary(acc.agreements.clone(), n_reference)),
            kld,
            probes: acc.probe.map(|p| {
                // A rung's pass rate beside mlx-lm's bf16 weights' (the same runtime, the same server).
                let compared = match subject {
                    MlxSubject::Bf16 => None,
                    MlxSubject::Rung { .. } => bf16_probe,
                };
                probe_summary(p, compared)
            }),
            load_error,
        };
        match subject {
            MlxSubject::Bf16 => bf16 = Some(record),
            MlxSubject::Rung { .. } => rungs.push(record),
        }
    }
    let bf16 = bf16.unwrap_or(MlxLmSubject {
        file_type: MlxSubject::Bf16.to_string(),
        quantized: None,
        upcast: None,
        converted: None,
        load_error: None,
        greedy: None,
        kld: None,
        probes: None,
    });
    Some(CrossRuntime::Measured(Box::new(CrossRuntimeFigures {
        method: "the GGUF BF16's source weights (an HF checkpoint, or quantfarm's unquantized MLX conversion of it \
                 where mlx-lm's model cannot load its layout) and each MLX rung loaded by mlx_lm.load and run \
                 in mlx-lm, on the workers' helper (worker/mlx/quantfarm_mlx.py), fed the token ids llama.cpp was fed \
                 (never re-tokenized): greedy continuations at temperature 0 of the reference's prompt tokens, the \
                 bf16 weights compared with llama.cpp's GGUF BF16 and each rung with mlx-lm's bf16; logits of every \
                 chunk of the evaluation text scored against llama.cpp's base logits of the GGUF BF16 by \
                 llama-perplexity's procedure (a KL divergence across runtimes); on mlx's CPU build a quantized \
                 model's floating parameters are made f32 (upcast)"
            .into(),
        runtimes: folded.mlx_lm_runtimes.iter().cloned().collect(),
        model: folded.mlx_lm_model.clone().unwrap_or_default(),
        bf16,
        rungs,
    })))
}

/// A merged KL-divergence summary as the report records it.
pub(super) fn kld_record(k: Result<KldSummary, String>) -> Kld {
    match k {
        Ok(s) => match serde_json::from_value::<KldFigures>(s.to_json()) {
            Ok(f) => Kld::Measured(Box::new(f)),
            Err(e) => Kld::Unmeasured { error: format!("the figures do not fit the report: {e}") },
        },
        Err(e) => Kld::Unmeasured { error: e },
    }
}

/// Each subject's probe results (keyed by artifact `file_type`, the reference as "BF16"), with the models' pass
/// rate against the reference's and its noise band.
fn probe_summaries(folded: &Folded) -> BTreeMap<String, ProbeSummary> {
    let mut out = BTreeMap::new();
    let reference = folded.probes.iter().find(|(s, _)| *s == Subject::Reference).map(|(_, p)| *p);
    for &(subject, p) in &folded.probes {
        let (key, compared) = match subject {
            // The merge check's subjects run no probes.
            Subject::Adapter | Subject::MergedF32 => continue,
            Subject::Reference => ("BF16".to_string(), None),
            Subject::Model(target) => (target.to_string(), reference),
        };
        out.insert(key, probe_summary(p, compared));
    }
    out
}

/// Each subject's multiple-choice results (keyed by artifact `file_type`, the reference as "BF16"), each model's
/// set beside the reference's choices (when both scored the same task file).
fn choice_summaries(folded: &Folded) -> BTreeMap<String, ChoiceSummary> {
    let reference = folded.choices.iter().find(|(s, _)| *s == Subject::Reference).map(|(_, c)| *c);
    let mut out = BTreeMap::new();
    for &(subject, c) in &folded.choices {
        let key = match subject {
            Subject::Adapter | Subject::MergedF32 => continue,
            Subject::Reference => "BF16".to_string(),
            Subject::Model(target) => target.to_string(),
        };
        let n = c.chosen.len();
        let n_correct = c.correct.iter().filter(|&&k| k).count();
        let p = if n == 0 { f64::NAN } else { n_correct as f64 / n as f64 };
        let answers: u64 = c.n_answers.iter().map(|&a| u64::from(a)).sum();
        let against = reference
            .filter(|r| subject != Subject::Reference && r.tasks_sha256 == c.tasks_sha256 && r.chosen.len() == n);
        let pick = |f: &dyn Fn(usize) -> bool| (0..n).filter(|&i| f(i)).map(|i| i as u32).collect::<Vec<u32>>();
        out.insert(
            key,
            ChoiceSummary {
                tasks_sha256: c.tasks_sha256.clone(),
                n_tasks: n as u64,
                n_correct: n_correct as u64,
                accuracy: p,
                accuracy_unc: (p * (1.0 - p) / (n as f64 - 1.0)).sqrt(),
                chance: n as f64 / answers as f64,
                changed: against.map(|r| pick(&|i| c.chosen[i] != r.chosen[i])),
                now_wrong: against.map(|r| pick(&|i| r.correct[i] && !c.correct[i])),
                now_right: against.map(|r| pick(&|i| !r.correct[i] && c.correct[i])),
            },
        );
    }
    out
}

/// A subject's probe results, beside its reference's when it has one.
pub(super) fn probe_summary(p: &pb::ProbeResult, reference: Option<&pb::ProbeResult>) -> ProbeSummary {
    ProbeSummary {
        suite: p.suite.clone(),
        passed: p.passed,
        failed: p.failed,
        truncated: p.truncated,
        mean_score: p.mean_score,
        score_spread: p.score_spread,
        pass_scores: p.pass_scores.clone(),
        reference_mean_score: reference.map(|r| r.mean_score),
        reference_score_spread: reference.map(|r| r.score_spread),
        delta_vs_reference: reference.map(|r| p.mean_score - r.mean_score),
    }
}

/// Each quant level's figures as a peer tool printed them (keyed by artifact `file_type`, then tool), with whether
/// quantfarm's own figures print the same to every digit the tool prints.
fn peer_summaries(
    folded: &Folded,
    klds: &BTreeMap<String, Result<KldSummary, String>>,
) -> BTreeMap<String, BTreeMap<String, PeerFigures>> {
    let mut out: BTreeMap<String, BTreeMap<String, PeerFigures>> = BTreeMap::new();
    for &(level, p) in &folded.peers {
        let ours = klds.get(&level.to_string()).and_then(|r| r.as_ref().ok());
        // (label as printed, our figure, decimals printed)
        let compared: Vec<(&str, Option<f64>, usize)> = vec![
            ("Mean KLD", ours.map(|s| s.mean_kld.value), 6),
            ("Same top p", ours.map(|s| 100.0 * s.same_top_p.value), 3),
            ("Mean PPL(Q)", ours.map(|s| s.mean_ppl_q.value), 6),
            ("Mean PPL(base)", ours.map(|s| s.mean_ppl_base.value), 6),
        ];
        let mut same = BTreeMap::new();
        for (label, mine, digits) in compared {
            let theirs = p.figures.get(label);
            let equal = match (mine, theirs) {
                (Some(m), Some(t)) => format!("{m:.digits$}") == format!("{t:.digits$}"),
                _ => false,
            };
            same.insert(label.to_string(), equal);
        }
        out.entry(level.to_string()).or_default().insert(
            p.tool.clone(),
            PeerFigures {
                version: p.version.clone(),
                command: p.command.clone(),
                figures: p.figures.iter().map(|(k, v)| (k.clone(), *v)).collect(),
                same_as_quantfarm: same,
            },
        );
    }
    out
}

/// The adapter merged into the source: its location, format, every file with its content's sha256, and what the
/// merge changes (null without one).
fn adapter(rel: &Release) -> Option<Adapter> {
    let url = rel.adapter.clone()?;
    let plan = rel.result(&MergeKey::Plan.into()).and_then(pb::TaskResult::merge_plan);
    Some(Adapter {
        url,
        format: plan.map(|p| p.format.clone()),
        files: plan.map(|p| {
            p.adapter_files
                .iter()
                .map(|f| FileRef { url: f.url.clone(), sha256: f.sha256.clone(), bytes: f.bytes })
                .collect()
        }),
        changed_tensors: plan.map(|p| p.changed.len() as u64),
        untied_embeddings: plan.map(|p| p.untied),
    })
}

/// Link 1: the merge check's inputs and greedy agreement, or why it was not measured (null without an adapter).
fn merge_check(rel: &Release, greedy: &BTreeMap<String, GreedySummary>) -> Option<MergeCheck> {
    rel.adapter.as_ref()?;
    let Some(g) = greedy.get(MERGE_CHECK) else {
        return Some(MergeCheck::Unmeasured { error: merge_unmeasured(rel) });
    };
    let part = |part| artifact_result(rel.result(&MergeCheckKey { part }.into())).map(file_ref);
    Some(MergeCheck::Measured(Box::new(MergeCheckFigures {
        method: "greedy continuations of evaluation.prompts at temperature 0 in llama.cpp, all in F32: the merge \
                 (computed as the published one, rounded to f32) against the base with the adapter applied at run \
                 time, unmerged (a GGUF LoRA)"
            .into(),
        base: part(CheckPart::Base),
        lora: part(CheckPart::Lora),
        merged: part(CheckPart::Merged),
        greedy: g.clone(),
    })))
}

/// Why the merge check has no figures (with an adapter).
pub(super) fn merge_unmeasured(rel: &Release) -> String {
    let untied = rel.result(&MergeKey::Plan.into()).and_then(pb::TaskResult::merge_plan).is_some_and(|m| m.untied);
    if rel.eval.prompts.is_none() {
        "not measured: the merge check runs on evaluation.prompts, and the release has none".into()
    } else if untied {
        "not measured: the adapter changes the embeddings of a base with tied embeddings, and llama.cpp cannot apply \
         such a LoRA at run time (it would apply it to the output layer too), so the merge has no run-time reference \
         to be compared with in llama.cpp; its bytes are still recomputed and compared (verify/merge). PEFT applies \
         it as the merge does: with evaluation.transformers, the merge check in transformers measures it \
         (merge.transformers.greedy.agree; a release's own `merge` gate on that figure replaces this one)"
            .into()
    } else {
        "not measured: no merge-check greedy task ran".into()
    }
}

/// The tools that made the release: this coordinator, every worker that ran one of its tasks (version, platform,
/// the runtimes it found), and each peer tool's version as it reported it.
fn tools(rel: &Release, folded: &Folded, workers: &HashMap<String, WorkerRec>) -> Tools {
    let ran: std::collections::BTreeSet<&str> = rel.tasks.iter().filter_map(|t| t.worker.as_deref()).collect();
    let workers = ran
        .iter()
        .map(|id| WorkerRecord {
            id: id.to_string(),
            info: workers.get(*id).map(|w| WorkerDetails {
                name: w.info.name.clone(),
                version: w.info.version.clone(),
                os: w.info.os.clone(),
                arch: w.info.arch.clone(),
                cores: w.info.cores,
                runtimes: w.info.runtimes.clone(),
            }),
        })
        .collect();
    Tools { quantfarm: env!("CARGO_PKG_VERSION").to_string(), workers, peers: folded.peer_versions.clone() }
}

/// A release's unsigned report and the files published beside it.
pub struct Built {
    pub report: Report,
    /// (file name, bytes): the per-token values file ([`super::VALUES_FILE`]) when the report has its `paired`
    /// section.
    pub attachments: Vec<(&'static str, Vec<u8>)>,
}

/// Builds the unsigned report of a release whose tasks (but the report) are all done. `workers` are the
/// coordinator's known workers, `now_ms` the report's time, `values_url` where the per-token values file is
/// published (beside report.json).
pub fn build(rel: &Release, workers: &HashMap<String, WorkerRec>, now_ms: i64, values_url: &str) -> Built {
    // Each finished task adds its result by its family's fold.
    let mut folded = Folded::default();
    for t in &rel.tasks {
        t.key.fold(Done { task: t.task.as_ref(), result: t.result.as_ref() }, &mut folded);
    }
    let klds = merge_rungs(rel, &folded.kld);
    let greedy = greedy_summaries(&folded);
    let probes = probe_summaries(&folded);
    let choices = choice_summaries(&folded);
    let mut peers = peer_summaries(&folded, &klds);
    let (artifacts, all_verified) =
        artifacts(rel, std::mem::take(&mut folded.slots), &klds, &greedy, (&probes, &choices), &mut peers);
    let cross_runtime = cross_runtime(rel, &folded);
    let transformers = super::transformers::section(rel, &folded);
    let mut measured = measured(rel, &klds, &greedy, &probes, &artifacts, all_verified);
    cross_runtime_figures(&rel.spec, cross_runtime.as_ref(), &mut measured);
    super::transformers::figures(rel, transformers.as_ref(), &mut measured);
    let third_party = super::third_party::records(rel, &folded, &klds, &artifacts);
    let paired = super::paired::section(rel, &folded.kld, &klds, &artifacts, values_url);
    super::paired::figures(paired.as_ref().map(|p| &p.0), &mut measured);
    let (paired, attachments) = match paired {
        Some((p, bytes)) => (Some(p), vec![(super::VALUES_FILE, bytes)]),
        None => (None, Vec::new()),
    };
    let results = gates::evaluate(&rel.spec.gates, &measured);
    let passed = results.iter().all(|g| g.outcome.passed);
    let plan = rel.result(&TaskKey::PLAN).and_then(pb::TaskResult::plan);
    let report = Report {
        format: FORMAT.to_string(),
        quantfarm_version: env!("CARGO_PKG_VERSION").to_string(),
        release: ReleaseInfo {
            id: rel.id.clone(),
            name: rel.spec.name.clone(),
            spec_file: rel.file_name.clone(),
            spec_sha256: quantfarm_store::hex(&<sha2::Sha256 as sha2::Digest>::digest(rel.yaml.as_bytes())),
            spec: serde_json::to_value(&rel.spec).unwrap_or(serde_json::Value::Null),
        },
        source: Source {
            url: rel.source.clone(),
            format: plan.map(|p| p.format.clone()),
            architecture: plan.map(|p| p.architecture.clone()),
            identity: plan.map(|p| p.source_identity.clone()),
            bytes: plan.map(|p| p.source_bytes),
            tensors: plan.map(|p| p.tensors.len() as u64),
        },
        links: links(rel),
        adapter: adapter(rel),
        merge_check: merge_check(rel, &greedy),
        evaluation: evaluation(rel, &folded),
        cross_runtime,
        transformers,
        paired,
        third_party,
        comparison: None,
        sequential: super::sequential::section(rel),
        search: super::search::section(rel, &artifacts),
        artifacts,
        tasks: tasks::records(rel),
        gates: results.iter().map(gates::GateResult::record).collect(),
        tools: tools(rel, &folded, workers),
        timings: tasks::timings(rel, now_ms),
        verdict: if passed { Verdict::Released } else { Verdict::GateFailed },
        signature: None,
    };
    Built { report, attachments }
}

/// The artifacts in report order (the merged checkpoint, GGUF BF16, the GGUF quants, the MLX and vLLM checkpoints), each
/// with its figures; and whether every one was verified.
fn artifacts(
    rel: &Release,
    slots: HashMap<Slot, SlotAcc>,
    klds: &BTreeMap<String, Result<KldSummary, String>>,
    greedy: &BTreeMap<String, GreedySummary>,
    (probes, choices): (&BTreeMap<String, ProbeSummary>, &BTreeMap<String, ChoiceSummary>),
    peers: &mut BTreeMap<String, BTreeMap<String, PeerFigures>>,
) -> (Vec<Artifact>, bool) {
    // Report order: the merge, the GGUF BF16, the quant levels as the spec lists them, the MLX rungs by width, then
    // the recipes, then the floating-point modes, the vLLM ones by scheme.
    let rank = |slot: &Slot| -> u32 {
        match slot {
            Slot::Merged => 0,
            Slot::Bf16 => 1,
            Slot::Rung(EvalTarget::Quant(level)) => {
                rel.spec.quants().iter().position(|q| q.level() == *level).map_or(u32::MAX - 1, |p| p as u32 + 2)
            }
            Slot::Rung(EvalTarget::Mlx(MlxRung::Bits(bits))) => u32::MAX - 32 + bits,
            Slot::Rung(EvalTarget::Mlx(MlxRung::Mixed(recipe))) => u32::MAX - 20 + *recipe as u32,
            Slot::Rung(EvalTarget::Mlx(MlxRung::Mode(mode))) => u32::MAX - 14 + *mode as u32,
            Slot::Rung(EvalTarget::Vllm(rung)) => u32::MAX - 8 + *rung as u32,
        }
    };
    let mut slots: Vec<(Slot, SlotAcc)> = slots.into_iter().collect();
    slots.sort_by_cached_key(|(slot, _)| (rank(slot), slot.file_type()));
    let imatrix = imatrix(rel);
    let mut list = Vec::new();
    let mut all_verified = !slots.is_empty() || rel.spec.outputs.noop.is_some();
    for (slot, acc) in slots {
        let ty = slot.file_type();
        let elements: u64 = acc.types.values().map(|t| t.1).sum();
        let tensor_bytes: u64 = acc.types.values().map(|t| t.2).sum();
        let verified =
            !acc.verified.is_empty() && acc.verified.iter().all(|&v| v) && acc.verified.len() == acc.files.len();
        all_verified &= verified;
        let bits_per_weight =
            if elements > 0 { (tensor_bytes as f64 * 8.0 / elements as f64 * 10000.0).round() / 10000.0 } else { 0.0 };
        let container = match slot {
            Slot::Merged => Container::Hf,
            Slot::Bf16 | Slot::Rung(EvalTarget::Quant(_)) => Container::Gguf,
            Slot::Rung(EvalTarget::Mlx { .. }) => Container::Mlx,
            Slot::Rung(EvalTarget::Vllm(_)) => Container::Vllm,
        };
        let kld = klds.get(&ty).map(|k| kld_record(k.clone()));
        let level = match slot {
            Slot::Rung(EvalTarget::Quant(level)) => Some(level),
            Slot::Merged | Slot::Bf16 | Slot::Rung(EvalTarget::Mlx { .. } | EvalTarget::Vllm(_)) => None,
        };
        list.push(Artifact {
            name: format!("{}-{ty}", rel.spec.prefix()),
            container,
            files: acc.files.iter().map(file_ref).collect(),
            bytes: acc.files.iter().map(|a| a.bytes).sum(),
            bits_per_weight,
            type_mix: acc
                .types
                .into_iter()
                .map(|(ggml_type, (tensors, elements, bytes))| TypeCount { ggml_type, tensors, elements, bytes })
                .collect(),
            verified,
            imatrix: level.and_then(|_| imatrix.clone()),
            recipe: level.and_then(|l| rel.spec.rung(l)).and_then(|r| match r {
                crate::spec::Rung::Search(s) => crate::kinds::chosen(&rel.spec, &|k: &TaskKey| rel.result(k), s)
                    .ok()
                    .map(|c| RecipeDoc::from(&c.recipe)),
                crate::spec::Rung::File(_) | crate::spec::Rung::Recipe(_) => r.recipe().map(RecipeDoc::from),
            }),
            kld,
            greedy: greedy.get(&ty).cloned(),
            probes: probes.get(&ty).cloned(),
            choices: choices.get(&ty).cloned(),
            peers: peers.remove(&ty),
            file_type: ty,
        });
    }
    (list, all_verified)
}

/// What each link of the parity method did, in words.
fn links(rel: &Release) -> Links {
    Links {
        merge: match (&rel.adapter, &rel.eval.prompts) {
            (None, _) => "not applicable: no adapter".to_string(),
            (Some(adapter), None) => format!("adapter {adapter} merged exactly (f64, rounded once); each file recomputed and compared byte for byte; greedy agreement not measured (no evaluation.prompts)"),
            (Some(adapter), Some(_)) => format!("adapter {adapter} merged exactly (f64, rounded once); each file recomputed and compared byte for byte; the merge's greedy agreement with the base plus the adapter at run time in merge_check"),
        },
        conversion: "GGUF BF16 written from the source by the mapping; each file recomputed and compared byte for byte"
            .to_string(),
        quantization: if rel.spec.evaluation.is_some() {
            "llama-quantize's algorithms; each file recomputed and compared byte for byte; information loss measured as KL divergence against the GGUF BF16 in llama.cpp, by llama-perplexity's procedure, per chunk group on the workers, merged here (artifacts[].kld)"
        } else {
            "llama-quantize's algorithms; each file recomputed and compared byte for byte; information loss not measured (no evaluation section)"
        }
        .to_string(),
        probes: if rel.eval.probes.is_none() {
            "not measured (no evaluation.probes)"
        } else {
            "the probe suite run on the reference and every model in llama.cpp (artifacts[].probes)"
        }
        .to_string(),
    }
}

/// The importance matrix the quants were made with: the file's identity, and, when the farm computed it, the
/// calibration text's identity and chunking.
fn imatrix(rel: &Release) -> Option<Imatrix> {
    use crate::spec::ImatrixSource;
    match rel.spec.imatrix()? {
        ImatrixSource::File(_) => {
            let sha256 = rel.result(&TaskKey::PLAN).and_then(pb::TaskResult::plan).map(|p| p.imatrix_sha256.clone());
            Some(Imatrix::File { url: rel.imatrix.clone().unwrap_or_default(), sha256 })
        }
        ImatrixSource::Text { ctx, batch, all_experts, .. } => {
            let merged = artifact_result(rel.result(&ImatrixKey::Merge.into()));
            let plan = rel.result(&ImatrixKey::Plan.into()).and_then(pb::TaskResult::kld_plan);
            Some(Imatrix::Computed {
                url: merged.map(|a| a.url.clone()),
                sha256: merged.map(|a| a.sha256.clone()),
                text: rel.imatrix.clone().unwrap_or_default(),
                text_sha256: plan.map(|p| p.text_sha256.clone()),
                tokens_sha256: plan.map(|p| p.tokens_sha256.clone()),
                chunks: plan.map(|p| p.n_chunks),
                ctx: *ctx,
                batch: *batch,
                method: "llama-imatrix's collection in llama.cpp (Σx² per input column and token counts of every blk.* matrix), f64 sums per chunk group on the workers, added in chunk order".to_string(),
                all_experts: *all_experts,
                experts: rel.result(&ImatrixKey::Merge.into()).and_then(expert_coverage),
            })
        }
    }
}

/// The merge's account of the experts each mixture-of-experts weight's calibration reached.
fn expert_coverage(r: &pb::TaskResult) -> Option<ExpertCoverage> {
    let Some(pb::task_result::Kind::Artifact(a)) = r.kind.as_ref() else { return None };
    Some(ExpertCoverage {
        weights: a.experts.len() as u32,
        partial: a
            .experts
            .iter()
            .filter(|e| !e.unrouted.is_empty())
            .map(|e| {
                let c = quantfarm_quant::imatrix::sums::ExpertCoverage {
                    weight: e.weight.clone(),
                    experts: e.experts,
                    unrouted: e.unrouted.clone(),
                };
                PartialExperts { percent: c.percent(), weight: c.weight, experts: c.experts, unrouted: c.unrouted }
            })
            .collect(),
    })
}

/// What the KL divergence was measured on: the text, its tokenization and chunking, and the reference.
fn evaluation(rel: &Release, folded: &Folded) -> Option<Evaluation> {
    let e = rel.spec.evaluation.as_ref()?;
    let n_prompts = n_reference_prompts(folded);
    let plan = kld_plan_result(rel);
    Some(Evaluation {
        text: rel.eval.text.clone().unwrap_or_default(),
        text_sha256: plan.map(|k| k.text_sha256.clone()),
        tokens_sha256: plan.map(|k| k.tokens_sha256.clone()),
        ctx: e.ctx,
        batch: e.batch,
        n_chunks: plan.map(|k| k.n_chunks),
        chunks_per_task: plan.map(|k| k.n_seq),
        reference: artifact_result(rel.result(&Gguf { shard: 0 }.into())).map(|a| a.url.clone()),
        runtime: "llama.cpp (llama-cpp-2), llama-perplexity --kl-divergence's procedure".to_string(),
        prompts: rel.eval.prompts.clone().unwrap_or_default(),
        n_prompts: n_prompts as u64,
        max_tokens: e.max_tokens,
        probes: rel.eval.probes.clone().unwrap_or_default(),
        context: e.context,
    })
}
