//! The release's record: `report.json` with the spec, every artifact's identity (URL, sha256, bytes, type mix,
//! bits per weight), every task's inputs, outputs, worker and duration, the gates with their inputs and results,
//! and the verdict. It is signed by [`crate::signing`] over its RFC 8785 canonical form and published by
//! [`publish`] with its views and DSSE envelope.

use std::collections::{BTreeMap, HashMap};

use quantfarm_proto::{self as pb, task, task_result, verify_task};
use serde_json::{json, Map, Value};

use crate::gates;
use crate::graph::{CheckPart, Subject, TaskKey};
use crate::sched::{Release, WorkerRec};
use quantfarm_parity::{ChunkStats, KldSummary};

pub const FORMAT: &str = "quantfarm-report/1";

/// One published artifact: every file of one output (all split files of one GGUF).
#[derive(Default)]
struct ArtifactAcc {
    files: Vec<Value>,
    bytes: u64,
    types: BTreeMap<String, (u64, u64, u64)>,
    verified: Vec<bool>,
    produced_by: Vec<String>,
}

fn artifact_result(r: Option<&pb::TaskResult>) -> Option<(&pb::Artifact, bool)> {
    match r?.kind.as_ref()? {
        task_result::Kind::Artifact(a) => Some((a.artifact.as_ref()?, a.cache_hit)),
        _ => None,
    }
}

fn verify_result(r: Option<&pb::TaskResult>) -> Option<&pb::VerifyResult> {
    match r?.kind.as_ref()? {
        task_result::Kind::Verify(v) => Some(v),
        _ => None,
    }
}

fn split_json(rule: &Option<pb::SplitRule>) -> Value {
    match rule.as_ref().and_then(|r| r.rule.as_ref()) {
        None => Value::Null,
        Some(pb::split_rule::Rule::MaxTensors(n)) => json!({"max_tensors": n}),
        Some(pb::split_rule::Rule::MaxBytes(n)) => json!({"max_bytes": n}),
    }
}

fn settings_json(s: &Option<pb::KldSettings>) -> Value {
    s.as_ref()
        .map_or(Value::Null, |s| json!({"text": s.text, "ctx": s.ctx, "batch": s.batch, "max_chunks": s.max_chunks}))
}

/// A task's inputs, as the report shows them.
fn inputs_json(t: Option<&pb::Task>) -> Value {
    let Some(kind) = t.and_then(|t| t.kind.as_ref()) else { return Value::Null };
    match kind {
        task::Kind::Plan(p) => json!({"source": p.source, "split": split_json(&p.split), "imatrix": p.imatrix}),
        task::Kind::Gguf(g) => json!({
            "source": g.source, "plan_digest": g.plan_digest, "shard": g.shard, "n_shards": g.n_shards,
            "split": split_json(&g.split)
        }),
        task::Kind::Quantize(q) => {
            json!({"input": q.input, "file_type": q.file_type, "shard": q.shard, "n_shards": q.n_shards,
                   "imatrix": q.imatrix, "imatrix_sha256": q.imatrix_sha256})
        }
        task::Kind::Verify(v) => {
            let (artifact, what) = match &v.what {
                Some(verify_task::What::Gguf(g)) => (g.output.clone(), "gguf"),
                Some(verify_task::What::Quantize(q)) => (q.output.clone(), "quantize"),
                Some(verify_task::What::Merge(m)) => (m.output.clone(), "merge"),
                Some(verify_task::What::Mlx(m)) => (m.output.clone(), "mlx"),
                None => (String::new(), "none"),
            };
            json!({"artifact": artifact, "recompute": what, "expect_sha256": v.expect_sha256})
        }
        task::Kind::Noop(n) => json!({"sleep_ms": n.sleep_ms}),
        task::Kind::MergePlan(m) => json!({"base": m.base, "adapter": m.adapter, "base_name": m.base_name}),
        task::Kind::Merge(m) => json!({
            "base": m.base, "adapter": m.adapter, "plan_digest": m.plan_digest,
            "file": if m.side_files { Value::Null } else { json!(m.file) }, "side_files": m.side_files
        }),
        task::Kind::Mlx(m) => json!({"source": m.source, "bits": m.bits, "group_size": m.group_size}),
        task::Kind::MergeCheck(m) => json!({
            "base": m.base, "adapter": m.adapter, "base_name": m.base_name,
            "part": pb::MergeCheckPart::try_from(m.part).map_or("unknown", |p| p.as_str_name())
        }),
        task::Kind::KldPlan(k) => json!({"reference": k.reference, "settings": settings_json(&k.settings)}),
        task::Kind::Imatrix(t) => json!({
            "reference": t.reference, "settings": settings_json(&t.settings), "first_chunk": t.first_chunk,
            "n_chunks": t.n_chunks, "tokens_sha256": t.tokens_sha256, "dataset": t.dataset
        }),
        task::Kind::ImatrixMerge(t) => json!({
            "parts": t.parts.iter().map(|a| json!({"url": a.url, "sha256": a.sha256})).collect::<Vec<_>>()
        }),
        task::Kind::KldBase(k) => json!({
            "reference": k.reference, "settings": settings_json(&k.settings), "first_chunk": k.first_chunk,
            "n_chunks": k.n_chunks, "tokens_sha256": k.tokens_sha256
        }),
        task::Kind::Kld(k) => json!({
            "model": k.model, "base": k.base, "base_sha256": k.base_sha256, "first_chunk": k.first_chunk,
            "batch": k.batch
        }),
        task::Kind::Greedy(g) => json!({
            "model": g.model, "prompts": g.prompts, "share": g.share, "n_shares": g.n_shares,
            "max_tokens": g.max_tokens, "ctx": g.ctx, "reference_continuations": g.reference.len(),
            "lora": g.lora
        }),
        task::Kind::Probe(p) => json!({"model": p.model, "suite": p.suite, "ctx": p.ctx}),
        task::Kind::PeerKld(p) => json!({
            "tool": p.tool, "model": p.model, "settings": settings_json(&p.settings), "base": p.base,
            "base_sha256": p.base_sha256
        }),
    }
}

fn outputs_json(r: Option<&pb::TaskResult>) -> Value {
    let Some(kind) = r.and_then(|r| r.kind.as_ref()) else { return Value::Null };
    match kind {
        task_result::Kind::Plan(p) => json!({
            "architecture": p.architecture, "format": p.format, "plan_digest": p.plan_digest,
            "source_identity": p.source_identity, "source_bytes": p.source_bytes, "tensors": p.tensors.len(),
            "imatrix_sha256": p.imatrix_sha256,
            "split_files": p.shards.len()
        }),
        task_result::Kind::Artifact(a) => {
            let art = a.artifact.as_ref();
            json!({
                "url": art.map(|a| a.url.clone()), "sha256": art.map(|a| a.sha256.clone()),
                "bytes": art.map(|a| a.bytes), "cache_hit": a.cache_hit
            })
        }
        task_result::Kind::Verify(v) => json!({
            "identical": v.identical, "stored_sha256": v.stored_sha256, "recomputed_sha256": v.recomputed_sha256,
            "detail": v.detail
        }),
        task_result::Kind::Noop(_) => json!({}),
        task_result::Kind::MergePlan(m) => json!({
            "format": m.format, "plan_digest": m.plan_digest, "inputs_identity": m.inputs_identity,
            "adapter_files": m.adapter_files.iter().map(|f| json!({"url": f.url, "sha256": f.sha256, "bytes": f.bytes})).collect::<Vec<_>>(),
            "files": m.files, "changed": m.changed.len(), "untied": m.untied
        }),
        task_result::Kind::KldPlan(k) => json!({
            "n_chunks": k.n_chunks, "n_seq": k.n_seq, "n_vocab": k.n_vocab, "text_sha256": k.text_sha256,
            "tokens_sha256": k.tokens_sha256
        }),
        // Sums only: the per-token values are in the artifact's merged figures.
        task_result::Kind::Kld(k) => json!({
            "chunks": k.chunks.iter().map(|c| json!({
                "chunk": c.chunk, "tokens": c.count, "sum_kld": c.sum_kld, "same_top": c.n_same_top
            })).collect::<Vec<_>>(),
            "note": k.note
        }),
        task_result::Kind::Greedy(g) => json!({
            "continuations": g.continuations.iter().map(|c| json!({
                "index": c.index, "prompt_tokens": c.prompt_tokens.len(), "tokens": c.tokens.len()
            })).collect::<Vec<_>>(),
            "agreements": g.agreements.iter().map(|a| json!({"index": a.index, "identical": a.identical})).collect::<Vec<_>>(),
            "note": g.note
        }),
        task_result::Kind::PeerKld(p) => json!({
            "tool": p.tool, "version": p.version, "command": p.command,
            "figures": p.figures.iter().collect::<BTreeMap<_, _>>(),
            "base": p.base.as_ref().map(|a| json!({"url": a.url, "sha256": a.sha256, "bytes": a.bytes}))
        }),
        task_result::Kind::Probe(p) => json!({
            "suite": p.suite, "passed": p.passed, "failed": p.failed, "truncated": p.truncated,
            "mean_score": p.mean_score, "score_spread": p.score_spread, "note": p.note
        }),
    }
}

fn kld_plan_result(rel: &Release) -> Option<&pb::KldPlanResult> {
    match rel.result(&TaskKey::KldPlan)?.kind.as_ref()? {
        task_result::Kind::KldPlan(k) => Some(k),
        _ => None,
    }
}

/// Each measured model's KL-divergence figures (keyed by its artifact `file_type`), merged from its chunk groups'
/// statistics, or why they cannot be: a chunk missing or given twice.
fn kld_summaries(rel: &Release) -> BTreeMap<String, Result<KldSummary, String>> {
    let mut chunks: BTreeMap<String, Vec<ChunkStats>> = BTreeMap::new();
    for t in &rel.tasks {
        let TaskKey::Kld { target, .. } = &t.key else { continue };
        let list = chunks.entry(target.to_string()).or_default();
        if let Some(task_result::Kind::Kld(k)) = t.result.as_ref().and_then(|r| r.kind.as_ref()) {
            list.extend(k.chunks.iter().map(ChunkStats::from));
        }
    }
    let expected = kld_plan_result(rel).map_or(0, |k| k.n_chunks as u64);
    chunks
        .into_iter()
        .map(|(target, list)| {
            let merged = KldSummary::merge(&list).map_err(|e| e.to_string()).and_then(|s| {
                if s.n_chunks == expected {
                    Ok(s)
                } else {
                    Err(format!("{} of the text's {expected} chunks were measured", s.n_chunks))
                }
            });
            (target, merged)
        })
        .collect()
}

/// The key of the merge check's greedy summary in [`greedy_summaries`].
const MERGE_CHECK: &str = "merge-check";

/// Each model's greedy agreement with its reference (keyed by its artifact `file_type`, the merge check's as
/// [`MERGE_CHECK`]), its shares joined in prompt order: k of N byte-identical, the mean common-prefix fraction, and
/// every disagreement with where it starts and the reference's top-2 margin there.
fn greedy_summaries(rel: &Release) -> BTreeMap<String, Value> {
    let mut agreements: BTreeMap<String, (Subject, Vec<&pb::PromptAgreement>)> = BTreeMap::new();
    // Continuations per reference subject: a comparison is complete when it covers every one.
    let mut n_reference: BTreeMap<String, usize> = BTreeMap::new();
    for t in &rel.tasks {
        let TaskKey::Greedy { subject, .. } = &t.key else { continue };
        let Some(task_result::Kind::Greedy(g)) = t.result.as_ref().and_then(|r| r.kind.as_ref()) else { continue };
        let key = match subject {
            Subject::Reference | Subject::Adapter => {
                *n_reference.entry(subject.to_string()).or_default() += g.continuations.len();
                continue;
            }
            Subject::Model(target) => target.to_string(),
            Subject::MergedF32 => MERGE_CHECK.to_string(),
        };
        agreements.entry(key).or_insert_with(|| (*subject, Vec::new())).1.extend(&g.agreements);
    }
    agreements
        .into_iter()
        .map(|(target, (subject, mut list))| {
            let n_reference =
                subject.compared_with().and_then(|r| n_reference.get(&r.to_string()).copied()).unwrap_or(0);
            list.sort_by_key(|a| a.index);
            let n = list.len();
            let identical = list.iter().filter(|a| a.identical).count();
            let mean_prefix = if n == 0 { 0.0 } else { list.iter().map(|a| a.prefix_fraction).sum::<f64>() / n as f64 };
            let differ: Vec<Value> = list
                .iter()
                .filter(|a| !a.identical)
                .map(|a| {
                    json!({
                        "index": a.index, "first_difference": a.first_difference,
                        "reference_margin": a.reference_margin, "common_prefix": a.common_prefix,
                        "reference_tokens": a.reference_tokens, "model_tokens": a.model_tokens,
                        "reference_text": a.reference_text, "model_text": a.model_text
                    })
                })
                .collect();
            let summary = json!({
                "n": n,
                "identical": identical,
                "agree": if n == 0 { 0.0 } else { identical as f64 / n as f64 },
                "mean_prefix_fraction": mean_prefix,
                "complete": n == n_reference,
                "disagreements": differ,
            });
            (target, summary)
        })
        .collect()
}

/// Each subject's probe results (keyed by artifact `file_type`, the reference as "BF16"), with the models' pass
/// rate against the reference's and its noise band.
fn probe_summaries(rel: &Release) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let reference =
        rel.result(&TaskKey::Probe { subject: Subject::Reference }).and_then(|r| match r.kind.as_ref()? {
            task_result::Kind::Probe(p) => Some(p),
            _ => None,
        });
    for t in &rel.tasks {
        let TaskKey::Probe { subject } = &t.key else { continue };
        let Some(task_result::Kind::Probe(p)) = t.result.as_ref().and_then(|r| r.kind.as_ref()) else { continue };
        let mut v = json!({
            "suite": p.suite, "passed": p.passed, "failed": p.failed, "truncated": p.truncated,
            "mean_score": p.mean_score, "score_spread": p.score_spread, "pass_scores": p.pass_scores,
        });
        let key = match subject {
            // The merge check's subjects run no probes.
            Subject::Adapter | Subject::MergedF32 => continue,
            Subject::Reference => "BF16".to_string(),
            Subject::Model(target) => {
                if let Some(r) = reference {
                    v["reference_mean_score"] = json!(r.mean_score);
                    v["reference_score_spread"] = json!(r.score_spread);
                    v["delta_vs_reference"] = json!(p.mean_score - r.mean_score);
                }
                target.to_string()
            }
        };
        out.insert(key, v);
    }
    out
}

/// Each quant level's figures as a peer tool printed them (keyed by artifact `file_type`, then tool), with whether
/// quantfarm's own figures print the same to every digit the tool prints.
fn peer_summaries(rel: &Release, klds: &BTreeMap<String, Result<KldSummary, String>>) -> BTreeMap<String, Value> {
    let mut out: BTreeMap<String, Value> = BTreeMap::new();
    for t in &rel.tasks {
        let TaskKey::PeerKld { level, .. } = &t.key else { continue };
        let Some(task_result::Kind::PeerKld(p)) = t.result.as_ref().and_then(|r| r.kind.as_ref()) else { continue };
        let ours = klds.get(level.name()).and_then(|r| r.as_ref().ok());
        // (label as printed, our figure, decimals printed)
        let compared: Vec<(&str, Option<f64>, usize)> = vec![
            ("Mean KLD", ours.map(|s| s.mean_kld.value), 6),
            ("Same top p", ours.map(|s| 100.0 * s.same_top_p.value), 3),
            ("Mean PPL(Q)", ours.map(|s| s.mean_ppl_q.value), 6),
            ("Mean PPL(base)", ours.map(|s| s.mean_ppl_base.value), 6),
        ];
        let mut same = Map::new();
        for (label, mine, digits) in compared {
            let theirs = p.figures.get(label);
            let equal = match (mine, theirs) {
                (Some(m), Some(t)) => format!("{m:.digits$}") == format!("{t:.digits$}"),
                _ => false,
            };
            same.insert(label.to_string(), json!(equal));
        }
        let entry = out.entry(level.name().to_string()).or_insert_with(|| json!({}));
        entry[p.tool.as_str()] = json!({
            "version": p.version,
            "command": p.command,
            "figures": p.figures.iter().collect::<BTreeMap<_, _>>(),
            "same_as_quantfarm": same,
        });
    }
    out
}

/// The adapter merged into the source: its location, format, every file with its content's sha256, and what the
/// merge changes (null without one).
fn adapter_json(rel: &Release) -> Value {
    if rel.adapter.is_empty() {
        return Value::Null;
    }
    let plan = match rel.result(&TaskKey::MergePlan).and_then(|r| r.kind.as_ref()) {
        Some(task_result::Kind::MergePlan(m)) => Some(m),
        _ => None,
    };
    json!({
        "url": rel.adapter,
        "format": plan.map(|p| p.format.clone()),
        "files": plan.map(|p| p.adapter_files.iter().map(|f| json!({"url": f.url, "sha256": f.sha256, "bytes": f.bytes})).collect::<Vec<_>>()),
        "changed_tensors": plan.map(|p| p.changed.len()),
        "untied_embeddings": plan.map(|p| p.untied),
    })
}

/// Link 1: the merge check's inputs and greedy agreement, or why it was not measured (null without an adapter).
fn merge_check_json(rel: &Release, greedy: &BTreeMap<String, Value>) -> Value {
    if rel.adapter.is_empty() {
        return Value::Null;
    }
    let Some(g) = greedy.get(MERGE_CHECK) else {
        return json!({"error": merge_unmeasured(rel)});
    };
    let part = |part| {
        artifact_result(rel.result(&TaskKey::MergeCheck { part }))
            .map(|(a, _)| json!({"url": a.url, "sha256": a.sha256, "bytes": a.bytes}))
    };
    json!({
        "method": "greedy continuations of evaluation.prompts at temperature 0 in llama.cpp, all in F32: the merge \
                   (computed as the published one, rounded to f32) against the base with the adapter applied at run \
                   time, unmerged (a GGUF LoRA)",
        "base": part(CheckPart::Base),
        "lora": part(CheckPart::Lora),
        "merged": part(CheckPart::Merged),
        "greedy": g,
    })
}

/// Why the merge check has no figures (with an adapter).
fn merge_unmeasured(rel: &Release) -> String {
    let untied = matches!(
        rel.result(&TaskKey::MergePlan).and_then(|r| r.kind.as_ref()),
        Some(task_result::Kind::MergePlan(m)) if m.untied
    );
    if rel.eval.prompts.is_empty() {
        "not measured: the merge check runs on evaluation.prompts, and the release has none".into()
    } else if untied {
        "not measured: the adapter changes the embeddings of a base with tied embeddings, and llama.cpp cannot apply \
         such a LoRA at run time (it would apply it to the output layer too), so the merge has no run-time reference \
         to be compared with; its bytes are still recomputed and compared (verify/merge)"
            .into()
    } else {
        "not measured: no merge-check greedy task ran".into()
    }
}

/// A greedy summary's figures, or why it has none.
fn greedy_figures(s: Option<&Value>, why_none: &str) -> (Result<f64, String>, Result<f64, String>) {
    match s {
        Some(s) if s["complete"] == true => (
            s["agree"].as_f64().ok_or_else(|| "no agreement figure".to_string()),
            s["mean_prefix_fraction"].as_f64().ok_or_else(|| "no prefix figure".to_string()),
        ),
        Some(s) => {
            let e = format!("incomplete: {} prompts compared", s["n"]);
            (Err(e.clone()), Err(e))
        }
        None => (Err(why_none.to_string()), Err(why_none.to_string())),
    }
}

/// A probe summary's pass rate and spread, or `None` when no pass was scored: a pass whose every answer was cut off
/// by its token cap has no score, and a suite with no scored pass says nothing (its rate is missing, not 0).
pub(crate) fn scored_probes(p: &Value) -> Option<(f64, f64)> {
    if p["pass_scores"].as_array().is_some_and(|s| s.is_empty()) {
        return None;
    }
    p["mean_score"].as_f64().map(|m| (m, p["score_spread"].as_f64().unwrap_or(0.0)))
}

/// A probe summary's pass rate for the gates, or why it has none (`whose` names the subject).
fn probe_pass_rate(p: &Value, whose: &str) -> Result<f64, String> {
    scored_probes(p).map(|(m, _)| m).ok_or_else(|| {
        format!(
            "{whose} probe answers were all cut off by their token cap ({} truncated): no score; raise the probes' max_tokens",
            p["truncated"]
        )
    })
}

/// Every figure the gates read, per level and release-wide, each with why it is missing where it is.
fn measured(
    rel: &Release,
    klds: &BTreeMap<String, Result<KldSummary, String>>,
    greedy: &BTreeMap<String, Value>,
    probes: &BTreeMap<String, Value>,
    artifacts: &[Value],
    all_verified: bool,
) -> gates::Measured {
    let spec = &rel.spec;
    let eval = spec.evaluation.as_ref();
    let reference_probe = probes.get("BF16");
    let mut levels = Vec::new();
    for level in spec.levels() {
        let mut f = gates::LevelFigures::default();
        let unmeasured = |what: &str, input: Option<&String>| -> String {
            if eval.is_some() && !spec.measures(&level) {
                "not measured: evaluation.skip lists it".to_string()
            } else if input.is_none() {
                format!("not measured: the release has no evaluation.{what}")
            } else {
                format!("not measured: no {what} task ran for it")
            }
        };
        match klds.get(&level) {
            Some(Ok(k)) => {
                let pct = |p: f64| k.kld_percentiles.iter().find(|(q, _)| (q - p).abs() < 1e-9).map(|(_, v)| *v);
                for (name, v) in [
                    ("kld.mean", Some(k.mean_kld.value)),
                    ("kld.mean_unc", Some(k.mean_kld.unc)),
                    ("kld.median", Some(k.median_kld)),
                    ("kld.max", Some(k.max_kld)),
                    ("kld.p90", pct(0.90)),
                    ("kld.p95", pct(0.95)),
                    ("kld.p99", pct(0.99)),
                    ("kld.p99_9", pct(0.999)),
                    // Percent, as the report's kld figures and llama-perplexity print them.
                    ("kld.same_top_p", Some(100.0 * k.same_top_p.value)),
                    ("kld.rms_dp", Some(100.0 * k.rms_dp.value)),
                    ("kld.ppl", Some(k.mean_ppl_q.value)),
                    ("kld.ppl_ratio", Some(k.mean_ppl_ratio.value)),
                    ("kld.ln_ppl_ratio", Some(k.mean_ln_ppl_ratio.value)),
                ] {
                    f.set(name, v.ok_or_else(|| "no such percentile".to_string()));
                }
            }
            other => {
                let why = match other {
                    Some(Err(e)) => format!("not measured: {e}"),
                    _ => unmeasured("text", eval.and_then(|e| e.text.as_ref())),
                };
                for name in gates::LEVEL_FIGURES.iter().map(|(n, _)| *n).filter(|n| n.starts_with("kld.")) {
                    f.set(name, Err(why.clone()));
                }
            }
        }
        let (agree, prefix) =
            greedy_figures(greedy.get(&level), &unmeasured("prompts", eval.and_then(|e| e.prompts.as_ref())));
        f.set("greedy.agree", agree);
        f.set("greedy.prefix", prefix);
        match probes.get(&level) {
            Some(p) => {
                let num = |v: &Value, what: &str| v.as_f64().ok_or_else(|| format!("no probe {what}"));
                f.set("probe.pass_rate", probe_pass_rate(p, "the level's"));
                f.set("probe.spread", num(&p["score_spread"], "spread"));
                f.set("probe.truncated", num(&p["truncated"], "truncation count"));
                match reference_probe {
                    Some(r) => {
                        f.set("baseline", probe_pass_rate(r, "the reference's"));
                        let spread = |v: &Value| v["score_spread"].as_f64().unwrap_or(0.0);
                        f.set("noise", Ok(spread(r).max(spread(p))));
                    }
                    None => {
                        f.set("baseline", Err("the reference's probes did not run".into()));
                        f.set("noise", Err("the reference's probes did not run".into()));
                    }
                }
            }
            None => {
                let why = unmeasured("probes", eval.and_then(|e| e.probes.as_ref()));
                for name in ["probe.pass_rate", "probe.spread", "probe.truncated", "baseline", "noise"] {
                    f.set(name, Err(why.clone()));
                }
            }
        }
        match artifacts.iter().find(|a| a["file_type"] == level.as_str()) {
            Some(a) => {
                f.set("bits_per_weight", a["bits_per_weight"].as_f64().ok_or_else(|| "no bits per weight".into()));
                f.set("bytes", a["bytes"].as_u64().map(|b| b as f64).ok_or_else(|| "no size".into()));
                f.verified = a["verified"].as_bool();
            }
            None => {
                f.set("bits_per_weight", Err("the artifact was not made".into()));
                f.set("bytes", Err("the artifact was not made".into()));
            }
        }
        f.set(
            "default.kld.mean",
            gates::default_kld_max(&level).ok_or_else(|| format!("no default limit for {level}")),
        );
        levels.push((level, f));
    }
    let mut global = BTreeMap::new();
    let merge_why =
        if rel.adapter.is_empty() { "no adapter: nothing was merged".to_string() } else { merge_unmeasured(rel) };
    let (agree, prefix) = greedy_figures(greedy.get(MERGE_CHECK), &merge_why);
    global.insert("merge.greedy.agree", agree);
    global.insert("merge.greedy.prefix", prefix);
    let base_ppl = klds.values().find_map(|k| k.as_ref().ok()).map(|k| k.mean_ppl_base.value);
    global.insert("reference.kld.ppl", base_ppl.ok_or_else(|| "no KL-divergence pass ran".to_string()));
    global.insert(
        "reference.probe.pass_rate",
        reference_probe.map_or_else(
            || Err("the reference's probes did not run".into()),
            |r| probe_pass_rate(r, "the reference's"),
        ),
    );
    gates::Measured { levels, global, all_verified, has_adapter: !rel.adapter.is_empty() }
}

/// The tools that made the release: this coordinator, every worker that ran one of its tasks (version, platform,
/// the runtimes it found), and each peer tool's version as it reported it.
fn tools_json(rel: &Release, workers: &HashMap<String, WorkerRec>) -> Value {
    let ran: std::collections::BTreeSet<&str> = rel.tasks.iter().filter_map(|t| t.worker.as_deref()).collect();
    let list: Vec<Value> = ran
        .iter()
        .map(|id| match workers.get(*id) {
            Some(w) => json!({
                "id": id, "name": w.info.name, "version": w.info.version, "os": w.info.os, "arch": w.info.arch,
                "cores": w.info.cores, "runtimes": w.info.runtimes
            }),
            // A worker of an earlier coordinator run (before a restart): only its id is known now.
            None => json!({"id": id}),
        })
        .collect();
    let mut peers = BTreeMap::new();
    for t in &rel.tasks {
        if let Some(task_result::Kind::PeerKld(p)) = t.result.as_ref().and_then(|r| r.kind.as_ref()) {
            peers.insert(p.tool.clone(), p.version.clone());
        }
    }
    json!({"quantfarm": env!("CARGO_PKG_VERSION"), "workers": list, "peers": peers})
}

/// Wall time of the release and the time its tasks ran, in all and by kind (`quantize`, `kld`, ...).
fn timings_json(rel: &Release, now_ms: i64) -> Value {
    let mut by_kind: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    for t in rel.tasks.iter().filter(|t| t.result.is_some()) {
        let kind = t.id.split('/').next().unwrap_or(&t.id);
        let e = by_kind.entry(kind).or_default();
        e.0 += 1;
        e.1 += t.duration_ms;
        e.2 = e.2.max(t.duration_ms);
    }
    json!({
        "created_ms": rel.created_ms,
        "reported_ms": now_ms,
        "wall_ms": (now_ms - rel.created_ms).max(0),
        "task_ms": by_kind.values().map(|v| v.1).sum::<u64>(),
        "by_kind": by_kind.iter().map(|(k, v)| (k.to_string(), json!({"tasks": v.0, "total_ms": v.1, "max_ms": v.2}))).collect::<Map<_, _>>(),
    })
}

/// Signs `report` with `key` and publishes it at `target` (`…/report.json`) with its views (`report.html`, the
/// model card, …) and its DSSE envelope beside it. Every file is staged before any is committed, and report.json is
/// committed last: its presence says the release's files are all there.
pub async fn publish(
    report: Value,
    passed: bool,
    key: &crate::signing::SigningKey,
    target: &quantfarm_store::Location,
) -> Result<crate::sched::Published, String> {
    use quantfarm_store::StagedSink;
    let signed = crate::signing::sign_report(report, key).map_err(|e| e.to_string())?;
    let text = crate::canonical::canonical_json(&signed).map_err(|e| e.to_string())?;
    let envelope = crate::attestation::envelope(&signed, key).map_err(|e| e.to_string())?;
    // The views are rendered from the report as published (canonical: keys sorted), so that `quantfarm report
    // render` of report.json gives the same files byte for byte.
    let published: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let mut files: Vec<(&str, String)> = crate::views::render_all(&published);
    files.push((
        "report.intoto.json",
        format!("{}\n", crate::canonical::canonical_json(&envelope).map_err(|e| e.to_string())?),
    ));
    let mut sinks = Vec::new();
    for (name, body) in &files {
        let loc = target.sibling(name).map_err(|e| e.to_string())?;
        let mut sink = StagedSink::create(&loc, true).await.map_err(|e| format!("{loc}: {e}"))?;
        sink.write(body.as_bytes()).await.map_err(|e| format!("{loc}: {e}"))?;
        sinks.push(sink);
    }
    let mut sink = StagedSink::create(target, true).await.map_err(|e| e.to_string())?;
    sink.write(text.as_bytes()).await.map_err(|e| e.to_string())?;
    for s in sinks {
        s.commit().await.map_err(|e| e.to_string())?;
    }
    sink.commit().await.map_err(|e| e.to_string())?;
    Ok(crate::sched::Published { json: text, url: target.to_string(), passed })
}

/// Builds the unsigned report of a release whose tasks (but the report) are all done; returns it with whether
/// every gate passed. `workers` are the coordinator's known workers, `now_ms` the report's time.
pub fn build(rel: &Release, workers: &HashMap<String, WorkerRec>, now_ms: i64) -> (Value, bool) {
    let klds = kld_summaries(rel);
    let greedy = greedy_summaries(rel);
    let probes = probe_summaries(rel);
    let peers = peer_summaries(rel, &klds);
    // Slots in report order: the merged checkpoint, GGUF BF16, the GGUF quants, the MLX checkpoints.
    let mut artifacts: BTreeMap<(u32, String), ArtifactAcc> = BTreeMap::new();
    let level_order =
        |l: &str| rel.spec.quants().iter().position(|q| q.0.name() == l).map_or(u32::MAX - 1, |p| p as u32 + 2);
    let merged = || (0, "merged".to_string());
    let bf16 = || (1, "BF16".to_string());
    let mlx = |bits: u32| (u32::MAX - 16 + bits, format!("MLX-{bits}bit"));
    for t in &rel.tasks {
        let (slot, producer) = match &t.key {
            TaskKey::Merge { .. } | TaskKey::MergeSide => (merged(), true),
            TaskKey::VerifyMerge { .. } | TaskKey::VerifyMergeSide => (merged(), false),
            TaskKey::Gguf { .. } => (bf16(), true),
            TaskKey::Quantize { level, .. } => ((level_order(level.name()), level.name().to_string()), true),
            TaskKey::VerifyGguf { .. } => (bf16(), false),
            TaskKey::VerifyQuantize { level, .. } => ((level_order(level.name()), level.name().to_string()), false),
            TaskKey::Mlx { bits } => (mlx(*bits), true),
            TaskKey::VerifyMlx { bits } => (mlx(*bits), false),
            _ => continue,
        };
        let acc = artifacts.entry(slot).or_default();
        if producer {
            if let Some((a, _)) = artifact_result(t.result.as_ref()) {
                acc.files.push(json!({"url": a.url, "sha256": a.sha256, "bytes": a.bytes}));
                acc.bytes += a.bytes;
                for tc in &a.types {
                    let e = acc.types.entry(tc.ggml_type.clone()).or_default();
                    e.0 += tc.tensors;
                    e.1 += tc.elements;
                    e.2 += tc.bytes;
                }
                acc.produced_by.push(t.id.clone());
            }
        } else {
            acc.verified.push(verify_result(t.result.as_ref()).is_some_and(|v| v.identical));
        }
    }
    let imatrix = imatrix_json(rel);
    let mut artifact_list = Vec::new();
    let mut all_verified = !artifacts.is_empty() || rel.spec.outputs.noop.is_some();
    for ((_, ty), acc) in &artifacts {
        let elements: u64 = acc.types.values().map(|t| t.1).sum();
        let tensor_bytes: u64 = acc.types.values().map(|t| t.2).sum();
        let verified =
            !acc.verified.is_empty() && acc.verified.iter().all(|&v| v) && acc.verified.len() == acc.files.len();
        all_verified &= verified;
        let bpw =
            if elements > 0 { (tensor_bytes as f64 * 8.0 / elements as f64 * 10000.0).round() / 10000.0 } else { 0.0 };
        let container = match ty.as_str() {
            "merged" => "hf",
            t if t.starts_with("MLX-") => "mlx",
            _ => "gguf",
        };
        let kld = match klds.get(ty) {
            Some(Ok(s)) => s.to_json(),
            Some(Err(e)) => json!({"error": e}),
            None => Value::Null,
        };
        let is_quant = container == "gguf" && ty != "BF16";
        artifact_list.push(json!({
            "imatrix": if is_quant { imatrix.clone() } else { Value::Null },
            "kld": kld,
            "greedy": greedy.get(ty).cloned().unwrap_or(Value::Null),
            "probes": probes.get(ty).cloned().unwrap_or(Value::Null),
            "peers": peers.get(ty).cloned().unwrap_or(Value::Null),
            "name": format!("{}-{ty}", rel.spec.prefix()),
            "container": container,
            "file_type": ty,
            "files": acc.files,
            "bytes": acc.bytes,
            "bits_per_weight": bpw,
            "type_mix": acc.types.iter().map(|(k, v)| json!({"type": k, "tensors": v.0, "elements": v.1, "bytes": v.2})).collect::<Vec<_>>(),
            "verified": verified,
        }));
    }
    let measured = measured(rel, &klds, &greedy, &probes, &artifact_list, all_verified);
    let results = gates::evaluate(&rel.spec.gates, &measured);
    let passed = results.iter().all(|g| g.outcome.passed);
    let gates: Vec<Value> = results.iter().map(gates::GateResult::to_json).collect();
    let tasks: Vec<Value> = rel
        .tasks
        .iter()
        .filter(|t| t.key != TaskKey::Report)
        .map(|t| {
            json!({
                "id": t.id, "worker": t.worker, "attempts": t.attempts, "duration_ms": t.duration_ms,
                "inputs": inputs_json(t.task.as_ref()), "outputs": outputs_json(t.result.as_ref()),
            })
        })
        .collect();
    let plan = rel.result(&TaskKey::Plan).and_then(|r| match r.kind.as_ref()? {
        task_result::Kind::Plan(p) => Some(p),
        _ => None,
    });
    let spec = serde_json::to_value(&rel.spec).unwrap_or(Value::Null);
    let report = json!({
        "format": FORMAT,
        "quantfarm_version": env!("CARGO_PKG_VERSION"),
        "release": {
            "id": rel.id,
            "name": rel.spec.name,
            "spec_file": rel.file_name,
            "spec_sha256": quantfarm_store::hex(&<sha2::Sha256 as sha2::Digest>::digest(rel.yaml.as_bytes())),
            "spec": spec,
        },
        "source": {
            "url": rel.source,
            "format": plan.map(|p| p.format.clone()),
            "architecture": plan.map(|p| p.architecture.clone()),
            "identity": plan.map(|p| p.source_identity.clone()),
            "bytes": plan.map(|p| p.source_bytes),
            "tensors": plan.map(|p| p.tensors.len()),
        },
        "links": {
            "merge": if rel.adapter.is_empty() {
                "not applicable: no adapter".to_string()
            } else if rel.eval.prompts.is_empty() {
                format!("adapter {} merged exactly (f64, rounded once); each file recomputed and compared byte for byte; greedy agreement not measured (no evaluation.prompts)", rel.adapter)
            } else {
                format!("adapter {} merged exactly (f64, rounded once); each file recomputed and compared byte for byte; the merge's greedy agreement with the base plus the adapter at run time in merge_check", rel.adapter)
            },
            "conversion": "GGUF BF16 written from the source by the mapping; each file recomputed and compared byte for byte",
            "quantization": if rel.spec.evaluation.is_some() {
                "llama-quantize's algorithms; each file recomputed and compared byte for byte; information loss measured as KL divergence against the GGUF BF16 in llama.cpp, by llama-perplexity's procedure, per chunk group on the workers, merged here (artifacts[].kld)"
            } else {
                "llama-quantize's algorithms; each file recomputed and compared byte for byte; information loss not measured (no evaluation section)"
            },
            "probes": if rel.eval.probes.is_empty() {
                "not measured (no evaluation.probes)"
            } else {
                "the probe suite run on the reference and every model in llama.cpp (artifacts[].probes)"
            },
        },
        "adapter": adapter_json(rel),
        "merge_check": merge_check_json(rel, &greedy),
        "evaluation": evaluation_json(rel),
        "artifacts": artifact_list,
        "tasks": tasks,
        "gates": gates,
        "tools": tools_json(rel, workers),
        "timings": timings_json(rel, now_ms),
        "verdict": if passed { "released" } else { "gate_failed" },
    });
    (report, passed)
}

/// The importance matrix the quants were made with: the file's identity, and, when the farm computed it, the
/// calibration text's identity and chunking.
fn imatrix_json(rel: &Release) -> Value {
    use crate::spec::ImatrixSource;
    match rel.spec.imatrix() {
        None => Value::Null,
        Some(ImatrixSource::File(_)) => {
            let sha = rel.result(&TaskKey::Plan).and_then(|r| match r.kind.as_ref()? {
                task_result::Kind::Plan(p) => Some(p.imatrix_sha256.clone()),
                _ => None,
            });
            json!({"from": "file", "url": rel.imatrix, "sha256": sha})
        }
        Some(ImatrixSource::Text { ctx, batch, .. }) => {
            let merged = artifact_result(rel.result(&TaskKey::ImatrixMerge)).map(|(a, _)| a);
            let plan = rel.result(&TaskKey::ImatrixPlan).and_then(|r| match r.kind.as_ref()? {
                task_result::Kind::KldPlan(p) => Some(p),
                _ => None,
            });
            json!({
                "from": "computed",
                "url": merged.map(|a| a.url.clone()),
                "sha256": merged.map(|a| a.sha256.clone()),
                "text": rel.imatrix,
                "text_sha256": plan.map(|p| p.text_sha256.clone()),
                "tokens_sha256": plan.map(|p| p.tokens_sha256.clone()),
                "chunks": plan.map(|p| p.n_chunks),
                "ctx": ctx,
                "batch": batch,
                "method": "llama-imatrix's collection in llama.cpp (Σx² per input column and token counts of every blk.* matrix), f64 sums per chunk group on the workers, added in chunk order",
            })
        }
    }
}

/// What the KL divergence was measured on: the text, its tokenization and chunking, and the reference.
fn evaluation_json(rel: &Release) -> Value {
    let Some(e) = &rel.spec.evaluation else { return Value::Null };
    let prompts_n: usize = rel
        .tasks
        .iter()
        .filter(|t| matches!(t.key, TaskKey::Greedy { subject: Subject::Reference, .. }))
        .filter_map(|t| match t.result.as_ref()?.kind.as_ref()? {
            task_result::Kind::Greedy(g) => Some(g.continuations.len()),
            _ => None,
        })
        .sum();
    let plan = kld_plan_result(rel);
    let reference = artifact_result(rel.result(&TaskKey::Gguf { shard: 0 })).map(|(a, _)| a.url.clone());
    json!({
        "text": rel.eval.text,
        "text_sha256": plan.map(|k| k.text_sha256.clone()),
        "tokens_sha256": plan.map(|k| k.tokens_sha256.clone()),
        "ctx": e.ctx,
        "batch": e.batch,
        "n_chunks": plan.map(|k| k.n_chunks),
        "chunks_per_task": plan.map(|k| k.n_seq),
        "reference": reference,
        "runtime": "llama.cpp (llama-cpp-2), llama-perplexity --kl-divergence's procedure",
        "prompts": rel.eval.prompts,
        "n_prompts": prompts_n,
        "max_tokens": e.max_tokens,
        "probes": rel.eval.probes,
        "context": e.context,
    })
}
