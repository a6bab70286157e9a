//! The merge check's inputs (link 1), each a GGUF file: the adapter as a GGUF LoRA, the base widened to F32, and
//! the merge rounded to f32. The greedy tasks then run the base with the LoRA applied at run time (llama.cpp's
//! unmerged adapter path) against the merge.
//!
//! Both sides are F32 so that what differs is the merge's arithmetic alone: the published merge is rounded to the
//! base's bf16, and llama.cpp rounds activations to bf16 against bf16 weights; either rounding flips greedy
//! near-ties (reference margins of a few hundredths of a logit) that say nothing about the merge. The merged side
//! is made by the same merge plan as the published checkpoint (`MergeOptions::widen`), whose bytes verify tasks
//! already check.

use quantfarm_proto::{self as pb, task_result, MergeCheckPart, WorkerKind};
use quantfarm_store::{Committed, Digest, Location};
use quantfarm_tensors::convert::{plan_hf_to_gguf, write_gguf_shard, OutType};
use quantfarm_tensors::merge::{adapter_to_gguf, merge_adapter};
use quantfarm_tensors::TensorSource;

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{location, task_dir};
use crate::outputs::produce;
use crate::writers::merge_options;

pub struct MergeCheck;

impl Executor for MergeCheck {
    type Task = pb::MergeCheckTask;
    const KIND: WorkerKind = WorkerKind::Merge;

    async fn run(m: &pb::MergeCheckTask, env: &Env) -> Result<task_result::Kind, Failure> {
        let part = MergeCheckPart::try_from(m.part).unwrap_or(MergeCheckPart::Unspecified);
        let made = produce(&m.output, env, |out| async move { write_part(m, part, &out, env).await }).await?;
        Ok(task_result::Kind::Artifact(made))
    }
}

async fn write_part(
    m: &pb::MergeCheckTask,
    part: MergeCheckPart,
    out: &Location,
    env: &Env,
) -> Result<Digest, Failure> {
    let (base, adapter) = (location(&m.base)?, location(&m.adapter)?);
    let opts = quantfarm_tensors::merge::MergeOptions { widen: true, ..merge_options(&m.base_name, env) };
    let done = match part {
        MergeCheckPart::Lora => adapter_to_gguf(&base, &adapter, out, &opts).await?,
        MergeCheckPart::Base => f32_gguf(&base, out, env).await?,
        MergeCheckPart::Merged => {
            let dir = task_dir(env)?;
            // The merge is written under the base's folder name: the GGUF's general.name comes from it, and
            // llama.cpp tokenizes by that name (`llama-vocab.cpp`: special tokens of a model named phi-3 / phi3
            // strip the spaces after them), so another name could make the two sides tokenize differently.
            let name = match base.file_name() {
                "" => "base",
                n => n,
            };
            let merged = Location::local(dir.path().join(name));
            merge_adapter(&base, &adapter, &merged, &opts).await?;
            f32_gguf(&merged, out, env).await?
        }
        MergeCheckPart::Unspecified => {
            return Err(Failure::input(format!("merge check: part {} is not one this worker knows", m.part)))
        }
    };
    Ok(Digest::new(done.sha256, done.bytes))
}

/// The HF checkpoint folder `src` as one F32 GGUF file at `out` (bf16 weights widened exactly).
async fn f32_gguf(src: &Location, out: &Location, env: &Env) -> Result<Committed, Failure> {
    let source = TensorSource::open(src).await?;
    let plan = plan_hf_to_gguf(&source, OutType::F32).await?;
    // One split file holding every tensor.
    #[allow(clippy::single_range_in_vec_init)]
    let ranges = [0..plan.tensors.len()];
    Ok(write_gguf_shard(&plan, &source, &ranges, 0, out, env.budget, false).await?)
}
