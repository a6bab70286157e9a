//! Reading a task's inputs from the store: hashing an object within the budget, small texts whole, and local copies
//! of models and files for llama.cpp (which reads paths). Inputs are read where they lie when the store is a local
//! folder. Else the farm-made ones the task lists (`Task.inputs`) come through the worker's cache when it has one
//! (`crate::cache`), and every listed file is checked against its recorded digest; the rest are fetched into a
//! scratch folder removed with the task.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use quantfarm_store::{Blob, Digest, Location};
use quantfarm_tensors::gguf::split::{parse_split_file_name, split_file_name};
use quantfarm_tensors::TensorSource;
use sha2::{Digest as _, Sha256};

use crate::cache::{digest_lines, download, read_hashing, Pinned};
use crate::env::Env;
use crate::failure::Failure;

/// A task message's URL as a store location.
pub fn location(url: &str) -> Result<Location, Failure> {
    Location::parse(url).map_err(Failure::from)
}

/// Whether an object is there.
pub async fn exists(loc: &Location) -> bool {
    Blob::open(loc).await.is_ok()
}

/// Reads a whole object within `budget` and hashes it.
pub async fn hash_object(loc: &Location, budget: u64) -> Result<Digest, Failure> {
    read_hashing(loc, None, budget).await
}

/// Reads a small input file (a text, a prompt set, a probe suite) whole, with its sha256.
pub async fn read_text(url: &str) -> Result<(String, String), Failure> {
    let loc = location(url)?;
    let blob = Blob::open(&loc).await?;
    let mut bytes = vec![0u8; blob.len() as usize];
    blob.read_at(0, &mut bytes).await?;
    let sha = quantfarm_store::hex(&Sha256::digest(&bytes));
    let text = String::from_utf8(bytes).map_err(|e| Failure::input(format!("{url}: the text is not UTF-8: {e}")))?;
    Ok((text, sha))
}

/// A scratch folder for one task's fetched files, removed with it.
pub fn task_dir(env: &Env) -> Result<tempfile::TempDir, Failure> {
    std::fs::create_dir_all(&env.scratch).map_err(|e| Failure::transient(env.scratch.display(), e))?;
    tempfile::Builder::new()
        .prefix("eval-")
        .tempdir_in(&env.scratch)
        .map_err(|e| Failure::transient(env.scratch.display(), e))
}

/// Places the object at `from` (URL `url`) at the local path `to` for this task: from the worker's cache (a link
/// to its entry, kept for the task) when the task lists the file among its inputs, else fetched. A listed file is
/// checked against its recorded digest either way: another one is `Failure::corrupt`, so its producer makes it
/// again.
async fn place(url: &str, from: &Location, to: &Path, env: &Env) -> Result<(), Failure> {
    let start = Instant::now();
    let Some(input) = env.input(url) else {
        download(from, to, env.budget).await?;
        env.fetched_for(start.elapsed());
        return Ok(());
    };
    if let Some(cache) = &env.cache {
        if let Some(pin) = cache.get(input, None, env.budget).await? {
            link(pin.path(), to)?;
            keep(env, pin, start);
            return Ok(());
        }
    }
    let Digest { sha256: sha, .. } = download(from, to, env.budget).await?;
    env.fetched_for(start.elapsed());
    if sha != input.sha256 {
        return Err(Failure::corrupt(url, &sha, &input.sha256));
    }
    Ok(())
}

/// Keeps a cache entry for the task, counting the time since `start` as fetching when it was fetched for it.
fn keep(env: &Env, pin: Pinned, start: Instant) {
    if pin.fetched() {
        env.fetched_for(start.elapsed());
    }
    env.keep(pin);
}

fn link(entry: &Path, to: &Path) -> Result<(), Failure> {
    let _ = std::fs::remove_file(to);
    std::os::unix::fs::symlink(entry, to).map_err(|e| Failure::transient(to.display(), e))
}

/// A local path for the model at `url`: a GGUF file (with its split siblings) or a checkpoint folder.
pub async fn local_model(url: &str, dir: &Path, env: &Env) -> Result<PathBuf, Failure> {
    let loc = location(url)?;
    if let Some(p) = loc.local_path() {
        return Ok(p.to_path_buf());
    }
    if loc.is_dir().await? {
        let folder = dir.join(loc.file_name());
        let names = loc.list().await?;
        let start = Instant::now();
        if let Some(input) = env.input(url) {
            if let Some(cache) = &env.cache {
                if let Some(pin) = cache.get(input, Some(&names), env.budget).await? {
                    link(pin.path(), &folder)?;
                    keep(env, pin, start);
                    return Ok(folder);
                }
            }
        }
        std::fs::create_dir_all(&folder).map_err(|e| Failure::transient(folder.display(), e))?;
        let mut files = Vec::with_capacity(names.len());
        for name in &names {
            let Digest { sha256: sha, bytes } = download(&loc.child(name)?, &folder.join(name), env.budget).await?;
            files.push((name.clone(), sha, bytes));
        }
        env.fetched_for(start.elapsed());
        if let Some(input) = env.input(url) {
            let Digest { sha256: digest, .. } = digest_lines(files);
            if digest != input.sha256 {
                return Err(Failure::corrupt(url, &digest, &input.sha256));
            }
        }
        return Ok(folder);
    }
    let name = loc.file_name().to_string();
    match parse_split_file_name(&name) {
        Some((prefix, _, count)) => {
            for i in 0..count {
                let part = split_file_name(prefix, i, count);
                let sib = loc.sibling(&part)?;
                place(&sib.to_string(), &sib, &dir.join(&part), env).await?;
            }
        }
        None => place(url, &loc, &dir.join(&name), env).await?,
    }
    Ok(dir.join(name))
}

/// A local path for the file at `url`.
pub async fn local_file(url: &str, dir: &Path, env: &Env) -> Result<PathBuf, Failure> {
    let loc = location(url)?;
    if let Some(p) = loc.local_path() {
        return Ok(p.to_path_buf());
    }
    let path = dir.join(loc.file_name());
    place(url, &loc, &path, env).await?;
    Ok(path)
}

/// The GGUF model whose first file is `first` (a split set), as a tensor source whose files listed among the
/// task's inputs are read from the worker's cache (each checked against its recorded digest as it is fetched or
/// used), the others from the store: a quantize task reads one file of the set whole, and only the headers of the
/// others.
pub async fn gguf_source(first: &str, env: &Env) -> Result<TensorSource, Failure> {
    let loc = location(first)?;
    let Some(cache) = env.cache.as_ref().filter(|_| loc.local_path().is_none() && !env.inputs.is_empty()) else {
        return Ok(TensorSource::open(&loc).await?);
    };
    let mut local: HashMap<String, Location> = HashMap::new();
    let (dir, _) = first.rsplit_once('/').unwrap_or(("", first));
    for input in env.inputs.values().filter(|i| i.url.rsplit_once('/').map(|p| p.0) == Some(dir)) {
        let start = Instant::now();
        if let Some(pin) = cache.get(input, None, env.budget).await? {
            let name = input.url.rsplit_once('/').map_or(input.url.as_str(), |p| p.1).to_string();
            local.insert(name, Location::local(pin.path()));
            keep(env, pin, start);
        }
    }
    let resolve = move |name: &str| local.get(name).cloned();
    Ok(TensorSource::open_gguf_resolved(&loc, &resolve).await?)
}

/// The sha256 and bytes of the stored object at `url`: through the worker's cache when the task lists it among its
/// inputs (fetched and checked against the recorded digest, or an entry checked again), else read and hashed.
pub async fn stored_digest(url: &str, env: &Env) -> Result<Digest, Failure> {
    if let (Some(input), Some(cache)) = (env.input(url), env.cache.as_ref()) {
        if location(url)?.local_path().is_none() {
            let start = Instant::now();
            if let Some(pin) = cache.get(input, None, env.budget).await? {
                keep(env, pin, start);
                return Ok(Digest::new(input.sha256.clone(), input.bytes));
            }
        }
    }
    hash_object(&location(url)?, env.budget).await
}
