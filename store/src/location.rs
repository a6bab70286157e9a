//! Where model files live: a local path, `file://`, `s3://bucket/key`, or any `object_store` backend given in code
//! (tests use the in-memory one). One [`Location`] names one object or folder in one store.
//!
//! Object keys are checked before use: no `..` or `.` segments, no empty segments, no control characters — a
//! release spec or a manifest must not be able to point outside its bucket prefix.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjPath;
use object_store::ObjectStore;

use crate::error::{Error, Result};

/// One object (or folder prefix) in a store.
#[derive(Clone)]
pub struct Location {
    backend: Backend,
    display: String,
}

#[derive(Clone)]
enum Backend {
    /// A file on this machine: read with positional reads, written through a staged temp file.
    Local(PathBuf),
    /// An object in an object store (S3, memory, …), which outputs are staged into as multipart uploads.
    Object { store: Stores, key: ObjPath, scheme: String },
}

/// One object store seen through the two interfaces quantfarm uses: objects, and multipart uploads by id (so that a
/// dead writer's upload can be aborted by someone else).
#[derive(Clone)]
pub(crate) struct Stores {
    pub(crate) objects: Arc<dyn ObjectStore>,
    pub(crate) multipart: Arc<dyn MultipartStore>,
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display)
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display)
    }
}

/// Checks an object key and turns it into an `object_store` path.
pub fn checked_key(key: &str, context: &str) -> Result<ObjPath> {
    let bad =
        |msg: &str| Error::InvalidLocation { location: context.to_string(), msg: format!("object key {key:?}: {msg}") };
    if key.starts_with('/') {
        return Err(bad("is absolute"));
    }
    if key.chars().any(char::is_control) {
        return Err(bad("contains a control character"));
    }
    let trimmed = key.strip_suffix('/').unwrap_or(key);
    if trimmed.is_empty() {
        return Ok(ObjPath::default());
    }
    for seg in trimmed.split('/') {
        match seg {
            "" => return Err(bad("has an empty segment")),
            "." | ".." => return Err(bad("has a '.' or '..' segment")),
            _ => {}
        }
    }
    ObjPath::parse(trimmed).map_err(|e| bad(&e.to_string()))
}

impl Location {
    /// Parses a plain path, `file://PATH`, or `s3://BUCKET/KEY` (endpoint, region and credentials from the usual
    /// `AWS_*` environment variables; an `http://` endpoint is allowed, for MinIO and local servers).
    pub fn parse(s: &str) -> Result<Location> {
        if let Some(rest) = s.strip_prefix("s3://") {
            let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(Error::InvalidLocation { location: s.into(), msg: "no bucket name".into() });
            }
            let store = crate::s3::store_from_env(bucket).map_err(|e| Error::from_store(s, e))?;
            let key = checked_key(key, s)?;
            return Ok(Location::in_store(Arc::new(store), key, "s3", bucket));
        }
        let path = match s.strip_prefix("file://") {
            Some(p) => PathBuf::from(p),
            None if s.contains("://") => {
                return Err(Error::InvalidLocation {
                    location: s.into(),
                    msg: "unsupported URL scheme (use a path, file://, or s3://)".into(),
                })
            }
            None => PathBuf::from(s),
        };
        Ok(Location::local(path))
    }

    pub fn local(path: impl Into<PathBuf>) -> Location {
        let path = path.into();
        Location { display: path.display().to_string(), backend: Backend::Local(path) }
    }

    /// An object `key` in `store`; `scheme` and `bucket` only shape how it is displayed (`s3://bucket/key`).
    pub fn in_store<S: ObjectStore + MultipartStore>(
        store: Arc<S>,
        key: ObjPath,
        scheme: &str,
        bucket: &str,
    ) -> Location {
        let store = Stores { objects: store.clone(), multipart: store };
        Location {
            display: format!("{scheme}://{bucket}/{key}"),
            backend: Backend::Object { store, key, scheme: format!("{scheme}://{bucket}") },
        }
    }

    pub fn local_path(&self) -> Option<&FsPath> {
        match &self.backend {
            Backend::Local(p) => Some(p),
            Backend::Object { .. } => None,
        }
    }

    pub fn object(&self) -> Option<(&Arc<dyn ObjectStore>, &ObjPath)> {
        self.stores().map(|(s, key)| (&s.objects, key))
    }

    pub(crate) fn stores(&self) -> Option<(&Stores, &ObjPath)> {
        match &self.backend {
            Backend::Local(_) => None,
            Backend::Object { store, key, .. } => Some((store, key)),
        }
    }

    /// The last path segment.
    pub fn file_name(&self) -> &str {
        match &self.backend {
            Backend::Local(p) => p.file_name().and_then(|n| n.to_str()).unwrap_or(""),
            Backend::Object { key, .. } => key.filename().unwrap_or(""),
        }
    }

    /// Another file in the same folder.
    pub fn sibling(&self, name: &str) -> Result<Location> {
        match &self.backend {
            Backend::Local(p) => Ok(Location::local(p.with_file_name(name))),
            Backend::Object { store, key, scheme } => {
                let full = match key.as_ref().rsplit_once('/') {
                    Some((dir, _)) => format!("{dir}/{name}"),
                    None => name.to_string(),
                };
                Ok(self.with_key(store, checked_key(&full, &self.display)?, scheme))
            }
        }
    }

    /// A file inside this folder.
    pub fn child(&self, name: &str) -> Result<Location> {
        match &self.backend {
            Backend::Local(p) => Ok(Location::local(p.join(name))),
            Backend::Object { store, key, scheme } => {
                let full = if key.as_ref().is_empty() { name.to_string() } else { format!("{key}/{name}") };
                Ok(self.with_key(store, checked_key(&full, &self.display)?, scheme))
            }
        }
    }

    fn with_key(&self, store: &Stores, key: ObjPath, scheme: &str) -> Location {
        Location {
            display: format!("{scheme}/{key}"),
            backend: Backend::Object { store: store.clone(), key, scheme: scheme.to_string() },
        }
    }

    /// Whether this names a folder: a local directory, or an object prefix with objects below it. (Listing rather
    /// than a HEAD of the key: some S3-compatible servers answer a HEAD of a "folder" with an error, not 404.)
    pub async fn is_dir(&self) -> Result<bool> {
        match &self.backend {
            Backend::Local(p) => Ok(p.is_dir()),
            Backend::Object { store, key, .. } => {
                let prefix = if key.as_ref().is_empty() { None } else { Some(key) };
                let res =
                    store.objects.list_with_delimiter(prefix).await.map_err(|e| Error::from_store(&self.display, e))?;
                Ok(!res.objects.is_empty() || !res.common_prefixes.is_empty())
            }
        }
    }

    /// Removes the file or object here; one that is not there is no error. (For a stored output found corrupt, so
    /// that it can be made again through the staged sink.)
    pub async fn remove(&self) -> Result<()> {
        match &self.backend {
            Backend::Local(p) => match std::fs::remove_file(p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::from_io(&self.display, e)),
                _ => Ok(()),
            },
            Backend::Object { store, key, .. } => {
                match object_store::ObjectStoreExt::delete(store.objects.as_ref(), key).await {
                    Err(e) if !matches!(e, object_store::Error::NotFound { .. }) => {
                        Err(Error::from_store(&self.display, e))
                    }
                    _ => Ok(()),
                }
            }
        }
    }

    /// The names of the files directly inside this folder, sorted; staging files of outputs being written (or left
    /// by a writer that died, see [`crate::staging`]) are not among them.
    pub async fn list(&self) -> Result<Vec<String>> {
        let mut names = match &self.backend {
            Backend::Local(p) => {
                let io = |e| Error::from_io(&self.display, e);
                let mut names = Vec::new();
                for entry in std::fs::read_dir(p).map_err(io)? {
                    let entry = entry.map_err(io)?;
                    if entry.file_type().map_err(io)?.is_file() {
                        names.push(entry.file_name().to_string_lossy().into_owned());
                    }
                }
                names
            }
            Backend::Object { store, key, .. } => {
                let prefix = if key.as_ref().is_empty() { None } else { Some(key) };
                let res =
                    store.objects.list_with_delimiter(prefix).await.map_err(|e| Error::from_store(&self.display, e))?;
                res.objects.iter().filter_map(|m| m.location.filename().map(str::to_string)).collect()
            }
        };
        names.retain(|n| !crate::staging::is_staging(n));
        names.sort();
        Ok(names)
    }
}
