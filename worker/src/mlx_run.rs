//! One task's mlx-lm: a helper started for the task (`crate::mlx_lm`) with its model loaded, what the report records
//! of the run (`MlxLmRun`: versions, device, how the model was loaded), and the helper's errors as task failures.
//!
//! A checkpoint mlx-lm refuses to load is not a task failure: the task answers with the refusal in
//! `MlxLmRun.load_error`, so the rest of the release goes on and the report shows the rung as not measured, with
//! mlx-lm's own message.

use std::path::{Path, PathBuf};

use quantfarm_proto as pb;
use quantfarm_quant::mlx_file::{quantize_mlx_checkpoint, MlxOptions};
use quantfarm_store::Location;
use quantfarm_tensors::convert::plan_hf_to_mlx;
use quantfarm_tensors::{Format, TensorSource};
use sha2::{Digest, Sha256};

use crate::env::Env;
use crate::failure::Failure;
use crate::mlx_lm::{Error, MlxLm};

/// The checkpoint mlx-lm is given for a model.
pub struct Checkpoint {
    pub path: PathBuf,
    /// Why it is quantfarm's MLX conversion of the model rather than the model's own folder (empty when it is not).
    pub converted: String,
}

/// The checkpoint mlx-lm loads for the model at `url`, fetched to the local folder `model`: the folder itself, or,
/// for an HF checkpoint whose layout mlx-lm's model cannot load (its mapping's `mlx.split`: gpt-oss's fused experts
/// saved in bf16, which mlx-lm 0.32.2's `sanitize` does not take), quantfarm's unquantized MLX conversion of it: the
/// model's own parameters, as `mlx_lm.convert` without `-q` writes them from a checkpoint it can load (the same
/// weights in the layout mlx-lm's model holds them; `tests/tests/mlx_families.rs` checks that layout against
/// mlx-lm's). The conversion is made once per worker for a model of known digest (a farm-made one: `Task.inputs`)
/// and kept in the worker's cache (`Cache::derived`), so the model's greedy, KLD and probe tasks share it; else it
/// is made into the task's folder `dir`.
pub async fn checkpoint(url: &str, model: PathBuf, dir: &Path, env: &Env) -> Result<Checkpoint, Failure> {
    let plain = |path| Ok(Checkpoint { path, converted: String::new() });
    let Ok(src) = TensorSource::open(&Location::local(&model)).await else { return plain(model) };
    // A checkpoint quantfarm cannot plan is left to mlx-lm, whose own message the report shows.
    let plan = match plan_hf_to_mlx(&src) {
        Ok(plan) if src.format() == Format::Safetensors => plan,
        _ => return plain(model),
    };
    let Some(split) = plan.tensors.iter().find(|t| t.part.is_some()) else { return plain(model) };
    let converted = format!(
        "quantfarm's unquantized MLX conversion of {}: mlx-lm's model cannot load its layout ({} is split into the \
         model's own parameters, e.g. {})",
        model.display(),
        split.sources.first().map_or("a fused tensor", String::as_str),
        split.name
    );
    let opts = MlxOptions { budget: env.budget, overwrite: true, ..MlxOptions::unquantized() };
    let convert = |out: PathBuf| {
        let (src, opts, model) = (&src, &opts, &model);
        async move {
            quantize_mlx_checkpoint(src, &Location::local(&out), opts)
                .await
                .map(drop)
                .map_err(|e| Failure::internal(format!("{}: its MLX conversion for mlx-lm: {e}", model.display())))
        }
    };
    if let (Some(cache), Some(input)) = (&env.cache, env.input(url)) {
        // Named by the model's digest and the conversion's version: another quantfarm may convert differently.
        let key = quantfarm_store::hex(&Sha256::digest(
            format!("mlx-lm layout of {} by quantfarm {}", input.sha256, env!("CARGO_PKG_VERSION")).as_bytes(),
        ));
        if let Some(pin) = cache.derived(&key, input.bytes, env.budget, convert).await? {
            let path = pin.path().to_path_buf();
            env.keep(pin);
            tracing::info!(model = %model.display(), at = %path.display(), "{converted}");
            return Ok(Checkpoint { path, converted });
        }
    }
    let out = dir.join("mlx-lm-layout");
    convert(out.clone()).await?;
    tracing::info!(model = %model.display(), "{converted}");
    Ok(Checkpoint { path: out, converted })
}

/// The helper's errors by what a retry can do: a helper that died or could not start may run elsewhere (transient);
/// a request the helper refused will be refused again (input); anything else is a bug (internal).
pub fn failure(e: Error) -> Failure {
    e.into()
}

/// What opening a model gave: a helper ready to run it, or mlx-lm's refusal to load it.
pub enum Opened {
    Ready(Box<MlxLm>, pb::MlxLmRun),
    Refused(pb::MlxLmRun),
}

/// Starts a helper (written into `scratch`) and loads `model` in it. On mlx's CPU build a quantized model's floating
/// parameters are made f32 (its quantized matmul accumulates bf16 activations otherwise); on a GPU, models run as
/// their users run them.
pub async fn open(model: &Checkpoint, scratch: &Path) -> Result<Opened, Failure> {
    let mut helper = MlxLm::start(&crate::runtimes::python(), scratch).await.map_err(failure)?;
    let v = &helper.versions;
    let mut run = pb::MlxLmRun {
        mlx: v.mlx.clone(),
        mlx_lm: v.mlx_lm.clone(),
        device: v.device.clone(),
        device_name: v.device_name.clone(),
        converted: model.converted.clone(),
        ..Default::default()
    };
    let upcast = v.device == "cpu";
    match helper.load(&model.path, upcast).await {
        Ok(loaded) => {
            run.quantized = loaded.quantized;
            run.upcast = loaded.upcast;
            Ok(Opened::Ready(Box::new(helper), run))
        }
        Err(Error::Input { msg, .. }) => {
            helper.stop().await;
            run.load_error = msg;
            Ok(Opened::Refused(run))
        }
        Err(e) => Err(failure(e)),
    }
}

/// Token ids as mlx-lm takes them (llama.cpp's are `i32`; a negative one is no token).
pub fn ids(tokens: &[i32], what: &str) -> Result<Vec<u32>, Failure> {
    tokens
        .iter()
        .map(|&t| u32::try_from(t).map_err(|_| Failure::input(format!("{what}: token id {t} is negative"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use quantfarm_proto::FailureKind;

    /// A helper killed mid-task is retried (elsewhere: the coordinator prefers another worker than the one a task
    /// failed on); a request mlx-lm refuses is not.
    #[test]
    fn helper_errors_keep_their_meaning_as_failures() {
        let msg = || "m".to_string();
        for (e, kind) in [
            (Error::Died { runtime: "mlx-lm", msg: msg() }, FailureKind::Transient),
            (Error::Start { runtime: "mlx-lm", python: "p".into(), msg: msg() }, FailureKind::Transient),
            (Error::Input { runtime: "mlx-lm", msg: msg() }, FailureKind::Input),
            (Error::Runtime { runtime: "mlx-lm", msg: msg() }, FailureKind::Internal),
            (Error::Protocol { runtime: "mlx-lm", op: "greedy", msg: msg() }, FailureKind::Internal),
        ] {
            let text = e.to_string();
            let f = failure(e);
            assert_eq!(f.kind, kind, "{text}");
            assert!(f.message.contains(&text), "{} / {text}", f.message);
        }
    }
}
