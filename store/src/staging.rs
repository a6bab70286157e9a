//! Where an output is staged before its commit, and how the staging of a writer that died is swept away.
//!
//! [`crate::StagedSink`] stages output `NAME` beside it, under a name no reader takes for an output:
//!
//! - locally, the temp file `.NAME.partial-XXXXXX` in the output's folder, renamed to `NAME` at commit;
//! - in an object store, a multipart upload to `NAME` itself, plus the marker object `.NAME.partial-XXXXXXXX`
//!   beside it that holds the upload's id (not every S3-compatible server lists incomplete uploads —
//!   `ListMultipartUploads` — so the marker is how someone else finds the upload to abort it).
//!
//! A writer that stops cleanly (commit, error, cancellation) removes its staging. One that is killed cannot: the
//! farm's coordinator, which knows when a lease dies, calls [`sweep`] for the output that lease was making.
//! [`Location::list`] never shows staging names.

use std::time::SystemTime;

use object_store::{ObjectStore, ObjectStoreExt};

use crate::error::{Error, Result};
use crate::location::Location;

/// The prefix of every staging name of output `name`.
pub fn prefix(name: &str) -> String {
    format!(".{name}.partial-")
}

/// Whether `name` is a staging name (of some output).
pub fn is_staging(name: &str) -> bool {
    name.starts_with('.') && name.contains(".partial-")
}

/// The output a staging name stages (`.NAME.partial-X` → `NAME`).
fn staged_name(staging: &str) -> Option<&str> {
    let rest = staging.strip_prefix('.')?;
    rest.rfind(".partial-").map(|at| &rest[..at])
}

/// What [`sweep`] removed: staging files (local), and aborted uploads with their markers (object stores).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    pub files: usize,
    pub uploads: usize,
}

/// Removes the staging a dead writer left for the output at `target` — a file's staging beside it, and for a folder
/// output (an MLX checkpoint, a merge's side files) the staging of every file inside it — that was last written
/// before `before`. A live writer keeps writing its staging (and one that starts after `before` creates its own
/// later), so it is left alone; an object store's clock running ahead of this machine's by more than the time
/// between a lease's death and its task's next start could make a new writer's upload look old: that upload's
/// commit then fails and its task is retried.
pub async fn sweep(target: &Location, before: SystemTime) -> Result<Swept> {
    let mut swept = Swept::default();
    if let Some(path) = target.local_path() {
        let name = target.file_name().to_string();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            swept.files += sweep_local_dir(dir, &|n: &str| n.starts_with(&prefix(&name)), before)?;
        }
        if path.is_dir() {
            swept.files += sweep_local_dir(path, &is_staging, before)?;
        }
        return Ok(swept);
    }
    let parent = target.sibling("x")?;
    let name = target.file_name().to_string();
    swept.uploads += sweep_markers(&parent, &|n: &str| n.starts_with(&prefix(&name)), before).await?;
    swept.uploads += sweep_markers(&target.child("x")?, &is_staging, before).await?;
    Ok(swept)
}

/// Removes the files of `dir` whose names `matches` and that were last modified before `before`.
fn sweep_local_dir(
    dir: &std::path::Path,
    matches: &(dyn Fn(&str) -> bool + Sync),
    before: SystemTime,
) -> Result<usize> {
    let shown = dir.display().to_string();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::from_io(shown, e)),
    };
    let mut n = 0;
    for entry in entries {
        let entry = entry.map_err(|e| Error::from_io(&shown, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !matches(&name) {
            continue;
        }
        let meta = match entry.metadata() {
            Ok(m) => m,
            Err(_) => continue, // gone meanwhile: its writer committed or removed it
        };
        if !meta.is_file() || meta.modified().is_ok_and(|m| m >= before) {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => {
                tracing::info!(file = %entry.path().display(), "removed a dead writer's staging file");
                n += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::from_io(entry.path().display().to_string(), e)),
        }
    }
    Ok(n)
}

/// Aborts the uploads named by the markers in the folder of `inside` (any file location in it) whose names
/// `matches` and that were written before `before`, and removes the markers.
async fn sweep_markers(
    inside: &Location,
    matches: &(dyn Fn(&str) -> bool + Sync),
    before: SystemTime,
) -> Result<usize> {
    let (stores, key) = inside
        .stores()
        .ok_or_else(|| Error::InvalidLocation { location: inside.to_string(), msg: "not in an object store".into() })?;
    let folder = key.as_ref().rsplit_once('/').map(|(d, _)| object_store::path::Path::from(d));
    let shown = inside.to_string();
    let listed = stores.objects.list_with_delimiter(folder.as_ref()).await.map_err(|e| Error::from_store(&shown, e))?;
    let mut n = 0;
    for meta in listed.objects {
        let Some(marker) = meta.location.filename() else { continue };
        let Some(staged) = staged_name(marker).filter(|_| matches(marker)) else { continue };
        if SystemTime::from(meta.last_modified) >= before {
            continue;
        }
        let marker_shown = format!("{}/{}", folder.as_ref().map_or("", |f| f.as_ref()), marker);
        let id = match stores.objects.get(&meta.location).await {
            Ok(got) => got.bytes().await.map_err(|e| Error::from_store(&marker_shown, e))?,
            Err(object_store::Error::NotFound { .. }) => continue, // its writer finished meanwhile
            Err(e) => return Err(Error::from_store(marker_shown, e)),
        };
        let id = String::from_utf8_lossy(&id).into_owned();
        let target = match &folder {
            Some(f) => f.clone().join(staged),
            None => object_store::path::Path::from(staged),
        };
        // An upload already completed or aborted is no error: the marker is what is left to remove.
        if let Err(e) = stores.multipart.abort_multipart(&target, &id).await {
            tracing::debug!(upload = %id, object = %target, "abort: {e}");
        }
        match stores.objects.delete(&meta.location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(Error::from_store(marker_shown, e)),
        }
        tracing::info!(object = %target, upload = %id, "aborted a dead writer's upload");
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_names() {
        assert_eq!(prefix("m.gguf"), ".m.gguf.partial-");
        assert!(is_staging(".m.gguf.partial-a1B2c3"));
        assert!(!is_staging("m.gguf"));
        assert!(!is_staging(".hidden"));
        assert_eq!(staged_name(".m.gguf.partial-a1B2c3"), Some("m.gguf"));
        assert_eq!(staged_name("m.gguf"), None);
    }
}
