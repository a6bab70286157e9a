//! Evaluation: links 1–4 of the parity method, measured in the runtime users deploy.
//!
//! llama.cpp (through `llama-cpp-2`, the only crate of the workspace that links C++) computes logits; this crate
//! owns what makes the numbers comparable and distributable: llama-perplexity's chunking and base-logits file
//! ([`kld`]), statistics that merge exactly across chunks and workers ([`kld::stats`]), greedy agreement with the
//! model's own chat template ([`greedy`], [`template`]), task probes on the built-in runtime or an
//! OpenAI-compatible server ([`probe`], [`responders`]), and the exact conversion that lets MLX and HF checkpoints
//! be evaluated in the same runtime ([`prepare`]).

pub mod choice;
pub mod error;
pub mod greedy;
pub mod imatrix;
pub mod kld;
pub mod logits;
pub mod prepare;
pub mod probe;
pub mod responders;
pub mod runtime;
mod runtime_log;
pub mod template;

pub use error::{Error, Result, Setting};
pub use runtime::{LoadOptions, Model, Session, Token};
