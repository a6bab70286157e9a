//! `verify`: recomputes an output into a scratch file (or folder) with the same writer that made it, and compares
//! it with the stored object and the sha256 its producer reported.

use quantfarm_proto::{self as pb, task_result, verify_task, WorkerKind};
use quantfarm_store::Location;

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{hash_object, location};
use crate::outputs::folder_digest;
use crate::writers::{write_gguf, write_merge, write_mlx, write_quantized};

pub struct Verify;

impl Executor for Verify {
    type Task = pb::VerifyTask;
    const KIND: WorkerKind = WorkerKind::Verify;

    async fn run(v: &pb::VerifyTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::Verify(verify(v, env).await?))
    }
}

async fn verify(v: &pb::VerifyTask, env: &Env) -> Result<pb::VerifyResult, Failure> {
    std::fs::create_dir_all(&env.scratch).map_err(|e| Failure::transient(env.scratch.display(), e))?;
    let dir = tempfile::tempdir_in(&env.scratch).map_err(|e| Failure::transient(env.scratch.display(), e))?;
    let scratch = Location::local(dir.path().join("recomputed"));
    let what = v.what.as_ref().ok_or_else(|| Failure::input("verify: nothing to verify"))?;
    let (stored_url, recomputed) = match what {
        verify_task::What::Gguf(g) => (g.output.clone(), write_gguf(g, &scratch, env).await?),
        verify_task::What::Quantize(q) => (q.output.clone(), write_quantized(q, &scratch, env).await?),
        verify_task::What::Merge(m) => (m.output.clone(), write_merge(m, &scratch, env).await?),
        verify_task::What::Mlx(m) => (m.output.clone(), write_mlx(m, &scratch, env).await?),
    };
    let stored_loc = location(&stored_url)?;
    let stored = match what {
        // A folder: its files, as the recomputation names them.
        verify_task::What::Mlx(_) | verify_task::What::Merge(pb::MergeTask { side_files: true, .. }) => {
            folder_digest(&stored_loc, &scratch.list().await?, env).await?.0
        }
        verify_task::What::Gguf(_) | verify_task::What::Quantize(_) | verify_task::What::Merge(_) => {
            hash_object(&stored_loc, env.budget).await?.0
        }
    };
    if stored != v.expect_sha256 {
        // Not what its producer committed: the store changed it since. The producer makes it again.
        return Err(Failure::corrupt(&stored_url, &stored, &v.expect_sha256));
    }
    let identical = stored == recomputed.0;
    let detail = if identical {
        format!("{stored_url}: recomputed {} bytes, identical", recomputed.1)
    } else {
        format!("{stored_url}: stored {stored}, recomputed {}, the producer reported {}", recomputed.0, v.expect_sha256)
    };
    Ok(pb::VerifyResult {
        identical,
        expected_sha256: v.expect_sha256.clone(),
        stored_sha256: stored,
        recomputed_sha256: recomputed.0,
        detail,
    })
}
