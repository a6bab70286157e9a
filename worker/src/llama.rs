//! llama.cpp as the evaluation executors use it (through `quantfarm-eval`): models loaded with the task's threads,
//! blocking work kept off the async threads, and the evaluation text tokenized as the release planned it.

use std::path::{Path, PathBuf};

use quantfarm_eval::kld::base_file::BaseHeader;
use quantfarm_eval::kld::{session_for, tokenize_text};
use quantfarm_eval::prepare::prepare;
use quantfarm_eval::{LoadOptions, Model};
use quantfarm_proto as pb;
use sha2::{Digest, Sha256};

use crate::env::Env;
use crate::failure::Failure;

/// Runs blocking llama.cpp work off the async threads.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Failure> + Send + 'static,
) -> Result<T, Failure> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Failure::internal(format!("the evaluation thread failed: {e}")))?
}

/// A GGUF model with the worker's threads; with a GGUF LoRA applied at run time at scale 1 when `lora` is given.
pub fn load(path: &Path, lora: Option<PathBuf>, env: &Env) -> Result<Model, Failure> {
    let opts = LoadOptions { threads: env.threads, lora: lora.map(|l| (l, 1.0)), ..LoadOptions::default() };
    Ok(Model::load(path, &opts)?)
}

/// A model ready for llama.cpp: loaded from a GGUF file, or from the exact conversion of an MLX folder; with a GGUF
/// LoRA applied at run time at scale 1 when `lora` is given. The note says what was converted, if anything.
pub fn load_prepared(
    path: &Path,
    lora: Option<PathBuf>,
    workdir: &Path,
    env: &Env,
) -> Result<(Model, Option<String>), Failure> {
    let prepared = prepare(path, Some(workdir))?;
    let model = load(&prepared.path, lora, env)?;
    Ok((model, prepared.note.clone()))
}

/// The task's KL-divergence settings, which it must carry.
pub fn settings(s: &Option<pb::KldSettings>) -> Result<&pb::KldSettings, Failure> {
    s.as_ref().ok_or_else(|| Failure::input("the task has no KL-divergence settings"))
}

/// sha256 over the tokens as little-endian i32s: how a plan names the text's tokens.
pub fn tokens_sha256(tokens: &[i32]) -> String {
    let mut h = Sha256::new();
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    quantfarm_store::hex(&h.finalize())
}

/// An evaluation error as a task failure; one about a setting names it as the release spells it
/// (`evaluation.ctx`, `imatrix.text`), not as the command line does.
pub fn eval_failure(e: quantfarm_eval::Error, s: &pb::KldSettings) -> Failure {
    use quantfarm_eval::{Error, Setting};
    match e {
        Error::Setting { setting, msg } if !s.section.is_empty() => {
            let key = format!("{}.{}", s.section, setting.key());
            match setting {
                Setting::Text => Failure::input(format!("{key} ({}): {msg}", s.text)),
                Setting::Ctx | Setting::Batch | Setting::Chunks => Failure::input(format!("{key}: {msg}")),
            }
        }
        e => e.into(),
    }
}

/// The text's whole chunks as the reference tokenizes them.
pub fn tokenize(model: &Model, text: &str, s: &pb::KldSettings) -> Result<BaseHeader, Failure> {
    let max = (s.max_chunks > 0).then_some(s.max_chunks as usize);
    tokenize_text(model, text, s.ctx, max).map_err(|e| eval_failure(e, s))
}

/// A session shaped like llama-perplexity's for the settings' chunking.
pub fn session<'m>(model: &'m Model, s: &pb::KldSettings) -> Result<quantfarm_eval::Session<'m>, Failure> {
    session_for(model, s.ctx, s.batch).map_err(|e| eval_failure(e, s))
}

/// [`tokenize`], refusing tokens other than the plan's (the text or the tokenizer changed since).
pub fn tokenize_as_planned(
    model: &Model,
    text: &str,
    s: &pb::KldSettings,
    planned: &str,
) -> Result<BaseHeader, Failure> {
    let header = tokenize(model, text, s)?;
    let sha = tokens_sha256(&header.tokens);
    if sha != planned {
        return Err(Failure::input(format!(
            "{}: the text's tokens changed since the release was planned (sha256 {sha}, planned {planned})",
            s.text
        )));
    }
    Ok(header)
}
