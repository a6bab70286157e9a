//! `plan`: reads a source's headers (writing the built-in synthetic model first when the release names one) and
//! returns its tensor inventory, its split into GGUF files and the importance matrix's sha256; runs the vLLM
//! outputs' pre-flight.

use quantfarm_proto::{self as pb, task_result, FailureKind, WorkerKind};
use quantfarm_quant::imatrix::Imatrix;
use quantfarm_quant::vllm_file::check;
use quantfarm_store::Location;
use quantfarm_tensors::{convert, TensorSource};
use sha2::{Digest, Sha256};

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{hash_object, location};
use crate::writers::{open_plan, split_rule, vllm_options};

pub struct Plan;

impl Executor for Plan {
    type Task = pb::PlanTask;
    const KIND: WorkerKind = WorkerKind::Plan;

    async fn run(p: &pb::PlanTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::Plan(plan(p, env).await?))
    }
}

/// sha256 over the source files' names, sizes and store versions.
fn source_identity(src: &TensorSource) -> String {
    let mut h = Sha256::new();
    for b in src.files() {
        h.update(format!("{}\n{}\n{}\n", b.name(), b.len(), b.version()).as_bytes());
    }
    quantfarm_store::hex(&h.finalize())
}

/// Writes the built-in synthetic model at `dir` unless it is there (any worker writes the same bytes).
async fn materialize(name: &str, dir: &Location) -> Result<(), Failure> {
    use quantfarm_tensors::synthetic;
    // Every model of the catalogue is the tiny Llama today; a second one adds its writer here.
    if pb::synthetic_model(name).is_none() {
        return Err(Failure::input(format!("unknown synthetic model {name:?}")));
    }
    if synthetic::tiny_llama_exists(dir).await? {
        return Ok(());
    }
    match synthetic::write_tiny_llama(dir).await {
        Ok(_) => Ok(()),
        // Another worker wrote it meanwhile.
        Err(_) if synthetic::tiny_llama_exists(dir).await? => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The vLLM schemes' pre-flight on the source's headers (`vllm_file::check`): a scheme that cannot be made is the
/// input's fault, named by tensor and rule, before any compute.
async fn vllm_preflight(p: &pb::PlanTask, env: &Env) -> Result<(), Failure> {
    for s in &p.vllm {
        let opts = vllm_options(&Some(s.clone()), env)?;
        if let Err(e) = check(&location(&p.source)?, &opts).await {
            return Err(match Failure::from(e) {
                f if f.kind == FailureKind::Input => {
                    Failure::input(format!("outputs.vllm: {} cannot be made: {}", s.scheme, f.message))
                }
                f => f,
            });
        }
    }
    Ok(())
}

async fn plan(p: &pb::PlanTask, env: &Env) -> Result<pb::PlanResult, Failure> {
    if !p.synthetic.is_empty() {
        materialize(&p.synthetic, &location(&p.source)?).await?;
    }
    vllm_preflight(p, env).await?;
    let (src, plan) = open_plan(&p.source).await?;
    let nbytes: Vec<u64> = plan.tensors.iter().map(|t| t.nbytes).collect();
    let ranges = convert::split_ranges(&nbytes, split_rule(&p.split));
    // The importance matrix is checked now (it must load) and named by its bytes, so the quant outputs are
    // content-addressed by it and every quantize task can tell it is the same file.
    let imatrix_sha256 = if p.imatrix.is_empty() {
        String::new()
    } else {
        let loc = location(&p.imatrix)?;
        Imatrix::load(&loc).await?;
        hash_object(&loc, 8 << 20).await?.sha256
    };
    Ok(pb::PlanResult {
        architecture: src.architecture().unwrap_or_default(),
        format: src.format().name().to_string(),
        plan_digest: plan.digest(),
        source_identity: source_identity(&src),
        source_bytes: src.files().iter().map(|b| b.len()).sum(),
        tensors: plan
            .tensors
            .iter()
            .map(|t| pb::PlannedTensor {
                name: t.name.clone(),
                source: t.source.clone(),
                ggml_type: t.ty.name().to_string(),
                bytes: t.nbytes,
                elements: t.ne.iter().product(),
                ne: t.ne.clone(),
            })
            .collect(),
        shards: ranges.iter().map(|r| pb::ShardRange { start: r.start as u32, end: r.end as u32 }).collect(),
        imatrix_sha256,
    })
}
