//! A worker's own scratch folder (fetched models, recomputed outputs), inside the folder its machine's workers
//! share. It holds a lock file for as long as its worker runs; a worker that starts removes the folders whose lock
//! it can take — those of workers that died (a SIGKILL leaves them behind) — before it claims its own. The lock is
//! the operating system's (`flock`, released when its process ends however it ends), so a live worker's folder is
//! never taken for a dead one's.

use std::fs::File;
use std::path::{Path, PathBuf};

const LOCK: &str = ".lock";

pub struct Scratch {
    dir: PathBuf,
    /// Locked while this worker runs.
    _lock: File,
}

impl Scratch {
    /// Removes dead workers' folders in `shared`, then makes and locks this worker's own (`NAME-XXXXXX`).
    pub fn claim(shared: &Path, worker: &str) -> std::io::Result<Scratch> {
        std::fs::create_dir_all(shared)?;
        let removed = sweep_dead(shared);
        if removed > 0 {
            tracing::info!(scratch = %shared.display(), removed, "removed dead workers' scratch folders");
        }
        let safe: String =
            worker.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
        let dir = tempfile::Builder::new().prefix(&format!("{safe}-")).tempdir_in(shared)?.keep();
        // Locked under a temporary name, then renamed into place: a folder whose `.lock` can be taken is dead.
        let staged = dir.join(".lock.new");
        let lock = File::create(&staged)?;
        lock.try_lock().map_err(std::io::Error::other)?;
        std::fs::rename(&staged, dir.join(LOCK))?;
        Ok(Scratch { dir, _lock: lock })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Removes every folder of `shared` whose lock file can be locked (its worker is gone); returns how many.
fn sweep_dead(shared: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(shared) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let lock_path = entry.path().join(LOCK);
        let Ok(lock) = File::open(&lock_path) else { continue };
        if lock.try_lock().is_ok() && std::fs::remove_dir_all(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_workers_folder_is_removed_and_a_live_ones_kept() {
        let shared = tempfile::tempdir().unwrap();
        let live = Scratch::claim(shared.path(), "w/1").unwrap();
        std::fs::write(live.path().join("model.gguf"), b"x").unwrap();
        // A dead worker's folder: its lock file is there, nobody holds it.
        let dead = shared.path().join("w2-abc");
        std::fs::create_dir_all(&dead).unwrap();
        std::fs::write(dead.join(LOCK), b"").unwrap();
        std::fs::write(dead.join("eval-1"), b"left behind").unwrap();
        // A folder being claimed right now (no lock in place yet) is left alone.
        let claiming = shared.path().join("w3-def");
        std::fs::create_dir_all(&claiming).unwrap();

        let other = Scratch::claim(shared.path(), "w4").unwrap();
        assert!(!dead.exists(), "the dead worker's folder is removed");
        assert!(live.path().join("model.gguf").exists(), "the live worker's folder is kept");
        assert!(claiming.exists());
        assert!(live.path().file_name().unwrap().to_string_lossy().starts_with("w_1-"));
        let path = other.path().to_path_buf();
        drop(other);
        assert!(!path.exists(), "a worker that stops removes its folder");
    }
}
