//! One executor per task kind. Each is a thin call into `tensors`/`quant`: the worker loop only leases, runs,
//! heartbeats and reports. Outputs go through the staged sink; an output that already exists at its
//! content-addressed location is the right one (a cache hit) and is only hashed.

use std::collections::BTreeMap;
use std::time::Duration;

use quantfarm_proto::{self as pb, task, task_result, verify_task, FailureKind};
use quantfarm_quant::file::{quantize_gguf_shard, FileError, Options};
use quantfarm_quant::imatrix::Imatrix;
use quantfarm_quant::FileType;
use quantfarm_store::Blob;
use quantfarm_store::Location;
use quantfarm_tensors::convert::{self, GgufPlan, SplitRule};
use quantfarm_tensors::gguf::GgufHeader;
use quantfarm_tensors::TensorSource;
use sha2::{Digest, Sha256};

/// A task's failure, classified so the coordinator knows whether a retry can help.
#[derive(Debug)]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
    /// With [`FailureKind::Corrupt`]: the input whose stored bytes are not the ones its producer recorded.
    pub corrupt_url: Option<String>,
}

impl Failure {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Failure {
        Failure { kind, message: message.into(), corrupt_url: None }
    }

    pub fn input(message: impl Into<String>) -> Failure {
        Failure::new(FailureKind::Input, message)
    }

    /// Input `url` was made by another task of the release and recorded with `expected`, but the store now holds
    /// bytes with sha256 `found`: the coordinator has that task make it again.
    pub fn corrupt(url: &str, found: &str, expected: &str) -> Failure {
        Failure {
            kind: FailureKind::Corrupt,
            message: format!("{url}: the stored object has sha256 {found}, its producer recorded {expected}: corrupt"),
            corrupt_url: Some(url.to_string()),
        }
    }

    pub fn into_proto(self) -> pb::TaskFailure {
        pb::TaskFailure {
            kind: self.kind as i32,
            message: self.message,
            corrupt_url: self.corrupt_url.unwrap_or_default(),
        }
    }
}

/// Failures by meaning, not by origin: a missing object, a refused input or a row larger than the memory budget
/// fails the same way on every try (an input failure, not retried); a timeout or a dropped connection may not
/// (transient).
impl From<quantfarm_store::Error> for Failure {
    fn from(e: quantfarm_store::Error) -> Failure {
        let kind = if e.is_transient() { FailureKind::Transient } else { FailureKind::Input };
        Failure::new(kind, e.to_string())
    }
}

impl From<quantfarm_tensors::Error> for Failure {
    fn from(e: quantfarm_tensors::Error) -> Failure {
        use quantfarm_tensors::Error as E;
        match e {
            E::Store(e) => e.into(),
            e => Failure::input(e.to_string()),
        }
    }
}

impl From<FileError> for Failure {
    fn from(e: FileError) -> Failure {
        match e {
            FileError::Tensors(t) => t.into(),
            other => Failure::input(other.to_string()),
        }
    }
}

/// What an executor may use.
#[derive(Clone)]
pub struct Env {
    /// Bytes of tensor data one task holds at once.
    pub budget: u64,
    /// Scratch folder for recomputed outputs (verify).
    pub scratch: std::path::PathBuf,
    /// Threads one task may use: the worker's cores shared among its slots.
    pub threads: usize,
    /// The sha256 the farm recorded for this task's output, when it was made before ([`pb::Task`]'s
    /// `known_output_sha256`): a stored copy with other bytes is corrupt and is made again.
    pub known_output: Option<String>,
}

pub async fn run(t: &pb::Task, env: &Env) -> Result<pb::TaskResult, Failure> {
    let known_output = Some(t.known_output_sha256.clone()).filter(|s| !s.is_empty());
    let env = &Env { known_output, ..env.clone() };
    let kind = match t.kind.as_ref().ok_or_else(|| Failure::input("the task has no kind"))? {
        task::Kind::Plan(p) => task_result::Kind::Plan(plan(p).await?),
        task::Kind::Gguf(g) => task_result::Kind::Artifact(gguf(g, env).await?),
        task::Kind::Quantize(q) => task_result::Kind::Artifact(quantize(q, env).await?),
        task::Kind::Verify(v) => task_result::Kind::Verify(verify(v, env).await?),
        task::Kind::MergePlan(m) => task_result::Kind::MergePlan(merge_plan(m, env).await?),
        task::Kind::Merge(m) => task_result::Kind::Artifact(merge(m, env).await?),
        task::Kind::Mlx(m) => task_result::Kind::Artifact(mlx(m, env).await?),
        task::Kind::MergeCheck(m) => task_result::Kind::Artifact(crate::merge_check::merge_check(m, env).await?),
        task::Kind::KldPlan(k) => task_result::Kind::KldPlan(crate::evaluate::kld_plan(k, env).await?),
        task::Kind::KldBase(k) => task_result::Kind::Artifact(crate::evaluate::kld_base(k, env).await?),
        task::Kind::Kld(k) => task_result::Kind::Kld(crate::evaluate::kld(k, env).await?),
        task::Kind::Imatrix(t) => task_result::Kind::Artifact(crate::evaluate::imatrix_part(t, env).await?),
        task::Kind::ImatrixMerge(t) => task_result::Kind::Artifact(crate::evaluate::imatrix_merge(t, env).await?),
        task::Kind::Greedy(g) => task_result::Kind::Greedy(crate::evaluate::greedy(g, env).await?),
        task::Kind::Probe(p) => task_result::Kind::Probe(crate::evaluate::probe(p, env).await?),
        task::Kind::PeerKld(p) => task_result::Kind::PeerKld(crate::peer::peer_kld(p, env).await?),
        task::Kind::Noop(n) => {
            if n.sleep_ms > 0 {
                tokio::time::sleep(Duration::from_millis(n.sleep_ms as u64)).await;
            }
            task_result::Kind::Noop(pb::NoopResult {})
        }
    };
    Ok(pb::TaskResult { kind: Some(kind) })
}

pub(crate) fn location(url: &str) -> Result<Location, Failure> {
    Location::parse(url).map_err(Failure::from)
}

fn split_rule(r: &Option<pb::SplitRule>) -> Option<SplitRule> {
    match r.as_ref()?.rule.as_ref()? {
        pb::split_rule::Rule::MaxTensors(n) => Some(SplitRule::MaxTensors(*n as usize)),
        pb::split_rule::Rule::MaxBytes(n) => Some(SplitRule::MaxBytes(*n)),
    }
}

/// sha256 over the source files' names, sizes and store versions.
fn source_identity(src: &TensorSource) -> String {
    let mut h = Sha256::new();
    for b in src.files() {
        h.update(format!("{}\n{}\n{}\n", b.name(), b.len(), b.version()).as_bytes());
    }
    quantfarm_store::hex(&h.finalize())
}

async fn open_plan(source: &str) -> Result<(TensorSource, GgufPlan), Failure> {
    let src = TensorSource::open(&location(source)?).await?;
    let plan = convert::plan_hf_to_gguf(&src, convert::OutType::Bf16).await?;
    Ok((src, plan))
}

/// Writes the built-in synthetic model at `dir` unless it is there (any worker writes the same bytes).
async fn materialize(name: &str, dir: &Location) -> Result<(), Failure> {
    use quantfarm_tensors::synthetic;
    // Every model of the catalogue is the tiny Llama today; a second one adds its writer here.
    if pb::synthetic_model(name).is_none() {
        return Err(Failure::input(format!("unknown synthetic model {name:?}")));
    }
    if synthetic::tiny_llama_exists(dir).await? {
        return Ok(());
    }
    match synthetic::write_tiny_llama(dir).await {
        Ok(_) => Ok(()),
        // Another worker wrote it meanwhile.
        Err(_) if synthetic::tiny_llama_exists(dir).await? => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn plan(p: &pb::PlanTask) -> Result<pb::PlanResult, Failure> {
    if !p.synthetic.is_empty() {
        materialize(&p.synthetic, &location(&p.source)?).await?;
    }
    let (src, plan) = open_plan(&p.source).await?;
    let nbytes: Vec<u64> = plan.tensors.iter().map(|t| t.nbytes).collect();
    let ranges = convert::split_ranges(&nbytes, split_rule(&p.split));
    // The importance matrix is checked now (it must load) and named by its bytes, so the quant outputs are
    // content-addressed by it and every quantize task can tell it is the same file.
    let imatrix_sha256 = if p.imatrix.is_empty() {
        String::new()
    } else {
        let loc = location(&p.imatrix)?;
        Imatrix::load(&loc).await.map_err(|e| Failure::input(e.to_string()))?;
        hash_object(&loc, 8 << 20).await?.0
    };
    Ok(pb::PlanResult {
        architecture: src.architecture().unwrap_or_default(),
        format: src.format().name().to_string(),
        plan_digest: plan.digest(),
        source_identity: source_identity(&src),
        source_bytes: src.files().iter().map(|b| b.len()).sum(),
        tensors: plan
            .tensors
            .iter()
            .map(|t| pb::PlannedTensor {
                name: t.name.clone(),
                source: t.source.clone(),
                ggml_type: t.ty.name().to_string(),
                bytes: t.nbytes,
                elements: t.ne.iter().product(),
            })
            .collect(),
        shards: ranges.iter().map(|r| pb::ShardRange { start: r.start as u32, end: r.end as u32 }).collect(),
        imatrix_sha256,
    })
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

/// Per-type tensor counts of one GGUF or safetensors file (from its header).
async fn type_mix(loc: &Location) -> Result<Vec<pb::TypeCount>, Failure> {
    let blob = Blob::open(loc).await?;
    let counts: Vec<(String, u64, u64)> = if loc.file_name().ends_with(".safetensors") {
        let header = quantfarm_tensors::safetensors::StHeader::read(&blob).await?;
        header.tensors.iter().map(|t| (t.dtype.to_string(), t.shape.iter().product(), t.nbytes())).collect()
    } else {
        let header = GgufHeader::read(&blob).await?;
        header.tensors.iter().map(|t| (t.ty.name().to_string(), t.elements(), t.nbytes())).collect()
    };
    let mut mix: BTreeMap<String, pb::TypeCount> = BTreeMap::new();
    for (ty, elements, bytes) in counts {
        let e = mix.entry(ty.clone()).or_insert_with(|| pb::TypeCount { ggml_type: ty, ..Default::default() });
        e.tensors += 1;
        e.elements += elements;
        e.bytes += bytes;
    }
    Ok(mix.into_values().collect())
}

async fn exists(loc: &Location) -> bool {
    Blob::open(loc).await.is_ok()
}

/// The artifact at `out`, just written (`cache_hit` false) or found there.
fn artifact_result(out: &Location, (sha256, bytes): (String, u64), cache_hit: bool) -> pb::ArtifactResult {
    pb::ArtifactResult {
        artifact: Some(pb::Artifact { url: out.to_string(), sha256, bytes, types: vec![] }),
        cache_hit,
    }
}

/// Whether an output found at its content-addressed location has the bytes the farm recorded for it (`digest`, its
/// sha256 or folder digest): with other bytes it is corrupt, logged as such, and the caller makes it again.
pub(crate) fn found_intact(out: &Location, digest: &str, env: &Env) -> bool {
    match env.known_output.as_deref() {
        Some(known) if known != digest => {
            tracing::warn!(output = %out, found = digest, recorded = known, "the stored output is corrupt: making it again");
            false
        }
        _ => true,
    }
}

/// The output already at `out`, if it is intact (see [`found_intact`]); a corrupt one is removed.
pub(crate) async fn cached(out: &Location, env: &Env) -> Result<Option<(String, u64)>, Failure> {
    if !exists(out).await {
        return Ok(None);
    }
    let found = hash_object(out, env.budget).await?;
    if found_intact(out, &found.0, env) {
        return Ok(Some(found));
    }
    out.remove().await?;
    Ok(None)
}

async fn write_gguf(g: &pb::GgufShardTask, out: &Location, env: &Env) -> Result<(String, u64), Failure> {
    let (src, plan) = open_plan(&g.source).await?;
    if plan.digest() != g.plan_digest {
        return Err(Failure::input(format!(
            "{}: the source's headers changed since the release was planned (plan {} now, {} then)",
            g.source,
            plan.digest(),
            g.plan_digest
        )));
    }
    let nbytes: Vec<u64> = plan.tensors.iter().map(|t| t.nbytes).collect();
    let ranges = convert::split_ranges(&nbytes, split_rule(&g.split));
    if ranges.len() != g.n_shards as usize || g.shard >= g.n_shards {
        return Err(Failure::input(format!(
            "split file {} of {}: the plan gives {} files",
            g.shard + 1,
            g.n_shards,
            ranges.len()
        )));
    }
    let c = convert::write_gguf_shard(&plan, &src, &ranges, g.shard as usize, out, env.budget, false).await?;
    Ok((c.sha256, c.bytes))
}

/// Makes the content-addressed output at `url` with `write`, unless it is already there (a cache hit).
pub(crate) async fn produce<F>(
    url: &str,
    env: &Env,
    write: impl FnOnce(Location) -> F,
) -> Result<pb::ArtifactResult, Failure>
where
    F: std::future::Future<Output = Result<(String, u64), Failure>>,
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
async fn typed(out: &Location, digest: (String, u64), cache_hit: bool) -> Result<pb::ArtifactResult, Failure> {
    let mut r = artifact_result(out, digest, cache_hit);
    let name = out.file_name();
    if name.ends_with(".gguf") || name.ends_with(".safetensors") {
        if let Some(a) = r.artifact.as_mut() {
            a.types = type_mix(out).await?;
        }
    }
    Ok(r)
}

async fn gguf(g: &pb::GgufShardTask, env: &Env) -> Result<pb::ArtifactResult, Failure> {
    produce(&g.output, env, |out| async move { write_gguf(g, &out, env).await }).await
}

async fn write_quantized(q: &pb::QuantizeTask, out: &Location, env: &Env) -> Result<(String, u64), Failure> {
    let ftype = FileType::from_name(&q.file_type)
        .ok_or_else(|| Failure::input(format!("unknown file type {:?}", q.file_type)))?;
    let src = TensorSource::open(&location(&q.input)?).await?;
    let n = src.gguf().map_or(0, |g| g.shards.len());
    if n != q.n_shards as usize {
        return Err(Failure::input(format!("{}: has {n} split files, the task expects {}", q.input, q.n_shards)));
    }
    let imatrix = if q.imatrix.is_empty() {
        None
    } else {
        let loc = location(&q.imatrix)?;
        let (sha, _) = hash_object(&loc, 8 << 20).await?;
        if sha != q.imatrix_sha256 {
            return Err(Failure::input(format!(
                "{}: the importance matrix changed since the release was planned (sha256 {sha}, planned {})",
                q.imatrix, q.imatrix_sha256
            )));
        }
        let mut im = Imatrix::load(&loc).await.map_err(|e| Failure::input(e.to_string()))?;
        // llama-quantize records the file as named on its command line; the farm records the file's name.
        im.file = loc.file_name().to_string();
        Some(std::sync::Arc::new(im))
    };
    let opts = Options { budget: env.budget, threads: Some(env.threads), imatrix, ..Options::new(ftype) };
    let done = quantize_gguf_shard(&src, q.shard as usize, out, &opts).await?;
    Ok((done.committed.sha256, done.committed.bytes))
}

async fn quantize(q: &pb::QuantizeTask, env: &Env) -> Result<pb::ArtifactResult, Failure> {
    produce(&q.output, env, |out| async move { write_quantized(q, &out, env).await }).await
}

/// Recomputes the artifact into a scratch file (or folder) and compares it with the stored object and the
/// producer's sha256.
async fn verify(v: &pb::VerifyTask, env: &Env) -> Result<pb::VerifyResult, Failure> {
    std::fs::create_dir_all(&env.scratch)
        .map_err(|e| Failure::new(FailureKind::Transient, format!("{}: {e}", env.scratch.display())))?;
    let dir = tempfile::tempdir_in(&env.scratch)
        .map_err(|e| Failure::new(FailureKind::Transient, format!("{}: {e}", env.scratch.display())))?;
    let scratch = Location::local(dir.path().join("recomputed"));
    let what = v.what.as_ref().ok_or_else(|| Failure::input("verify: nothing to verify"))?;
    let (stored_url, recomputed) = match what {
        verify_task::What::Gguf(g) => (g.output.clone(), write_gguf(g, &scratch, env).await?),
        verify_task::What::Quantize(q) => (q.output.clone(), write_quantized(q, &scratch, env).await?),
        verify_task::What::Merge(m) => (m.output.clone(), write_merge(m, &scratch, env).await?),
        verify_task::What::Mlx(m) => (m.output.clone(), write_mlx(m, &scratch, env).await?),
    };
    let stored_loc = location(&stored_url)?;
    let stored = match what {
        // A folder: its files, as the recomputation names them.
        verify_task::What::Mlx(_) | verify_task::What::Merge(pb::MergeTask { side_files: true, .. }) => {
            folder_digest(&stored_loc, &scratch.list().await?, env).await?.0
        }
        _ => hash_object(&stored_loc, env.budget).await?.0,
    };
    if stored != v.expect_sha256 {
        // Not what its producer committed: the store changed it since. The producer makes it again.
        return Err(Failure::corrupt(&stored_url, &stored, &v.expect_sha256));
    }
    let identical = stored == recomputed.0;
    let detail = if identical {
        format!("{stored_url}: recomputed {} bytes, identical", recomputed.1)
    } else {
        format!("{stored_url}: stored {stored}, recomputed {}, the producer reported {}", recomputed.0, v.expect_sha256)
    };
    Ok(pb::VerifyResult {
        identical,
        expected_sha256: v.expect_sha256.clone(),
        stored_sha256: stored,
        recomputed_sha256: recomputed.0,
        detail,
    })
}

pub(crate) fn merge_options(base_name: &str, env: &Env) -> quantfarm_tensors::merge::MergeOptions {
    quantfarm_tensors::merge::MergeOptions {
        budget: env.budget,
        overwrite: false,
        base_name: (!base_name.is_empty()).then(|| base_name.to_string()),
        widen: false,
    }
}

/// sha256 over the names, sizes and store versions of every file in the base and adapter folders.
async fn folders_identity(dirs: &[&Location]) -> Result<String, Failure> {
    let mut h = Sha256::new();
    for dir in dirs {
        let mut names = dir.list().await?;
        names.sort();
        for name in names {
            let b = Blob::open(&dir.child(&name)?).await?;
            h.update(format!("{dir}/{name}\n{}\n{}\n", b.len(), b.version()).as_bytes());
        }
    }
    Ok(quantfarm_store::hex(&h.finalize()))
}

/// Every file of `dir` with the sha256 of its content, read in chunks of at most `budget` bytes (adapters are
/// small; this is what lets a report name the adapter by content, not just by name and size).
async fn folder_digests(dir: &Location, budget: u64) -> Result<Vec<pb::Artifact>, Failure> {
    let mut names = dir.list().await?;
    names.sort();
    let chunk = budget.clamp(1 << 20, 64 << 20);
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let loc = dir.child(&name)?;
        let b = Blob::open(&loc).await?;
        let mut h = Sha256::new();
        let mut at = 0u64;
        while at < b.len() {
            let n = chunk.min(b.len() - at);
            h.update(b.read_vec(at, n).await?);
            at += n;
        }
        out.push(pb::Artifact {
            url: loc.to_string(),
            sha256: quantfarm_store::hex(&h.finalize()),
            bytes: b.len(),
            types: vec![],
        });
    }
    Ok(out)
}

async fn merge_plan(m: &pb::MergePlanTask, env: &Env) -> Result<pb::MergePlanResult, Failure> {
    let (base, adapter) = (location(&m.base)?, location(&m.adapter)?);
    let plan = quantfarm_tensors::merge::plan_merge(&base, &adapter, &merge_options(&m.base_name, env)).await?;
    Ok(pb::MergePlanResult {
        format: plan.format().name().to_string(),
        plan_digest: plan.digest(),
        inputs_identity: folders_identity(&[&base, &adapter]).await?,
        files: plan.file_names().iter().map(|s| s.to_string()).collect(),
        changed: plan.changed(),
        untied: plan.untied(),
        file_bytes: plan.file_bytes(),
        adapter_files: folder_digests(&adapter, env.budget).await?,
    })
}

/// Writes one file of the merge at `out` (or the side files into folder `out`); returns its sha256 (the folder's
/// digest for side files) and bytes.
async fn write_merge(m: &pb::MergeTask, out: &Location, env: &Env) -> Result<(String, u64), Failure> {
    let (base, adapter) = (location(&m.base)?, location(&m.adapter)?);
    let plan = quantfarm_tensors::merge::plan_merge(&base, &adapter, &merge_options(&m.base_name, env)).await?;
    if plan.digest() != m.plan_digest {
        return Err(Failure::input(format!(
            "{} + {}: the merge plan changed since the release was planned ({} now, {} then)",
            m.base,
            m.adapter,
            plan.digest(),
            m.plan_digest
        )));
    }
    if m.side_files {
        let mut names = Vec::new();
        for (name, bytes) in plan.side_files().await? {
            let target = out.child(&name)?;
            if !exists(&target).await {
                let mut sink = quantfarm_store::StagedSink::create(&target, false).await?;
                sink.write(&bytes).await?;
                if let Err(e) = sink.commit().await {
                    // Another lease wrote the same bytes meanwhile.
                    if !exists(&target).await {
                        return Err(e.into());
                    }
                }
            }
            names.push(name);
        }
        return folder_digest(out, &names, env).await;
    }
    let file = m.file as usize;
    if file >= plan.file_names().len() {
        return Err(Failure::input(format!("the merge has {} files, not file {file}", plan.file_names().len())));
    }
    let w = plan.stage_file(file, out, env.budget, false).await?;
    let c = w.finish().await?;
    Ok((c.sha256, c.bytes))
}

async fn merge(m: &pb::MergeTask, env: &Env) -> Result<pb::ArtifactResult, Failure> {
    if !m.side_files {
        return produce(&m.output, env, |out| async move { write_merge(m, &out, env).await }).await;
    }
    let out = location(&m.output)?;
    let mut digest = write_merge(m, &out, env).await?;
    if !found_intact(&out, &digest.0, env) {
        // Side files already there are kept as found: remove them all, then write them again.
        for name in out.list().await? {
            out.child(&name)?.remove().await?;
        }
        digest = write_merge(m, &out, env).await?;
    }
    Ok(artifact_result(&out, digest, false))
}

/// sha256 over the `sha256  name` lines (sorted by name) of files `names` in folder `dir`, and their total bytes.
pub async fn folder_digest(dir: &Location, names: &[String], env: &Env) -> Result<(String, u64), Failure> {
    let mut files = Vec::with_capacity(names.len());
    for name in names {
        let (sha, bytes) = hash_object(&dir.child(name)?, env.budget).await?;
        files.push((name.clone(), sha, bytes));
    }
    Ok(digest_lines(files))
}

/// The folder digest of files given as (name, sha256, bytes): sha256 over their `sha256  name` lines sorted by name.
fn digest_lines(mut files: Vec<(String, String, u64)>) -> (String, u64) {
    files.sort();
    let mut h = Sha256::new();
    for (name, sha, _) in &files {
        h.update(format!("{sha}  {name}\n").as_bytes());
    }
    (quantfarm_store::hex(&h.finalize()), files.iter().map(|f| f.2).sum())
}

/// Writes the MLX checkpoint of `m.source` into folder `out`; returns its folder digest and bytes.
async fn write_mlx(m: &pb::MlxTask, out: &Location, env: &Env) -> Result<(String, u64), Failure> {
    use quantfarm_quant::mlx_file::{quantize_mlx_checkpoint, MlxOptions};
    let src = TensorSource::open(&location(&m.source)?).await?;
    // A folder left by a lease that died between commits holds some of the (deterministic) files: replace them.
    let opts = MlxOptions { budget: env.budget, overwrite: true, ..MlxOptions::new(m.bits, m.group_size as usize) };
    let done = quantize_mlx_checkpoint(&src, out, &opts).await.map_err(|e| match e {
        quantfarm_quant::mlx_file::MlxFileError::Tensors(t) => t.into(),
        other => Failure::input(other.to_string()),
    })?;
    let name = |c: &quantfarm_store::Committed| {
        Location::parse(&c.location).map(|l| l.file_name().to_string()).unwrap_or_default()
    };
    Ok(digest_lines(done.files.iter().map(|c| (name(c), c.sha256.clone(), c.bytes)).collect()))
}

/// Per-type tensor counts of an MLX checkpoint folder (quantized modules as `MLX_Q4_G64` …).
async fn mlx_type_mix(dir: &Location) -> Result<Vec<pb::TypeCount>, Failure> {
    let src = TensorSource::open(dir).await?;
    let mut mix: BTreeMap<String, pb::TypeCount> = BTreeMap::new();
    for e in src.tensors() {
        let name = e.ty.to_string();
        let t = mix.entry(name.clone()).or_insert_with(|| pb::TypeCount { ggml_type: name, ..Default::default() });
        t.tensors += 1;
        t.elements += e.elements();
        t.bytes += e.bytes;
    }
    Ok(mix.into_values().collect())
}

async fn mlx(m: &pb::MlxTask, env: &Env) -> Result<pb::ArtifactResult, Failure> {
    let out = location(&m.output)?;
    // config.json is committed last: a folder that has it is complete.
    let found = match exists(&out.child("config.json")?).await {
        true => Some(folder_digest(&out, &out.list().await?, env).await?).filter(|d| found_intact(&out, &d.0, env)),
        false => None,
    };
    // A corrupt folder is written over: the writer replaces every file of the checkpoint.
    let (cache_hit, (sha256, bytes)) = match found {
        Some(d) => (true, d),
        None => (false, write_mlx(m, &out, env).await?),
    };
    let types = mlx_type_mix(&out).await?;
    Ok(pb::ArtifactResult { artifact: Some(pb::Artifact { url: out.to_string(), sha256, bytes, types }), cache_hit })
}
