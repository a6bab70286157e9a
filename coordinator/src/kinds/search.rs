//! `search`: the sensitivities a searched rung's recipe is chosen from (docs/search.md). After the plan:
//! `search/plan` tokenizes the search text with the reference; `search/lookup` asks whether this reference's
//! sensitivities, with these settings, are stored already (an earlier release made them: then nothing is measured
//! again); otherwise the text's `search/base/G` base logits and one `search/probe/G/V` per tensor group and distinct
//! candidate type (the group alone quantized, measured until precise enough); `search/write` stores them
//! (`sensitivity.json`, content-addressed by the reference and the settings). A searched rung's quantize tasks wait
//! for it; its recipe is [`chosen`] from the sensitivities, the same way for every task and for the report.

use std::fmt;

use quantfarm_ggml::GgmlType;
use quantfarm_proto::{self as pb, task, task_result};
use quantfarm_quant::recipe_search::{self, Group, Priced, Tensor, Variant};
use serde::{Deserialize, Serialize};

use super::expand::{chunked, model_cost};
use super::lookup::{artifact_of, plan_of, reference_files};
use super::quantize::imatrix_input;
use super::{num, Done, Family, Folded, Gguf, Grown, Opens, Quantize, Results, Stage, TaskKey};
use crate::graph::naming::artifact;
use crate::graph::Ctx;
use crate::spec::{ImatrixSource, KldMetric, Level, Recipe, ReleaseSpec, SearchRung, Target, TensorTypeRule};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Search {
    /// Tokenizes the search text with the reference and counts its chunks.
    Plan,
    /// Whether the sensitivities are stored already.
    Lookup,
    /// The reference's base logits of one chunk group of the search text.
    Base { group: u32 },
    /// One tensor group (`group`, [`recipe_search::groups`]'s order) at one of its distinct candidate types.
    Probe { group: u32, variant: u32 },
    /// The sensitivities stored.
    Write,
    /// Candidate recipe `point` of the `kld` rung at ladder index `rung`, measured on the search text.
    Candidate { rung: u32, point: u32 },
}

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

/// The search text: `outputs.gguf.search.text`, else the computed importance matrix's.
fn text<'a>(ctx: &Ctx<'a>) -> Result<&'a str, String> {
    if let Some(t) = ctx.eval.search_text.as_deref() {
        return Ok(t);
    }
    match ctx.spec.imatrix() {
        Some(ImatrixSource::Text { .. }) => ctx.imatrix.ok_or_else(|| "the search has no text".to_string()),
        _ => Err("the search has no text (outputs.gguf.search.text)".into()),
    }
}

fn kld_settings(ctx: &Ctx) -> Result<pb::KldSettings, String> {
    let s = ctx.spec.search_settings();
    Ok(pb::KldSettings {
        text: text(ctx)?.to_string(),
        ctx: s.ctx,
        batch: s.batch,
        max_chunks: s.chunks,
        section: "outputs.gguf.search".into(),
    })
}

fn search_plan<'a>(results: &Results<'a>) -> Result<&'a pb::KldPlanResult, String> {
    results(&Search::Plan.into()).and_then(pb::TaskResult::kld_plan).ok_or_else(|| "search/plan has no plan".into())
}

fn lookup_of<'a>(results: &Results<'a>) -> Result<&'a pb::SensitivityLookupResult, String> {
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

fn n_groups(kp: &pb::KldPlanResult) -> u32 {
    kp.n_chunks.div_ceil(kp.n_seq.max(1))
}

/// Where the sensitivities live: content-addressed by the reference, the importance matrix, the text's tokens and
/// the search's settings, under one name whatever the release is called, so a later release finds them.
fn sensitivity_url(ctx: &Ctx, results: &Results) -> Result<String, String> {
    let refs = reference_files(results)?;
    let kp = search_plan(results)?;
    let plan = plan_of(results)?;
    let (_, imatrix_sha256) = imatrix_input(ctx, results, plan)?;
    let s = ctx.spec.search_settings();
    let numbers =
        [s.ctx.to_string(), s.batch.to_string(), s.chunks.to_string(), s.precision.to_string(), s.layers.to_string()];
    let candidates: Vec<&str> = s.candidates.iter().map(|t| t.name()).collect();
    let mut id = vec![SENSITIVITY_FORMAT, &kp.tokens_sha256, "imatrix", &imatrix_sha256];
    id.extend(numbers.iter().map(String::as_str));
    id.push("candidates");
    id.extend(candidates);
    id.push("reference");
    id.extend(refs.iter().map(|a| a.sha256.as_str()));
    Ok(artifact(ctx, &id, "sensitivity.json")?.to_string())
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
    let imatrix = match spec.imatrix() {
        None => None,
        Some(ImatrixSource::File(_)) => Some(plan.imatrix_sha256.clone()),
        Some(ImatrixSource::Text { .. }) => Some(artifact_of(results, &super::Imatrix::Merge.into())?.sha256.clone()),
    };
    let reference = (0..plan.shards.len() as u32)
        .map(|shard| artifact_of(results, &Gguf { shard }.into()).map(|a| a.sha256.clone()))
        .collect::<Result<_, _>>()?;
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

/// What every choice reads: each group's options, the bytes no group holds, the model's elements.
struct Space {
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
    fn points(&self, points: u32) -> Result<Vec<(u64, Vec<usize>)>, String> {
        let extreme = |f: fn(std::slice::Iter<'_, Priced>) -> Option<u64>| -> u64 {
            self.fixed + self.options.iter().map(|o| f(o.iter()).unwrap_or(0)).sum::<u64>()
        };
        let lo = extreme(|i| i.map(|p| p.bytes).min());
        let hi = extreme(|i| i.map(|p| p.bytes).max());
        let mut out: Vec<(u64, Vec<usize>)> = Vec::new();
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
    fn recipe(
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
fn candidate_points(spec: &ReleaseSpec, results: &Results) -> Result<(Space, Vec<(u64, Vec<usize>)>), String> {
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

impl Search {
    fn probe_task(
        self,
        ctx: &Ctx,
        results: &Results,
        group: u32,
        variant: u32,
    ) -> Result<pb::SensitivityProbeTask, String> {
        let p = probes(ctx.spec, results)?;
        let (g, variants) = p.groups.get(group as usize).ok_or_else(|| format!("{self:?}: no such group"))?;
        let v = variants.get(variant as usize).ok_or_else(|| format!("{self:?}: no such variant"))?;
        let plan = plan_of(results)?;
        let refs = reference_files(results)?;
        let (imatrix, imatrix_sha256) = imatrix_input(ctx, results, plan)?;
        let rules = recipe_search::probe_rules(&p.tensors, g, v.asked);
        let kp = search_plan(results)?;
        let bases = (0..n_groups(kp))
            .map(|b| artifact_of(results, &Search::Base { group: b }.into()).cloned())
            .collect::<Result<Vec<_>, _>>()?;
        let s = ctx.spec.search_settings();
        Ok(pb::SensitivityProbeTask {
            quantize: Some(pb::QuantizeTask {
                input: refs[0].url.clone(),
                shard: 0,
                n_shards: refs.len() as u32,
                file_type: SearchRung::BASE.name().to_string(),
                output: String::new(),
                imatrix,
                imatrix_sha256,
                tensor_types: rules.iter().map(|(p, t)| format!("{p}={}", t.name())).collect(),
                output_tensor_type: String::new(),
                token_embedding_type: String::new(),
            }),
            bases,
            batch: s.batch,
            min_chunks: 4.min(kp.n_chunks),
            precision: s.precision,
        })
    }

    fn base_task(ctx: &Ctx, results: &Results, group: u32) -> Result<pb::KldBaseTask, String> {
        let kp = search_plan(results)?;
        let settings = kld_settings(ctx)?;
        let first = group * kp.n_seq;
        if first >= kp.n_chunks {
            return Err(format!("search chunk group {group} starts past the text's {} chunks", kp.n_chunks));
        }
        let n_chunks = kp.n_seq.min(kp.n_chunks - first);
        let refs = reference_files(results)?;
        let (ctx_s, batch_s, first_s, n_s) =
            (settings.ctx.to_string(), settings.batch.to_string(), first.to_string(), n_chunks.to_string());
        // The evaluation's base logits' identity (the same text and chunking make the same file), under a name that
        // does not depend on the release's: a later release of the same reference finds them.
        let mut parts =
            vec!["quantfarm kld-base v1", &kp.text_sha256, &kp.tokens_sha256, &ctx_s, &batch_s, &first_s, &n_s];
        parts.extend(refs.iter().map(|a| a.sha256.as_str()));
        let name = format!("search-kld-base-{first:05}-{n_chunks}.logits");
        Ok(pb::KldBaseTask {
            reference: refs[0].url.clone(),
            settings: Some(settings),
            first_chunk: first,
            n_chunks,
            tokens_sha256: kp.tokens_sha256.clone(),
            output: artifact(ctx, &parts, &name)?.to_string(),
        })
    }

    /// A `kld` rung's candidate recipe, scored on the whole search text (every part: its tail figures need them).
    fn candidate_task(ctx: &Ctx, results: &Results, point: u32) -> Result<pb::SensitivityProbeTask, String> {
        let (space, points) = candidate_points(ctx.spec, results)?;
        let (_, choice) = points.get(point as usize).ok_or_else(|| format!("no candidate recipe {point}"))?;
        let name = crate::spec::RecipeName::new("candidate")?;
        let (recipe, _) = space.recipe(name, choice)?;
        let plan = plan_of(results)?;
        let refs = reference_files(results)?;
        let (imatrix, imatrix_sha256) = imatrix_input(ctx, results, plan)?;
        let kp = search_plan(results)?;
        let bases = (0..n_groups(kp))
            .map(|b| artifact_of(results, &Search::Base { group: b }.into()).cloned())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(pb::SensitivityProbeTask {
            quantize: Some(pb::QuantizeTask {
                input: refs[0].url.clone(),
                shard: 0,
                n_shards: refs.len() as u32,
                file_type: SearchRung::BASE.name().to_string(),
                output: String::new(),
                imatrix,
                imatrix_sha256,
                tensor_types: recipe.tensor_types.iter().map(TensorTypeRule::arg).collect(),
                output_tensor_type: String::new(),
                token_embedding_type: String::new(),
            }),
            bases,
            batch: ctx.spec.search_settings().batch,
            min_chunks: kp.n_chunks,
            precision: 0.0,
        })
    }

    fn write_task(ctx: &Ctx, results: &Results) -> Result<pb::SensitivityWriteTask, String> {
        let found = lookup_of(results)?;
        let json = if found.found {
            found.json.clone()
        } else {
            let mut j = serde_json::to_string_pretty(&sensitivity(ctx.spec, results)?).map_err(|e| e.to_string())?;
            j.push('\n');
            j
        };
        Ok(pb::SensitivityWriteTask { json, output: sensitivity_url(ctx, results)? })
    }
}

impl Family for Search {
    const NAME: &'static str = "search";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Search::Plan => write!(f, "/plan"),
            Search::Lookup => write!(f, "/lookup"),
            Search::Base { group } => write!(f, "/base/{group}"),
            Search::Probe { group, variant } => write!(f, "/probe/{group}/{variant}"),
            Search::Write => write!(f, "/write"),
            Search::Candidate { rung, point } => write!(f, "/candidate/{rung}/{point}"),
        }
    }

    fn parse(rest: &[&str]) -> Option<Search> {
        match rest {
            ["plan"] => Some(Search::Plan),
            ["lookup"] => Some(Search::Lookup),
            ["base", g] => Some(Search::Base { group: num(g)? }),
            ["probe", g, v] => Some(Search::Probe { group: num(g)?, variant: num(v)? }),
            ["write"] => Some(Search::Write),
            ["candidate", r, p] => Some(Search::Candidate { rung: num(r)?, point: num(p)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Kld)
    }

    fn stage(&self) -> String {
        "search".into()
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        Ok(match *self {
            Search::Plan => task::Kind::KldPlan(pb::KldPlanTask {
                reference: reference_files(results)?[0].url.clone(),
                settings: Some(kld_settings(ctx)?),
            }),
            Search::Lookup => {
                task::Kind::SensitivityLookup(pb::SensitivityLookupTask { sensitivity: sensitivity_url(ctx, results)? })
            }
            Search::Base { group } => task::Kind::KldBase(Search::base_task(ctx, results, group)?),
            Search::Probe { group, variant } => {
                task::Kind::SensitivityProbe(self.probe_task(ctx, results, group, variant)?)
            }
            Search::Write => task::Kind::SensitivityWrite(Search::write_task(ctx, results)?),
            Search::Candidate { point, .. } => {
                task::Kind::SensitivityProbe(Search::candidate_task(ctx, results, point)?)
            }
        })
    }

    /// The report reads the search's results by their keys.
    fn fold<'a>(&self, _: Done<'a>, _: &mut Folded<'a>) {}

    /// The lookup's result opens the probes (or, when the sensitivities are stored, nothing to measure).
    fn opens<'r>(&self, result: &'r pb::TaskResult) -> Result<Opens<'r>, String> {
        match self {
            Search::Plan => chunked(result, "search/plan: the search text").map(|_| Opens::Nothing),
            Search::Lookup => match result.kind.as_ref() {
                Some(task_result::Kind::SensitivityLookup(l)) => Ok(Opens::Looked(l.found)),
                _ => Err("search/lookup: not a lookup result".into()),
            },
            // The sensitivities are known: a `kld` rung's candidates can be measured.
            Search::Write => Ok(Opens::Sensed),
            Search::Base { .. } | Search::Probe { .. } | Search::Candidate { .. } => Ok(Opens::Nothing),
        }
    }

    /// After the plan, when a rung is searched: the search text's plan, the lookup, and the write after it (which
    /// the searched rungs' quantize tasks wait for); after a lookup that found nothing, the base logits and the
    /// probes, which the write then waits for.
    fn grow(stage: Stage, ctx: &Ctx, results: &Results, out: &mut Grown) {
        match stage {
            Stage::Planned(inv) => {
                if !ctx.spec.searches() || inv.n == 0 {
                    return;
                }
                out.add(Search::Plan, inv.ggufs(), inv.plan.source_bytes);
                let mut deps = inv.ggufs();
                deps.push(Search::Plan.into());
                if super::lookup::computes_imatrix(ctx) {
                    deps.push(super::Imatrix::Merge.into());
                }
                out.add(Search::Lookup, deps, 1);
                out.add(Search::Write, vec![Search::Lookup.into()], 1);
            }
            Stage::Looked(false) => {
                let (Ok(kp), Ok(p), Ok(plan)) = (search_plan(results), probes(ctx.spec, results), plan_of(results))
                else {
                    return;
                };
                let ggufs: Vec<TaskKey> = (0..plan.shards.len() as u32).map(|shard| Gguf { shard }.into()).collect();
                let mut base_deps = ggufs.clone();
                base_deps.push(Search::Plan.into());
                let bases: Vec<TaskKey> = (0..n_groups(kp)).map(|group| Search::Base { group }.into()).collect();
                for b in &bases {
                    out.add(b.clone(), base_deps.clone(), model_cost(results));
                }
                let mut probe_deps = ggufs;
                probe_deps.extend(bases);
                probe_deps.push(Search::Lookup.into());
                let mut all = Vec::new();
                for (g, (_, variants)) in p.groups.iter().enumerate() {
                    for v in 0..variants.len() {
                        let key: TaskKey = Search::Probe { group: g as u32, variant: v as u32 }.into();
                        out.add(key.clone(), probe_deps.clone(), model_cost(results) * 2);
                        all.push(key);
                    }
                }
                out.waits.push((Search::Write.into(), all));
            }
            Stage::Sensed => {
                let kld_rungs: Vec<(u32, Level)> = ctx
                    .spec
                    .quants()
                    .iter()
                    .enumerate()
                    .filter(|(_, q)| q.search().is_some_and(|s| matches!(s.target, Target::Kld { .. })))
                    .map(|(i, q)| (i as u32, q.level()))
                    .collect();
                if kld_rungs.is_empty() {
                    return;
                }
                let (Ok(kp), Ok((_, points)), Ok(plan)) =
                    (search_plan(results), candidate_points(ctx.spec, results), plan_of(results))
                else {
                    return;
                };
                // The base logits (made already unless the sensitivities were found stored: the graph keeps one of
                // each key).
                let ggufs: Vec<TaskKey> = (0..plan.shards.len() as u32).map(|shard| Gguf { shard }.into()).collect();
                let mut base_deps = ggufs.clone();
                base_deps.push(Search::Plan.into());
                let bases: Vec<TaskKey> = (0..n_groups(kp)).map(|group| Search::Base { group }.into()).collect();
                for b in &bases {
                    out.add(b.clone(), base_deps.clone(), model_cost(results));
                }
                let mut deps = ggufs;
                deps.extend(bases);
                deps.push(Search::Write.into());
                for (rung, level) in kld_rungs {
                    let keys: Vec<TaskKey> =
                        (0..points.len() as u32).map(|point| Search::Candidate { rung, point }.into()).collect();
                    for k in &keys {
                        out.add(k.clone(), deps.clone(), model_cost(results) * 2);
                    }
                    for shard in 0..plan.shards.len() as u32 {
                        out.waits.push((Quantize { level, shard }.into(), keys.clone()));
                    }
                }
            }
            Stage::Looked(true)
            | Stage::Start
            | Stage::Merged(_)
            | Stage::Calibrated(_)
            | Stage::TextPlanned(_)
            | Stage::Measured(_) => {}
        }
    }
}
