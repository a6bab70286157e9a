//! `mlx`: makes an MLX affine checkpoint folder (config.json committed last: a folder that has it is complete).

use quantfarm_proto::{self as pb, task_result, WorkerKind};
use quantfarm_store::Digest;

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{exists, location};
use crate::outputs::{folder_digest, found_intact, mlx_type_mix};
use crate::writers::write_mlx;

pub struct Mlx;

impl Executor for Mlx {
    type Task = pb::MlxTask;
    const KIND: WorkerKind = WorkerKind::Mlx;

    async fn run(m: &pb::MlxTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::Artifact(mlx(m, env).await?))
    }
}

async fn mlx(m: &pb::MlxTask, env: &Env) -> Result<pb::ArtifactResult, Failure> {
    let out = location(&m.output)?;
    let found = match exists(&out.child("config.json")?).await {
        true => {
            Some(folder_digest(&out, &out.list().await?, env).await?).filter(|d| found_intact(&out, &d.sha256, env))
        }
        false => None,
    };
    // A corrupt folder is written over: the writer replaces every file of the checkpoint.
    let (cache_hit, Digest { sha256, bytes }) = match found {
        Some(d) => (true, d),
        None => (false, write_mlx(m, &out, env).await?),
    };
    let types = mlx_type_mix(&out).await?;
    Ok(pb::ArtifactResult {
        artifact: Some(pb::Artifact { url: out.to_string(), sha256, bytes, types }),
        cache_hit,
        experts: vec![],
    })
}
