//! Each task message and result as a release's record shows them (the report's `tasks`): the message's fields,
//! minus what is too large to repeat.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::{self as pb, task, task_result, verify_task};

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

fn vllm_scheme_json(s: &pb::VllmScheme) -> Value {
    json!({"scheme": s.scheme, "group_size": s.group_size, "ignore": s.ignore, "like": s.like})
}

impl task::Kind {
    /// The task's inputs as a release's record shows them: the message, minus what is too large to repeat (tensor
    /// lists, continuations' tokens).
    pub fn record(&self) -> Value {
        inputs_json(self)
    }
}

impl task_result::Kind {
    /// The task's outputs as a release's record shows them: the result, minus what is too large to repeat
    /// (per-token values, continuations' tokens).
    pub fn record(&self) -> Value {
        outputs_json(self)
    }
}

fn inputs_json(kind: &task::Kind) -> Value {
    match kind {
        task::Kind::Plan(p) => {
            let mut v = json!({"source": p.source, "split": split_json(&p.split), "imatrix": p.imatrix});
            // The vLLM pre-flight, only where there is one (a plan without it reads as before).
            if !p.vllm.is_empty() {
                v["vllm"] = json!(p.vllm.iter().map(vllm_scheme_json).collect::<Vec<_>>());
            }
            v
        }
        task::Kind::Gguf(g) => json!({
            "source": g.source, "plan_digest": g.plan_digest, "shard": g.shard, "n_shards": g.n_shards,
            "split": split_json(&g.split)
        }),
        task::Kind::Quantize(q) => {
            let mut v = json!({"input": q.input, "file_type": q.file_type, "shard": q.shard, "n_shards": q.n_shards,
                   "imatrix": q.imatrix, "imatrix_sha256": q.imatrix_sha256});
            // A recipe's flags, only where there are some (a plain file type's inputs read as before).
            if !q.tensor_types.is_empty() {
                v["tensor_types"] = json!(q.tensor_types);
            }
            for (key, t) in
                [("output_tensor_type", &q.output_tensor_type), ("token_embedding_type", &q.token_embedding_type)]
            {
                if !t.is_empty() {
                    v[key] = json!(t);
                }
            }
            v
        }
        task::Kind::Verify(v) => {
            let (artifact, what) = match &v.what {
                Some(verify_task::What::Gguf(g)) => (g.output.clone(), "gguf"),
                Some(verify_task::What::Quantize(q)) => (q.output.clone(), "quantize"),
                Some(verify_task::What::Merge(m)) => (m.output.clone(), "merge"),
                Some(verify_task::What::Mlx(m)) => (m.output.clone(), "mlx"),
                Some(verify_task::What::Vllm(t)) => (t.output.clone(), "vllm"),
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
        task::Kind::Vllm(t) => {
            json!({"source": t.source, "scheme": t.scheme.as_ref().map_or(Value::Null, vllm_scheme_json)})
        }
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
        task::Kind::Choice(c) => json!({"model": c.model, "tasks": c.tasks, "ctx": c.ctx}),
        task::Kind::SensitivityLookup(l) => json!({"sensitivity": l.sensitivity}),
        task::Kind::SensitivityProbe(p) => json!({
            "input": p.quantize.as_ref().map(|q| q.input.clone()),
            "tensor_types": p.quantize.as_ref().map(|q| q.tensor_types.clone()),
            "bases": p.bases.iter().map(|a| json!({"url": a.url, "sha256": a.sha256})).collect::<Vec<_>>(),
            "batch": p.batch, "min_chunks": p.min_chunks, "precision": p.precision
        }),
        task::Kind::SensitivityWrite(w) => json!({"bytes": w.json.len()}),
        task::Kind::PeerKld(p) => json!({
            "tool": p.tool, "model": p.model, "settings": settings_json(&p.settings), "base": p.base,
            "base_sha256": p.base_sha256
        }),
        task::Kind::MlxLmGreedy(g) => json!({
            "runtime": "mlx-lm", "model": g.model, "max_tokens": g.max_tokens,
            "reference_continuations": g.reference.len()
        }),
        task::Kind::MlxLmProbe(p) => json!({"runtime": "mlx_lm.server", "model": p.model, "suite": p.suite}),
        task::Kind::MlxLmKld(k) => json!({
            "runtime": "mlx-lm", "model": k.model, "base": k.base, "base_sha256": k.base_sha256,
            "first_chunk": k.first_chunk, "bos": k.bos
        }),
        task::Kind::TransformersGreedy(g) => json!({
            "runtime": "transformers", "model": g.model, "adapter": g.adapter, "max_tokens": g.max_tokens,
            "reference_continuations": g.reference.len(), "activations": g.activations, "dtype": g.dtype
        }),
        task::Kind::TransformersKld(k) => json!({
            "runtime": "transformers", "model": k.model, "adapter": k.adapter, "base": k.base,
            "base_sha256": k.base_sha256, "first_chunk": k.first_chunk, "bos": k.bos, "activations": k.activations,
            "dtype": k.dtype
        }),
        task::Kind::TransformersProbe(p) => json!({
            "runtime": "transformers", "model": p.model, "suite": p.suite, "activations": p.activations,
            "dtype": p.dtype
        }),
    }
}

/// `outputs` with how mlx-lm ran the task's model, when it did (a member only then, so the outputs of llama.cpp's
/// tasks read as they always have).
fn with_mlx_lm(mut outputs: Value, r: Option<&pb::MlxLmRun>) -> Value {
    if let Some(r) = r {
        outputs["mlx_lm"] = json!({
            "mlx": r.mlx, "mlx_lm": r.mlx_lm, "device": r.device, "device_name": r.device_name,
            "quantized": r.quantized, "upcast": r.upcast, "load_error": r.load_error
        });
    }
    outputs
}

/// `outputs` with how transformers ran the task's model, when it did.
fn with_transformers(mut outputs: Value, r: Option<&pb::TransformersRun>) -> Value {
    if let Some(r) = r {
        outputs["transformers"] = json!({
            "torch": r.torch, "transformers": r.transformers, "compressed_tensors": r.compressed_tensors,
            "peft": r.peft, "device": r.device, "device_name": r.device_name, "quantized": r.quantized,
            "scheme": r.scheme, "activations": r.activations, "dtype": r.dtype, "load_error": r.load_error
        });
    }
    outputs
}

fn outputs_json(kind: &task_result::Kind) -> Value {
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
        task_result::Kind::Kld(k) => with_transformers(
            with_mlx_lm(
                json!({
                    "chunks": k.chunks.iter().map(|c| json!({
                        "chunk": c.chunk, "tokens": c.count, "sum_kld": c.sum_kld, "same_top": c.n_same_top
                    })).collect::<Vec<_>>(),
                    "note": k.note
                }),
                k.mlx_lm.as_ref(),
            ),
            k.transformers.as_ref(),
        ),
        task_result::Kind::Greedy(g) => with_transformers(
            with_mlx_lm(
                json!({
                    "continuations": g.continuations.iter().map(|c| json!({
                        "index": c.index, "prompt_tokens": c.prompt_tokens.len(), "tokens": c.tokens.len()
                    })).collect::<Vec<_>>(),
                    "agreements": g.agreements.iter().map(|a| json!({"index": a.index, "identical": a.identical})).collect::<Vec<_>>(),
                    "note": g.note
                }),
                g.mlx_lm.as_ref(),
            ),
            g.transformers.as_ref(),
        ),
        task_result::Kind::PeerKld(p) => json!({
            "tool": p.tool, "version": p.version, "command": p.command,
            "figures": p.figures.iter().collect::<BTreeMap<_, _>>(),
            "base": p.base.as_ref().map(|a| json!({"url": a.url, "sha256": a.sha256, "bytes": a.bytes}))
        }),
        task_result::Kind::SensitivityLookup(l) => json!({"found": l.found, "sha256": l.sha256}),
        task_result::Kind::SensitivityProbe(p) => json!({
            "chunks": p.chunks, "tokens": p.tokens, "mean_kld": p.mean_kld, "half_width": p.half_width,
            "model_bytes": p.model_bytes, "seconds": p.seconds
        }),
        task_result::Kind::Choice(c) => json!({
            "tasks_sha256": c.tasks_sha256, "chosen": c.chosen, "correct": c.correct, "n_answers": c.n_answers,
            "note": c.note
        }),
        task_result::Kind::Probe(p) => with_transformers(
            with_mlx_lm(
                json!({
                    "suite": p.suite, "passed": p.passed, "failed": p.failed, "truncated": p.truncated,
                    "mean_score": p.mean_score, "score_spread": p.score_spread, "note": p.note
                }),
                p.mlx_lm.as_ref(),
            ),
            p.transformers.as_ref(),
        ),
    }
}
