//! The staged sink: every output is written to a staging place and made visible at its final name only by
//! [`StagedSink::commit`]. Locally that is a temp file in the destination's folder, fsynced and renamed; in an
//! object store a multipart upload, completed on commit and aborted otherwise. A failed or dropped write therefore
//! never leaves a partial artifact, nor replaces an existing one.

mod write_behind;

use sha2::{Digest, Sha256};
use write_behind::WriteBehind;

use crate::error::{Error, Result};
use crate::location::Location;

/// Multipart part size: S3's minimum is 5 MiB; two parts in flight bound the sink's memory to about 3 parts.
const PART_SIZE: usize = 8 << 20;
const PARTS_IN_FLIGHT: usize = 2;

/// What a committed output is: its location, size and sha256.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    pub location: String,
    pub bytes: u64,
    pub sha256: String,
}

pub struct StagedSink {
    target: Location,
    stage: Stage,
    bytes: u64,
}

impl std::fmt::Debug for StagedSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedSink").field("target", &self.target).field("bytes", &self.bytes).finish()
    }
}

enum Stage {
    /// Written and hashed on a thread of its own. `out` is declared first so that, on drop, its thread is stopped
    /// before `tmp` removes the file.
    Local {
        out: WriteBehind,
        tmp: tempfile::NamedTempFile,
        overwrite: bool,
    },
    Object {
        upload: Option<object_store::WriteMultipart>,
        hasher: Sha256,
    },
}

impl StagedSink {
    /// Starts an output at `target`. Unless `overwrite`, an existing output there is an error now (and again at
    /// commit, for local files, so a concurrent writer cannot be clobbered).
    pub async fn create(target: &Location, overwrite: bool) -> Result<StagedSink> {
        let name = target.to_string();
        let stage = if let Some(path) = target.local_path() {
            if !overwrite && path.exists() {
                return Err(Error::Exists { path: path.to_path_buf() });
            }
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => std::path::PathBuf::from("."),
            };
            let io = |e| Error::from_io(&name, e);
            std::fs::create_dir_all(&dir).map_err(io)?;
            let prefix = format!(".{}.partial-", target.file_name());
            let mut builder = tempfile::Builder::new();
            builder.prefix(&prefix);
            // Outputs are ordinary files (rw-r--r--, less the umask), not the private 0600 of a temp file.
            #[cfg(unix)]
            builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644));
            let tmp = builder.tempfile_in(&dir).map_err(io)?;
            let out = WriteBehind::new(tmp.as_file().try_clone().map_err(io)?).map_err(io)?;
            Stage::Local { out, tmp, overwrite }
        } else {
            use object_store::ObjectStoreExt;
            let (store, key) = target.object().expect("a location is local or in a store");
            if !overwrite {
                match store.head(key).await {
                    Ok(_) => return Err(Error::Exists { path: name.clone().into() }),
                    Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(Error::from_store(&name, e)),
                }
            }
            let upload = store.put_multipart(key).await.map_err(|e| Error::from_store(&name, e))?;
            let upload = Some(object_store::WriteMultipart::new_with_chunk_size(upload, PART_SIZE));
            Stage::Object { upload, hasher: Sha256::new() }
        };
        Ok(StagedSink { target: target.clone(), stage, bytes: 0 })
    }

    pub fn bytes_written(&self) -> u64 {
        self.bytes
    }

    pub async fn write(&mut self, data: &[u8]) -> Result<()> {
        self.bytes += data.len() as u64;
        crate::io_counters::add_written(data.len());
        match &mut self.stage {
            Stage::Local { out, .. } => out.write(data).map_err(|e| Error::from_io(self.target.to_string(), e)),
            Stage::Object { upload, hasher } => {
                hasher.update(data);
                let up = upload.as_mut().expect("upload present until commit");
                up.wait_for_capacity(PARTS_IN_FLIGHT)
                    .await
                    .map_err(|e| Error::from_store(self.target.to_string(), e))?;
                up.write(data);
                Ok(())
            }
        }
    }

    /// Writes `n` zero bytes (GGUF padding).
    pub async fn write_zeros(&mut self, n: usize) -> Result<()> {
        const ZEROS: [u8; 64] = [0; 64];
        let mut left = n;
        while left > 0 {
            let k = left.min(ZEROS.len());
            self.write(&ZEROS[..k]).await?;
            left -= k;
        }
        Ok(())
    }

    /// Makes the output visible at its final name, all at once.
    pub async fn commit(mut self) -> Result<Committed> {
        let name = self.target.to_string();
        let stage = std::mem::replace(&mut self.stage, Stage::Object { upload: None, hasher: Sha256::new() });
        let hasher = match stage {
            Stage::Local { tmp, out, overwrite } => {
                let io = |e| Error::from_io(&name, e);
                let (file, hasher) = out.finish().map_err(io)?;
                file.sync_all().map_err(io)?;
                let path = self.target.local_path().expect("local stage has a local target").to_path_buf();
                if overwrite {
                    tmp.persist(&path).map_err(|e| io(e.error))?;
                } else {
                    tmp.persist_noclobber(&path).map_err(|e| match e.error.kind() {
                        std::io::ErrorKind::AlreadyExists => Error::Exists { path: path.clone() },
                        _ => io(e.error),
                    })?;
                }
                // The rename is durable once the folder's entry is on disk.
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
                }
                hasher
            }
            Stage::Object { upload, hasher } => {
                let up = upload.expect("upload present until commit");
                up.finish().await.map_err(|e| Error::from_store(&name, e))?;
                hasher
            }
        };
        let sha256 = crate::hex(&hasher.finalize());
        tracing::debug!(location = %name, bytes = self.bytes, %sha256, "committed");
        Ok(Committed { location: name, bytes: self.bytes, sha256 })
    }

    /// Drops the staged output; nothing becomes visible.
    pub async fn abort(mut self) -> Result<()> {
        if let Stage::Object { upload, .. } = &mut self.stage {
            if let Some(up) = upload.take() {
                up.abort().await.map_err(|e| Error::from_store(self.target.to_string(), e))?;
            }
        }
        Ok(())
    }
}

impl Drop for StagedSink {
    /// A sink dropped without commit (an error, a panic, a cancelled task) aborts: the local temp file is removed
    /// by `NamedTempFile`; an upload is aborted on the runtime if one is running.
    fn drop(&mut self) {
        if let Stage::Object { upload, .. } = &mut self.stage {
            if let Some(up) = upload.take() {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        let _ = up.abort().await;
                    });
                }
            }
        }
    }
}
