//! The figures the gates read, per level and release-wide, from the report's sections as built: each with why it is
//! missing where it is (a level that was not measured never passes).

use std::collections::BTreeMap;

use quantfarm_parity::KldSummary;

use super::build::merge_unmeasured;
use super::model::*;
use crate::gates::{self, Figure, GlobalFigure};
use crate::kinds::{MlxSubject, MERGE_CHECK};
use crate::sched::Release;
use crate::spec::EvalTarget;

/// A greedy summary's figures, or why it has none.
pub(super) fn greedy_figures(s: Option<&GreedySummary>, why_none: &str) -> (Result<f64, String>, Result<f64, String>) {
    match s {
        Some(s) if s.complete => (Ok(s.agree), Ok(s.mean_prefix_fraction)),
        Some(s) => {
            let e = format!("incomplete: {} prompts compared", s.n);
            (Err(e.clone()), Err(e))
        }
        None => (Err(why_none.to_string()), Err(why_none.to_string())),
    }
}

/// A probe summary's pass rate for the gates, or why it has none (`whose` names the subject).
pub(super) fn probe_pass_rate(p: &ProbeSummary, whose: &str) -> Result<f64, String> {
    p.scored().map(|(m, _)| m).ok_or_else(|| {
        format!(
            "{whose} probe answers were all cut off by their token cap ({} truncated): no score; raise the probes' max_tokens",
            p.truncated
        )
    })
}

/// Every figure the gates read, per level and release-wide, each with why it is missing where it is.
pub(super) fn measured(
    rel: &Release,
    klds: &BTreeMap<String, Result<KldSummary, String>>,
    greedy: &BTreeMap<String, GreedySummary>,
    probes: &BTreeMap<String, ProbeSummary>,
    artifacts: &[Artifact],
    all_verified: bool,
) -> gates::Measured {
    let spec = &rel.spec;
    let eval = spec.evaluation.as_ref();
    let reference_probe = probes.get("BF16");
    let mut levels = Vec::new();
    for target in spec.levels() {
        // The gates and the report's sections name it (the JSON boundary).
        let level = target.to_string();
        let mut f = gates::LevelFigures::default();
        let unmeasured = |what: &str, input: Option<&String>| -> String {
            if eval.is_some() && !spec.measures(target) {
                "not measured: evaluation.skip lists it".to_string()
            } else if input.is_none() {
                format!("not measured: the release has no evaluation.{what}")
            } else {
                format!("not measured: no {what} task ran for it")
            }
        };
        match klds.get(&level) {
            Some(Ok(k)) => {
                let pct = |p: f32| k.kld_percentile(p);
                for (name, v) in [
                    (Figure::KldMean, Some(k.mean_kld.value)),
                    (Figure::KldMeanUnc, Some(k.mean_kld.unc)),
                    (Figure::KldMedian, Some(k.median_kld)),
                    (Figure::KldMax, Some(k.max_kld)),
                    (Figure::KldP90, pct(0.90)),
                    (Figure::KldP95, pct(0.95)),
                    (Figure::KldP99, pct(0.99)),
                    (Figure::KldP999, pct(0.999)),
                    // Percent, as the report's kld figures and llama-perplexity print them.
                    (Figure::KldSameTopP, Some(100.0 * k.same_top_p.value)),
                    (Figure::KldRmsDp, Some(100.0 * k.rms_dp.value)),
                    (Figure::KldPpl, Some(k.mean_ppl_q.value)),
                    (Figure::KldPplRatio, Some(k.mean_ppl_ratio.value)),
                    (Figure::KldLnPplRatio, Some(k.mean_ln_ppl_ratio.value)),
                ] {
                    f.set(name, v.ok_or_else(|| "no such percentile".to_string()));
                }
            }
            other => {
                let why = match other {
                    Some(Err(e)) => format!("not measured: {e}"),
                    _ => unmeasured("text", eval.and_then(|e| e.text.as_ref())),
                };
                for &figure in Figure::ALL.iter().filter(|f| f.name().starts_with("kld.")) {
                    f.set(figure, Err(why.clone()));
                }
            }
        }
        let (agree, prefix) =
            greedy_figures(greedy.get(&level), &unmeasured("prompts", eval.and_then(|e| e.prompts.as_ref())));
        f.set(Figure::GreedyAgree, agree);
        f.set(Figure::GreedyPrefix, prefix);
        match probes.get(&level) {
            Some(p) => {
                f.set(Figure::ProbePassRate, probe_pass_rate(p, "the level's"));
                f.set(Figure::ProbeSpread, Ok(p.score_spread));
                f.set(Figure::ProbeTruncated, Ok(f64::from(p.truncated)));
                match reference_probe {
                    Some(r) => {
                        f.set(Figure::Baseline, probe_pass_rate(r, "the reference's"));
                        f.set(Figure::Noise, Ok(r.score_spread.max(p.score_spread)));
                    }
                    None => {
                        f.set(Figure::Baseline, Err("the reference's probes did not run".into()));
                        f.set(Figure::Noise, Err("the reference's probes did not run".into()));
                    }
                }
            }
            None => {
                let why = unmeasured("probes", eval.and_then(|e| e.probes.as_ref()));
                use Figure::{Baseline, Noise, ProbePassRate, ProbeSpread, ProbeTruncated};
                for figure in [ProbePassRate, ProbeSpread, ProbeTruncated, Baseline, Noise] {
                    f.set(figure, Err(why.clone()));
                }
            }
        }
        match artifacts.iter().find(|a| a.file_type == level) {
            Some(a) => {
                f.set(Figure::BitsPerWeight, Ok(a.bits_per_weight));
                f.set(Figure::Bytes, Ok(a.bytes as f64));
                f.verified = Some(a.verified);
            }
            None => {
                f.set(Figure::BitsPerWeight, Err("the artifact was not made".into()));
                f.set(Figure::Bytes, Err("the artifact was not made".into()));
            }
        }
        f.in_choices = eval.is_some_and(|e| e.choices.is_some());
        let choices = artifacts.iter().find(|a| a.file_type == level).and_then(|a| a.choices.as_ref());
        let why = || unmeasured("choices", eval.and_then(|e| e.choices.as_ref()));
        let count = |v: Option<&Vec<u32>>| v.map(|v| v.len() as f64).ok_or("the reference's choices did not run");
        f.set(Figure::ChoiceAccuracy, choices.map(|c| c.accuracy).ok_or_else(why));
        f.set(
            Figure::ChoiceChanged,
            choices.map_or_else(|| Err(why()), |c| count(c.changed.as_ref()).map_err(String::from)),
        );
        f.set(
            Figure::ChoiceNowWrong,
            choices.map_or_else(|| Err(why()), |c| count(c.now_wrong.as_ref()).map_err(String::from)),
        );
        // A recipe is held to its base file type's limit.
        let limit_of = |name: &str| gates::default_kld_max(name).ok_or_else(|| format!("no default limit for {name}"));
        let limit = match target {
            EvalTarget::Quant(l) => match rel.spec.rung(l) {
                // A searched rung's: the rung it is sized like, or its KLD target (spec/search.rs).
                Some(crate::spec::Rung::Search(s)) => s.default_kld_mean(&rel.spec),
                Some(r) => limit_of(r.base().name()),
                None => limit_of(&level),
            },
            EvalTarget::Mlx { .. } | EvalTarget::Vllm(_) => limit_of(&level),
        };
        f.set(Figure::DefaultKldMean, limit);
        levels.push((level, f));
    }
    let mut global = BTreeMap::new();
    let merge_why =
        if rel.adapter.is_none() { "no adapter: nothing was merged".to_string() } else { merge_unmeasured(rel) };
    let (agree, prefix) = greedy_figures(greedy.get(MERGE_CHECK), &merge_why);
    global.insert(GlobalFigure::MergeGreedyAgree, agree);
    global.insert(GlobalFigure::MergeGreedyPrefix, prefix);
    let base_ppl = klds.values().find_map(|k| k.as_ref().ok()).map(|k| k.mean_ppl_base.value);
    global.insert(GlobalFigure::ReferenceKldPpl, base_ppl.ok_or_else(|| "no KL-divergence pass ran".to_string()));
    global.insert(
        GlobalFigure::ReferenceProbePassRate,
        reference_probe.map_or_else(
            || Err("the reference's probes did not run".into()),
            |r| probe_pass_rate(r, "the reference's"),
        ),
    );
    let reference_choices = artifacts.iter().find(|a| a.file_type == "BF16").and_then(|a| a.choices.as_ref());
    global.insert(
        GlobalFigure::ReferenceChoiceAccuracy,
        reference_choices.map(|c| c.accuracy).ok_or_else(|| "the reference's choices did not run".to_string()),
    );
    gates::Measured {
        levels,
        global,
        all_verified,
        has_adapter: rel.adapter.is_some(),
        has_mlx_lm: false,
        has_transformers: false,
        has_transformers_adapter: false,
    }
}

/// One subject's figures in mlx-lm, each a value or why it has none.
struct SubjectFigures {
    kld_mean: Result<f64, String>,
    same_top_p: Result<f64, String>,
    agree: Result<f64, String>,
    prefix: Result<f64, String>,
    pass_rate: Result<f64, String>,
    truncated: Result<f64, String>,
}

/// The cross-runtime link's figures for the gates: release-wide, the bf16 weights in mlx-lm against llama.cpp
/// (`cross_runtime.*`); per MLX rung, its own in mlx-lm (`mlx_lm.*`), which its `measured` gate then requires.
pub(super) fn cross_runtime_figures(
    spec: &crate::spec::ReleaseSpec,
    c: Option<&CrossRuntime>,
    m: &mut gates::Measured,
) {
    let why = match c {
        None => "not applicable: the release has no MLX output, GGUF output or evaluation".to_string(),
        Some(CrossRuntime::Unmeasured { error }) => error.clone(),
        Some(CrossRuntime::Measured(_)) => String::new(),
    };
    let figures = c.and_then(CrossRuntime::figures);
    m.has_mlx_lm = figures.is_some();
    let subject_figures = |s: Option<&MlxLmSubject>| -> SubjectFigures {
        let unmeasured = |what: &str| match s.and_then(|s| s.load_error.as_ref()) {
            Some(e) => format!("not measured: {e}"),
            None if !why.is_empty() => why.clone(),
            None => format!("not measured: no mlx-lm {what} task ran for it"),
        };
        let kld = match s.and_then(|s| s.kld.as_ref()) {
            Some(Kld::Measured(k)) => Ok((k.mean_kld, k.same_top_p)),
            Some(Kld::Unmeasured { error }) => Err(error.clone()),
            None => Err(unmeasured("kld")),
        };
        let (agree, prefix) = greedy_figures(s.and_then(|s| s.greedy.as_ref()), &unmeasured("greedy"));
        let probes = s.and_then(|s| s.probes.as_ref());
        SubjectFigures {
            kld_mean: kld.clone().map(|k| k.0),
            same_top_p: kld.map(|k| k.1),
            agree,
            prefix,
            pass_rate: probes.map_or_else(|| Err(unmeasured("probe")), |p| probe_pass_rate(p, "the mlx-lm")),
            truncated: probes.map(|p| f64::from(p.truncated)).ok_or_else(|| unmeasured("probe")),
        }
    };
    // The bf16 weights in mlx-lm: the release's cross-runtime figures (its probes' truncations are not gated).
    let bf16 = subject_figures(figures.map(|f| &f.bf16));
    m.global.insert(GlobalFigure::CrossRuntimeKldMean, bf16.kld_mean);
    m.global.insert(GlobalFigure::CrossRuntimeKldSameTopP, bf16.same_top_p);
    m.global.insert(GlobalFigure::CrossRuntimeGreedyAgree, bf16.agree);
    m.global.insert(GlobalFigure::CrossRuntimeGreedyPrefix, bf16.prefix);
    m.global.insert(GlobalFigure::CrossRuntimeProbePassRate, bf16.pass_rate);
    if figures.is_none() {
        return;
    }
    for (level, f) in m.levels.iter_mut() {
        let Some(MlxSubject::Rung { rung }) = MlxSubject::parse(level) else { continue };
        if !spec.measures(EvalTarget::Mlx(rung)) {
            continue;
        }
        let rung = figures.and_then(|c| c.rungs.iter().find(|r| r.file_type == MlxSubject::Rung { rung }.to_string()));
        let r = subject_figures(rung);
        f.set(Figure::MlxLmKldMean, r.kld_mean);
        f.set(Figure::MlxLmKldSameTopP, r.same_top_p);
        f.set(Figure::MlxLmGreedyAgree, r.agree);
        f.set(Figure::MlxLmGreedyPrefix, r.prefix);
        f.set(Figure::MlxLmProbePassRate, r.pass_rate);
        f.set(Figure::MlxLmProbeTruncated, r.truncated);
        f.in_mlx_lm = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An MLX rung mlx-lm could not load fails its `measured` gate with mlx-lm's message, though llama.cpp measured
    /// its exact conversion; the bf16 weights' link-2 figures still reach the gates.
    #[test]
    fn a_rung_mlx_lm_cannot_load_is_not_measured() {
        let spec: crate::spec::ReleaseSpec = serde_norway::from_str(
            "name: t\nsource: s\noutputs:\n  gguf: {quants: [Q8_0]}\n  mlx: {bits: [4]}\nevaluation: {text: t.txt, prompts: p.json, probes: p.yaml}\n",
        )
        .unwrap();
        let mut f = gates::LevelFigures::default();
        f.set(Figure::KldMean, Ok(0.3));
        f.set(Figure::ProbeTruncated, Ok(0.0));
        let mut m = gates::Measured { levels: vec![("MLX-4bit".into(), f)], ..Default::default() };
        let error = "mlx_lm.load(/w/MLX-4bit): ValueError: Received 1 parameters not in model: lm_head.biases";
        let subject = |file_type: &str, load_error: Option<&str>| MlxLmSubject {
            file_type: file_type.into(),
            quantized: None,
            upcast: None,
            converted: None,
            load_error: load_error.map(str::to_string),
            greedy: None,
            kld: None,
            probes: None,
        };
        let mut bf16 = subject("BF16", None);
        bf16.kld = Some(Kld::Unmeasured { error: "2 of the text's 3 chunks were measured".into() });
        let c = CrossRuntime::Measured(Box::new(CrossRuntimeFigures {
            method: String::new(),
            runtimes: vec![],
            model: String::new(),
            bf16,
            rungs: vec![subject("MLX-4bit", Some(error))],
        }));
        cross_runtime_figures(&spec, Some(&c), &mut m);
        assert!(m.has_mlx_lm);
        assert_eq!(m.global[&GlobalFigure::CrossRuntimeKldMean], Err("2 of the text's 3 chunks were measured".into()));
        let gates = gates::evaluate(&[], &m);
        let measured = gates.iter().find(|g| g.name == gates::MEASURED).unwrap();
        assert!(!measured.outcome.passed);
        assert!(
            measured.outcome.detail.contains(&format!("no KL-divergence figure in mlx-lm (not measured: {error})")),
            "{}",
            measured.outcome.detail
        );
        assert!(gates.iter().any(|g| g.name == "cross-runtime-kld" && !g.outcome.passed));
        // Turned off, the link is said to be unmeasured and its gates do not apply.
        let mut m = gates::Measured::default();
        let off = CrossRuntime::Unmeasured { error: "not measured: evaluation.mlx_lm is false".into() };
        cross_runtime_figures(&spec, Some(&off), &mut m);
        assert!(!m.has_mlx_lm);
        assert!(gates::evaluate(&[], &m).iter().all(|g| !g.name.starts_with("cross-runtime")));
    }
}
