//! The crate's one error type: each variant names the file, model or setting it is about.

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file whose bytes or fields do not follow its format.
    #[error("{file}: {field}: {msg}")]
    Format { file: String, field: String, msg: String },

    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },

    /// llama.cpp refused to load, create a context for, or decode with a model.
    #[error("{model}: {msg}")]
    Runtime { model: String, msg: String },

    /// Two inputs that must agree do not (vocabulary, context, tokens of a base file and a model).
    #[error("{what}: {msg}")]
    Mismatch { what: String, msg: String },

    /// An evaluation setting that cannot be used as given. Shown with the command line's spelling (`--ctx`); a
    /// caller that takes its settings elsewhere (a release.yaml's `evaluation.ctx`) names them by
    /// [`Setting::key`] instead.
    #[error("{}: {msg}", setting.flag())]
    Setting { setting: Setting, msg: String },

    #[error(transparent)]
    Stats(#[from] quantfarm_parity::StatsError),

    /// A chat template that does not render.
    #[error("chat template of {model}: {msg}")]
    Template { model: String, msg: String },

    /// An OpenAI-compatible server that cannot be reached or answers something unexpected.
    #[error("{endpoint}: {msg}")]
    Endpoint { endpoint: String, msg: String },

    /// A non-GGUF model that could not be converted for evaluation.
    #[error("{model}: cannot convert for evaluation: {source}")]
    Convert {
        model: String,
        #[source]
        source: quantfarm_tensors::Error,
    },
}

/// The settings of a KL-divergence or imatrix pass, as llama-perplexity and llama-imatrix take them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// The text's tokens per chunk (`-c`).
    Ctx,
    /// Tokens per decode (`-b`).
    Batch,
    /// How many chunks to evaluate (`--chunks`).
    Chunks,
    /// The text evaluated (`-f`).
    Text,
}

impl Setting {
    /// The command line's flag.
    pub fn flag(self) -> &'static str {
        match self {
            Setting::Ctx => "--ctx",
            Setting::Batch => "--batch",
            Setting::Chunks => "--chunks",
            Setting::Text => "--text",
        }
    }

    /// The key in a settings section (`ctx` of release.yaml's `evaluation:` or `imatrix:`).
    pub fn key(self) -> &'static str {
        match self {
            Setting::Ctx => "ctx",
            Setting::Batch => "batch",
            Setting::Chunks => "chunks",
            Setting::Text => "text",
        }
    }
}

impl Error {
    pub(crate) fn setting(setting: Setting, msg: impl Into<String>) -> Error {
        Error::Setting { setting, msg: msg.into() }
    }

    pub(crate) fn format(file: impl Into<String>, field: impl Into<String>, msg: impl Into<String>) -> Error {
        Error::Format { file: file.into(), field: field.into(), msg: msg.into() }
    }

    pub(crate) fn runtime(model: impl Into<String>, msg: impl Into<String>) -> Error {
        Error::Runtime { model: model.into(), msg: msg.into() }
    }

    pub(crate) fn mismatch(what: impl Into<String>, msg: impl Into<String>) -> Error {
        Error::Mismatch { what: what.into(), msg: msg.into() }
    }
}
