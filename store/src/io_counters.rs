//! Process-wide counts of the bytes read from and written to an object store (S3) through [`crate::blob::Blob`]
//! and [`crate::sink::StagedSink`]: every tensor, header and file quantfarm itself moves over the network. Local
//! files (a folder store, a worker's cache and scratch) are not counted: they are no store traffic. Workers send
//! the counts to the coordinator, whose metrics show them per worker.

use std::sync::atomic::{AtomicU64, Ordering};

static READ: AtomicU64 = AtomicU64::new(0);
static WRITTEN: AtomicU64 = AtomicU64::new(0);

/// Bytes read since the process started.
pub fn bytes_read() -> u64 {
    READ.load(Ordering::Relaxed)
}

/// Bytes written (staged, committed or not) since the process started.
pub fn bytes_written() -> u64 {
    WRITTEN.load(Ordering::Relaxed)
}

pub(crate) fn add_read(n: usize) {
    READ.fetch_add(n as u64, Ordering::Relaxed);
}

pub(crate) fn add_written(n: usize) {
    WRITTEN.fetch_add(n as u64, Ordering::Relaxed);
}
