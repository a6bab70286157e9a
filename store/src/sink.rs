//! The staged sink: every output is written to a staging place and made visible at its final name only by
//! [`StagedSink::commit`]. Locally that is a temp file in the destination's folder, fsynced and renamed; in an
//! object store an output smaller than a multipart part is held in memory and written with one PUT at commit (no
//! staging at all), a larger one goes through a multipart upload (with a marker object naming it, see
//! [`crate::staging`]), completed on commit and aborted otherwise. A failed or dropped write therefore never leaves
//! a partial artifact, nor replaces an existing one; a killed writer's staging is swept by
//! [`crate::staging::sweep`]. (An upload whose writer is killed between creating it and writing its marker, a few
//! milliseconds, has no marker to find it by; a server that lists incomplete uploads, or a bucket lifecycle rule
//! that aborts them, removes it.)

mod write_behind;

use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as ObjPath;
use object_store::{MultipartId, ObjectStore, ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use tokio::task::JoinSet;
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
    Local { out: WriteBehind, tmp: tempfile::NamedTempFile, overwrite: bool },
    Object {
        /// The bytes written so far, while they are fewer than a part: an output that stays this small is put
        /// whole at commit.
        head: Vec<u8>,
        /// The multipart upload, started when the output outgrows one part.
        upload: Option<Upload>,
        hasher: Sha256,
        objects: Arc<dyn ObjectStore>,
        multipart: Arc<dyn MultipartStore>,
        key: ObjPath,
    },
    /// Committed (the stage moved out).
    Done,
}

/// A multipart upload in flight: parts of [`PART_SIZE`] bytes, at most [`PARTS_IN_FLIGHT`] of them sent at once.
struct Upload {
    multipart: Arc<dyn MultipartStore>,
    objects: Arc<dyn ObjectStore>,
    key: ObjPath,
    id: MultipartId,
    /// The marker object naming the upload, removed when it is completed or aborted.
    marker: ObjPath,
    buf: Vec<u8>,
    /// Each part's id once sent, by index.
    parts: Vec<Option<PartId>>,
    sending: JoinSet<(usize, object_store::Result<PartId>)>,
}

impl Upload {
    async fn start(
        multipart: Arc<dyn MultipartStore>,
        objects: Arc<dyn ObjectStore>,
        key: &ObjPath,
    ) -> object_store::Result<Upload> {
        let id = multipart.create_multipart(key).await?;
        let tag = crate::hex(&Sha256::digest(id.as_bytes())[..8]);
        let name = format!("{}{tag}", crate::staging::prefix(key.filename().unwrap_or("")));
        let marker = match key.as_ref().rsplit_once('/') {
            Some((dir, _)) => ObjPath::from(dir).join(name.as_str()),
            None => ObjPath::from(name.as_str()),
        };
        if let Err(e) = objects.put(&marker, PutPayload::from(id.clone().into_bytes())).await {
            let _ = multipart.abort_multipart(key, &id).await;
            return Err(e);
        }
        Ok(Upload {
            multipart,
            objects,
            key: key.clone(),
            id,
            marker,
            buf: Vec::new(),
            parts: Vec::new(),
            sending: JoinSet::new(),
        })
    }

    async fn write(&mut self, mut data: &[u8]) -> object_store::Result<()> {
        while !data.is_empty() {
            let n = (PART_SIZE - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.buf.len() == PART_SIZE {
                self.send_part().await?;
            }
        }
        Ok(())
    }

    /// Sends what the buffer holds as the next part, after waiting for room.
    async fn send_part(&mut self) -> object_store::Result<()> {
        while self.sending.len() >= PARTS_IN_FLIGHT {
            self.receive_one().await?;
        }
        let idx = self.parts.len();
        self.parts.push(None);
        let data = PutPayload::from(std::mem::take(&mut self.buf));
        let (multipart, key, id) = (self.multipart.clone(), self.key.clone(), self.id.clone());
        self.sending.spawn(async move { (idx, multipart.put_part(&key, &id, idx, data).await) });
        Ok(())
    }

    async fn receive_one(&mut self) -> object_store::Result<()> {
        match self.sending.join_next().await {
            Some(Ok((idx, part))) => {
                self.parts[idx] = Some(part?);
                Ok(())
            }
            Some(Err(e)) => Err(object_store::Error::Generic { store: "multipart", source: Box::new(e) }),
            None => Ok(()),
        }
    }

    async fn complete(mut self) -> object_store::Result<()> {
        // The last part may be short; an empty output is one empty part.
        if !self.buf.is_empty() || self.parts.is_empty() {
            self.send_part().await?;
        }
        while !self.sending.is_empty() {
            self.receive_one().await?;
        }
        let parts = std::mem::take(&mut self.parts).into_iter().flatten().collect();
        self.multipart.complete_multipart(&self.key, &self.id, parts).await?;
        self.remove_marker().await;
        Ok(())
    }

    async fn abort(mut self) -> object_store::Result<()> {
        self.sending.abort_all();
        let aborted = self.multipart.abort_multipart(&self.key, &self.id).await;
        self.remove_marker().await;
        aborted
    }

    /// The marker goes once the upload is completed or aborted; one left behind (a failed delete) names an upload
    /// that no longer exists, which [`crate::staging::sweep`] removes.
    async fn remove_marker(&mut self) {
        if let Err(e) = self.objects.delete(&self.marker).await {
            tracing::debug!(marker = %self.marker, "could not remove the staging marker: {e}");
        }
    }
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
            let (stores, _) = target.stores().expect("an object location has its stores");
            Stage::Object {
                head: Vec::new(),
                upload: None,
                hasher: Sha256::new(),
                objects: stores.objects.clone(),
                multipart: stores.multipart.clone(),
                key: key.clone(),
            }
        };
        Ok(StagedSink { target: target.clone(), stage, bytes: 0 })
    }

    pub fn bytes_written(&self) -> u64 {
        self.bytes
    }

    pub async fn write(&mut self, data: &[u8]) -> Result<()> {
        self.bytes += data.len() as u64;
        if matches!(self.stage, Stage::Object { .. }) {
            crate::io_counters::add_written(data.len());
        }
        match &mut self.stage {
            Stage::Local { out, .. } => out.write(data).map_err(|e| Error::from_io(self.target.to_string(), e)),
            Stage::Done => unreachable!("commit takes the sink"),
            Stage::Object { head, upload, hasher, objects, multipart, key } => {
                hasher.update(data);
                let err = |e| Error::from_store(self.target.to_string(), e);
                if let Some(up) = upload {
                    return up.write(data).await.map_err(err);
                }
                head.extend_from_slice(data);
                if head.len() >= PART_SIZE {
                    let mut up = Upload::start(multipart.clone(), objects.clone(), key).await.map_err(err)?;
                    up.write(&std::mem::take(head)).await.map_err(err)?;
                    *upload = Some(up);
                }
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
        let stage = std::mem::replace(&mut self.stage, Stage::Done);
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
            Stage::Object { head, upload, hasher, objects, key, .. } => {
                match upload {
                    Some(up) => up.complete().await.map_err(|e| Error::from_store(&name, e))?,
                    // One PUT: the object appears whole or not at all.
                    None => {
                        objects.put(&key, PutPayload::from(head)).await.map_err(|e| Error::from_store(&name, e))?;
                    }
                }
                hasher
            }
            Stage::Done => unreachable!("a sink is committed once"),
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
