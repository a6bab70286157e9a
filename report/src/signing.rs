//! Signed release reports: ed25519 over the RFC 8785 canonical form of the report.
//!
//! A parity report is evidence that a quantized artifact was checked; it is only worth something if whoever reads
//! it can tell that it was not edited afterwards (integrity) and, given the farm's public key, that the farm wrote it
//! (authorship). A report signed here carries a `"signature"` member, appended last:
//!
//! ```json
//! "signature": {
//!   "algorithm": "ed25519",
//!   "canonicalization": "RFC8785",
//!   "public_key": "quantfarm-ed25519-public:<base64>",
//!   "fingerprint": "SHA256:<32 hex digits>",
//!   "value": "<base64 of the 64-byte signature>"
//! }
//! ```
//!
//! The signed message is the UTF-8 of [`canonical_json`] of the report object *without* its `"signature"` member,
//! so pretty-printing, reindenting or reordering keys keeps the signature valid while any change to a value breaks
//! it. Verification uses `verify_strict` (no malleable or small-order-key signatures). The embedded public key only
//! proves integrity: anybody can re-sign an edited report with their own key. Authorship needs a key obtained some
//! other way, passed as `pinned` to [`verify_report`].
//!
//! Floats must survive being written and read back bit for bit, or reports holding measurements stop verifying
//! after a trip through a file: serde_json must be built with its `float_roundtrip` feature (its default parser
//! misreads about one double in five by one ULP).
//!
//! # Key text formats
//!
//! Both are one line; trailing (and leading) whitespace, including the final newline, is ignored; base64 is the
//! standard alphabet with padding:
//!
//! - secret key: `quantfarm-ed25519-secret:<base64 of the 32-byte ed25519 seed>`, in a file of mode 0600
//!   (see [`SigningKey::write_new`]) or in an environment variable ([`SigningKey::from_env`]);
//! - public key: `quantfarm-ed25519-public:<base64 of the 32-byte ed25519 public key>`.
//!
//! The prefixes make a key's kind obvious to a person and let errors say "this is the secret key, not the public
//! one" instead of failing on a length. Errors name the file or variable and what was expected, and never echo the
//! text: it may be a secret pasted in the wrong place.
//!
//! # Fingerprint
//!
//! [`PublicKey::fingerprint`] is `SHA256:` followed by the first 16 bytes of SHA-256 of the raw 32-byte public key,
//! as 32 lowercase hex digits: short enough to read aloud, long enough (128 bits) that nobody can make a key that
//! matches a given one.

use std::fmt;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use ed25519_dalek::Signer as _;
use rand_core::{OsRng, RngCore as _};
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};

use crate::canonical::{canonical_json, CanonicalError};

/// Prefix of a secret key's text form.
pub const SECRET_PREFIX: &str = "quantfarm-ed25519-secret:";
/// Prefix of a public key's text form.
pub const PUBLIC_PREFIX: &str = "quantfarm-ed25519-public:";
/// Value of `signature.algorithm`.
pub const ALGORITHM: &str = "ed25519";
/// Value of `signature.canonicalization`.
pub const CANONICALIZATION: &str = "RFC8785";
/// Name of the member that holds the signature.
pub const SIGNATURE_FIELD: &str = "signature";
/// Environment variable that overrides [`default_key_path`].
pub const KEY_FILE_ENV: &str = "QUANTFARM_KEY_FILE";

const SECRET_FORMAT: &str = "one line `quantfarm-ed25519-secret:<base64 of a 32-byte seed>`";
const PUBLIC_FORMAT: &str = "one line `quantfarm-ed25519-public:<base64 of a 32-byte public key>`";

/// Why a key could not be read, parsed, created or written.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key file could not be read.
    #[error("cannot read key file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The environment variable that should hold a key is not set (or not UTF-8).
    #[error("environment variable {var} is not set or is not UTF-8; expected it to hold {SECRET_FORMAT}")]
    EnvMissing {
        /// The variable.
        var: String,
    },
    /// The text is not a key of the expected kind. The text itself is never included.
    #[error("{origin}: {problem}; expected {expected}")]
    Malformed {
        /// Where the text came from: a file, a variable, or "key text".
        origin: String,
        /// What is wrong with it.
        problem: String,
        /// The format that was expected.
        expected: &'static str,
    },
    /// [`SigningKey::write_new`] never replaces a key: the old one may have signed reports that are still out there.
    #[error("refusing to overwrite the existing key file {}: remove or move it first if you really mean to replace it", path.display())]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// The key file or its folder could not be created or written.
    #[error("cannot write key file {}: {source}", path.display())]
    Write {
        /// The file (or the folder that could not be created).
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The operating system's random generator failed.
    #[error("cannot generate a key: the operating system's random number generator failed: {0}")]
    Random(String),
}

/// Why a report could not be signed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// Only a JSON object can carry a `"signature"` member.
    #[error("cannot sign the report: it is {0}, not a JSON object")]
    NotAnObject(&'static str),
    /// Signing twice would either drop the first signature or sign over it; neither is what anybody wants.
    #[error("cannot sign the report: it already has a \"signature\" field")]
    AlreadySigned,
    /// The report holds a value without a canonical form.
    #[error("cannot sign the report: {0}")]
    Canonical(#[from] CanonicalError),
}

/// Why a report did not verify.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The document is not a JSON object.
    #[error("not a signed report: it is {0}, not a JSON object")]
    NotAnObject(&'static str),
    /// The report has no `"signature"` member.
    #[error("the report is not signed: it has no \"signature\" field")]
    MissingSignature,
    /// A member of the signature is missing, of the wrong type, or holds an unsupported or undecodable value.
    #[error("malformed signature: field {field}: {problem}")]
    Malformed {
        /// The field, as `signature.<name>`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The recorded fingerprint is not the fingerprint of the recorded key.
    #[error(
        "malformed signature: signature.fingerprint is {recorded} but the recorded public key's fingerprint is \
         {actual}; the signature block was edited"
    )]
    FingerprintMismatch {
        /// The fingerprint written in the report.
        recorded: String,
        /// The fingerprint of the key written in the report.
        actual: String,
    },
    /// The report was signed, but not by the key it was checked against.
    #[error("the report was signed by key {signer}, expected key {expected}")]
    WrongKey {
        /// Fingerprint of the key in the report.
        signer: String,
        /// Fingerprint of the pinned key.
        expected: String,
    },
    /// The signature does not match the report's content.
    #[error("bad signature by key {signer}: the report was modified after signing or the signature is forged")]
    BadSignature {
        /// Fingerprint of the key in the report.
        signer: String,
    },
    /// The report holds a value without a canonical form, so it cannot have been signed by [`sign_report`].
    #[error("cannot verify the report: {0}")]
    Canonical(#[from] CanonicalError),
}

/// A successful verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Fingerprint of the key that signed the report.
    pub fingerprint: String,
    /// True when checked against a pinned key (authorship and integrity); false when only against the key the
    /// report itself records (integrity only, not authorship).
    pub pinned: bool,
}

/// An ed25519 secret key. Its `Debug` shows only the public fingerprint; the seed is zeroized on drop.
#[derive(Clone)]
pub struct SigningKey(ed25519_dalek::SigningKey);

/// An ed25519 public key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(ed25519_dalek::VerifyingKey);

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey").field("public", &self.public().fingerprint()).finish_non_exhaustive()
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PublicKey").field(&self.to_text()).finish()
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

impl SigningKey {
    /// A new key from the operating system's random generator.
    pub fn generate() -> Result<Self, KeyError> {
        let mut seed = [0u8; 32];
        OsRng.try_fill_bytes(&mut seed).map_err(|e| KeyError::Random(e.to_string()))?;
        let key = ed25519_dalek::SigningKey::from_bytes(&seed);
        seed.fill(0);
        Ok(Self(key))
    }

    /// Parses the text form `quantfarm-ed25519-secret:<base64 seed>`.
    pub fn from_text(text: &str) -> Result<Self, KeyError> {
        Self::parse(text, "secret key text")
    }

    /// The text form, `quantfarm-ed25519-secret:<base64 seed>` (no newline). Handle with care.
    pub fn to_text(&self) -> String {
        format!("{SECRET_PREFIX}{}", BASE64.encode(self.0.as_bytes()))
    }

    /// Reads a key file holding the text form.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let text = read_key_file(path)?;
        Self::parse(&text, &format!("key file {}", path.display()))
    }

    /// Reads the text form from the environment variable `var` (for CI, where the key is a secret variable).
    pub fn from_env(var: &str) -> Result<Self, KeyError> {
        let text = std::env::var(var).map_err(|_| KeyError::EnvMissing { var: var.to_string() })?;
        Self::parse(&text, &format!("environment variable {var}"))
    }

    /// Generates a key and writes it to `path`, which must not exist: mode 0600 on unix, parent folders created
    /// (mode 0700 on unix). A key is never overwritten ([`KeyError::Exists`]).
    pub fn write_new(path: &Path) -> Result<Self, KeyError> {
        let key = Self::generate()?;
        key.write_to_new_file(path)?;
        Ok(key)
    }

    /// The public half.
    pub fn public(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }

    /// An ed25519 signature of `message` as it is (for envelopes that sign bytes, not reports).
    pub fn sign_bytes(&self, message: &[u8]) -> [u8; 64] {
        self.0.sign(message).to_bytes()
    }

    fn parse(text: &str, origin: &str) -> Result<Self, KeyError> {
        let malformed = |problem: &str| KeyError::Malformed {
            origin: origin.to_string(),
            problem: problem.to_string(),
            expected: SECRET_FORMAT,
        };
        let text = text.trim();
        let Some(body) = text.strip_prefix(SECRET_PREFIX) else {
            return Err(malformed(if text.starts_with(PUBLIC_PREFIX) {
                "this is a public key; signing needs the secret key"
            } else if text.is_empty() {
                "it is empty"
            } else {
                "it does not start with `quantfarm-ed25519-secret:`"
            }));
        };
        let seed = decode_32(body).map_err(|problem| malformed(&problem))?;
        Ok(Self(ed25519_dalek::SigningKey::from_bytes(&seed)))
    }

    fn write_to_new_file(&self, path: &Path) -> Result<(), KeyError> {
        let write_err = |path: &Path, source| KeyError::Write { path: path.to_path_buf(), source };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            let mut builder = fs::DirBuilder::new();
            builder.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
            builder.create(parent).map_err(|e| write_err(parent, e))?;
        }
        let mut options = fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                KeyError::Exists { path: path.to_path_buf() }
            } else {
                write_err(path, e)
            }
        })?;
        let written = file.write_all(format!("{}\n", self.to_text()).as_bytes()).and_then(|()| file.sync_all());
        if let Err(e) = written {
            drop(file);
            // A truncated key file would fail later with a confusing parse error; leave nothing behind instead.
            let _ = fs::remove_file(path);
            return Err(write_err(path, e));
        }
        Ok(())
    }
}

impl PublicKey {
    /// Parses the text form `quantfarm-ed25519-public:<base64 key>`.
    pub fn from_text(text: &str) -> Result<Self, KeyError> {
        Self::parse(text, "public key text")
    }

    /// The text form, `quantfarm-ed25519-public:<base64 key>` (no newline).
    pub fn to_text(&self) -> String {
        format!("{PUBLIC_PREFIX}{}", BASE64.encode(self.0.as_bytes()))
    }

    /// Reads a public key file holding the text form.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let text = read_key_file(path)?;
        Self::parse(&text, &format!("public key file {}", path.display()))
    }

    /// Whether `signature` is this key's ed25519 signature of `message` (strict: no malleable signatures).
    pub fn verify_bytes(&self, message: &[u8], signature: &[u8]) -> bool {
        ed25519_dalek::Signature::from_slice(signature).is_ok_and(|s| self.0.verify_strict(message, &s).is_ok())
    }

    /// `SHA256:` + the first 16 bytes of SHA-256 of the raw 32-byte key, as 32 lowercase hex digits.
    pub fn fingerprint(&self) -> String {
        let digest = Sha256::digest(self.0.as_bytes());
        let mut out = String::with_capacity(7 + 32);
        out.push_str("SHA256:");
        for b in &digest[..16] {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }

    fn parse(text: &str, origin: &str) -> Result<Self, KeyError> {
        let malformed = |problem: &str| KeyError::Malformed {
            origin: origin.to_string(),
            problem: problem.to_string(),
            expected: PUBLIC_FORMAT,
        };
        let text = text.trim();
        let Some(body) = text.strip_prefix(PUBLIC_PREFIX) else {
            return Err(malformed(if text.starts_with(SECRET_PREFIX) {
                "this is a SECRET key, which must not be shared; use the public key (the `.pub` file written next to \
                 it by `quantfarm keygen`)"
            } else if text.is_empty() {
                "it is empty"
            } else {
                "it does not start with `quantfarm-ed25519-public:`"
            }));
        };
        let bytes = decode_32(body).map_err(|problem| malformed(&problem))?;
        let key = ed25519_dalek::VerifyingKey::from_bytes(&bytes)
            .map_err(|_| malformed("the 32 bytes are not a valid ed25519 public key"))?;
        Ok(Self(key))
    }
}

fn read_key_file(path: &Path) -> Result<String, KeyError> {
    fs::read_to_string(path).map_err(|source| KeyError::Read { path: path.to_path_buf(), source })
}

/// Decodes the base64 body of a key; the error describes the problem without repeating the text.
fn decode_32(body: &str) -> Result<[u8; 32], String> {
    if body.contains(|c: char| c.is_whitespace()) {
        return Err("it spans more than one line or contains spaces".into());
    }
    let bytes = BASE64.decode(body).map_err(|e| format!("the part after the prefix is not valid base64 ({e})"))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| format!("the part after the prefix decodes to {} bytes instead of 32", bytes.len()))
}

/// Where the signing key lives by default: `$QUANTFARM_KEY_FILE` if set, else
/// `$XDG_CONFIG_HOME/quantfarm/signing.key`, else `$HOME/.config/quantfarm/signing.key` (relative to the current
/// folder if even `HOME` is unset).
pub fn default_key_path() -> PathBuf {
    key_path_from(|var| std::env::var_os(var))
}

fn key_path_from(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> PathBuf {
    let set = |var: &str| env(var).filter(|v| !v.is_empty());
    if let Some(path) = set(KEY_FILE_ENV) {
        return PathBuf::from(path);
    }
    // The XDG spec says a relative XDG_CONFIG_HOME is invalid and must be ignored.
    let config = set("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| set("HOME").map(|home| PathBuf::from(home).join(".config")))
        .unwrap_or_else(|| PathBuf::from(".config"));
    config.join("quantfarm").join("signing.key")
}

/// Loads the key at `path`, or creates it there (as [`SigningKey::write_new`]) if there is no file yet.
/// The flag is true when the key was created.
pub fn load_or_create(path: &Path) -> Result<(SigningKey, bool), KeyError> {
    match SigningKey::load(path) {
        Ok(key) => Ok((key, false)),
        Err(KeyError::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            match SigningKey::write_new(path) {
                Ok(key) => Ok((key, true)),
                // Another process created it in between: use theirs.
                Err(KeyError::Exists { .. }) => Ok((SigningKey::load(path)?, false)),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Signs `report` (a JSON object without a `"signature"` member) and returns it with the `"signature"` member
/// appended last. The signed bytes are the RFC 8785 form of the report as given.
pub fn sign_report(report: Value, key: &SigningKey) -> Result<Value, SignError> {
    let Value::Object(mut map) = report else {
        return Err(SignError::NotAnObject(kind_of(&report)));
    };
    if map.contains_key(SIGNATURE_FIELD) {
        return Err(SignError::AlreadySigned);
    }
    let message = canonical_json(&Value::Object(map.clone()))?;
    let signature = key.0.sign(message.as_bytes());
    let public = key.public();
    let mut block = Map::new();
    block.insert("algorithm".into(), ALGORITHM.into());
    block.insert("canonicalization".into(), CANONICALIZATION.into());
    block.insert("public_key".into(), public.to_text().into());
    block.insert("fingerprint".into(), public.fingerprint().into());
    block.insert("value".into(), BASE64.encode(signature.to_bytes()).into());
    map.insert(SIGNATURE_FIELD.into(), Value::Object(block));
    Ok(Value::Object(map))
}

/// The public key a signed report records (not proof of anything by itself: see [`verify_report`]).
pub fn recorded_key(report: &Value) -> Result<PublicKey, VerifyError> {
    let Value::Object(map) = report else {
        return Err(VerifyError::NotAnObject(kind_of(report)));
    };
    let text = match map.get(SIGNATURE_FIELD) {
        None => return Err(VerifyError::MissingSignature),
        Some(block) => block.get("public_key").and_then(Value::as_str),
    };
    let text = text.ok_or_else(|| VerifyError::Malformed {
        field: "signature.public_key".into(),
        problem: "missing or not a string".into(),
    })?;
    PublicKey::parse(text, "signature.public_key")
        .map_err(|e| VerifyError::Malformed { field: "signature.public_key".into(), problem: e.to_string() })
}

/// Verifies a report signed by [`sign_report`].
///
/// With `pinned`, the report must have been signed by that key: authorship and integrity. Without, the signature is
/// checked against the key the report records, which proves only that the report was not changed after whoever
/// holds that key signed it ([`Verified::pinned`] is false).
pub fn verify_report(report: &Value, pinned: Option<&PublicKey>) -> Result<Verified, VerifyError> {
    let Value::Object(map) = report else {
        return Err(VerifyError::NotAnObject(kind_of(report)));
    };
    let block = match map.get(SIGNATURE_FIELD) {
        None => return Err(VerifyError::MissingSignature),
        Some(Value::Object(block)) => block,
        Some(other) => {
            return Err(VerifyError::Malformed {
                field: SIGNATURE_FIELD.into(),
                problem: format!("expected an object, found {}", kind_of(other)),
            });
        }
    };
    let malformed =
        |name: &str, problem: String| VerifyError::Malformed { field: format!("signature.{name}"), problem };
    const FIELDS: [&str; 5] = ["algorithm", "canonicalization", "public_key", "fingerprint", "value"];
    if let Some(unknown) = block.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(malformed(unknown, "unknown field (it would not be covered by the signature)".into()));
    }
    let field = |name: &str| -> Result<&str, VerifyError> {
        match block.get(name) {
            None => Err(malformed(name, "missing".into())),
            Some(Value::String(s)) => Ok(s),
            Some(other) => Err(malformed(name, format!("expected a string, found {}", kind_of(other)))),
        }
    };
    let algorithm = field("algorithm")?;
    if algorithm != ALGORITHM {
        return Err(malformed("algorithm", format!("unsupported algorithm {algorithm:?}, expected {ALGORITHM:?}")));
    }
    let canonicalization = field("canonicalization")?;
    if canonicalization != CANONICALIZATION {
        return Err(malformed(
            "canonicalization",
            format!("unsupported canonicalization {canonicalization:?}, expected {CANONICALIZATION:?}"),
        ));
    }
    let public = PublicKey::parse(field("public_key")?, "signature.public_key").map_err(|e| match e {
        KeyError::Malformed { problem, expected, .. } => {
            malformed("public_key", format!("{problem}; expected {expected}"))
        }
        other => malformed("public_key", other.to_string()),
    })?;
    let signer = public.fingerprint();
    let recorded = field("fingerprint")?;
    if recorded != signer {
        return Err(VerifyError::FingerprintMismatch { recorded: recorded.to_string(), actual: signer });
    }
    let value = field("value")?;
    let bytes = BASE64.decode(value).map_err(|e| malformed("value", format!("not valid base64 ({e})")))?;
    let signature = ed25519_dalek::Signature::from_slice(&bytes)
        .map_err(|_| malformed("value", format!("decodes to {} bytes, expected a 64-byte signature", bytes.len())))?;
    if let Some(pinned) = pinned {
        if *pinned != public {
            return Err(VerifyError::WrongKey { signer, expected: pinned.fingerprint() });
        }
    }
    let mut unsigned = map.clone();
    unsigned.remove(SIGNATURE_FIELD);
    let message = canonical_json(&Value::Object(unsigned))?;
    public
        .0
        .verify_strict(message.as_bytes(), &signature)
        .map_err(|_| VerifyError::BadSignature { signer: signer.clone() })?;
    Ok(Verified { fingerprint: signer, pinned: pinned.is_some() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report() -> Value {
        json!({
            "release": "acme/llama-3-8b-ft",
            "artifacts": [
                {"name": "model-Q4_K_M.gguf", "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
                 "bytes": 4920734016u64, "kl_divergence": 0.0123, "passed": true},
                {"name": "model-Q8_0.gguf", "sha256": "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752",
                 "bytes": 8540770560u64, "kl_divergence": 0.0009, "passed": true}
            ],
            "notes": "naïve café \u{1f600}\n",
            "thresholds": {"kl_divergence": 0.05, "top1_agreement": 0.9}
        })
    }

    fn signed() -> (Value, SigningKey) {
        let key = SigningKey::generate().unwrap();
        (sign_report(report(), &key).unwrap(), key)
    }

    #[test]
    fn sign_then_verify() {
        let (doc, key) = signed();
        let block = &doc["signature"];
        assert_eq!(block["algorithm"], "ed25519");
        assert_eq!(block["canonicalization"], "RFC8785");
        assert_eq!(block["public_key"], key.public().to_text().as_str());
        assert_eq!(block["fingerprint"], key.public().fingerprint().as_str());
        assert_eq!(doc.as_object().unwrap().keys().next_back().unwrap(), "signature", "signature is appended last");

        let v = verify_report(&doc, None).unwrap();
        assert_eq!(v, Verified { fingerprint: key.public().fingerprint(), pinned: false });
        let v = verify_report(&doc, Some(&key.public())).unwrap();
        assert_eq!(v, Verified { fingerprint: key.public().fingerprint(), pinned: true });
    }

    #[test]
    fn survives_pretty_printing_and_reparsing() {
        let (doc, key) = signed();
        let text = serde_json::to_string_pretty(&doc).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap();
        verify_report(&back, Some(&key.public())).unwrap();
        let compact: Value = serde_json::from_str(&serde_json::to_string(&doc).unwrap()).unwrap();
        verify_report(&compact, Some(&key.public())).unwrap();
    }

    /// Reports hold measured floats; a report written to disk and read back must still verify. This needs
    /// serde_json's `float_roundtrip` feature: without it serde_json misreads about one double in five by an ULP.
    #[test]
    fn floats_survive_a_trip_through_text() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut values = Vec::new();
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(json!((x >> 11) as f64 / (1u64 << 53) as f64));
            let f = f64::from_bits(x);
            if f.is_finite() {
                values.push(json!(f));
            }
        }
        let key = SigningKey::generate().unwrap();
        let doc = sign_report(json!({ "values": values }), &key).unwrap();
        let back: Value = serde_json::from_str(&serde_json::to_string_pretty(&doc).unwrap()).unwrap();
        assert_eq!(back, doc, "serde_json must be built with the float_roundtrip feature");
        verify_report(&back, Some(&key.public())).unwrap();
    }

    #[test]
    fn reordering_keys_still_verifies() {
        let (doc, key) = signed();
        let map = doc.as_object().unwrap();
        // Reverse the top-level members and those of every artifact.
        let mut reordered = Map::new();
        for (k, v) in map.iter().rev() {
            let v = match v {
                Value::Array(items) => Value::Array(
                    items
                        .iter()
                        .map(|item| {
                            Value::Object(
                                item.as_object().unwrap().iter().rev().map(|(k, v)| (k.clone(), v.clone())).collect(),
                            )
                        })
                        .collect(),
                ),
                other => other.clone(),
            };
            reordered.insert(k.clone(), v);
        }
        let reordered = Value::Object(reordered);
        assert_ne!(serde_json::to_string(&reordered).unwrap(), serde_json::to_string(&doc).unwrap());
        verify_report(&reordered, Some(&key.public())).unwrap();
    }

    fn assert_tampered(doc: &Value, key: &SigningKey) {
        let err = verify_report(doc, Some(&key.public())).unwrap_err();
        assert!(matches!(err, VerifyError::BadSignature { .. }), "{err:?}");
        assert!(err.to_string().contains("modified after signing or the signature is forged"), "{err}");
        assert!(matches!(verify_report(doc, None), Err(VerifyError::BadSignature { .. })));
    }

    #[test]
    fn tampering_is_detected() {
        let (doc, key) = signed();
        let edits: &[fn(&mut Value)] = &[
            |d| d["artifacts"][0]["sha256"] = json!("0".repeat(64)),
            |d| d["artifacts"][1]["bytes"] = json!(8540770561u64),
            |d| d["artifacts"][0]["kl_divergence"] = json!(0.0124),
            |d| d["artifacts"][0]["passed"] = json!(false),
            |d| d["notes"] = json!("naïve café \u{1f600}"),
            |d| {
                d.as_object_mut().unwrap().insert("extra".into(), json!(null));
            },
            |d| {
                d.as_object_mut().unwrap().remove("thresholds");
            },
            |d| d["artifacts"].as_array_mut().unwrap().reverse(),
            |d| d["artifacts"].as_array_mut().unwrap().truncate(1),
        ];
        for edit in edits {
            let mut d = doc.clone();
            edit(&mut d);
            assert_tampered(&d, &key);
        }
    }

    #[test]
    fn forged_signature_value_is_detected() {
        let (mut doc, key) = signed();
        let other = SigningKey::generate().unwrap();
        let forged = sign_report(report(), &other).unwrap();
        doc["signature"]["value"] = forged["signature"]["value"].clone();
        assert_tampered(&doc, &key);
    }

    #[test]
    fn wrong_pinned_key_is_refused() {
        let (doc, key) = signed();
        let other = SigningKey::generate().unwrap();
        let err = verify_report(&doc, Some(&other.public())).unwrap_err();
        assert!(matches!(err, VerifyError::WrongKey { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&key.public().fingerprint()) && msg.contains(&other.public().fingerprint()), "{msg}");

        // Re-signing an edited report with another key passes integrity, but not the pinned check.
        let mut edited = report();
        edited["artifacts"][0]["passed"] = json!(false);
        let resigned = sign_report(edited, &other).unwrap();
        assert!(!verify_report(&resigned, None).unwrap().pinned);
        assert!(matches!(verify_report(&resigned, Some(&key.public())), Err(VerifyError::WrongKey { .. })));
    }

    #[test]
    fn fingerprint_mismatch_is_refused() {
        let (mut doc, _) = signed();
        let other = SigningKey::generate().unwrap();
        doc["signature"]["fingerprint"] = json!(other.public().fingerprint());
        let err = verify_report(&doc, None).unwrap_err();
        assert!(matches!(err, VerifyError::FingerprintMismatch { .. }), "{err:?}");
    }

    #[test]
    fn swapped_public_key_is_refused() {
        // Replacing key and fingerprint consistently (but not the signature) fails on the signature itself.
        let (mut doc, _) = signed();
        let other = SigningKey::generate().unwrap();
        doc["signature"]["public_key"] = json!(other.public().to_text());
        doc["signature"]["fingerprint"] = json!(other.public().fingerprint());
        assert!(matches!(verify_report(&doc, None), Err(VerifyError::BadSignature { .. })));
    }

    #[test]
    fn malformed_signatures_name_the_field() {
        let (doc, _) = signed();
        let cases: Vec<(&str, Value, &str)> = vec![
            ("algorithm", json!("rsa"), "signature.algorithm"),
            ("algorithm", json!(1), "signature.algorithm"),
            ("canonicalization", json!("none"), "signature.canonicalization"),
            ("public_key", json!("quantfarm-ed25519-public:AAAA"), "signature.public_key"),
            ("public_key", json!("ssh-ed25519 AAAA"), "signature.public_key"),
            ("value", json!("not base64!"), "signature.value"),
            ("value", json!("AAAA"), "signature.value"),
            ("comment", json!("signed by Alice"), "signature.comment"),
        ];
        for (name, value, field) in cases {
            let mut d = doc.clone();
            d["signature"][name] = value;
            let err = verify_report(&d, None).unwrap_err();
            match &err {
                VerifyError::Malformed { field: f, .. } => assert_eq!(f, field),
                other => panic!("{name}: expected Malformed, got {other:?}"),
            }
            assert!(err.to_string().contains(field), "{err}");
        }
        let mut d = doc.clone();
        d["signature"].as_object_mut().unwrap().remove("value");
        assert!(verify_report(&d, None).unwrap_err().to_string().contains("signature.value: missing"));
        let mut d = doc.clone();
        d["signature"] = json!("abc");
        assert!(matches!(verify_report(&d, None), Err(VerifyError::Malformed { .. })));
        let mut d = doc;
        d.as_object_mut().unwrap().remove("signature");
        assert!(matches!(verify_report(&d, None), Err(VerifyError::MissingSignature)));
        assert!(matches!(verify_report(&json!([1]), None), Err(VerifyError::NotAnObject(_))));
    }

    #[test]
    fn sign_refuses_non_objects_signed_reports_and_huge_integers() {
        let key = SigningKey::generate().unwrap();
        assert!(matches!(sign_report(json!([1, 2]), &key), Err(SignError::NotAnObject(_))));
        let doc = sign_report(report(), &key).unwrap();
        assert!(matches!(sign_report(doc, &key), Err(SignError::AlreadySigned)));
        let err = sign_report(json!({"seed": u64::MAX}), &key).unwrap_err();
        assert!(matches!(err, SignError::Canonical(_)), "{err:?}");
        assert!(err.to_string().contains("/seed"), "{err}");
    }

    #[test]
    fn key_text_round_trips() {
        let key = SigningKey::generate().unwrap();
        let text = key.to_text();
        assert!(text.starts_with(SECRET_PREFIX));
        let back = SigningKey::from_text(&format!("{text}\n")).unwrap();
        assert_eq!(back.public(), key.public());
        let public = key.public();
        assert_eq!(PublicKey::from_text(&format!("{}  \r\n", public.to_text())).unwrap(), public);
        let fp = public.fingerprint();
        assert!(fp.starts_with("SHA256:") && fp.len() == 7 + 32, "{fp}");
        assert!(fp[7..].chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{fp}");
        // Debug never shows the secret.
        let debug = format!("{key:?}");
        assert!(!debug.contains(&text[SECRET_PREFIX.len()..]) && debug.contains(&fp), "{debug}");
    }

    #[test]
    fn known_fingerprint() {
        // RFC 8032 test 1: secret 9d61b1..., public d75a98...
        let seed: [u8; 32] = [
            0x9d, 0x61, 0xb1, 0x9d, 0xef, 0xfd, 0x5a, 0x60, 0xba, 0x84, 0x4a, 0xf4, 0x92, 0xec, 0x2c, 0xc4, 0x44, 0x49,
            0xc5, 0x69, 0x7b, 0x32, 0x69, 0x19, 0x70, 0x3b, 0xac, 0x03, 0x1c, 0xae, 0x7f, 0x60,
        ];
        let key = SigningKey::from_text(&format!("{SECRET_PREFIX}{}", BASE64.encode(seed))).unwrap();
        assert_eq!(key.public().to_text(), "quantfarm-ed25519-public:11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=");
        let digest = Sha256::digest(key.public().0.as_bytes());
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(key.public().fingerprint(), format!("SHA256:{hex}"));
    }

    #[test]
    fn malformed_key_text_is_explained_without_echoing_it() {
        let secret = SigningKey::generate().unwrap().to_text();
        let public = SigningKey::generate().unwrap().public().to_text();
        let secret_body = &secret[SECRET_PREFIX.len()..];
        let bad_secret: Vec<(String, &str)> = vec![
            (String::new(), "empty"),
            (public.clone(), "public key"),
            ("ssh-ed25519 AAAAC3Nz".into(), "does not start with"),
            (format!("{SECRET_PREFIX}{}", &secret_body[..20]), "base64"),
            (format!("{SECRET_PREFIX}{}", BASE64.encode([7u8; 31])), "31 bytes"),
            (format!("{SECRET_PREFIX}!!!!"), "base64"),
            (format!("{secret}\n{secret}"), "more than one line"),
        ];
        for (text, problem) in bad_secret {
            let msg = SigningKey::from_text(&text).unwrap_err().to_string();
            assert!(msg.contains(problem), "{msg}");
            assert!(msg.contains("quantfarm-ed25519-secret:<base64"), "{msg}");
            assert!(!msg.contains(secret_body), "secret echoed: {msg}");
        }
        let msg = PublicKey::from_text(&secret).unwrap_err().to_string();
        assert!(msg.contains("SECRET key") && !msg.contains(secret_body), "{msg}");
        let msg = PublicKey::from_text("quantfarm-ed25519-public:").unwrap_err().to_string();
        assert!(msg.contains("0 bytes instead of 32"), "{msg}");
    }

    #[test]
    fn key_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/signing.key");
        let key = SigningKey::write_new(&path).unwrap();
        assert_eq!(SigningKey::load(&path).unwrap().public(), key.public());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let before = fs::read(&path).unwrap();
        let err = SigningKey::write_new(&path).unwrap_err();
        assert!(matches!(err, KeyError::Exists { .. }), "{err:?}");
        assert!(err.to_string().contains("refusing to overwrite"), "{err}");
        assert_eq!(fs::read(&path).unwrap(), before, "existing key untouched");

        let (loaded, created) = load_or_create(&path).unwrap();
        assert!(!created && loaded.public() == key.public());
        let fresh = dir.path().join("c/signing.key");
        let (made, created) = load_or_create(&fresh).unwrap();
        assert!(created && SigningKey::load(&fresh).unwrap().public() == made.public());

        let pub_path = dir.path().join("signing.key.pub");
        fs::write(&pub_path, format!("{}\n", key.public())).unwrap();
        assert_eq!(PublicKey::load(&pub_path).unwrap(), key.public());
        let msg = PublicKey::load(&path).unwrap_err().to_string();
        assert!(msg.contains("public key file") && msg.contains("signing.key") && msg.contains("SECRET"), "{msg}");

        let garbage = dir.path().join("garbage.key");
        fs::write(&garbage, "hello\n").unwrap();
        let msg = SigningKey::load(&garbage).unwrap_err().to_string();
        assert!(msg.contains("garbage.key") && msg.contains("expected one line"), "{msg}");
        let err = SigningKey::load(&dir.path().join("missing.key")).unwrap_err();
        assert!(matches!(err, KeyError::Read { .. }) && err.to_string().contains("missing.key"), "{err}");
        // A garbage file is not replaced by load_or_create.
        assert!(load_or_create(&garbage).is_err());
    }

    #[test]
    fn key_from_env() {
        let key = SigningKey::generate().unwrap();
        let var = "QUANTFARM_TEST_SIGNING_KEY_FROM_ENV";
        // Only this test touches this variable.
        std::env::set_var(var, format!("{}\n", key.to_text()));
        assert_eq!(SigningKey::from_env(var).unwrap().public(), key.public());
        std::env::set_var(var, "nonsense");
        let msg = SigningKey::from_env(var).unwrap_err().to_string();
        assert!(msg.contains(var) && msg.contains("expected"), "{msg}");
        std::env::remove_var(var);
        let msg = SigningKey::from_env(var).unwrap_err().to_string();
        assert!(msg.contains(var) && msg.contains("not set"), "{msg}");
    }

    #[test]
    fn default_key_path_order() {
        use std::ffi::OsString;
        fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
            move |var: &str| pairs.iter().find(|(k, _)| *k == var).map(|(_, v)| OsString::from(v))
        }
        let all = [("QUANTFARM_KEY_FILE", "/k/key"), ("XDG_CONFIG_HOME", "/xdg"), ("HOME", "/home/u")];
        assert_eq!(key_path_from(env(&all)), PathBuf::from("/k/key"));
        assert_eq!(key_path_from(env(&all[1..])), PathBuf::from("/xdg/quantfarm/signing.key"));
        assert_eq!(key_path_from(env(&all[2..])), PathBuf::from("/home/u/.config/quantfarm/signing.key"));
        let relative_xdg = [("QUANTFARM_KEY_FILE", ""), ("XDG_CONFIG_HOME", "rel"), ("HOME", "/home/u")];
        assert_eq!(key_path_from(env(&relative_xdg)), PathBuf::from("/home/u/.config/quantfarm/signing.key"));
    }
}
