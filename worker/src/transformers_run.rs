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
use crate::helper::Error;
use crate::transformers::{Activations, Transformers};

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

/// Starts a helper (written into the task's scratch folder) and loads `model` in it, on the task's threads.
pub async fn open(model: &Path, activations: Activations, env: &Env) -> Result<Opened, Failure> {
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
    match helper.load(model, activations, None, env.threads).await {
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
