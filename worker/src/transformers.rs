//! Hugging Face transformers as a runtime: a client for the helper program
//! `worker/transformers/quantfarm_transformers.py` (its protocol is documented at its top; the requests it shares
//! with mlx-lm's helper are `crate::helper`'s), which runs HF checkpoints, and with compressed-tensors the vLLM
//! checkpoints, as transformers loads them. It needs a Python with `torch`, `transformers` and `compressed-tensors`
//! (`scripts/install-llm-compressor`'s environment), named by `$QUANTFARM_TRANSFORMERS_PYTHON`; a worker advertises
//! `transformers` only when the helper answers the version handshake.

use std::path::Path;

use serde::Deserialize;
use serde_json::json;

use crate::helper::{self, Error, Helper, Script};

/// The helper program, as shipped in the repository.
pub const HELPER: &str = include_str!("../transformers/quantfarm_transformers.py");

/// The transformers helper.
pub const SCRIPT: Script = Script {
    runtime: "transformers",
    text: HELPER,
    stem: "quantfarm_transformers",
    // One thread per helper is the worker's share of the machine; tokenizers' own pool stays off.
    env: &[("TOKENIZERS_PARALLELISM", "false"), ("TRANSFORMERS_VERBOSITY", "error")],
};

/// The runtime name workers advertise when the helper answers its handshake.
pub const RUNTIME: &str = "transformers";

/// What the handshake tells: the versions and the device, recorded in the report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Versions {
    pub torch: String,
    pub transformers: String,
    pub compressed_tensors: String,
    pub peft: String,
    pub device: String,
    pub device_name: String,
}

/// Which activations a vLLM checkpoint runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activations {
    /// As its scheme says: FP8_DYNAMIC's inputs quantized per token to e4m3 and back (vLLM's W8A8, emulated).
    AsSaved,
    /// Its decompressed weights with bf16 inputs (vLLM's weight-only path).
    WeightOnly,
}

impl Activations {
    pub fn name(self) -> &'static str {
        match self {
            Activations::AsSaved => "as-saved",
            Activations::WeightOnly => "weight-only",
        }
    }

    /// The inverse of [`Activations::name`]; empty is as-saved.
    pub fn parse(s: &str) -> Option<Activations> {
        match s {
            "" | "as-saved" => Some(Activations::AsSaved),
            "weight-only" => Some(Activations::WeightOnly),
            _ => None,
        }
    }
}

/// The dtype a model runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    Bf16,
    /// The weights widened exactly (the merge check's pair: the merge, not bf16 arithmetic, is compared).
    F32,
}

impl Dtype {
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bfloat16",
            Dtype::F32 => "float32",
        }
    }

    /// The inverse of [`Dtype::name`]; empty is bfloat16.
    pub fn parse(s: &str) -> Option<Dtype> {
        match s {
            "" | "bfloat16" => Some(Dtype::Bf16),
            "float32" => Some(Dtype::F32),
            _ => None,
        }
    }
}

/// A probe's answer: the content, why it ended (`stop` or `length`) and the prompt's tokens.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Chat {
    pub content: String,
    pub finish: String,
    pub prompt_tokens: u64,
}

/// A loaded model: whether it is a compressed-tensors checkpoint, its weights' scheme and the dtype it runs in.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Loaded {
    pub quantized: bool,
    pub scheme: String,
    pub dtype: String,
    pub vocab: Option<u32>,
}

/// A running transformers helper.
pub struct Transformers {
    helper: Helper,
    pub versions: Versions,
}

impl Transformers {
    /// Writes the helper into `dir`, starts it with `python` and shakes hands.
    pub async fn start(python: &Path, dir: &Path) -> Result<Transformers, Error> {
        let helper = Helper::start(SCRIPT, python, dir).await?;
        let versions = helper.parse("hello", helper.hello.clone())?;
        Ok(Transformers { helper, versions })
    }

    /// `from_pretrained` of a checkpoint folder in bf16 (a vLLM checkpoint decompressed, with `activations`), with a
    /// PEFT adapter applied at run time when `adapter` is given, run on `threads` threads.
    pub async fn load(
        &mut self,
        model: &Path,
        activations: Activations,
        adapter: Option<&Path>,
        dtype: Dtype,
        threads: usize,
    ) -> Result<Loaded, Error> {
        let req = json!({
            "model": model, "activations": activations.name(), "adapter": adapter, "dtype": dtype.name(),
            "threads": threads.max(1)
        });
        let v = self.helper.call("load", req).await?;
        self.helper.parse("load", v)
    }

    /// One probe's answer (`probe`, its `repeat`-th pass seeding the sampling when its temperature is above 0): the
    /// chat rendered by the checkpoint's template with the probe's kwargs, then generated.
    pub async fn chat(&mut self, probe: &quantfarm_eval::probe::Probe, repeat: usize) -> Result<Chat, Error> {
        let req = json!({
            "messages": probe.messages, "kwargs": probe.kwargs, "max_tokens": probe.max_tokens,
            "temperature": probe.temperature, "seed": repeat,
        });
        let v = self.helper.call("chat", req).await?;
        self.helper.parse("chat", v)
    }

    /// The helper client itself, for the loops the runtimes share (`crate::exec`'s `helper_runs`).
    pub fn helper(&mut self) -> &mut Helper {
        &mut self.helper
    }

    /// Stops the helper.
    pub async fn stop(self) {
        self.helper.stop().await
    }
}

/// The Python that runs the transformers helper: `$QUANTFARM_TRANSFORMERS_PYTHON` (no default: the runtime is only
/// advertised where a pinned environment was named).
pub fn python() -> Option<std::path::PathBuf> {
    std::env::var_os("QUANTFARM_TRANSFORMERS_PYTHON").map(std::path::PathBuf::from)
}

/// The handshake alone, blocking: what a worker checks before it advertises `transformers`.
pub fn handshake(python: &Path, dir: &Path) -> Result<Versions, Error> {
    helper::parse(SCRIPT.runtime, "hello", helper::handshake(SCRIPT, python, dir)?)
}
