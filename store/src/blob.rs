//! Ranged reads of one file or object into caller-owned buffers.
//!
//! Local files are read with positional reads (`pread`) straight into the caller's buffer; objects in a store are
//! fetched with ranged GETs whose body is streamed into the buffer as it arrives, so a read never holds more than
//! the buffer the caller sized to its budget.

use std::sync::Arc;

use futures::StreamExt;
use object_store::{GetOptions, GetRange, ObjectStoreExt};

use crate::error::{Error, Result};
use crate::location::Location;

/// A store read is split into concurrent ranged GETs of at least this many bytes…
const MIN_PART_BYTES: usize = 8 << 20;
/// …and at most this many at once.
const MAX_PARTS_IN_FLIGHT: usize = 4;

#[cfg(unix)]
fn local_version(meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    format!("file:{}:{}:{}.{}", meta.dev(), meta.ino(), meta.mtime(), meta.mtime_nsec())
}

#[cfg(not(unix))]
fn local_version(meta: &std::fs::Metadata) -> String {
    let t = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).unwrap_or_default();
    format!("file:{}", t.as_nanos())
}

/// An open file or object of known length.
#[derive(Clone)]
pub struct Blob {
    loc: Location,
    name: String,
    len: u64,
    version: String,
    file: Option<Arc<std::fs::File>>,
}

impl std::fmt::Debug for Blob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Blob({}, {} bytes)", self.name, self.len)
    }
}

impl Blob {
    pub async fn open(loc: &Location) -> Result<Blob> {
        let name = loc.to_string();
        if let Some(path) = loc.local_path() {
            let io = |e| Error::from_io(&name, e);
            let file = std::fs::File::open(path).map_err(io)?;
            let meta = file.metadata().map_err(io)?;
            if !meta.is_file() {
                return Err(Error::InvalidLocation { location: name, msg: "not a regular file".into() });
            }
            let version = local_version(&meta);
            return Ok(Blob { loc: loc.clone(), len: meta.len(), version, file: Some(Arc::new(file)), name });
        }
        let (store, key) = loc.object().expect("a location is local or in a store");
        let meta = store.head(key).await.map_err(|e| Error::from_store(&name, e))?;
        tracing::debug!(object = %name, bytes = meta.size, "opened");
        let version = match (&meta.e_tag, &meta.version) {
            (Some(e), _) => format!("etag:{e}"),
            (None, Some(v)) => format!("version:{v}"),
            (None, None) => format!("modified:{}", meta.last_modified.timestamp_nanos_opt().unwrap_or(0)),
        };
        Ok(Blob { loc: loc.clone(), len: meta.size, version, file: None, name })
    }

    /// What changes when the content changes: the store's ETag (or version), or a local file's modification
    /// time, inode and device. Not a content hash — reading a whole model to name it is what this avoids.
    pub fn version(&self) -> &str {
        &self.version
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The location as the user wrote it, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn location(&self) -> &Location {
        &self.loc
    }

    /// Fills `buf` with the bytes at `offset..offset + buf.len()`.
    pub async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if offset.checked_add(buf.len() as u64).is_none_or(|e| e > self.len) {
            return Err(Error::OutOfRange { path: self.name.clone(), offset, len: buf.len() as u64, size: self.len });
        }
        if buf.is_empty() {
            return Ok(());
        }
        if let Some(file) = &self.file {
            use std::os::unix::fs::FileExt;
            // Page-cache reads: short enough to do on the async thread, and a copy fewer than spawn_blocking.
            file.read_exact_at(buf, offset).map_err(|e| Error::from_io(&self.name, e))?;
            return Ok(());
        }
        // Large reads from a store go as several ranged GETs at once, each streaming into its own slice of the
        // caller's buffer: one connection rarely fills the link, and no extra memory is needed.
        let parts = (buf.len() / MIN_PART_BYTES).clamp(1, MAX_PARTS_IN_FLIGHT);
        let part_len = buf.len().div_ceil(parts);
        let reads =
            buf.chunks_mut(part_len).enumerate().map(|(i, part)| self.get_into(offset + (i * part_len) as u64, part));
        futures::future::try_join_all(reads).await?;
        crate::io_counters::add_read(buf.len());
        Ok(())
    }

    /// One ranged GET of `buf.len()` bytes at `offset`, streamed into `buf`.
    async fn get_into(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let (store, key) = self.loc.object().expect("a location is local or in a store");
        let end = offset + buf.len() as u64;
        let opts = GetOptions { range: Some(GetRange::Bounded(offset..end)), ..Default::default() };
        let res = store.get_opts(key, opts).await.map_err(|e| Error::from_store(&self.name, e))?;
        let mut stream = res.into_stream();
        let mut filled = 0usize;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| Error::from_store(&self.name, e))?;
            let n = chunk.len();
            if filled + n > buf.len() {
                return Err(Error::ShortRead {
                    path: self.name.clone(),
                    msg: "the store returned more bytes than the range asked for".into(),
                });
            }
            buf[filled..filled + n].copy_from_slice(&chunk);
            filled += n;
        }
        if filled != buf.len() {
            return Err(Error::ShortRead {
                path: self.name.clone(),
                msg: format!("the store returned {filled} of {} bytes at {offset}", buf.len()),
            });
        }
        Ok(())
    }

    /// Reads `len` bytes at `offset` into a new buffer (never more than the file holds).
    pub async fn read_vec(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(Error::OutOfRange { path: self.name.clone(), offset, len, size: self.len });
        }
        let mut buf = vec![0u8; len as usize];
        self.read_at(offset, &mut buf).await?;
        Ok(buf)
    }
}
