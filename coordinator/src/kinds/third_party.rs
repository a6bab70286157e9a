//! `third-party`: a GGUF file of the same base made elsewhere (an `evaluation.peers` entry: a published Q4_K_M, a
//! "dynamic" rung), scored on each chunk group against the farm's own base logits exactly as a rung is (a `kld` task
//! on its URL); its first group's task also describes the file (sha256, size, tensor types). The report sets it
//! beside the farm's rung of nearest size.

use std::fmt;

use quantfarm_parity::ChunkStats;
use quantfarm_proto::{self as pb, task};

use super::expand::model_cost;
use super::lookup::{artifact_of, kld_plan_of, kld_settings};
use super::{num, Done, Family, Folded, Grown, KldBase, Results, Stage};
use crate::graph::Ctx;

/// Third-party file `index` (its place among the GGUF entries of `evaluation.peers`) on chunk group `group`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ThirdParty {
    pub index: u32,
    pub group: u32,
}

impl Family for ThirdParty {
    const NAME: &'static str = "third-party";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}/{}", self.index, self.group)
    }

    fn parse(rest: &[&str]) -> Option<ThirdParty> {
        match rest {
            [i, g] => Some(ThirdParty { index: num(i)?, group: num(g)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Kld)
    }

    fn stage(&self) -> String {
        format!("kld third party {}", self.index)
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        let kp = kld_plan_of(results)?;
        let base = artifact_of(results, &KldBase { group: self.group }.into())?;
        let model = ctx.eval.third_party.get(self.index as usize).ok_or("no such third-party file")?;
        Ok(task::Kind::Kld(pb::KldTask {
            model: model.clone(),
            base: base.url.clone(),
            base_sha256: base.sha256.clone(),
            first_chunk: self.group * kp.n_seq,
            batch: kld_settings(ctx)?.batch,
            describe: self.group == 0,
        }))
    }

    fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>) {
        let Some(k) = done.result.and_then(pb::TaskResult::kld) else { return };
        let acc = into.third_party.entry(self.index).or_default();
        acc.chunks.extend(k.chunks.iter().map(ChunkStats::from));
        if let Some(m) = &k.model {
            acc.file = Some(m);
        }
    }

    /// With an evaluation text: per third-party file and chunk group, a task after the group's base logits. The
    /// report waits for them.
    fn grow(stage: Stage, ctx: &Ctx, results: &Results, out: &mut Grown) {
        let Stage::TextPlanned(kp) = stage else { return };
        for index in 0..ctx.eval.third_party.len() as u32 {
            for group in 0..kp.n_chunks.div_ceil(kp.n_seq.max(1)) {
                out.add_measured(ThirdParty { index, group }, vec![KldBase { group }.into()], model_cost(results));
            }
        }
    }
}
