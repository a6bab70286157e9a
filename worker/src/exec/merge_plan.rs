//! `merge/plan`: plans the merge of an adapter into its base, and names both by their files.

use quantfarm_proto::{self as pb, task_result, WorkerKind};
use quantfarm_store::{Blob, Location};
use sha2::{Digest, Sha256};

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::location;
use crate::writers::merge_options;

pub struct MergePlan;

impl Executor for MergePlan {
    type Task = pb::MergePlanTask;
    const KIND: WorkerKind = WorkerKind::Merge;

    async fn run(m: &pb::MergePlanTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::MergePlan(merge_plan(m, env).await?))
    }
}

async fn merge_plan(m: &pb::MergePlanTask, env: &Env) -> Result<pb::MergePlanResult, Failure> {
    let (base, adapter) = (location(&m.base)?, location(&m.adapter)?);
    let plan = quantfarm_tensors::merge::plan_merge(&base, &adapter, &merge_options(&m.base_name, env)).await?;
    Ok(pb::MergePlanResult {
        format: plan.format().name().to_string(),
        plan_digest: plan.digest(),
        inputs_identity: folders_identity(&[&base, &adapter]).await?,
        files: plan.file_names().iter().map(|s| s.to_string()).collect(),
        changed: plan.changed(),
        untied: plan.untied(),
        file_bytes: plan.file_bytes(),
        adapter_files: folder_digests(&adapter, env.budget).await?,
    })
}

/// sha256 over the names, sizes and store versions of every file in the base and adapter folders.
async fn folders_identity(dirs: &[&Location]) -> Result<String, Failure> {
    let mut h = Sha256::new();
    for dir in dirs {
        let mut names = dir.list().await?;
        names.sort();
        for name in names {
            let b = Blob::open(&dir.child(&name)?).await?;
            h.update(format!("{dir}/{name}\n{}\n{}\n", b.len(), b.version()).as_bytes());
        }
    }
    Ok(quantfarm_store::hex(&h.finalize()))
}

/// Every file of `dir` with the sha256 of its content, read in chunks of at most `budget` bytes (adapters are
/// small; this is what lets a report name the adapter by content, not just by name and size).
async fn folder_digests(dir: &Location, budget: u64) -> Result<Vec<pb::Artifact>, Failure> {
    let mut names = dir.list().await?;
    names.sort();
    let chunk = budget.clamp(1 << 20, 64 << 20);
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let loc = dir.child(&name)?;
        let b = Blob::open(&loc).await?;
        let mut h = Sha256::new();
        let mut at = 0u64;
        while at < b.len() {
            let n = chunk.min(b.len() - at);
            h.update(b.read_vec(at, n).await?);
            at += n;
        }
        out.push(pb::Artifact {
            url: loc.to_string(),
            sha256: quantfarm_store::hex(&h.finalize()),
            bytes: b.len(),
            types: vec![],
        });
    }
    Ok(out)
}
