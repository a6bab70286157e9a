//! `quantize`: one split file of a quant level (a llama-quantize file type or a recipe), quantized from the GGUF
//! BF16's file of the same index, with the release's importance matrix if it has one.

use std::fmt;

use quantfarm_proto::{self as pb, task};

use super::lookup::{artifact_of, computes_imatrix, plan_of};
use super::{num, Done, Family, Folded, Gguf, Grown, Imatrix, Results, Slot, Stage};
use crate::graph::naming::{artifact, file_name};
use crate::graph::Ctx;
use crate::spec::{EvalTarget, ImatrixSource, Level};

/// One split file of one quant level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quantize {
    pub level: Level,
    pub shard: u32,
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
        let (imatrix, imatrix_sha256) = match ctx.spec.imatrix() {
            None => (String::new(), String::new()),
            Some(ImatrixSource::File(_)) => (ctx.imatrix.unwrap_or_default().to_string(), plan.imatrix_sha256.clone()),
            Some(ImatrixSource::Text { .. }) => {
                let a = artifact_of(results, &Imatrix::Merge.into())?;
                (a.url.clone(), a.sha256.clone())
            }
        };
        let recipe = rung.recipe();
        let tensor_types: Vec<String> = recipe.map_or(vec![], |r| r.tensor_types.iter().map(|t| t.arg()).collect());
        let type_name = |t: Option<quantfarm_ggml::GgmlType>| t.map_or(String::new(), |t| t.name().to_string());
        let output_tensor_type = type_name(recipe.and_then(|r| r.output_tensor_type));
        let token_embedding_type = type_name(recipe.and_then(|r| r.token_embedding_type));
        // A plain file type's identity is as it always was; a recipe's adds its flags (its name changes no byte).
        let mut parts = vec!["quantfarm quantize v1", rung.base().name()];
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
    /// quantized from the same file; the other files' names are in its metadata) and the computed imatrix.
    fn grow(stage: Stage, ctx: &Ctx, _: &Results, out: &mut Grown) {
        let Stage::Planned(inv) = stage else { return };
        let mut deps = inv.ggufs();
        if computes_imatrix(ctx) && inv.n > 0 {
            deps.push(Imatrix::Merge.into());
        }
        for level in ctx.spec.quants() {
            for shard in 0..inv.n {
                out.add(Quantize { level: level.level(), shard }, deps.clone(), inv.shard_bytes[shard as usize] * 2);
            }
        }
    }
}
