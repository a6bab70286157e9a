//! The one error type of this crate. Every variant names the file (object) it is about, and format errors name the
//! field, so a user can tell which input is wrong and how.

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file's bytes do not follow its format.
    #[error("{file}: {field}: {msg}")]
    Format { file: String, field: String, msg: String },

    /// Reading or writing a file or object: not found, exists, a bad location, a connection error
    /// ([`quantfarm_store::Error`] says which).
    #[error(transparent)]
    Store(#[from] quantfarm_store::Error),

    /// A folder that holds no model of the format asked for.
    #[error("{location}: {msg}")]
    NoModel { location: String, msg: String },

    #[error("{file}: no tensor named {name:?}")]
    NoSuchTensor { file: String, name: String },

    /// A read that cannot be done within the memory budget (e.g. a single row larger than the budget).
    #[error("{file}: tensor {tensor:?}: {msg}")]
    Budget { file: String, tensor: String, msg: String },

    /// An architecture mapping (`mappings/*.yaml`) that does not parse or validate; `msg` names the line.
    #[error("mapping {file}: {msg}")]
    Mapping { file: String, msg: String },

    /// A checkpoint tensor that no rule of the mapping renames or drops (convert_hf_to_gguf's
    /// `ModelBase.map_tensor_name` "Can not map tensor").
    #[error("cannot map tensor '{tensor}' (mapping {mapping})")]
    Unmapped { tensor: String, mapping: String },

    #[error(transparent)]
    Dequant(#[from] crate::dequant::DequantError),
}

impl Error {
    pub(crate) fn format(file: impl Into<String>, field: impl Into<String>, msg: impl Into<String>) -> Error {
        Error::Format { file: file.into(), field: field.into(), msg: msg.into() }
    }
}
