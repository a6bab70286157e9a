//! One task's transformers: a helper started for the task (`crate::transformers`) with its model loaded, and what
//! the report records of the run (`TransformersRun`: versions, device, how the model was loaded).
//!
//! A checkpoint transformers refuses to load is not a task failure: the task answers with the refusal in
//! `TransformersRun.load_error`, so the rest of the release goes on and the report shows it, with transformers' own
//! message.

use std::path::Path;

use quantfarm_proto as pb;

use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::local_model;
use crate::helper::Error;
use crate::transformers::{Activations, Dtype, Transformers};

/// What opening a model gave: a helper ready to run it, or transformers' refusal to load it.
pub enum Opened {
    Ready(Box<Transformers>, pb::TransformersRun),
    Refused(pb::TransformersRun),
}

/// The activations a task names.
pub fn activations(name: &str) -> Result<Activations, Failure> {
    Activations::parse(name)
        .ok_or_else(|| Failure::input(format!("activations {name:?}: expected as-saved or weight-only")))
}

/// What a task asks the helper to load: its model and adapter (URLs; the adapter empty for none), activations and
/// dtype (as the task names them).
pub struct Request<'a> {
    pub model: &'a str,
    pub adapter: &'a str,
    pub activations: &'a str,
    pub dtype: &'a str,
}

/// A task's model (and adapter, when it names one) fetched into the task's folder `dir`, then opened with the
/// activations and dtype it names.
pub async fn open_task(r: Request<'_>, dir: &Path, env: &Env) -> Result<Opened, Failure> {
    let Request { model, adapter, activations, dtype } = r;
    let acts = self::activations(activations)?;
    let dtype =
        Dtype::parse(dtype).ok_or_else(|| Failure::input(format!("dtype {dtype:?}: expected bfloat16 or float32")))?;
    let model = local_model(model, dir, env).await?;
    let adapter = match adapter {
        "" => None,
        url => {
            // A folder of its own: the adapter's name may be the base's.
            let into = dir.join("adapter");
            std::fs::create_dir_all(&into).map_err(|e| Failure::transient(into.display(), e))?;
            Some(local_model(url, &into, env).await?)
        }
    };
    open(&model, adapter.as_deref(), acts, dtype, env).await
}

/// Starts a helper (written into the task's scratch folder) and loads `model` in it in `dtype`, with `adapter`
/// applied at run time (PEFT, unmerged) when given, on the task's threads.
async fn open(
    model: &Path,
    adapter: Option<&Path>,
    activations: Activations,
    dtype: Dtype,
    env: &Env,
) -> Result<Opened, Failure> {
    let python = crate::transformers::python().ok_or_else(|| {
        Failure::transient("transformers", "no QUANTFARM_TRANSFORMERS_PYTHON on this worker (it does not advertise it)")
    })?;
    let mut helper = Transformers::start(&python, &env.scratch).await?;
    let v = &helper.versions;
    let mut run = pb::TransformersRun {
        torch: v.torch.clone(),
        transformers: v.transformers.clone(),
        compressed_tensors: v.compressed_tensors.clone(),
        peft: v.peft.clone(),
        device: v.device.clone(),
        device_name: v.device_name.clone(),
        activations: activations.name().to_string(),
        ..Default::default()
    };
    match helper.load(model, activations, adapter, dtype, env.threads).await {
        Ok(loaded) => {
            run.quantized = loaded.quantized;
            run.scheme = loaded.scheme;
            run.dtype = loaded.dtype;
            Ok(Opened::Ready(Box::new(helper), run))
        }
        Err(Error::Input { msg, .. }) => {
            helper.stop().await;
            run.load_error = msg;
            Ok(Opened::Refused(run))
        }
        Err(e) => Err(e.into()),
    }
}
