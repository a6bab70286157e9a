//! The store's errors, by what they mean for the caller rather than where they came from (after `object_store`'s
//! `Error::NotFound { path }`): each names the file or object it is about.
//!
//! [`Error::is_transient`] is the one question a retry policy asks: a timeout or a dropped connection may go away
//! on its own; a missing object, an existing output or a malformed location will not.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No file or object at `path`.
    #[error("{path}: not found")]
    NotFound { path: String },

    /// An output that already exists and may not be replaced.
    #[error("{}: already exists (refusing to replace it)", path.display())]
    Exists { path: PathBuf },

    /// A location string that is not a path, `file://`, `s3://bucket/key` or `memory://` URL, or an unsafe key.
    #[error("{location}: {msg}")]
    InvalidLocation { location: String, msg: String },

    /// A read past the end of the file: the bytes asked for are not there (a file shorter than its header says).
    #[error("{path}: {len} bytes at {offset} run past the end ({size} bytes)")]
    OutOfRange { path: String, offset: u64, len: u64, size: u64 },

    /// The store answered a ranged read with more or fewer bytes than asked for.
    #[error("{path}: {msg}")]
    ShortRead { path: String, msg: String },

    /// A local file system error other than a missing file.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// An object store error other than a missing object: a timeout, a refused connection, a server error.
    #[error("{path}: object store: {source}")]
    Backend {
        path: String,
        #[source]
        source: Box<object_store::Error>,
    },
}

impl Error {
    /// Whether trying again may succeed: connection and server trouble, and local I/O errors other than a missing
    /// file or a refused permission (a full disk on one machine, say, is another machine's success).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::NotFound { .. }
            | Error::Exists { .. }
            | Error::InvalidLocation { .. }
            | Error::OutOfRange { .. } => false,
            Error::ShortRead { .. } | Error::Backend { .. } => true,
            Error::Io { source, .. } => !matches!(
                source.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::InvalidInput
            ),
        }
    }

    /// An `object_store` error about `path`, by meaning.
    pub fn from_store(path: impl Into<String>, source: object_store::Error) -> Error {
        let path = path.into();
        match source {
            object_store::Error::NotFound { .. } => Error::NotFound { path },
            object_store::Error::AlreadyExists { .. } => Error::Exists { path: path.into() },
            source => Error::Backend { path, source: Box::new(source) },
        }
    }

    /// A local I/O error about `path`, by meaning.
    pub fn from_io(path: impl Into<String>, source: std::io::Error) -> Error {
        let path = path.into();
        match source.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound { path },
            std::io::ErrorKind::AlreadyExists => Error::Exists { path: path.into() },
            _ => Error::Io { path, source },
        }
    }
}
