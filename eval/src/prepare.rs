//! Models that are not GGUF are evaluated after an exact conversion: an HF or MLX checkpoint becomes a GGUF that
//! llama.cpp loads (MLX affine weights dequantized as MLX computes them), so every format is compared in one
//! runtime on the same tokens. BF16 when every float in the checkpoint is bf16 (the dequantized values are then
//! exactly bf16), F32 otherwise. A compressed-tensors checkpoint for vLLM is first dequantized to the bf16
//! checkpoint its weights stand for (`quantfarm_quant::vllm_read`).

use std::path::{Path, PathBuf};

use quantfarm_quant::vllm_file::VllmFileError;
use quantfarm_quant::vllm_read::{compressed, dequantize_vllm_checkpoint};
use quantfarm_store::Location;
use quantfarm_tensors::convert::{convert_hf_to_gguf, OutType};
use quantfarm_tensors::{Dtype, Format, TensorSource, TensorType};

use crate::error::{Error, Result};

/// A model ready for the runtime; a converted one lives in a temporary folder dropped with it.
pub struct Prepared {
    pub path: PathBuf,
    /// What was done to get it (shown to users: "converted from MLX 4-bit, bf16").
    pub note: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

/// Memory budget of the conversion's reads.
const BUDGET: u64 = 256 << 20;

/// A GGUF file is used as it is; an HF or MLX folder is converted into `workdir` (or the system's temp folder).
pub fn prepare(input: &Path, workdir: Option<&Path>) -> Result<Prepared> {
    let name = input.display().to_string();
    if input.is_file() {
        return Ok(Prepared { path: input.to_path_buf(), note: None, _dir: None });
    }
    if !input.is_dir() {
        return Err(Error::runtime(name, "no such model file or folder"));
    }
    let conv = |source: quantfarm_tensors::Error| Error::Convert { model: name.clone(), source };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Io { file: name.clone(), source: e })?;
    let src = Location::local(input);
    let source = rt.block_on(TensorSource::open(&src)).map_err(conv)?;
    let format = source.format();
    if format == Format::Gguf {
        return Err(Error::runtime(name, "a GGUF split folder: give its first file"));
    }
    let dir = match workdir {
        Some(w) => tempfile::Builder::new().prefix("quantfarm-eval-").tempdir_in(w),
        None => tempfile::Builder::new().prefix("quantfarm-eval-").tempdir(),
    }
    .map_err(|e| Error::Io { file: "temporary folder".into(), source: e })?;
    // A vLLM checkpoint: its weights dequantized to the bf16 checkpoint they stand for first (weight-only).
    let ct_error = |e: VllmFileError| Error::runtime(&name, e.to_string());
    let (src, source, what) = match compressed(&source.metadata()).map_err(ct_error)? {
        None => (src, source, format!("converted from {}", format.name())),
        Some(scheme) => {
            let hf = Location::local(dir.path().join("dequantized"));
            rt.block_on(dequantize_vllm_checkpoint(&src, &hf, BUDGET, false)).map_err(ct_error)?;
            let source = rt.block_on(TensorSource::open(&hf)).map_err(conv)?;
            let what = format!(
                "converted from a compressed-tensors checkpoint ({}), its weights dequantized to bf16 as \
                 compressed-tensors decompresses them (vLLM's weight-only path),",
                scheme.name()
            );
            (hf, source, what)
        }
    };
    // 1-D tensors (norms) are F32 in the GGUF whatever the out type, so only the weights decide.
    let all_bf16 = source.tensors().iter().filter(|t| t.shape.len() >= 2).all(|t| match t.ty {
        TensorType::Dtype(d) => {
            !matches!(d, Dtype::F16 | Dtype::F32 | Dtype::F64 | Dtype::F8E4M3 | Dtype::F8E5M2 | Dtype::F8E8M0)
        }
        TensorType::MlxAffine { scale_dtype, .. } => scale_dtype == Dtype::BF16,
        // Every value of a floating-point mode is exact in bf16.
        TensorType::MlxFp { .. } => true,
        TensorType::Ggml(_) => false,
    });
    let out = if all_bf16 { OutType::Bf16 } else { OutType::F32 };
    let dst = Location::local(dir.path());
    let done = rt.block_on(convert_hf_to_gguf(&src, &dst, "model", out, None, BUDGET, false)).map_err(conv)?;
    if done.is_empty() {
        return Err(Error::runtime(&name, "the conversion wrote no file"));
    }
    // The dequantized checkpoint, if any, is not needed once converted (best effort: the folder goes with `dir`).
    let _ = std::fs::remove_dir_all(dir.path().join("dequantized"));
    let path = dir.path().join(quantfarm_tensors::convert::output_file_name("model", 0, done.len()));
    let note = format!("{what} to a {} GGUF for evaluation", out.name());
    tracing::info!(model = %name, "{note}");
    Ok(Prepared { path, note: Some(note), _dir: Some(dir) })
}
