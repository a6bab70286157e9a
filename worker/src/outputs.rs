//! Writing a task's content-addressed output: an output already at its URL with the bytes the farm recorded is the
//! right one (a cache hit) and is only hashed; a corrupt one is made again; a new one goes through the staged sink,
//! so nothing is visible at the URL until it is whole. Also what a result says of an output: its sha256, size and
//! per-type tensor counts, and the digest of a folder of files.

use std::collections::BTreeMap;
use std::path::Path;

use quantfarm_proto as pb;
use quantfarm_store::{Blob, Digest, Location, StagedSink};
use quantfarm_tensors::gguf::GgufHeader;
use quantfarm_tensors::TensorSource;

pub use crate::cache::digest_lines;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{exists, hash_object, location};

/// The artifact at `out`, just written (`cache_hit` false) or found there.
pub fn artifact_result(out: &Location, Digest { sha256, bytes }: Digest, cache_hit: bool) -> pb::ArtifactResult {
    pb::ArtifactResult {
        artifact: Some(pb::Artifact { url: out.to_string(), sha256, bytes, types: vec![] }),
        cache_hit,
        experts: vec![],
    }
}

/// Whether an output found at its content-addressed location has the bytes the farm recorded for it (`digest`, its
/// sha256 or folder digest): with other bytes it is corrupt, logged as such, and the caller makes it again.
pub fn found_intact(out: &Location, digest: &str, env: &Env) -> bool {
    match env.known_output.as_deref() {
        Some(known) if known != digest => {
            tracing::warn!(output = %out, found = digest, recorded = known, "the stored output is corrupt: making it again");
            false
        }
        _ => true,
    }
}

/// The output already at `out`, if it is intact (see [`found_intact`]); a corrupt one is removed.
pub async fn cached(out: &Location, env: &Env) -> Result<Option<Digest>, Failure> {
    if !exists(out).await {
        return Ok(None);
    }
    let found = hash_object(out, env.budget).await?;
    if found_intact(out, &found.sha256, env) {
        return Ok(Some(found));
    }
    out.remove().await?;
    Ok(None)
}

/// Makes the content-addressed output at `url` with `write`, unless it is already there (a cache hit).
pub async fn produce<F>(url: &str, env: &Env, write: impl FnOnce(Location) -> F) -> Result<pb::ArtifactResult, Failure>
where
    F: std::future::Future<Output = Result<Digest, Failure>>,
{
    let out = location(url)?;
    if let Some(found) = cached(&out, env).await? {
        return typed(&out, found, true).await;
    }
    match write(out.clone()).await {
        Ok(c) => typed(&out, c, false).await,
        // Another lease of this task committed first: its output is the same bytes.
        Err(e) => match cached(&out, env).await? {
            Some(found) => typed(&out, found, true).await,
            None => Err(e),
        },
    }
}

/// [`artifact_result`] with the type mix of a GGUF or safetensors output (other outputs have none).
async fn typed(out: &Location, digest: Digest, cache_hit: bool) -> Result<pb::ArtifactResult, Failure> {
    let mut r = artifact_result(out, digest, cache_hit);
    let name = out.file_name();
    if name.ends_with(".gguf") || name.ends_with(".safetensors") {
        if let Some(a) = r.artifact.as_mut() {
            a.types = type_mix(out).await?;
        }
    }
    Ok(r)
}

/// Per-type tensor counts of one GGUF or safetensors file (from its header).
pub(crate) async fn type_mix(loc: &Location) -> Result<Vec<pb::TypeCount>, Failure> {
    let blob = Blob::open(loc).await?;
    let counts: Vec<(String, u64, u64)> = if loc.file_name().ends_with(".safetensors") {
        let header = quantfarm_tensors::safetensors::StHeader::read(&blob).await?;
        header.tensors.iter().map(|t| (t.dtype.to_string(), t.shape.iter().product(), t.nbytes())).collect()
    } else {
        let header = GgufHeader::read(&blob).await?;
        header.tensors.iter().map(|t| (t.ty.name().to_string(), t.elements(), t.nbytes())).collect()
    };
    Ok(count_types(counts))
}

/// Per-type tensor counts of an MLX checkpoint folder (quantized modules as `MLX_Q4_G64` …).
pub async fn mlx_type_mix(dir: &Location) -> Result<Vec<pb::TypeCount>, Failure> {
    let src = TensorSource::open(dir).await?;
    Ok(count_types(src.tensors().iter().map(|e| (e.ty.to_string(), e.elements(), e.bytes)).collect()))
}

/// A vLLM checkpoint's type mix: each quantized module counted once, its scales with its codes
/// (`vllm_read::type_mix`).
pub async fn vllm_type_mix(dir: &Location) -> Result<Vec<pb::TypeCount>, Failure> {
    let src = TensorSource::open(dir).await?;
    Ok(count_types(quantfarm_quant::vllm_read::type_mix(&src).await?))
}

/// (type, elements, bytes) of each tensor, summed per type in name order.
fn count_types(tensors: Vec<(String, u64, u64)>) -> Vec<pb::TypeCount> {
    let mut mix: BTreeMap<String, pb::TypeCount> = BTreeMap::new();
    for (ty, elements, bytes) in tensors {
        let e = mix.entry(ty.clone()).or_insert_with(|| pb::TypeCount { ggml_type: ty, ..Default::default() });
        e.tensors += 1;
        e.elements += elements;
        e.bytes += bytes;
    }
    mix.into_values().collect()
}

/// sha256 over the `sha256  name` lines (sorted by name) of files `names` in folder `dir`, and their total bytes.
pub async fn folder_digest(dir: &Location, names: &[String], env: &Env) -> Result<Digest, Failure> {
    let mut files = Vec::with_capacity(names.len());
    for name in names {
        let Digest { sha256: sha, bytes } = hash_object(&dir.child(name)?, env.budget).await?;
        files.push((name.clone(), sha, bytes));
    }
    Ok(digest_lines(files))
}

/// Copies a local file into the store through the staged sink (nothing is visible there until it is whole);
/// returns its sha256 and bytes.
pub async fn upload(path: &Path, out: &Location, env: &Env) -> Result<Digest, Failure> {
    let blob = Blob::open(&Location::local(path)).await?;
    let mut sink = StagedSink::create(out, false).await?;
    let mut buf = vec![0u8; env.budget.clamp(1 << 16, 64 << 20).min(blob.len().max(1)) as usize];
    let mut off = 0;
    while off < blob.len() {
        let n = buf.len().min((blob.len() - off) as usize);
        blob.read_at(off, &mut buf[..n]).await?;
        sink.write(&buf[..n]).await?;
        off += n as u64;
    }
    let c = sink.commit().await?;
    Ok(Digest::new(c.sha256, c.bytes))
}
