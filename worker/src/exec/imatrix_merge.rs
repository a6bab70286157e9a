//! `imatrix/merge`: the parts, each checked against its task's sha256, added in chunk order into llama.cpp's GGUF
//! imatrix. Chunk order, not arrival order: the file is the same however the groups were spread. The result also
//! names, per mixture-of-experts weight, the experts no calibration token reached.

use quantfarm_proto::{self as pb, task_result, WorkerKind};
use quantfarm_quant::imatrix::sums::ImatrixSums;
use quantfarm_store::Digest;

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{hash_object, location};
use crate::outputs::produce;

pub struct ImatrixMerge;

impl Executor for ImatrixMerge {
    type Task = pb::ImatrixMergeTask;
    const KIND: WorkerKind = WorkerKind::Imatrix;

    async fn run(t: &pb::ImatrixMergeTask, env: &Env) -> Result<task_result::Kind, Failure> {
        let made = produce(&t.output, env, |out| async move {
            let mut sums = ImatrixSums::default();
            for a in &t.parts {
                let loc = location(&a.url)?;
                let Digest { sha256: sha, .. } = hash_object(&loc, env.budget).await?;
                if sha != a.sha256 {
                    return Err(Failure::corrupt(&a.url, &sha, &a.sha256));
                }
                let part = ImatrixSums::load(&loc).await?;
                sums.append(&part, &a.url)?;
            }
            if sums.entries.is_empty() {
                return Err(Failure::input("imatrix/merge: no part holds any statistics"));
            }
            let done = sums.write(&out, false, false).await?;
            Ok(Digest::new(done.sha256, done.bytes))
        })
        .await?;
        // Read back, so that a cache hit (the closure not run) reports the same coverage.
        let merged = ImatrixSums::load(&location(&t.output)?).await?;
        let experts = merged
            .expert_coverage()
            .into_iter()
            .map(|c| pb::ExpertCoverage { weight: c.weight, experts: c.experts, unrouted: c.unrouted })
            .collect();
        Ok(task_result::Kind::Artifact(pb::ArtifactResult { experts, ..made }))
    }
}
