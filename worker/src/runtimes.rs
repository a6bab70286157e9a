//! The external runtimes this machine has: llama.cpp's tools (for peer tasks, which run them as they are) and
//! mlx-lm and transformers, found once at registration and advertised with the worker's kinds.

use std::path::{Path, PathBuf};

/// Where llama.cpp's tools are looked for: `$QUANTFARM_LLAMA_BIN`, then PATH.
fn tool_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("QUANTFARM_LLAMA_BIN").map(PathBuf::from).into_iter().collect();
    if let Some(p) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    dirs
}

/// The path of a llama.cpp tool (`llama-perplexity`, …) on this machine.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    tool_dirs().into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// The external runtimes this machine has, so a release can ask for a peer tool's own figures beside quantfarm's
/// (link 2 across real runtimes): llama.cpp's tools on PATH or in `$QUANTFARM_LLAMA_BIN`, mlx-lm run by
/// `python3` (or `$QUANTFARM_PYTHON`, e.g. the environment `scripts/install-mlx-runtime` makes), and transformers
/// run by `$QUANTFARM_TRANSFORMERS_PYTHON` (`scripts/install-llm-compressor`'s environment).
pub fn runtimes() -> Vec<String> {
    runtimes_in(&tool_dirs(), &python(), crate::transformers::python().as_deref())
}

/// The Python that runs the mlx-lm helper: `$QUANTFARM_PYTHON`, else `python3`.
pub fn python() -> PathBuf {
    std::env::var_os("QUANTFARM_PYTHON").map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

/// Names a worker advertises: `llama-perplexity`, `llama-server`, `llama-completion` (each when found in `dirs`),
/// `mlx_lm` (when the mlx-lm helper, run by `python`, answers the version handshake: `crate::mlx_lm::handshake`),
/// `transformers` (when `transformers_python` is given and its transformers helper answers its own handshake).
pub fn runtimes_in(dirs: &[PathBuf], python: &Path, transformers_python: Option<&Path>) -> Vec<String> {
    let mut out = Vec::new();
    for tool in ["llama-perplexity", "llama-server", "llama-completion"] {
        if dirs.iter().any(|d| d.join(tool).is_file()) {
            out.push(tool.to_string());
        }
    }
    match crate::mlx_lm::handshake(python, &std::env::temp_dir().join("quantfarm-mlx")) {
        Ok(v) => {
            tracing::debug!(mlx = %v.mlx, mlx_lm = %v.mlx_lm, device = %v.device, "mlx-lm runtime found");
            out.push("mlx_lm".to_string());
        }
        // Said out loud when a Python was named for it: the user expected mlx-lm.
        Err(e) if std::env::var_os("QUANTFARM_PYTHON").is_some() => tracing::warn!("no mlx-lm runtime: {e}"),
        Err(e) => tracing::debug!("no mlx-lm runtime: {e}"),
    }
    if let Some(python) = transformers_python {
        match crate::transformers::handshake(python, &std::env::temp_dir().join("quantfarm-transformers")) {
            Ok(v) => {
                tracing::debug!(torch = %v.torch, transformers = %v.transformers, "transformers runtime found");
                out.push(crate::transformers::RUNTIME.to_string());
            }
            // Said out loud: a Python was named for it, so the user expected transformers.
            Err(e) => tracing::warn!("no transformers runtime: {e}"),
        }
    }
    out
}
