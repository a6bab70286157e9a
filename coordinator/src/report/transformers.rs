//! The report's `transformers` section, from the transformers tasks: the HF bf16 checkpoint against llama.cpp's GGUF
//! BF16, and each vLLM rung (as saved and weight-only) against llama.cpp's base logits and transformers' bf16 run.

use std::collections::BTreeMap;

use super::build::{greedy_summary, kld_record, merge_chunks, n_reference_prompts, probe_summary};
use super::figures::{greedy_figures, probe_pass_rate};
use super::model::{Kld, TransformersFigures, TransformersSubject};
use crate::gates;
use quantfarm_proto as pb;

use crate::kinds::{peft_adapter, EvalTarget, Folded, Merge, TfSubject};
use crate::sched::Release;

/// `None` for a release that runs nothing in transformers (no vLLM output, no GGUF reference, no evaluation, or
/// `evaluation.transformers: false`).
pub(super) fn section(rel: &Release, folded: &Folded) -> Option<TransformersFigures> {
    if !rel.spec.runs_transformers() {
        return None;
    }
    let by_name: BTreeMap<String, _> =
        folded.transformers_kld.iter().map(|(s, chunks)| (s.to_string(), chunks.clone())).collect();
    let mut klds = merge_chunks(rel, &by_name);
    let n_llama_reference = n_reference_prompts(folded);
    let n_bf16 = folded.transformers.get(&TfSubject::Bf16).map_or(0, |a| a.continuations);
    let n_adapter = folded.transformers.get(&TfSubject::Adapter).map_or(0, |a| a.continuations);
    let bf16_probe = folded.transformers.get(&TfSubject::Bf16).and_then(|a| a.probe);
    let mut bf16 = None;
    let (mut adapter, mut merged_f32) = (None, None);
    let mut rungs = Vec::new();
    for (&subject, acc) in &folded.transformers {
        let name = subject.to_string();
        let load_error = acc.run.map(|r| r.load_error.clone()).filter(|e| !e.is_empty());
        let n_reference = match subject {
            TfSubject::Bf16 | TfSubject::Adapter => n_llama_reference,
            TfSubject::MergedF32 => n_adapter,
            TfSubject::Rung { .. } => n_bf16,
        };
        let kld = klds.remove(&name).map(|k| match (&load_error, k) {
            (Some(e), _) => Kld::Unmeasured { error: format!("not measured: {e}") },
            (None, k) => kld_record(k),
        });
        let record = TransformersSubject {
            subject: name,
            file_type: match subject {
                TfSubject::Bf16 | TfSubject::MergedF32 => "BF16".to_string(),
                TfSubject::Adapter => "adapter".to_string(),
                TfSubject::Rung { rung, .. } => EvalTarget::Vllm(rung).to_string(),
            },
            activations: subject.activations().to_string(),
            dtype: subject.dtype().to_string(),
            scheme: acc.run.filter(|r| r.load_error.is_empty() && r.quantized).map(|r| r.scheme.clone()),
            greedy: (acc.ran_greedy && load_error.is_none() && n_reference > 0)
                .then(|| greedy_summary(acc.agreements.clone(), n_reference)),
            kld,
            probes: acc.probe.map(|p| {
                // A rung's pass rate beside transformers' bf16 checkpoint's (the same runtime, the same rendering).
                let compared = match subject {
                    TfSubject::Bf16 | TfSubject::Adapter | TfSubject::MergedF32 => None,
                    TfSubject::Rung { .. } => bf16_probe,
                };
                probe_summary(p, compared)
            }),
            load_error,
        };
        match subject {
            TfSubject::Bf16 => bf16 = Some(record),
            TfSubject::Adapter => adapter = Some(record),
            TfSubject::MergedF32 => merged_f32 = Some(record),
            TfSubject::Rung { .. } => rungs.push(record),
        }
    }
    let bf16 = bf16.unwrap_or(TransformersSubject {
        subject: "BF16".into(),
        file_type: "BF16".into(),
        activations: "as-saved".into(),
        dtype: TfSubject::Bf16.dtype().into(),
        scheme: None,
        load_error: None,
        greedy: None,
        kld: None,
        probes: None,
    });
    Some(TransformersFigures {
        method: "the GGUF BF16's source checkpoint (with an adapter, the merge), each vLLM rung and, with a PEFT \
                 adapter, the base with the adapter applied at run time by PeftModel.from_pretrained, unmerged (the \
                 merge check, link 1, in transformers), loaded by AutoModelForCausalLM.from_pretrained in \
                 bf16 on the workers' helper (worker/transformers/quantfarm_transformers.py; a vLLM checkpoint \
                 decompressed by compressed-tensors), fed the token ids llama.cpp was fed (never re-tokenized): a \
                 rung as saved (FP8_DYNAMIC's inputs quantized per token to e4m3 and back by compressed-tensors' \
                 forward: vLLM's W8A8 path, emulated) and weight-only (its decompressed weights with bf16 inputs: \
                 vLLM's weight-only path); greedy continuations at temperature 0 of the reference's prompt tokens, \
                 the bf16 checkpoint compared with llama.cpp's GGUF BF16, the adapter and each rung with transformers' \
                 bf16; logits \
                 of every chunk of the evaluation text scored against llama.cpp's base logits of the GGUF BF16 by \
                 llama-perplexity's procedure"
            .into(),
        runtimes: folded.transformers_runtimes.iter().cloned().collect(),
        model: folded.transformers_model.clone().unwrap_or_default(),
        bf16,
        adapter,
        merged_f32,
        rungs,
    })
}

/// The transformers figures for the gates: release-wide, the bf16 checkpoint against llama.cpp
/// (`transformers.bf16.*`) and the merge check in transformers (`merge.transformers.*`); per vLLM rung, its own
/// (`transformers.*`), which its `measured` gate then requires.
pub(super) fn figures(rel: &Release, t: Option<&TransformersFigures>, m: &mut gates::Measured) {
    use gates::{Figure, GlobalFigure};
    let spec = &rel.spec;
    // The default `transformers-kld` gate reads the bf16 checkpoint's KL divergence: it applies when there is a
    // text to measure it on (a release may run transformers for the merge check's prompts alone).
    m.has_transformers = t.is_some() && spec.evaluation.as_ref().is_some_and(|e| e.text.is_some());
    let why = "not applicable: the release runs nothing in transformers (no vLLM output, GGUF output or evaluation, \
               or evaluation.transformers is false)";
    let kld = |s: Option<&TransformersSubject>| -> Result<(f64, f64), String> {
        match s.map(|s| (s.load_error.as_ref(), s.kld.as_ref())) {
            None if t.is_none() => Err(why.to_string()),
            None => Err("not measured: no transformers task ran for it".into()),
            Some((Some(e), _)) => Err(format!("not measured: {e}")),
            Some((None, Some(Kld::Measured(k)))) => Ok((k.mean_kld, k.same_top_p)),
            Some((None, Some(Kld::Unmeasured { error }))) => Err(error.clone()),
            Some((None, None)) => Err("not measured: no transformers kld task ran for it".into()),
        }
    };
    let greedy = |s: Option<&TransformersSubject>| {
        let why_none = if t.is_none() { why } else { "not measured: no transformers greedy task ran for it" };
        greedy_figures(s.and_then(|s| s.greedy.as_ref()), why_none).0
    };
    let probes = |s: Option<&TransformersSubject>| -> (Result<f64, String>, Result<f64, String>) {
        let unmeasured = match s.map(|s| s.load_error.as_ref()) {
            None if t.is_none() => why.to_string(),
            Some(Some(e)) => format!("not measured: {e}"),
            None | Some(None) => "not measured: no transformers probe task ran for it".to_string(),
        };
        match s.and_then(|s| s.probes.as_ref()) {
            Some(p) => (probe_pass_rate(p, "the transformers"), Ok(f64::from(p.truncated))),
            None => (Err(unmeasured.clone()), Err(unmeasured)),
        }
    };
    let bf16 = t.map(|t| &t.bf16);
    m.global.insert(GlobalFigure::TransformersBf16KldMean, kld(bf16).map(|k| k.0));
    m.global.insert(GlobalFigure::TransformersBf16GreedyAgree, greedy(bf16));
    m.global.insert(GlobalFigure::TransformersBf16ProbePassRate, probes(bf16).0);
    let merged_f32 = adapter_format(rel).map(|_| t.and_then(|t| t.merged_f32.as_ref()));
    m.has_transformers_adapter = t.is_some() && merged_f32.is_ok();
    let load_error = t.iter().flat_map(|t| [&t.adapter, &t.merged_f32]).flatten().find_map(|s| {
        let e = s.load_error.as_ref()?;
        Some(format!("not measured: transformers could not load {}: {e}", s.label()))
    });
    let (agree, prefix) = match (merged_f32, load_error) {
        (Err(why), _) | (Ok(_), Some(why)) => (Err(why.clone()), Err(why)),
        (Ok(s), None) => {
            let why_none = if t.is_none() { why } else { "not measured: no transformers merge-check task ran" };
            greedy_figures(s.and_then(|s| s.greedy.as_ref()), why_none)
        }
    };
    m.global.insert(GlobalFigure::MergeTransformersGreedyAgree, agree);
    m.global.insert(GlobalFigure::MergeTransformersGreedyPrefix, prefix);
    let Some(t) = t else { return };
    for (level, f) in m.levels.iter_mut() {
        let Some(EvalTarget::Vllm(rung)) = EvalTarget::parse(level) else { continue };
        if !spec.measures(EvalTarget::Vllm(rung)) {
            continue;
        }
        let subject = |weight_only| {
            let name = TfSubject::Rung { rung, weight_only }.to_string();
            t.rungs.iter().find(|r| r.subject == name)
        };
        let saved = kld(subject(false));
        f.set(Figure::TransformersKldMean, saved.clone().map(|k| k.0));
        f.set(Figure::TransformersKldSameTopP, saved.map(|k| k.1));
        f.set(Figure::TransformersGreedyAgree, greedy(subject(false)));
        let (pass_rate, truncated) = probes(subject(false));
        f.set(Figure::TransformersProbePassRate, pass_rate);
        f.set(Figure::TransformersProbeTruncated, truncated);
        if rung.quantizes_activations() {
            f.set(Figure::TransformersWeightOnlyKldMean, kld(subject(true)).map(|k| k.0));
        }
        f.in_transformers = true;
    }
}

/// The adapter's format when PEFT can apply it at run time, or why the merge check in transformers does not apply.
fn adapter_format(rel: &Release) -> Result<&str, String> {
    if rel.adapter.is_none() {
        return Err("not applicable: the release has no adapter".into());
    }
    let plan = rel.result(&Merge::Plan.into()).and_then(pb::TaskResult::merge_plan);
    match plan {
        None => Err("not measured: the merge plan did not run".into()),
        Some(mp) if peft_adapter(mp) => Ok(&mp.format),
        Some(mp) => Err(format!(
            "not applicable: the adapter is in {}'s format, and PEFT applies its own format only (the merge check \
             in llama.cpp covers it)",
            mp.format
        )),
    }
}
