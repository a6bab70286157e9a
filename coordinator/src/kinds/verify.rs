//! `verify`: an output recomputed into scratch by another worker and compared byte for byte with the stored one
//! (the GGUF BF16's files, a quant level's, the merge's, an MLX or vLLM rung's).

use std::fmt;

use quantfarm_proto::{self as pb, task, verify_task};

use super::expand::{merge_files, merged};
use super::lookup::artifact_of;
use super::merge::merge_task;
use super::mlx::MlxKey;
use super::subjects::{EvalTarget, Subject};
use super::{
    num, Done, Family, Folded, Gguf, Greedy, Grown, Kld, Merge, Mlx, Probe, Quantize, Results, Slot, Stage, TaskKey,
    Vllm,
};
use crate::graph::Ctx;
use crate::spec::{Level, MlxRung, VllmRung};

/// The verification of one output, named after the task that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verify {
    Gguf { shard: u32 },
    Quantize { level: Level, shard: u32 },
    Merge { file: u32 },
    MergeSide,
    Mlx { rung: MlxRung },
    Vllm { rung: VllmRung },
}

impl Verify {
    /// The task that made the output.
    pub fn producer(self) -> TaskKey {
        match self {
            Verify::Gguf { shard } => Gguf { shard }.into(),
            Verify::Quantize { level, shard } => Quantize { level, shard }.into(),
            Verify::Merge { file } => Merge::File { file }.into(),
            Verify::MergeSide => Merge::Side.into(),
            Verify::Mlx { rung } => Mlx { rung }.into(),
            Verify::Vllm { rung } => Vllm { rung }.into(),
        }
    }

    /// The artifact it checks.
    fn slot(self) -> Slot {
        match self {
            Verify::Gguf { .. } => Slot::Bf16,
            Verify::Quantize { level, .. } => Slot::Rung(EvalTarget::Quant(level)),
            Verify::Merge { .. } | Verify::MergeSide => Slot::Merged,
            Verify::Mlx { rung } => Slot::Rung(EvalTarget::Mlx(rung)),
            Verify::Vllm { rung } => Slot::Rung(EvalTarget::Vllm(rung)),
        }
    }
}

/// The task of the release that reads `producer`'s stored GGUF file whole and checks it against its recorded digest
/// as it fetches it, if any: then the file's verify task need not read it again (`VerifyTask.stored_checked_by`).
/// Only on a remote store (a worker reads a local store's files in place, unfetched), and for a GGUF file of the
/// reference (read by the KL-divergence plan) or of a level an evaluation task loads.
fn stored_checker(ctx: &Ctx, v: Verify) -> Option<TaskKey> {
    if ctx.store.local_path().is_some() {
        return None;
    }
    let e = ctx.spec.evaluation.as_ref()?;
    match v {
        Verify::Gguf { .. } => e.text.is_some().then_some(Kld::Plan.into()),
        Verify::Quantize { level, .. } => {
            let target = EvalTarget::Quant(level);
            if !ctx.spec.measures(target) {
                None
            } else if e.text.is_some() {
                Some(Kld::Measure { target, group: 0 }.into())
            } else if e.probes.is_some() {
                Some(Probe { subject: Subject::Model(target) }.into())
            } else if e.prompts.is_some() {
                Some(Greedy { subject: Subject::Model(target), share: 0 }.into())
            } else {
                None
            }
        }
        Verify::Merge { .. } | Verify::MergeSide | Verify::Mlx { .. } | Verify::Vllm { .. } => None,
    }
}

impl Family for Verify {
    const NAME: &'static str = "verify";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verify::Gguf { shard } => write!(f, "/gguf/{shard}"),
            Verify::Quantize { level, shard } => write!(f, "/quantize/{level}/{shard}"),
            Verify::Merge { file } => write!(f, "/merge/{file}"),
            Verify::MergeSide => write!(f, "/merge/side"),
            Verify::Mlx { rung } => write!(f, "/mlx/{}", MlxKey(*rung)),
            Verify::Vllm { rung } => write!(f, "/vllm/{rung}"),
        }
    }

    fn parse(rest: &[&str]) -> Option<Verify> {
        Some(match rest {
            ["gguf", s] => Verify::Gguf { shard: num(s)? },
            ["quantize", l, s] => Verify::Quantize { level: Level::parse(l)?, shard: num(s)? },
            ["merge", "side"] => Verify::MergeSide,
            ["merge", f] => Verify::Merge { file: num(f)? },
            ["mlx", r] => Verify::Mlx { rung: MlxKey::parse(r)? },
            ["vllm", r] => Verify::Vllm { rung: VllmRung::parse(r)? },
            _ => return None,
        })
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Verify)
    }

    fn stage(&self) -> String {
        "verify".into()
    }

    /// The producer's message, aimed at the stored output's URL (the verifier recomputes it into scratch and
    /// compares the two).
    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        let a = artifact_of(results, &self.producer())?;
        let output = a.url.clone();
        let what = match *self {
            Verify::Gguf { shard } => {
                verify_task::What::Gguf(pb::GgufShardTask { output, ..Gguf { shard }.task(ctx, results)? })
            }
            Verify::Quantize { level, shard } => verify_task::What::Quantize(pb::QuantizeTask {
                output,
                ..Quantize { level, shard }.task(ctx, results)?
            }),
            Verify::Merge { file } => {
                verify_task::What::Merge(pb::MergeTask { output, ..merge_task(ctx, results, Some(file))? })
            }
            Verify::MergeSide => verify_task::What::Merge(pb::MergeTask { output, ..merge_task(ctx, results, None)? }),
            Verify::Mlx { rung } => verify_task::What::Mlx(pb::MlxTask { output, ..Mlx { rung }.task(ctx, results)? }),
            Verify::Vllm { rung } => {
                verify_task::What::Vllm(pb::VllmTask { output, ..Vllm { rung }.task(ctx, results)? })
            }
        };
        Ok(task::Kind::Verify(pb::VerifyTask {
            what: Some(what),
            expect_sha256: a.sha256.clone(),
            stored_checked_by: stored_checker(ctx, *self).map(|k| k.to_string()).unwrap_or_default(),
        }))
    }

    fn fold<'a>(&self, done: Done<'a>, into: &mut Folded<'a>) {
        into.verifies(self.slot(), done);
    }

    /// After the merge plan, one per merged file and one for the side files; after the plan, one per split file of
    /// the GGUF BF16, per (level, split file) and per MLX and vLLM rung. The report waits for every one.
    fn grow(stage: Stage, ctx: &Ctx, results: &Results, out: &mut Grown) {
        match stage {
            Stage::Merged(mp) => {
                for (file, bytes) in merge_files(mp) {
                    out.add(Verify::Merge { file }, vec![Merge::File { file }.into()], bytes);
                }
                out.add(Verify::MergeSide, vec![Merge::Side.into()], 1);
            }
            Stage::Planned(inv) => {
                // The merge's verifications, made before the report existed.
                if let Some(mp) = merged(results) {
                    out.measured.extend(merge_files(mp).map(|(file, _)| Verify::Merge { file }.into()));
                    out.measured.push(Verify::MergeSide.into());
                }
                for rung in ctx.spec.mlx_rungs() {
                    out.add_measured(Verify::Mlx { rung }, vec![Mlx { rung }.into()], inv.plan.source_bytes);
                }
                for &rung in ctx.spec.vllm_rungs() {
                    out.add_measured(Verify::Vllm { rung }, vec![Vllm { rung }.into()], inv.plan.source_bytes);
                }
                for shard in 0..inv.n {
                    out.add_measured(
                        Verify::Gguf { shard },
                        vec![Gguf { shard }.into()],
                        inv.shard_bytes[shard as usize],
                    );
                }
                for level in ctx.spec.quants() {
                    let level = level.level();
                    for shard in 0..inv.n {
                        let bytes = inv.shard_bytes[shard as usize] * 2;
                        out.add_measured(
                            Verify::Quantize { level, shard },
                            vec![Quantize { level, shard }.into()],
                            bytes,
                        );
                    }
                }
            }
            Stage::Start
            | Stage::Calibrated(_)
            | Stage::TextPlanned(_)
            | Stage::Measured(_)
            | Stage::Looked(_)
            | Stage::Sensed => {}
        }
    }
}
