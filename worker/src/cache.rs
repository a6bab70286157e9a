//! A worker's local cache of fetched inputs: the farm-made files (and MLX folders) its tasks read, kept on its disk
//! after the task, content-addressed by the sha256 the coordinator recorded when they were made (`Task.inputs`).
//!
//! - **Bounded.** The entries' bytes never exceed the cache's size (`--cache-size`): room is made by removing the
//!   least recently used entries no running task is reading. An input that does not fit is not kept (its task
//!   fetches it into scratch, as without a cache).
//! - **Checked.** A fetched file is hashed as it is written and kept only with the recorded digest; another digest
//!   means the stored copy is corrupt, which the task reports (`FailureKind::Corrupt`, so the producer makes it
//!   again). An entry is hashed again each time it is used: one that changed on disk is removed and fetched again,
//!   never used. (The evaluation runtimes read the whole model right after, so the second read comes from the page
//!   cache.)
//! - **Atomic.** A file is fetched under a `.partial-` name and renamed into place when whole and checked; partial
//!   names left by a killed worker are removed when the cache opens.
//! - **One worker per folder**: the folder is locked (`flock`) while its worker runs. Entries survive the worker:
//!   one started on the same folder finds them (least recently used first out, by modification time).
//!
//! - **Derived entries** (`Cache::derived`): a folder the worker made itself from inputs of known digests (the
//!   unquantized MLX conversion mlx-lm is given for a layout it cannot load, `crate::mlx_run::checkpoint`), named by
//!   a digest of what it was made from and how, its content digest kept beside it (`KEY.made`) and checked on every
//!   use as a fetched entry's. So the tasks that read one model (mlx-lm's greedy, KLD and probe tasks) make it once.
//!   Derived entries count against the same size; they are not reported as holdings.
//!
//! Workers report what they hold with every lease request; the coordinator leases them tasks whose inputs they
//! hold (`coordinator/src/affinity.rs`).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use quantfarm_proto as pb;
use quantfarm_store::{Blob, Digest, Location};
use sha2::{Digest as _, Sha256};

use crate::failure::Failure;

const LOCK: &str = ".lock";
const PARTIAL: &str = ".partial-";
/// The suffix of a derived entry's sidecar: its content digest (`KEY.made` beside the folder `KEY`).
const MADE: &str = ".made";

struct Entry {
    bytes: u64,
    /// Use order: larger is more recent.
    used: u64,
    /// Running tasks reading it (an entry in use is never removed).
    pins: u32,
    /// Whole and checked (an entry being fetched is reserved but not yet served).
    ready: bool,
    dir: bool,
    /// Made by this worker (`Cache::derived`), not fetched: not a holding the coordinator can lease by.
    derived: bool,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// Bytes of all entries, including those being fetched (reserved).
    bytes: u64,
    tick: u64,
}

/// What the cache did since its worker started (for logs and the tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub hit_bytes: u64,
    pub fetches: u64,
    pub fetched_bytes: u64,
    /// Entries found changed on disk (removed, fetched again).
    pub corrupt: u64,
    pub evicted: u64,
    /// Derived entries made (`Cache::derived`; a use of one already made counts as a hit).
    pub made: u64,
}

pub struct Cache {
    dir: PathBuf,
    size: u64,
    state: Mutex<State>,
    stats: Mutex<CacheStats>,
    _lock: File,
}

/// An entry a task is reading: it stays until dropped.
pub struct Pinned {
    cache: Arc<Cache>,
    sha256: String,
    path: PathBuf,
    /// Fetched from the store for this use (not a hit).
    fetched: bool,
}

impl Pinned {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fetched(&self) -> bool {
        self.fetched
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let mut st = self.cache.lock();
        if let Some(e) = st.entries.get_mut(&self.sha256) {
            e.pins = e.pins.saturating_sub(1);
        }
    }
}

fn is_digest(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn io(path: &Path, e: impl std::fmt::Display) -> Failure {
    Failure::transient(path.display(), e)
}

impl Cache {
    /// Opens (creating) the cache folder `dir` of at most `size` bytes: locks it, removes partial fetches, takes the
    /// entries found as they are (least recently modified first out) and trims them to the size.
    pub fn open(dir: &Path, size: u64) -> std::io::Result<Arc<Cache>> {
        std::fs::create_dir_all(dir)?;
        let lock = File::create(dir.join(LOCK))?;
        lock.try_lock()
            .map_err(|e| std::io::Error::other(format!("{}: in use by another worker ({e})", dir.display())))?;
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.starts_with(PARTIAL) {
                remove(&path);
                continue;
            }
            // A sidecar whose folder is gone (a killed worker between the two renames, or an eviction's).
            if let Some(key) = name.strip_suffix(MADE) {
                if !dir.join(key).exists() {
                    remove(&path);
                }
                continue;
            }
            if !is_digest(&name) {
                continue;
            }
            let meta = entry.metadata()?;
            let bytes = if meta.is_dir() { dir_bytes(&path)? } else { meta.len() };
            let mtime = meta.modified().ok();
            let derived = dir.join(format!("{name}{MADE}")).exists();
            found.push((mtime, name, bytes, meta.is_dir(), derived));
        }
        found.sort();
        let mut st = State::default();
        for (_, name, bytes, dir, derived) in found {
            st.tick += 1;
            st.bytes += bytes;
            st.entries.insert(name, Entry { bytes, used: st.tick, pins: 0, ready: true, dir, derived });
        }
        let cache = Arc::new(Cache {
            dir: dir.to_path_buf(),
            size,
            state: Mutex::new(st),
            stats: Mutex::default(),
            _lock: lock,
        });
        {
            let mut st = cache.lock();
            let evicted = cache.make_room(&mut st, 0);
            tracing::info!(
                cache = %dir.display(),
                entries = st.entries.len(),
                bytes = st.bytes,
                size,
                evicted,
                "worker cache opened"
            );
        }
        Ok(cache)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn stats(&self) -> CacheStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self, f: impl FnOnce(&mut CacheStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// The sha256 of every whole entry: what the worker reports holding.
    pub fn holdings(&self) -> Vec<String> {
        let st = self.lock();
        let mut v: Vec<String> =
            st.entries.iter().filter(|(_, e)| e.ready && !e.derived).map(|(k, _)| k.clone()).collect();
        v.sort();
        v
    }

    /// Removes least recently used entries nobody reads until `extra` more bytes fit; how many were removed. Stops
    /// short when only entries in use are left.
    fn make_room(&self, st: &mut State, extra: u64) -> usize {
        let mut removed = 0;
        while st.bytes + extra > self.size {
            let victim = st
                .entries
                .iter()
                .filter(|(_, e)| e.pins == 0 && e.ready)
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone());
            let Some(k) = victim else { break };
            if let Some(e) = st.entries.remove(&k) {
                st.bytes -= e.bytes;
                remove(&self.dir.join(&k));
                if e.derived {
                    remove(&self.dir.join(format!("{k}{MADE}")));
                }
                removed += 1;
            }
        }
        if removed > 0 {
            self.count(|s| s.evicted += removed as u64);
        }
        removed
    }

    /// The input `input` (a file, or with `folder` the named files of a folder) as a local path the caller reads
    /// while it holds the returned pin: from the cache when a checked entry is there, else fetched from the store
    /// into it. `None`: it cannot be kept (larger than the cache's room, or being fetched by another task); the
    /// caller fetches it itself. A stored copy without the recorded digest is `Failure::corrupt`.
    pub async fn get(
        self: &Arc<Self>,
        input: &pb::InputFile,
        folder: Option<&[String]>,
        budget: u64,
    ) -> Result<Option<Pinned>, Failure> {
        let sha = &input.sha256;
        if !is_digest(sha) || input.bytes > self.size {
            return Ok(None);
        }
        let path = self.dir.join(sha);
        // A hit: pinned, then checked.
        let hit = {
            let mut st = self.lock();
            st.tick += 1;
            let tick = st.tick;
            match st.entries.get_mut(sha) {
                Some(e) if e.ready => {
                    e.pins += 1;
                    e.used = tick;
                    Some(e.dir)
                }
                Some(_) => return Ok(None),
                None => None,
            }
        };
        if let Some(is_dir) = hit {
            let pin = Pinned { cache: self.clone(), sha256: sha.clone(), path: path.clone(), fetched: false };
            let Digest { sha256: found, bytes } = digest_local(&path, is_dir, budget).await?;
            if found == *sha {
                touch(&path);
                self.count(|s| {
                    s.hits += 1;
                    s.hit_bytes += bytes;
                });
                return Ok(Some(pin));
            }
            tracing::warn!(
                entry = %path.display(),
                url = %input.url,
                "cache entry changed on disk (sha256 {found}, expected {sha}): removed, fetching it again"
            );
            self.count(|s| s.corrupt += 1);
            drop(pin);
            self.forget(sha);
            remove(&path);
        }
        // A miss: reserve the room, fetch, check, commit.
        {
            let mut st = self.lock();
            if st.entries.contains_key(sha) {
                return Ok(None);
            }
            self.make_room(&mut st, input.bytes);
            if st.bytes + input.bytes > self.size {
                return Ok(None);
            }
            st.bytes += input.bytes;
            st.tick += 1;
            let used = st.tick;
            st.entries.insert(
                sha.clone(),
                Entry { bytes: input.bytes, used, pins: 1, ready: false, dir: folder.is_some(), derived: false },
            );
        }
        let pin = Pinned { cache: self.clone(), sha256: sha.clone(), path: path.clone(), fetched: true };
        match self.fetch(input, folder, &path, budget).await {
            Ok(bytes) => {
                self.commit(sha, bytes);
                self.count(|s| {
                    s.fetches += 1;
                    s.fetched_bytes += bytes;
                });
                Ok(Some(pin))
            }
            Err(f) => {
                drop(pin);
                self.forget(sha);
                Err(f)
            }
        }
    }

    /// The derived entry `key` (a digest naming what it is made from and how): a local folder the caller reads
    /// while it holds the returned pin, made by `make` into the folder it is given when absent (or found changed on
    /// disk). `estimate`: its bytes, for making room before it is made. `None`: it cannot be kept (no room, or
    /// another task is making it); the caller makes its own.
    pub async fn derived<F, Fut>(
        self: &Arc<Self>,
        key: &str,
        estimate: u64,
        budget: u64,
        make: F,
    ) -> Result<Option<Pinned>, Failure>
    where
        F: FnOnce(PathBuf) -> Fut,
        Fut: std::future::Future<Output = Result<(), Failure>>,
    {
        if !is_digest(key) || estimate > self.size {
            return Ok(None);
        }
        let path = self.dir.join(key);
        let sidecar = self.dir.join(format!("{key}{MADE}"));
        let hit = {
            let mut st = self.lock();
            st.tick += 1;
            let tick = st.tick;
            match st.entries.get_mut(key) {
                Some(e) if e.ready && e.derived => {
                    e.pins += 1;
                    e.used = tick;
                    true
                }
                Some(_) => return Ok(None),
                None => false,
            }
        };
        if hit {
            let pin = Pinned { cache: self.clone(), sha256: key.to_string(), path: path.clone(), fetched: false };
            let want = std::fs::read_to_string(&sidecar).unwrap_or_default();
            let Digest { sha256: found, bytes } = digest_local(&path, true, budget).await?;
            if found == want.trim() {
                touch(&path);
                self.count(|s| {
                    s.hits += 1;
                    s.hit_bytes += bytes;
                });
                return Ok(Some(pin));
            }
            tracing::warn!(entry = %path.display(), "derived cache entry changed on disk: removed, making it again");
            self.count(|s| s.corrupt += 1);
            drop(pin);
            self.forget(key);
            remove(&path);
            remove(&sidecar);
        }
        {
            let mut st = self.lock();
            if st.entries.contains_key(key) {
                return Ok(None);
            }
            self.make_room(&mut st, estimate);
            if st.bytes + estimate > self.size {
                return Ok(None);
            }
            st.bytes += estimate;
            st.tick += 1;
            let used = st.tick;
            st.entries.insert(
                key.to_string(),
                Entry { bytes: estimate, used, pins: 1, ready: false, dir: true, derived: true },
            );
        }
        let pin = Pinned { cache: self.clone(), sha256: key.to_string(), path: path.clone(), fetched: true };
        let partial = self.dir.join(format!("{PARTIAL}{key}-{}", std::process::id()));
        remove(&partial);
        let made = async {
            make(partial.clone()).await?;
            let Digest { sha256: digest, bytes } = digest_local(&partial, true, budget).await?;
            // The sidecar first: a folder in place always has its digest beside it.
            std::fs::write(&sidecar, format!("{digest}\n")).map_err(|e| io(&sidecar, e))?;
            std::fs::rename(&partial, &path).map_err(|e| io(&path, e))?;
            Ok(bytes)
        }
        .await;
        match made {
            Ok(bytes) => {
                self.commit(key, bytes);
                self.count(|s| s.made += 1);
                Ok(Some(pin))
            }
            Err(f) => {
                drop(pin);
                remove(&partial);
                self.forget(key);
                Err(f)
            }
        }
    }

    /// Marks the reserved entry `key` whole, `bytes` long (it was reserved at an estimate).
    fn commit(&self, key: &str, bytes: u64) {
        let mut st = self.lock();
        let reserved = match st.entries.get_mut(key) {
            Some(e) => {
                e.ready = true;
                std::mem::replace(&mut e.bytes, bytes)
            }
            None => bytes,
        };
        st.bytes = st.bytes - reserved + bytes;
    }

    /// Drops entry `key` from the books (its files are the caller's to remove).
    fn forget(&self, key: &str) {
        let mut st = self.lock();
        if let Some(e) = st.entries.remove(key) {
            st.bytes -= e.bytes;
        }
    }

    /// Fetches `input` into a partial name beside `path`, checks its digest and renames it into place.
    async fn fetch(
        &self,
        input: &pb::InputFile,
        folder: Option<&[String]>,
        path: &Path,
        budget: u64,
    ) -> Result<u64, Failure> {
        let partial = self.dir.join(format!("{PARTIAL}{}-{}", input.sha256, std::process::id()));
        remove(&partial);
        let from = Location::parse(&input.url).map_err(Failure::from)?;
        let result = async {
            let Digest { sha256: sha, bytes } = match folder {
                None => download(&from, &partial, budget).await?,
                Some(names) => {
                    std::fs::create_dir_all(&partial).map_err(|e| io(&partial, e))?;
                    let mut files = Vec::with_capacity(names.len());
                    for name in names {
                        let Digest { sha256: sha, bytes } =
                            download(&from.child(name)?, &partial.join(name), budget).await?;
                        files.push((name.clone(), sha, bytes));
                    }
                    digest_lines(files)
                }
            };
            if sha != input.sha256 {
                return Err(Failure::corrupt(&input.url, &sha, &input.sha256));
            }
            std::fs::rename(&partial, path).map_err(|e| io(path, e))?;
            Ok(bytes)
        }
        .await;
        if result.is_err() {
            remove(&partial);
        }
        result
    }
}

fn remove(path: &Path) {
    let _ = if path.is_dir() { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) };
}

fn touch(path: &Path) {
    if let Ok(f) = File::open(path) {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
}

fn dir_bytes(dir: &Path) -> std::io::Result<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        n += e?.metadata()?.len();
    }
    Ok(n)
}

/// The folder digest of files given as (name, sha256, bytes) (as `worker/src/outputs.rs` records a folder output):
/// [`Digest::of_folder`].
pub fn digest_lines(files: Vec<(String, String, u64)>) -> Digest {
    Digest::of_folder(files)
}

/// Copies one object to a local file in pieces of at most `budget` bytes, hashing it on the way: its sha256 and
/// bytes.
pub async fn download(from: &Location, to: &Path, budget: u64) -> Result<Digest, Failure> {
    let mut out = std::io::BufWriter::new(File::create(to).map_err(|e| io(to, e))?);
    let got = read_hashing(from, Some((&mut out, to)), budget).await?;
    out.flush().map_err(|e| io(to, e))?;
    Ok(got)
}

/// Reads one object whole in pieces of at most `budget` bytes, hashing it and writing it to `out` if given: its
/// sha256 and bytes.
pub async fn read_hashing(
    from: &Location,
    mut out: Option<(&mut (dyn Write + Send), &Path)>,
    budget: u64,
) -> Result<Digest, Failure> {
    let blob = Blob::open(from).await?;
    let mut buf = vec![0u8; budget.clamp(1 << 16, 64 << 20).min(blob.len().max(1)) as usize];
    let mut h = Sha256::new();
    let mut off = 0;
    while off < blob.len() {
        let n = buf.len().min((blob.len() - off) as usize);
        blob.read_at(off, &mut buf[..n]).await?;
        h.update(&buf[..n]);
        if let Some((w, path)) = out.as_mut() {
            w.write_all(&buf[..n]).map_err(|e| io(path, e))?;
        }
        off += n as u64;
    }
    Ok(Digest::new(quantfarm_store::hex(&h.finalize()), blob.len()))
}

/// The sha256 and bytes of a local file, or the folder digest of a local folder's files.
async fn digest_local(path: &Path, is_dir: bool, budget: u64) -> Result<Digest, Failure> {
    let path = path.to_path_buf();
    let shown = path.display().to_string();
    let buf_len = budget.clamp(1 << 16, 64 << 20) as usize;
    tokio::task::spawn_blocking(move || {
        let hash_file = |p: &Path| -> Result<Digest, Failure> {
            let mut f = File::open(p).map_err(|e| io(p, e))?;
            let mut buf = vec![0u8; buf_len];
            let mut h = Sha256::new();
            let mut n = 0u64;
            loop {
                let k = f.read(&mut buf).map_err(|e| io(p, e))?;
                if k == 0 {
                    break;
                }
                h.update(&buf[..k]);
                n += k as u64;
            }
            Ok(Digest::new(quantfarm_store::hex(&h.finalize()), n))
        };
        if !is_dir {
            return hash_file(&path);
        }
        let mut files = Vec::new();
        for e in std::fs::read_dir(&path).map_err(|e| io(&path, e))? {
            let e = e.map_err(|e| io(&path, e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Digest { sha256: sha, bytes } = hash_file(&e.path())?;
            files.push((name, sha, bytes));
        }
        Ok(digest_lines(files))
    })
    .await
    .map_err(|e| Failure::internal(format!("hashing {shown}: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(bytes: &[u8]) -> String {
        quantfarm_store::hex(&Sha256::digest(bytes))
    }

    /// A stored file (in a local folder standing for the store) and its input record.
    fn stored(dir: &Path, name: &str, bytes: &[u8]) -> pb::InputFile {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        pb::InputFile { url: p.display().to_string(), sha256: sha(bytes), bytes: bytes.len() as u64 }
    }

    #[tokio::test]
    async fn fetches_once_evicts_lru_and_refetches_a_corrupt_entry() {
        let store = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path(), 250).unwrap();
        let a = stored(store.path(), "a", &[1u8; 100]);
        let b = stored(store.path(), "b", &[2u8; 100]);
        let c = stored(store.path(), "c", &[3u8; 100]);
        let pa = cache.get(&a, None, 1 << 20).await.unwrap().expect("a fits");
        assert_eq!(std::fs::read(pa.path()).unwrap(), [1u8; 100]);
        drop(pa);
        // Again: a hit, nothing fetched.
        drop(cache.get(&a, None, 1 << 20).await.unwrap().unwrap());
        assert_eq!((cache.stats().fetches, cache.stats().hits), (1, 1));
        // b, then c: c needs room, a (least recently used, not in use) goes... unless in use.
        let pb_ = cache.get(&b, None, 1 << 20).await.unwrap().unwrap();
        let pa = cache.get(&a, None, 1 << 20).await.unwrap().unwrap();
        assert!(cache.get(&c, None, 1 << 20).await.unwrap().is_none(), "both in use: c is not kept");
        drop(pb_);
        let pc = cache.get(&c, None, 1 << 20).await.unwrap().expect("b was not in use");
        assert_eq!(cache.holdings(), {
            let mut v = vec![a.sha256.clone(), c.sha256.clone()];
            v.sort();
            v
        });
        assert_eq!(cache.stats().evicted, 1);
        drop((pa, pc));
        // An entry changed on disk is found by its digest, removed and fetched again.
        std::fs::write(dir.path().join(&a.sha256), [9u8; 100]).unwrap();
        let before = cache.stats();
        let pa = cache.get(&a, None, 1 << 20).await.unwrap().unwrap();
        assert_eq!(std::fs::read(pa.path()).unwrap(), [1u8; 100]);
        assert_eq!((cache.stats().corrupt, cache.stats().fetches), (before.corrupt + 1, before.fetches + 1));
        drop(pa);
        // The stored copy itself corrupt: reported as such, nothing kept.
        std::fs::write(store.path().join("b"), [7u8; 100]).unwrap();
        let f = cache.get(&b, None, 1 << 20).await.err().expect("corrupt");
        assert_eq!(f.kind, pb::FailureKind::Corrupt);
        assert_eq!(f.corrupt_url.as_deref(), Some(b.url.as_str()));
        assert!(!cache.holdings().contains(&b.sha256));
        // Never past the size; a file larger than the cache is not kept.
        let big = stored(store.path(), "big", &[4u8; 300]);
        assert!(cache.get(&big, None, 1 << 20).await.unwrap().is_none());
        assert!(cache.lock().bytes <= 250);
        // Reopened by the next worker: the entries are still there; a partial fetch is removed.
        std::fs::write(dir.path().join(format!("{PARTIAL}x-1")), b"half").unwrap();
        let held = cache.holdings();
        assert!(!held.is_empty());
        drop(cache);
        let again = Cache::open(dir.path(), 250).unwrap();
        assert_eq!(again.holdings(), held);
        assert!(!dir.path().join(format!("{PARTIAL}x-1")).exists());
        // One worker per folder.
        assert!(Cache::open(dir.path(), 250).is_err());
    }

    /// A derived entry is made once and then used; one changed on disk is made again; it survives a reopen (its
    /// sidecar marks it derived), is never reported as a holding, and a failed make leaves nothing behind.
    #[tokio::test]
    async fn a_derived_entry_is_made_once_checked_and_kept_apart_from_holdings() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path(), 1 << 20).unwrap();
        let key = sha(b"derived from something");
        let made = std::sync::atomic::AtomicU32::new(0);
        let make = |out: PathBuf| {
            made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                std::fs::create_dir_all(&out).map_err(|e| io(&out, e))?;
                std::fs::write(out.join("model.safetensors"), [6u8; 32]).map_err(|e| io(&out, e))?;
                Ok(())
            }
        };
        let p = cache.derived(&key, 32, 1 << 20, make).await.unwrap().expect("fits");
        assert_eq!(std::fs::read(p.path().join("model.safetensors")).unwrap(), [6u8; 32]);
        drop(p);
        drop(cache.derived(&key, 32, 1 << 20, make).await.unwrap().unwrap());
        assert_eq!(made.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!((cache.stats().made, cache.stats().hits), (1, 1));
        assert!(cache.holdings().is_empty(), "a derived entry is not a holding");
        // Changed on disk: made again.
        std::fs::write(dir.path().join(&key).join("model.safetensors"), [0u8; 32]).unwrap();
        let p = cache.derived(&key, 32, 1 << 20, make).await.unwrap().unwrap();
        assert_eq!(std::fs::read(p.path().join("model.safetensors")).unwrap(), [6u8; 32]);
        assert_eq!((made.load(std::sync::atomic::Ordering::SeqCst), cache.stats().corrupt), (2, 1));
        drop(p);
        // Reopened: still derived (a hit, not a holding).
        drop(cache);
        let cache = Cache::open(dir.path(), 1 << 20).unwrap();
        assert!(cache.holdings().is_empty());
        drop(cache.derived(&key, 32, 1 << 20, make).await.unwrap().unwrap());
        assert_eq!((made.load(std::sync::atomic::Ordering::SeqCst), cache.stats().hits), (2, 1));
        // A make that fails: its error, and no entry or partial folder left.
        let other = sha(b"another");
        let failing = |out: PathBuf| async move {
            std::fs::create_dir_all(&out).map_err(|e| io(&out, e))?;
            Err(Failure::internal("no room on the device"))
        };
        let f = cache.derived(&other, 32, 1 << 20, failing).await.err().expect("fails");
        assert!(f.message.contains("no room"), "{}", f.message);
        let left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(PARTIAL) || n.starts_with(&other))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[tokio::test]
    async fn a_folder_is_one_entry_checked_by_its_folder_digest() {
        let store = tempfile::tempdir().unwrap();
        let model = store.path().join("mlx");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("config.json"), b"{}").unwrap();
        std::fs::write(model.join("model.safetensors"), [5u8; 64]).unwrap();
        let names = vec!["config.json".to_string(), "model.safetensors".to_string()];
        let Digest { sha256: digest, bytes } = digest_lines(vec![
            ("config.json".into(), sha(b"{}"), 2),
            ("model.safetensors".into(), sha(&[5u8; 64]), 64),
        ]);
        let input = pb::InputFile { url: model.display().to_string(), sha256: digest, bytes };
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path(), 1 << 20).unwrap();
        let p = cache.get(&input, Some(&names), 1 << 20).await.unwrap().unwrap();
        assert_eq!(std::fs::read(p.path().join("model.safetensors")).unwrap(), [5u8; 64]);
        drop(p);
        drop(cache.get(&input, Some(&names), 1 << 20).await.unwrap().unwrap());
        assert_eq!((cache.stats().fetches, cache.stats().hits), (1, 1));
    }
}
