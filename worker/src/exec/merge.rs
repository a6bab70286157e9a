//! `merge/N` and `merge/side`: one safetensors file of the merged checkpoint, or its side files (config, tokenizer).

use quantfarm_proto::{self as pb, task_result, WorkerKind};

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::location;
use crate::outputs::{artifact_result, found_intact, produce};
use crate::writers::write_merge;

pub struct Merge;

impl Executor for Merge {
    type Task = pb::MergeTask;
    const KIND: WorkerKind = WorkerKind::Merge;

    async fn run(m: &pb::MergeTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::Artifact(merge(m, env).await?))
    }
}

async fn merge(m: &pb::MergeTask, env: &Env) -> Result<pb::ArtifactResult, Failure> {
    if !m.side_files {
        return produce(&m.output, env, |out| async move { write_merge(m, &out, env).await }).await;
    }
    let out = location(&m.output)?;
    let mut digest = write_merge(m, &out, env).await?;
    if !found_intact(&out, &digest.sha256, env) {
        // Side files already there are kept as found: remove them all, then write them again.
        for name in out.list().await? {
            out.child(&name)?.remove().await?;
        }
        digest = write_merge(m, &out, env).await?;
    }
    Ok(artifact_result(&out, digest, false))
}
