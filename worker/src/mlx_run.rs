//! One task's mlx-lm: a helper started for the task (`crate::mlx_lm`) with its model loaded, what the report records
//! of the run (`MlxLmRun`: versions, device, how the model was loaded), and the helper's errors as task failures.
//!
//! A checkpoint mlx-lm refuses to load is not a task failure: the task answers with the refusal in
//! `MlxLmRun.load_error`, so the rest of the release goes on and the report shows the rung as not measured, with
//! mlx-lm's own message.

use std::path::Path;

use quantfarm_proto as pb;

use crate::failure::Failure;
use crate::mlx_lm::{Error, MlxLm};

/// The helper's errors by what a retry can do: a helper that died or could not start may run elsewhere (transient);
/// a request the helper refused will be refused again (input); anything else is a bug (internal).
pub fn failure(e: Error) -> Failure {
    match e {
        Error::Start { .. } | Error::Died { .. } => Failure::transient("mlx-lm", &e),
        Error::Input { .. } => Failure::input(e.to_string()),
        Error::Runtime { .. } | Error::Protocol { .. } => Failure::internal(e.to_string()),
    }
}

/// What opening a model gave: a helper ready to run it, or mlx-lm's refusal to load it.
pub enum Opened {
    Ready(Box<MlxLm>, pb::MlxLmRun),
    Refused(pb::MlxLmRun),
}

/// Starts a helper (written into `scratch`) and loads `model` in it. On mlx's CPU build a quantized model's floating
/// parameters are made f32 (its quantized matmul accumulates bf16 activations otherwise); on a GPU, models run as
/// their users run them.
pub async fn open(model: &Path, scratch: &Path) -> Result<Opened, Failure> {
    let mut helper = MlxLm::start(&crate::runtimes::python(), scratch).await.map_err(failure)?;
    let v = &helper.versions;
    let mut run = pb::MlxLmRun {
        mlx: v.mlx.clone(),
        mlx_lm: v.mlx_lm.clone(),
        device: v.device.clone(),
        device_name: v.device_name.clone(),
        ..Default::default()
    };
    let upcast = v.device == "cpu";
    match helper.load(model, upcast).await {
        Ok(loaded) => {
            run.quantized = loaded.quantized;
            run.upcast = loaded.upcast;
            Ok(Opened::Ready(Box::new(helper), run))
        }
        Err(Error::Input { msg }) => {
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
            (Error::Died { msg: msg() }, FailureKind::Transient),
            (Error::Start { python: "p".into(), msg: msg() }, FailureKind::Transient),
            (Error::Input { msg: msg() }, FailureKind::Input),
            (Error::Runtime { msg: msg() }, FailureKind::Internal),
            (Error::Protocol { op: "greedy", msg: msg() }, FailureKind::Internal),
        ] {
            let text = e.to_string();
            let f = failure(e);
            assert_eq!(f.kind, kind, "{text}");
            assert!(f.message.contains(&text), "{} / {text}", f.message);
        }
    }
}
