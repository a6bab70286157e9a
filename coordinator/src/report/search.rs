//! The report's `search` section: the sensitivities the searched rungs' recipes were chosen from (stored where, reused
//! or measured, at what cost), what each searched rung chose (recomputed from the same results the quantize tasks
//! read: `crate::kinds::chosen`), and the frontier of every GGUF rung measured.

use quantfarm_proto as pb;

use super::model::{
    Artifact, Container, FrontierPoint, Kld, Search, SearchCandidate, SearchPick, SearchSensitivity, SearchedRung,
};
use crate::kinds::{chosen, search_text, sensitivity, Search as SearchKey, TaskKey};
use crate::sched::Release;
use crate::spec::{Level, Rung};

const METHOD: &str = "each tensor group (a role in a range of layers, or a tensor outside the layers) quantized \
alone to each distinct candidate type, the rest left as the reference's, and scored against the reference on the \
search text until its mean KL divergence is within the precision (95 % interval over chunks); a searched rung takes \
the types with the least summed mean KL divergence within its budget of tensor bytes (multiple-choice knapsack, exact \
by dynamic programming on a grid of 65,536 cells; quantfarm_quant::recipe_search), written as llama-quantize \
--tensor-type entries on a Q8_0 base";

/// The section, when the release searches a rung and its sensitivities are known.
pub(super) fn section(rel: &Release, artifacts: &[Artifact]) -> Option<Search> {
    if !rel.spec.searches() {
        return None;
    }
    let results = |k: &TaskKey| rel.result(k);
    let settings = rel.spec.search_settings();
    let sens = sensitivity(&rel.spec, &results).ok();
    let lookup = rel.result(&SearchKey::Lookup.into()).and_then(pb::TaskResult::sensitivity_lookup);
    let written = rel.result(&SearchKey::Write.into()).and_then(pb::TaskResult::artifact);
    let plan = rel.result(&SearchKey::Plan.into()).and_then(pb::TaskResult::kld_plan);
    let text = search_text(&rel.spec, &rel.eval, rel.imatrix.as_deref());
    let variants = sens.iter().flat_map(|s| s.groups.iter().flat_map(|g| g.variants.iter()));
    let sensitivity = SearchSensitivity {
        url: written.map(|a| a.url.clone()),
        sha256: written.map(|a| a.sha256.clone()),
        reused: lookup.is_some_and(|l| l.found),
        text: text.unwrap_or_default().to_string(),
        tokens_sha256: plan.map(|p| p.tokens_sha256.clone()),
        ctx: settings.ctx,
        chunks: settings.chunks,
        precision: settings.precision,
        layers: settings.layers,
        candidates: settings.candidates.iter().map(|t| t.name().to_string()).collect(),
        groups: sens.as_ref().map_or(0, |s| s.groups.len() as u32),
        probes: variants.clone().count() as u32,
        probe_seconds: variants.clone().map(|v| v.seconds).sum(),
        probe_model_bytes: variants.map(|v| v.model_bytes).sum(),
    };
    let rungs = rel
        .spec
        .quants()
        .iter()
        .filter_map(Rung::search)
        .map(|s| match chosen(&rel.spec, &results, s) {
            Ok(c) => SearchedRung {
                name: s.name.to_string(),
                target: s.target.to_string(),
                budget_bytes: Some(c.budget),
                bytes: Some(c.bytes),
                bits_per_weight: Some(round4(c.bytes as f64 * 8.0 / c.elements.max(1) as f64)),
                predicted_kld: Some(c.predicted_kld),
                picks: c.picks.into_iter().map(|(group, ggml_type)| SearchPick { group, ggml_type }).collect(),
                error: None,
                candidates: c
                    .candidates
                    .iter()
                    .map(|k| SearchCandidate {
                        bytes: k.bytes,
                        bits_per_weight: round4(k.bytes as f64 * 8.0 / c.elements.max(1) as f64),
                        predicted_kld: k.predicted_kld,
                        measured: k.measured.filter(|m| m.is_finite()),
                    })
                    .collect(),
            },
            Err(e) => SearchedRung {
                name: s.name.to_string(),
                target: s.target.to_string(),
                budget_bytes: None,
                bytes: None,
                bits_per_weight: None,
                predicted_kld: None,
                picks: Vec::new(),
                error: Some(e),
                candidates: Vec::new(),
            },
        })
        .collect();
    Some(Search { method: METHOD.to_string(), sensitivity, rungs, frontier: frontier(rel, artifacts) })
}

fn round4(x: f64) -> f64 {
    (x * 10000.0).round() / 10000.0
}

/// Every GGUF quant measured in llama.cpp, smallest first.
fn frontier(rel: &Release, artifacts: &[Artifact]) -> Vec<FrontierPoint> {
    let mut points: Vec<FrontierPoint> = artifacts
        .iter()
        .filter(|a| a.container == Container::Gguf && a.file_type != "BF16")
        .filter_map(|a| {
            let Some(Kld::Measured(k)) = &a.kld else { return None };
            let searched =
                Level::parse(&a.file_type).and_then(|l| rel.spec.rung(l)).is_some_and(|r| r.search().is_some());
            let finite = |v: f64| v.is_finite().then_some(v);
            Some(FrontierPoint {
                name: a.file_type.clone(),
                searched,
                bytes: a.type_mix.iter().map(|t| t.bytes).sum(),
                bits_per_weight: a.bits_per_weight,
                kld_mean: finite(k.mean_kld),
                kld_p99_9: finite(k.kld_p99_9),
            })
        })
        .collect();
    points.sort_by(|a, b| a.bytes.cmp(&b.bytes).then_with(|| a.name.cmp(&b.name)));
    points
}
