//! What an executor may use: its share of the worker's memory and cores, a scratch folder, the worker's cache of
//! fetched inputs, and the task's inputs as the coordinator recorded them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quantfarm_proto as pb;

use crate::cache::{Cache, Pinned};

/// What an executor may use.
#[derive(Clone, Default)]
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
    /// The worker's cache of fetched inputs (`--cache-size`), if it has one.
    pub cache: Option<Arc<Cache>>,
    /// This task's farm-made inputs by URL, with their recorded digests (`Task.inputs`).
    pub inputs: Arc<HashMap<String, pb::InputFile>>,
    /// The cache entries this task reads: kept until the task ends (its `Env` is dropped).
    pub pins: Arc<Mutex<Vec<Pinned>>>,
    /// Milliseconds this task spent fetching inputs from the store (reported with its outcome).
    pub fetch_ms: Arc<AtomicU64>,
}

impl Env {
    /// The env of one task: its recorded output digest and inputs, and pins of its own.
    pub fn for_task(&self, t: &pb::Task) -> Env {
        Env {
            known_output: Some(t.known_output_sha256.clone()).filter(|s| !s.is_empty()),
            inputs: Arc::new(t.inputs.iter().map(|i| (i.url.clone(), i.clone())).collect()),
            pins: Arc::default(),
            fetch_ms: Arc::default(),
            ..self.clone()
        }
    }

    /// The recorded digest of the farm-made file at `url`, when the task lists it.
    pub fn input(&self, url: &str) -> Option<&pb::InputFile> {
        self.inputs.get(url)
    }

    /// Counts time spent fetching inputs.
    pub fn fetched_for(&self, d: Duration) {
        self.fetch_ms.fetch_add(d.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn fetch_ms(&self) -> u64 {
        self.fetch_ms.load(Ordering::Relaxed)
    }

    /// Keeps a cache entry for the rest of the task.
    pub fn keep(&self, pin: Pinned) {
        self.pins.lock().unwrap_or_else(|p| p.into_inner()).push(pin);
    }
}
