//! `gguf`: one split file of the GGUF BF16, written from the source by the mapping (the reference every level is
//! measured against).

use std::fmt;

use quantfarm_proto::{self as pb, task};

use super::lookup::{model_source, plan_of};
use super::{num, Done, Family, Folded, Grown, Results, Slot, Stage, TaskKey};
use crate::graph::naming::{artifact, file_name, split_text};
use crate::graph::Ctx;

/// One split file of the GGUF BF16.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gguf {
    pub shard: u32,
}

impl Gguf {
    /// The message that makes the file (its verification recomputes it with the same one).
    pub(super) fn task(self, ctx: &Ctx, results: &Results) -> Result<pb::GgufShardTask, String> {
        let plan = plan_of(results)?;
        let n = plan.shards.len() as u32;
        let split = ctx.spec.split_rule();
        let name = file_name(&format!("{}-BF16", ctx.spec.prefix()), self.shard, n);
        let output = artifact(
            ctx,
            &["quantfarm gguf-bf16 v1", &plan.source_identity, &plan.plan_digest, &split_text(&split)],
            &name,
        )?;
        Ok(pb::GgufShardTask {
            source: model_source(ctx, results)?,
            plan_digest: plan.plan_digest.clone(),
            split,
            shard: self.shard,
            n_shards: n,
            output: output.to_string(),
        })
    }
}

impl Family for Gguf {
    const NAME: &'static str = "gguf";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}", self.shard)
    }

    fn parse(rest: &[&str]) -> Option<Gguf> {
        match rest {
            [s] => Some(Gguf { shard: num(s)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Gguf)
    }

    fn stage(&self) -> String {
        "gguf BF16".into()
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        Ok(task::Kind::Gguf(self.task(ctx, results)?))
    }

    fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>) {
        into.makes(Slot::Bf16, done);
    }

    /// After the plan: one per split file.
    fn grow(stage: Stage, _: &Ctx, _: &Results, out: &mut Grown) {
        let Stage::Planned(inv) = stage else { return };
        for shard in 0..inv.n {
            out.add(Gguf { shard }, vec![TaskKey::PLAN], inv.shard_bytes[shard as usize]);
        }
    }
}
