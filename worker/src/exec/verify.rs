//! `verify`: recomputes an output into a scratch file (or folder) with the same writer that made it, and compares
//! it with the stored object and the sha256 its producer reported.

use quantfarm_proto::{self as pb, task_result, verify_task, WorkerKind};
use quantfarm_store::Location;

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{location, stored_digest};
use crate::outputs::folder_digest;
use crate::writers::{write_gguf, write_merge, write_mlx, write_quantized, write_vllm};

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
        verify_task::What::Vllm(t) => (t.output.clone(), write_vllm(t, &scratch, env).await?),
    };
    // The stored copy's digest, read here, or `None` when an evaluation task of the release reads the copy whole and
    // checks it against the recorded digest as it fetches it (reporting it corrupt otherwise): then the
    // recomputation is compared with that digest, and the copy is not read twice.
    let stored = if v.stored_checked_by.is_empty() {
        let stored_loc = location(&stored_url)?;
        let stored = match what {
            // A folder: its files, as the recomputation names them.
            verify_task::What::Mlx(_)
            | verify_task::What::Vllm(_)
            | verify_task::What::Merge(pb::MergeTask { side_files: true, .. }) => {
                folder_digest(&stored_loc, &scratch.list().await?, env).await?.sha256
            }
            // Through the worker's cache when it keeps the file: fetched and checked against the recorded digest (a
            // stored copy without it is reported corrupt there, as below), or an entry checked again.
            verify_task::What::Gguf(_) | verify_task::What::Quantize(_) | verify_task::What::Merge(_) => {
                stored_digest(&stored_url, env).await?.sha256
            }
        };
        if stored != v.expect_sha256 {
            // Not what its producer committed: the store changed it since. The producer makes it again.
            return Err(Failure::corrupt(&stored_url, &stored, &v.expect_sha256));
        }
        Some(stored)
    } else {
        None
    };
    // The stored copy (read or checked elsewhere) is the recorded digest's.
    let identical = recomputed.sha256 == v.expect_sha256;
    let detail = match (&stored, identical) {
        (Some(_), true) => format!("{stored_url}: recomputed {} bytes, identical", recomputed.bytes),
        (None, true) => format!(
            "{stored_url}: recomputed {} bytes, identical to the digest its producer recorded; the stored copy is \
             checked against it by {}",
            recomputed.bytes, v.stored_checked_by
        ),
        (Some(stored), false) => format!(
            "{stored_url}: stored {stored}, recomputed {}, the producer reported {}",
            recomputed.sha256, v.expect_sha256
        ),
        (None, false) => {
            format!("{stored_url}: recomputed {}, the producer reported {}", recomputed.sha256, v.expect_sha256)
        }
    };
    Ok(pb::VerifyResult {
        identical,
        expected_sha256: v.expect_sha256.clone(),
        stored_sha256: stored.unwrap_or_default(),
        recomputed_sha256: recomputed.sha256,
        detail,
    })
}
