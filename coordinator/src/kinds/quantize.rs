//! `quantize`: one split file of a quant level (a llama-quantize file type or a recipe), quantized from the GGUF
//! BF16's file of the same index, with the release's importance matrix if it has one.

use std::fmt;

use quantfarm_proto::{self as pb, task};

use super::lookup::{artifact_of, computes_imatrix, plan_of};
use super::{num, sensitivity, Done, Family, Folded, Gguf, Grown, Imatrix, Results, Search, Slot, Stage, TaskKey};
use crate::graph::naming::{artifact, file_name};
use crate::graph::Ctx;
use crate::spec::{EvalTarget, ImatrixSource, Level, ReleaseSpec, Rung, Target};

/// One split file of one quant level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quantize {
    pub level: Level,
    pub shard: u32,
}

/// The release's importance matrix as the quantize tasks read it: its URL and sha256 (empty without one).
pub(super) fn imatrix_input(ctx: &Ctx, results: &Results, plan: &pb::PlanResult) -> Result<(String, String), String> {
    let url = match ctx.spec.imatrix() {
        None => String::new(),
        Some(ImatrixSource::File(_)) => ctx.imatrix.unwrap_or_default().to_string(),
        Some(ImatrixSource::Text { .. }) => artifact_of(results, &Imatrix::Merge.into())?.url.clone(),
    };
    Ok((url, imatrix_sha256(ctx.spec, results, plan)?.unwrap_or_default()))
}

/// The release's importance matrix's sha256: the file's (checked by the plan) or the merged one's; `None` without.
pub(super) fn imatrix_sha256(
    spec: &ReleaseSpec,
    results: &Results,
    plan: &pb::PlanResult,
) -> Result<Option<String>, String> {
    Ok(match spec.imatrix() {
        None => None,
        Some(ImatrixSource::File(_)) => Some(plan.imatrix_sha256.clone()),
        Some(ImatrixSource::Text { .. }) => Some(artifact_of(results, &Imatrix::Merge.into())?.sha256.clone()),
    })
}

impl Quantize {
    /// The message that makes the file (its verification recomputes it with the same one).
    pub(super) fn task(self, ctx: &Ctx, results: &Results) -> Result<pb::QuantizeTask, String> {
        let Quantize { level, shard } = self;
        let plan = plan_of(results)?;
        let n = plan.shards.len() as u32;
        let rung = ctx.spec.rung(level).ok_or_else(|| format!("{level} is not a rung of this release"))?;
        let inputs: Vec<&pb::Artifact> =
            (0..n).map(|s| artifact_of(results, &Gguf { shard: s }.into())).collect::<Result<_, _>>()?;
        let (imatrix, imatrix_sha256) = imatrix_input(ctx, results, plan)?;
        // A searched rung's recipe, chosen from the sensitivities (the same for every task that asks).
        let searched = match rung {
            Rung::Search(s) => Some(sensitivity::chosen(ctx.spec, results, s)?.recipe),
            Rung::File(_) | Rung::Recipe(_) => None,
        };
        let recipe = searched.as_ref().or(rung.recipe());
        let tensor_types: Vec<String> = recipe.map_or(vec![], |r| r.tensor_types.iter().map(|t| t.arg()).collect());
        let type_name = |t: Option<quantfarm_ggml::GgmlType>| t.map_or(String::new(), |t| t.name().to_string());
        let output_tensor_type = type_name(recipe.and_then(|r| r.output_tensor_type));
        let token_embedding_type = type_name(recipe.and_then(|r| r.token_embedding_type));
        // A plain file type's identity is as it always was; a recipe's adds its flags (its name changes no byte).
        let mut parts = vec!["quantfarm quantize v1", rung.base().name()];
        // (A searched rung is its chosen recipe: the same bytes as a recipe written out.)
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
}

impl Family for Quantize {
    const NAME: &'static str = "quantize";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}/{}", self.level, self.shard)
    }

    fn parse(rest: &[&str]) -> Option<Quantize> {
        match rest {
            [l, s] => Some(Quantize { level: Level::parse(l)?, shard: num(s)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Quantize)
    }

    fn stage(&self) -> String {
        format!("quantize {}", self.level)
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        Ok(task::Kind::Quantize(self.task(ctx, results)?))
    }

    fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>) {
        into.makes(Slot::Rung(EvalTarget::Quant(self.level)), done);
    }

    /// After the plan: per (level, split file), after every file of the GGUF BF16 (a split file's tensors are
    /// quantized from the same file; the other files' names are in its metadata) and the computed imatrix; a
    /// searched rung also after its sensitivities (`search/write`) and the rung it is held to the size of.
    fn grow(stage: Stage, ctx: &Ctx, _: &Results, out: &mut Grown) {
        let Stage::Planned(inv) = stage else { return };
        let mut deps = inv.ggufs();
        if computes_imatrix(ctx) && inv.n > 0 {
            deps.push(Imatrix::Merge.into());
        }
        for rung in ctx.spec.quants() {
            let mut deps = deps.clone();
            // A searched rung waits for its sensitivities, and for the rung its budget is the size of.
            if let Rung::Search(s) = rung {
                deps.push(Search::Write.into());
                if let Target::SizeOf(level) = s.target {
                    deps.extend((0..inv.n).map(|shard| TaskKey::from(Quantize { level, shard })));
                }
            }
            for shard in 0..inv.n {
                out.add(Quantize { level: rung.level(), shard }, deps.clone(), inv.shard_bytes[shard as usize] * 2);
            }
        }
    }
}
