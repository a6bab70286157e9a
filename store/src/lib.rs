//! Where quantfarm's files live, and how they are read and written.
//!
//! A [`Location`] names one file or object: a local path, `file://`, `s3://bucket/key`, or any `object_store`
//! backend given in code. [`Blob`] reads ranges of one into caller-owned buffers (so memory follows the caller's
//! budget, never the file's size); [`StagedSink`] writes an output to a staging place and makes it visible whole at
//! commit, or not at all, and [`staging`] sweeps what a killed writer staged. [`io_counters`] count what went
//! through both. Errors are by meaning ([`Error`]): a missing object is [`Error::NotFound`], which no retry can
//! fix; a dropped connection is [`Error::Backend`], which one may.
//!
//! This crate knows nothing of model formats: the coordinator uses it without linking any tensor code.

#![cfg_attr(not(test), warn(clippy::unwrap_used))]
#![warn(missing_debug_implementations)]

pub mod blob;
pub mod digest;
pub mod error;
pub mod io_counters;
pub mod location;
pub mod s3;
pub mod sink;
pub mod staging;

pub use blob::Blob;
pub use digest::Digest;
pub use error::{Error, Result};
pub use location::Location;
pub use sink::{Committed, StagedSink};

/// Lower-case hexadecimal of `bytes` (how sha256 digests are written everywhere in quantfarm).
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}
