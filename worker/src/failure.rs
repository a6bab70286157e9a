//! A task's failure, classified by what it means so the coordinator knows whether a retry can help: a missing
//! object, a refused input or a row larger than the memory budget fails the same way on every try (an input
//! failure, not retried); a timeout or a dropped connection may not (transient).

use quantfarm_proto::{self as pb, FailureKind};
use quantfarm_quant::file::FileError;

#[derive(Debug)]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
    /// With [`FailureKind::Corrupt`]: the input whose stored bytes are not the ones its producer recorded.
    pub corrupt_url: Option<String>,
}

impl Failure {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Failure {
        Failure { kind, message: message.into(), corrupt_url: None }
    }

    pub fn input(message: impl Into<String>) -> Failure {
        Failure::new(FailureKind::Input, message)
    }

    pub fn transient(what: impl std::fmt::Display, e: impl std::fmt::Display) -> Failure {
        Failure::new(FailureKind::Transient, format!("{what}: {e}"))
    }

    pub fn internal(message: impl Into<String>) -> Failure {
        Failure::new(FailureKind::Internal, message)
    }

    /// Input `url` was made by another task of the release and recorded with `expected`, but the store now holds
    /// bytes with sha256 `found`: the coordinator has that task make it again.
    pub fn corrupt(url: &str, found: &str, expected: &str) -> Failure {
        Failure {
            kind: FailureKind::Corrupt,
            message: format!("{url}: the stored object has sha256 {found}, its producer recorded {expected}: corrupt"),
            corrupt_url: Some(url.to_string()),
        }
    }

    pub fn into_proto(self) -> pb::TaskFailure {
        pb::TaskFailure {
            kind: self.kind as i32,
            message: self.message,
            corrupt_url: self.corrupt_url.unwrap_or_default(),
        }
    }
}

impl From<quantfarm_store::Error> for Failure {
    fn from(e: quantfarm_store::Error) -> Failure {
        let kind = if e.is_transient() { FailureKind::Transient } else { FailureKind::Input };
        Failure::new(kind, e.to_string())
    }
}

impl From<quantfarm_tensors::Error> for Failure {
    fn from(e: quantfarm_tensors::Error) -> Failure {
        use quantfarm_tensors::Error as E;
        match e {
            E::Store(e) => e.into(),
            e => Failure::input(e.to_string()),
        }
    }
}

impl From<FileError> for Failure {
    fn from(e: FileError) -> Failure {
        match e {
            FileError::Tensors(t) => t.into(),
            other => Failure::input(other.to_string()),
        }
    }
}

impl From<quantfarm_quant::imatrix::ImatrixError> for Failure {
    /// The store's errors keep their kind; the file's are the input's.
    fn from(e: quantfarm_quant::imatrix::ImatrixError) -> Failure {
        match e {
            quantfarm_quant::imatrix::ImatrixError::Tensors(e) => e.into(),
            other => Failure::input(other.to_string()),
        }
    }
}

impl From<quantfarm_quant::mlx_file::MlxFileError> for Failure {
    fn from(e: quantfarm_quant::mlx_file::MlxFileError) -> Failure {
        match e {
            quantfarm_quant::mlx_file::MlxFileError::Tensors(t) => t.into(),
            other => Failure::input(other.to_string()),
        }
    }
}

impl From<quantfarm_quant::vllm_file::VllmFileError> for Failure {
    fn from(e: quantfarm_quant::vllm_file::VllmFileError) -> Failure {
        use quantfarm_quant::vllm_file::VllmFileError as E;
        match e {
            E::Tensors(t) => t.into(),
            E::Store(s) => s.into(),
            other => Failure::input(other.to_string()),
        }
    }
}

impl From<crate::helper::Error> for Failure {
    /// A helper that died or could not start may run elsewhere (transient); a request the helper refused will be
    /// refused again (input); anything else is a bug (internal).
    fn from(e: crate::helper::Error) -> Failure {
        use crate::helper::Error as E;
        match e {
            E::Start { runtime, .. } | E::Died { runtime, .. } => Failure::transient(runtime, &e),
            E::Input { .. } => Failure::input(e.to_string()),
            E::Runtime { .. } | E::Protocol { .. } => Failure::internal(e.to_string()),
        }
    }
}

impl From<quantfarm_eval::Error> for Failure {
    /// llama.cpp's I/O and an unreachable endpoint may pass; everything else is the input's.
    fn from(e: quantfarm_eval::Error) -> Failure {
        use quantfarm_eval::Error as E;
        let kind = match &e {
            E::Io { .. } | E::Endpoint { .. } => FailureKind::Transient,
            _ => FailureKind::Input,
        };
        Failure::new(kind, e.to_string())
    }
}
