//! `search`: the sensitivities a searched rung's recipe is chosen from (docs/search.md). After the plan:
//! `search/plan` tokenizes the search text with the reference; `search/lookup` asks whether this reference's
//! sensitivities, with these settings, are stored already (an earlier release made them: then nothing is measured
//! again); otherwise the text's `search/base/G` base logits and one `search/probe/G/V` per tensor group and distinct
//! candidate type (the group alone quantized, measured until precise enough); `search/write` stores them
//! (`sensitivity.json`, content-addressed by the reference and the settings). A searched rung's quantize tasks wait
//! for it; its recipe is [`chosen`] from the sensitivities, the same way for every task and for the report.

use std::fmt;

use quantfarm_proto::{self as pb, task, task_result};
use quantfarm_quant::recipe_search;

use super::expand::{chunked, model_cost};
use super::kld_base::base_part;
use super::lookup::{artifact_of, plan_of, reference_files};
use super::quantize::imatrix_input;
use super::sensitivity::{candidate_points, lookup_of, n_groups, probes, search_plan, sensitivity, SENSITIVITY_FORMAT};
use super::{num, Done, Family, Folded, Gguf, Grown, Opens, Quantize, Results, Stage, TaskKey};
use crate::graph::naming::artifact;
use crate::graph::{Ctx, EvalInputs};
use crate::spec::{ImatrixSource, Level, ReleaseSpec, SearchRung, Target, TensorTypeRule};

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

/// The search text, resolved: `outputs.gguf.search.text`, else the computed importance matrix's (`imatrix`: the
/// release's resolved imatrix file or text).
pub fn search_text<'a>(spec: &ReleaseSpec, eval: &'a EvalInputs, imatrix: Option<&'a str>) -> Option<&'a str> {
    eval.search_text.as_deref().or(match spec.imatrix() {
        Some(ImatrixSource::Text { .. }) => imatrix,
        _ => None,
    })
}

fn text<'a>(ctx: &Ctx<'a>) -> Result<&'a str, String> {
    search_text(ctx.spec, ctx.eval, ctx.imatrix)
        .ok_or_else(|| "the search has no text (outputs.gguf.search.text)".into())
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

/// A probe's message: the reference quantized by `rules` on the search rungs' base (made on the worker's disk),
/// scored against every base-logits part of the search text, stopping once `precision` is met after `min_chunks`.
fn probe_message(
    ctx: &Ctx,
    results: &Results,
    rules: Vec<String>,
    min_chunks: u32,
    precision: f64,
) -> Result<pb::SensitivityProbeTask, String> {
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
            tensor_types: rules,
            output_tensor_type: String::new(),
            token_embedding_type: String::new(),
        }),
        bases,
        batch: ctx.spec.search_settings().batch,
        min_chunks,
        precision,
    })
}

/// The search text's base-logits tasks (after the reference and the text's plan); returns what a task scoring
/// against them waits for: every reference file and every part.
fn grow_bases(plan: &pb::PlanResult, kp: &pb::KldPlanResult, results: &Results, out: &mut Grown) -> Vec<TaskKey> {
    let ggufs: Vec<TaskKey> = (0..plan.shards.len() as u32).map(|shard| Gguf { shard }.into()).collect();
    let mut base_deps = ggufs.clone();
    base_deps.push(Search::Plan.into());
    let bases: Vec<TaskKey> = (0..n_groups(kp)).map(|group| Search::Base { group }.into()).collect();
    for b in &bases {
        out.add(b.clone(), base_deps.clone(), model_cost(results));
    }
    ggufs.into_iter().chain(bases).collect()
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
        let rules = recipe_search::probe_rules(&p.tensors, g, v.asked);
        let kp = search_plan(results)?;
        let precision = ctx.spec.search_settings().precision;
        let rules = rules.iter().map(|(p, t)| format!("{p}={}", t.name())).collect();
        probe_message(ctx, results, rules, 4.min(kp.n_chunks), precision)
    }

    /// The search text's base logits of one chunk group, under a name that does not depend on the release's: a later
    /// release of the same reference finds them.
    fn base_task(ctx: &Ctx, results: &Results, group: u32) -> Result<pb::KldBaseTask, String> {
        let name = |first: u32, n: u32| format!("search-kld-base-{first:05}-{n}.logits");
        base_part(ctx, results, search_plan(results)?, kld_settings(ctx)?, group, name)
    }

    /// A `kld` rung's candidate recipe, scored on the whole search text (every part: its tail figures need them).
    fn candidate_task(ctx: &Ctx, results: &Results, point: u32) -> Result<pb::SensitivityProbeTask, String> {
        let (space, points) = candidate_points(ctx.spec, results)?;
        let (_, choice) = points.get(point as usize).ok_or_else(|| format!("no candidate recipe {point}"))?;
        let (recipe, _) = space.recipe(crate::spec::RecipeName::new("candidate")?, choice)?;
        let rules = recipe.tensor_types.iter().map(TensorTypeRule::arg).collect();
        probe_message(ctx, results, rules, search_plan(results)?.n_chunks, 0.0)
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
                let mut probe_deps = grow_bases(plan, kp, results, out);
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
                // The base logits: made already unless the sensitivities were found stored (the graph keeps one of
                // each key).
                let mut deps = grow_bases(plan, kp, results, out);
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
