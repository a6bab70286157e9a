//! Reading a task's inputs from the store: hashing an object within the budget, small texts whole, and local copies
//! of models and files for llama.cpp (which reads paths). Inputs are read where they lie when the store is a local
//! folder, else fetched into a scratch folder removed with the task.

use std::io::BufWriter;
use std::path::{Path, PathBuf};

use quantfarm_store::{Blob, Location};
use quantfarm_tensors::gguf::split::{parse_split_file_name, split_file_name};
use sha2::{Digest, Sha256};

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
pub async fn hash_object(loc: &Location, budget: u64) -> Result<(String, u64), Failure> {
    let blob = Blob::open(loc).await?;
    let mut buf = vec![0u8; budget.clamp(1 << 16, 64 << 20).min(blob.len().max(1)) as usize];
    let mut h = Sha256::new();
    let mut off = 0;
    while off < blob.len() {
        let n = buf.len().min((blob.len() - off) as usize);
        blob.read_at(off, &mut buf[..n]).await?;
        h.update(&buf[..n]);
        off += n as u64;
    }
    Ok((quantfarm_store::hex(&h.finalize()), blob.len()))
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

/// Copies one object to a local file, in pieces of at most `budget` bytes.
async fn download(from: &Location, to: &Path, budget: u64) -> Result<(), Failure> {
    use std::io::Write;
    let blob = Blob::open(from).await?;
    let mut out = BufWriter::new(std::fs::File::create(to).map_err(|e| Failure::transient(to.display(), e))?);
    let mut buf = vec![0u8; budget.clamp(1 << 16, 64 << 20).min(blob.len().max(1)) as usize];
    let mut off = 0;
    while off < blob.len() {
        let n = buf.len().min((blob.len() - off) as usize);
        blob.read_at(off, &mut buf[..n]).await?;
        out.write_all(&buf[..n]).map_err(|e| Failure::transient(to.display(), e))?;
        off += n as u64;
    }
    out.flush().map_err(|e| Failure::transient(to.display(), e))
}

/// A local path for the model at `url`: a GGUF file (with its split siblings) or a checkpoint folder.
pub async fn local_model(url: &str, dir: &Path, env: &Env) -> Result<PathBuf, Failure> {
    let loc = location(url)?;
    if let Some(p) = loc.local_path() {
        return Ok(p.to_path_buf());
    }
    if loc.is_dir().await? {
        let folder = dir.join(loc.file_name());
        std::fs::create_dir_all(&folder).map_err(|e| Failure::transient(folder.display(), e))?;
        for name in loc.list().await? {
            download(&loc.child(&name)?, &folder.join(&name), env.budget).await?;
        }
        return Ok(folder);
    }
    let name = loc.file_name().to_string();
    match parse_split_file_name(&name) {
        Some((prefix, _, count)) => {
            for i in 0..count {
                let part = split_file_name(prefix, i, count);
                download(&loc.sibling(&part)?, &dir.join(&part), env.budget).await?;
            }
        }
        None => download(&loc, &dir.join(&name), env.budget).await?,
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
    download(&loc, &path, env.budget).await?;
    Ok(path)
}
