//! `vllm`: makes the compressed-tensors checkpoint folder vLLM loads, FP8_DYNAMIC or W4A16 as llm-compressor writes
//! it (config.json committed last: a folder that has it is complete).

use quantfarm_proto::{self as pb, task_result, WorkerKind};
use quantfarm_store::Digest;

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{exists, location};
use crate::outputs::{folder_digest, found_intact, vllm_type_mix};
use crate::writers::write_vllm;

pub struct Vllm;

impl Executor for Vllm {
    type Task = pb::VllmTask;
    const KIND: WorkerKind = WorkerKind::Vllm;

    async fn run(v: &pb::VllmTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::Artifact(vllm(v, env).await?))
    }
}

async fn vllm(v: &pb::VllmTask, env: &Env) -> Result<pb::ArtifactResult, Failure> {
    let out = location(&v.output)?;
    let found = match exists(&out.child("config.json")?).await {
        true => {
            Some(folder_digest(&out, &out.list().await?, env).await?).filter(|d| found_intact(&out, &d.sha256, env))
        }
        false => None,
    };
    // A corrupt folder is written over: the writer replaces every file of the checkpoint.
    let (cache_hit, Digest { sha256, bytes }) = match found {
        Some(d) => (true, d),
        None => (false, write_vllm(v, &out, env).await?),
    };
    // Each quantized module once (FP8_E4M3_CHANNEL, INT4_G64), the rest as stored: what the report's size columns sum.
    let types = vllm_type_mix(&out).await?;
    Ok(pb::ArtifactResult {
        artifact: Some(pb::Artifact { url: out.to_string(), sha256, bytes, types }),
        cache_hit,
        experts: vec![],
    })
}
