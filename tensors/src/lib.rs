//! Model files read and written exactly, streamed within a memory budget.
//!
//! GGUF (v2/v3, split files), safetensors (single and sharded) and MLX checkpoints are parsed from headers only;
//! tensor bytes are read through one [`TensorSource`] over `object_store` (local folder, S3, memory) in ranges that
//! fit a caller's budget, and outputs go through one `StagedSink` so nothing partial is ever visible (both in
//! `quantfarm-store`).

#![forbid(unsafe_code)]

pub mod convert;
pub mod dequant;
pub mod dtype;
pub mod error;
pub mod gguf;
pub mod merge;
pub mod mlx;
pub mod pipeline;
pub mod safetensors;
pub mod source;
pub mod synthetic;
pub mod verify;
pub mod write;

pub use dtype::{Dtype, TensorType};
pub use error::{Error, Result};
pub use quantfarm_ggml::GgmlType;
pub use source::{Format, TensorEntry, TensorSource};
