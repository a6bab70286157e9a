//! A search's sensitivities and what is chosen from them: `sensitivity.json`'s types (stored ones found by
//! `search/lookup`, else gathered from the probes' results), and a searched rung's recipe ([`chosen`]): the least
//! summed measured cost within its budget, or a `kld` rung's smallest candidate within its `max`. Read the same way by
//! the quantize tasks' messages and by the report.

use quantfarm_ggml::GgmlType;
use quantfarm_proto as pb;
use quantfarm_quant::recipe_search::{self, Group, Priced, Tensor, Variant};
use serde::{Deserialize, Serialize};

use super::lookup::{artifact_of, plan_of, reference_files};
use super::quantize::imatrix_sha256;
use super::search::Search;
use super::{Quantize, Results, TaskKey};
use crate::spec::{KldMetric, Level, Recipe, ReleaseSpec, SearchRung, Target, TensorTypeRule};

/// The format tag of `sensitivity.json`.
pub const SENSITIVITY_FORMAT: &str = "quantfarm-sensitivity/1";

/// A search's sensitivities: what a later release of the same reference with the same settings reuses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sensitivity {
    pub format: String,
    /// The GGUF BF16's files' sha256, in order.
    pub reference: Vec<String>,
    /// The importance matrix the probes were quantized with (its sha256).
    pub imatrix: Option<String>,
    pub tokens_sha256: String,
    pub ctx: u32,
    pub batch: u32,
    pub chunks: u32,
    pub precision: f64,
    pub candidates: Vec<String>,
    pub layers: u32,
    pub groups: Vec<SensitiveGroup>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SensitiveGroup {
    pub name: String,
    pub pattern: String,
    pub tensors: u32,
    pub variants: Vec<Measured>,
}

/// One probe: a group at a type, its bytes and its measured mean KL divergence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// The type asked for; `types`: what each tensor of the group got (after the fallback).
    pub asked: String,
    pub types: Vec<String>,
    pub bytes: u64,
    pub mean_kld: f64,
    pub half_width: f64,
    pub chunks: u32,
    pub tokens: u64,
    /// The probe's wall time and its model's bytes (the search's cost).
    pub seconds: f64,
    pub model_bytes: u64,
}

pub(super) fn search_plan<'a>(results: &Results<'a>) -> Result<&'a pb::KldPlanResult, String> {
    results(&Search::Plan.into()).and_then(pb::TaskResult::kld_plan).ok_or_else(|| "search/plan has no plan".into())
}

pub(super) fn lookup_of<'a>(results: &Results<'a>) -> Result<&'a pb::SensitivityLookupResult, String> {
    results(&Search::Lookup.into())
        .and_then(pb::TaskResult::sensitivity_lookup)
        .ok_or_else(|| "search/lookup has no result".into())
}

/// The reference's tensors as the search reads them (from the plan).
fn tensors(plan: &pb::PlanResult) -> Result<Vec<Tensor>, String> {
    plan.tensors
        .iter()
        .map(|t| {
            let ty = GgmlType::from_name(&t.ggml_type)
                .ok_or_else(|| format!("plan: tensor {}: unknown type {:?}", t.name, t.ggml_type))?;
            if t.ne.is_empty() {
                return Err(format!("plan: tensor {} has no shape (a plan from an older worker)", t.name));
            }
            Ok(Tensor { name: t.name.clone(), ne: t.ne.clone(), ty })
        })
        .collect()
}

/// The groups of the reference and each one's distinct candidates, in order.
pub(super) struct Probes {
    pub tensors: Vec<Tensor>,
    pub groups: Vec<(Group, Vec<Variant>)>,
}

pub(super) fn probes(spec: &ReleaseSpec, results: &Results) -> Result<Probes, String> {
    let settings = spec.search_settings();
    let tensors = tensors(plan_of(results)?)?;
    let groups = recipe_search::groups(&tensors, settings.layers).map_err(|e| e.to_string())?;
    let groups = groups
        .into_iter()
        .map(|g| {
            let v = recipe_search::variants(&tensors, &g, &settings.candidates).map_err(|e| e.to_string())?;
            Ok((g, v))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Probes { tensors, groups })
}

pub(super) fn n_groups(kp: &pb::KldPlanResult) -> u32 {
    kp.n_chunks.div_ceil(kp.n_seq.max(1))
}

/// The sensitivities: stored ones found by the lookup, else the probes' results.
pub fn sensitivity(spec: &ReleaseSpec, results: &Results) -> Result<Sensitivity, String> {
    let found = lookup_of(results)?;
    if found.found {
        return serde_json::from_str(&found.json).map_err(|e| format!("the stored sensitivity.json: {e}"));
    }
    let p = probes(spec, results)?;
    let plan = plan_of(results)?;
    let kp = search_plan(results)?;
    let s = spec.search_settings();
    let imatrix = imatrix_sha256(spec, results, plan)?;
    let reference = reference_files(results)?.iter().map(|a| a.sha256.clone()).collect();
    let groups = p
        .groups
        .iter()
        .enumerate()
        .map(|(g, (group, variants))| {
            let variants = variants
                .iter()
                .enumerate()
                .map(|(v, var)| {
                    let key: TaskKey = Search::Probe { group: g as u32, variant: v as u32 }.into();
                    let r = results(&key)
                        .and_then(pb::TaskResult::sensitivity_probe)
                        .ok_or_else(|| format!("{key} has no result"))?;
                    Ok(Measured {
                        asked: var.asked.name().to_string(),
                        types: var.types.iter().map(|t| t.name().to_string()).collect(),
                        bytes: var.bytes,
                        mean_kld: r.mean_kld,
                        half_width: r.half_width,
                        chunks: r.chunks,
                        tokens: r.tokens,
                        seconds: r.seconds,
                        model_bytes: r.model_bytes,
                    })
                })
                .collect::<Result<Vec<_>, String>>()?;
            Ok(SensitiveGroup {
                name: group.name.clone(),
                pattern: group.pattern.clone(),
                tensors: group.tensors.len() as u32,
                variants,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Sensitivity {
        format: SENSITIVITY_FORMAT.into(),
        reference,
        imatrix,
        tokens_sha256: kp.tokens_sha256.clone(),
        ctx: s.ctx,
        batch: s.batch,
        chunks: s.chunks,
        precision: s.precision,
        candidates: s.candidates.iter().map(|t| t.name().to_string()).collect(),
        layers: s.layers,
        groups,
    })
}

/// A searched rung's choice: its recipe, and what the report says of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Chosen {
    pub recipe: Recipe,
    /// The budget (tensor bytes) and the model's elements (for bits per weight).
    pub budget: u64,
    pub elements: u64,
    /// The recipe's tensor bytes and the sum of its groups' measured costs (the predicted mean KL divergence).
    pub bytes: u64,
    pub predicted_kld: f64,
    /// Per group: its name and the type chosen.
    pub picks: Vec<(String, String)>,
    /// A `kld` rung's candidate recipes, smallest first, with their figure measured on the search text.
    pub candidates: Vec<Candidate>,
}

/// One candidate recipe of a `kld` rung.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub bytes: u64,
    pub predicted_kld: f64,
    /// Its figure on the search text, once measured.
    pub measured: Option<f64>,
}

/// A candidate recipe: its budget and the variant chosen per group.
pub(super) type Point = (u64, Vec<usize>);

/// What every choice reads: each group's options, the bytes no group holds, the model's elements.
pub(super) struct Space {
    sens: Sensitivity,
    options: Vec<Vec<Priced>>,
    fixed: u64,
    elements: u64,
}

impl Space {
    fn of(spec: &ReleaseSpec, results: &Results) -> Result<Space, String> {
        let sens = sensitivity(spec, results)?;
        let p = probes(spec, results)?;
        let plan = plan_of(results)?;
        if sens.groups.len() != p.groups.len()
            || sens
                .groups
                .iter()
                .zip(&p.groups)
                .any(|(a, (b, v))| a.pattern != b.pattern || a.variants.len() != v.len())
        {
            return Err("the stored sensitivities name other tensor groups than this model's".into());
        }
        let elements: u64 = plan.tensors.iter().map(|t| t.elements).sum();
        let grouped: std::collections::HashSet<usize> =
            p.groups.iter().flat_map(|(g, _)| g.tensors.iter().copied()).collect();
        let fixed = plan.tensors.iter().enumerate().filter(|(i, _)| !grouped.contains(i)).map(|(_, t)| t.bytes).sum();
        let options = sens
            .groups
            .iter()
            .map(|g| g.variants.iter().map(|v| Priced { bytes: v.bytes, cost: v.mean_kld }).collect())
            .collect();
        Ok(Space { sens, options, fixed, elements })
    }

    /// The least-cost choice within `budget` tensor bytes.
    fn allocate(&self, budget: u64) -> Result<Vec<usize>, String> {
        recipe_search::allocate(&self.options, self.fixed, budget).map_err(|e| e.to_string())
    }

    /// A `kld` rung's candidates: the choices at `points` budgets evenly spaced from the smallest recipe to the
    /// largest, each distinct choice once, smallest first.
    fn points(&self, points: u32) -> Result<Vec<Point>, String> {
        let extreme = |f: fn(std::slice::Iter<'_, Priced>) -> Option<u64>| -> u64 {
            self.fixed + self.options.iter().map(|o| f(o.iter()).unwrap_or(0)).sum::<u64>()
        };
        let lo = extreme(|i| i.map(|p| p.bytes).min());
        let hi = extreme(|i| i.map(|p| p.bytes).max());
        let mut out: Vec<Point> = Vec::new();
        for k in 0..u64::from(points.max(2)) {
            let budget = lo + (hi - lo) * k / u64::from(points.max(2) - 1);
            let choice = self.allocate(budget)?;
            if out.last().is_none_or(|(_, c)| *c != choice) {
                out.push((budget, choice));
            }
        }
        Ok(out)
    }

    /// The recipe of a choice, and its picks.
    pub(super) fn recipe(
        &self,
        name: crate::spec::RecipeName,
        choice: &[usize],
    ) -> Result<(Recipe, Vec<(String, String)>), String> {
        let mut tensor_types = Vec::with_capacity(choice.len());
        let mut picks = Vec::with_capacity(choice.len());
        for (g, &o) in self.sens.groups.iter().zip(choice) {
            let asked = &g.variants[o].asked;
            let ty = GgmlType::from_name(asked).ok_or_else(|| format!("sensitivity.json: unknown type {asked:?}"))?;
            tensor_types.push(TensorTypeRule { pattern: g.pattern.clone(), ty });
            picks.push((g.name.clone(), asked.clone()));
        }
        let recipe =
            Recipe { name, base: SearchRung::BASE, tensor_types, output_tensor_type: None, token_embedding_type: None };
        Ok((recipe, picks))
    }
}

/// A `kld` rung's candidate recipes (`search/candidate/R/P`), smallest first: (budget, choice).
pub(super) fn candidate_points(spec: &ReleaseSpec, results: &Results) -> Result<(Space, Vec<Point>), String> {
    let space = Space::of(spec, results)?;
    let points = space.points(spec.search_settings().points)?;
    Ok((space, points))
}

/// The figure a `kld` rung is held to, from a candidate's measurement.
fn figure(r: &pb::SensitivityProbeResult, metric: KldMetric) -> f64 {
    match metric {
        KldMetric::Mean => r.mean_kld,
        KldMetric::P99 => r.kld_p99,
        KldMetric::P99_9 => r.kld_p99_9,
        KldMetric::Max => r.kld_max,
    }
}

/// The index of `rung` in the ladder (its candidates' keys name it).
fn rung_index(spec: &ReleaseSpec, rung: &SearchRung) -> u32 {
    spec.quants().iter().position(|q| q.level() == Level::Recipe(rung.name)).unwrap_or(0) as u32
}

/// The recipe of searched rung `rung`: the least summed measured cost within its budget
/// ([`recipe_search::allocate`]); for a `kld` rung, the smallest candidate whose figure measured on the search
/// text is within its `max`.
pub fn chosen(spec: &ReleaseSpec, results: &Results, rung: &SearchRung) -> Result<Chosen, String> {
    let plan = plan_of(results)?;
    let at = |e: String| format!("{}: {e} (target {})", rung.name, rung.target);
    let (space, budget, choice, candidates) = match rung.target {
        Target::Bpw(b) => {
            let space = Space::of(spec, results)?;
            let budget = (b * space.elements as f64 / 8.0).floor() as u64;
            let choice = space.allocate(budget).map_err(at)?;
            (space, budget, choice, Vec::new())
        }
        Target::SizeOf(level) => {
            let space = Space::of(spec, results)?;
            let budget = level_tensor_bytes(results, level, plan.shards.len() as u32)?;
            let choice = space.allocate(budget).map_err(at)?;
            (space, budget, choice, Vec::new())
        }
        Target::Kld { metric, max } => {
            let (space, points) = candidate_points(spec, results)?;
            let index = rung_index(spec, rung);
            let mut candidates = Vec::with_capacity(points.len());
            let mut pick = None;
            for (p, (budget, choice)) in points.iter().enumerate() {
                let key: TaskKey = Search::Candidate { rung: index, point: p as u32 }.into();
                let measured = results(&key).and_then(pb::TaskResult::sensitivity_probe).map(|r| figure(r, metric));
                let (bytes, predicted_kld) = recipe_search::totals(&space.options, choice);
                candidates.push(Candidate { bytes: bytes + space.fixed, predicted_kld, measured });
                if pick.is_none() && measured.is_some_and(|m| m <= max) {
                    pick = Some((*budget, choice.clone()));
                }
            }
            let Some((budget, choice)) = pick else {
                let largest =
                    candidates.last().and_then(|c| c.measured).map_or("not measured".into(), |m| m.to_string());
                return Err(at(format!(
                    "none of the {} candidate recipes has {} <= {max} on the search text (the largest: {largest})",
                    candidates.len(),
                    metric.name()
                )));
            };
            (space, budget, choice, candidates)
        }
    };
    let (bytes, predicted_kld) = recipe_search::totals(&space.options, &choice);
    let (recipe, picks) = space.recipe(rung.name, &choice)?;
    Ok(Chosen {
        recipe,
        budget,
        elements: space.elements,
        bytes: bytes + space.fixed,
        predicted_kld,
        picks,
        candidates,
    })
}

/// The tensor bytes of a rung as made (every split file's type mix).
fn level_tensor_bytes(results: &Results, level: Level, n: u32) -> Result<u64, String> {
    let mut total = 0;
    for shard in 0..n {
        let a = artifact_of(results, &Quantize { level, shard }.into())?;
        total += a.types.iter().map(|t| t.bytes).sum::<u64>();
    }
    Ok(total)
}
