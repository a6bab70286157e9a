//! What an executor may use: its share of the worker's memory and cores, and a scratch folder.

/// What an executor may use.
#[derive(Clone)]
pub struct Env {
    /// Bytes of tensor data one task holds at once.
    pub budget: u64,
    /// Scratch folder for fetched inputs and recomputed outputs.
    pub scratch: std::path::PathBuf,
    /// Threads one task may use: the worker's cores shared among its slots.
    pub threads: usize,
    /// The sha256 the farm recorded for this task's output, when it was made before (`Task.known_output_sha256`):
    /// a stored copy with other bytes is corrupt and is made again.
    pub known_output: Option<String>,
}
