//! A search's tasks (docs/search.md): `search/lookup` (are this reference's sensitivities stored already?),
//! `search/probe/G/V` (one group at one type: the probe model made on this worker's disk and scored against the
//! search text's base logits until its mean is precise enough) and `search/write` (the sensitivities, as the
//! coordinator wrote them, stored at their content-addressed URL for a later release of the same reference).

use std::time::Instant;

use quantfarm_eval::kld::base_file::BaseFile;
use quantfarm_eval::kld::{check_compatible, chunks_per_decode, score_against, session_for};
use quantfarm_ggml::split::split_file_name;
use quantfarm_parity::kld::{ChunkStats, KldSummary};
use quantfarm_parity::paired::{kld_chunks, mean_interval};
use quantfarm_proto::{self as pb, task_result, WorkerKind};
use quantfarm_store::{Digest, Location, StagedSink};

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{exists, hash_object, local_file, location, read_text, task_dir};
use crate::llama::{blocking, load_prepared};
use crate::outputs::produce;
use crate::writers::write_quantized;

pub struct SensitivityLookup;

impl Executor for SensitivityLookup {
    type Task = pb::SensitivityLookupTask;
    const KIND: WorkerKind = WorkerKind::Kld;

    async fn run(t: &pb::SensitivityLookupTask, _env: &Env) -> Result<task_result::Kind, Failure> {
        let loc = location(&t.sensitivity)?;
        let result = if exists(&loc).await {
            let (json, sha256) = read_text(&t.sensitivity).await?;
            pb::SensitivityLookupResult { found: true, json, sha256 }
        } else {
            pb::SensitivityLookupResult::default()
        };
        Ok(task_result::Kind::SensitivityLookup(result))
    }
}

pub struct SensitivityWrite;

impl Executor for SensitivityWrite {
    type Task = pb::SensitivityWriteTask;
    const KIND: WorkerKind = WorkerKind::Kld;

    async fn run(t: &pb::SensitivityWriteTask, env: &Env) -> Result<task_result::Kind, Failure> {
        let made = produce(&t.output, env, |out| async move {
            let mut sink = StagedSink::create(&out, false).await?;
            sink.write(t.json.as_bytes()).await?;
            let c = sink.commit().await?;
            Ok(Digest::new(c.sha256, c.bytes))
        })
        .await?;
        Ok(task_result::Kind::Artifact(made))
    }
}

pub struct SensitivityProbe;

impl Executor for SensitivityProbe {
    type Task = pb::SensitivityProbeTask;
    const KIND: WorkerKind = WorkerKind::Kld;

    async fn run(t: &pb::SensitivityProbeTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::SensitivityProbe(probe(t, env).await?))
    }
}

async fn probe(t: &pb::SensitivityProbeTask, env: &Env) -> Result<pb::SensitivityProbeResult, Failure> {
    let start = Instant::now();
    let q = t.quantize.as_ref().ok_or_else(|| Failure::input("search/probe: no quantize message"))?;
    let dir = task_dir(env)?;
    // The probe model, every split file, on this worker's disk only.
    let n = q.n_shards.max(1);
    let name = |s: u32| if n > 1 { split_file_name("probe", s as u16, n as u16) } else { "probe.gguf".to_string() };
    let mut model_bytes = 0;
    for shard in 0..n {
        let out = Location::local(dir.path().join(name(shard)));
        let shard_task = pb::QuantizeTask { shard, output: out.to_string(), ..q.clone() };
        model_bytes += write_quantized(&shard_task, &out, env).await?.bytes;
    }
    let model_path = dir.path().join(name(0));
    let mut bases = Vec::with_capacity(t.bases.len());
    for (i, a) in t.bases.iter().enumerate() {
        let Digest { sha256: sha, .. } = hash_object(&location(&a.url)?, env.budget).await?;
        if sha != a.sha256 {
            return Err(Failure::corrupt(&a.url, &sha, &a.sha256));
        }
        bases.push((i, local_file(&a.url, dir.path(), env).await?));
    }
    let (batch, min_chunks, precision, env) = (t.batch, t.min_chunks.max(1) as usize, t.precision, env.clone());
    let mut result = blocking(move || {
        let (model, _) = load_prepared(&model_path, None, dir.path(), &env)?;
        let mut stats: Vec<ChunkStats> = Vec::new();
        for (part, path) in &bases {
            let mut base = BaseFile::open(path)?;
            let name = base.name.clone();
            check_compatible(&base.header, &name, &model, None)?;
            let (n_ctx, n_chunk) = (base.header.n_ctx, base.header.n_chunk());
            let mut session = session_for(&model, n_ctx, batch)?;
            let chunks: Vec<usize> = (0..n_chunk).collect();
            let first = stats.len() as u32;
            score_against(&mut session, &mut base, &chunks, chunks_per_decode(n_ctx, batch) as usize, |mut c| {
                // Numbered across the parts, in order (each part numbers its own from 0).
                c.chunk += first;
                stats.push(c);
                Ok(())
            })?;
            let last = *part + 1 == bases.len();
            let (mean, half) = estimate(&stats)?;
            if last || (stats.len() >= min_chunks && half <= precision * mean) {
                break;
            }
        }
        let (mean, half) = estimate(&stats)?;
        // The tail as llama-perplexity computes it over the tokens measured.
        let summary = KldSummary::merge(&stats).map_err(|e| Failure::input(e.0))?;
        let pct = |f: f32| summary.kld_percentile(f).unwrap_or(f64::NAN);
        drop(dir);
        Ok(pb::SensitivityProbeResult {
            chunks: stats.len() as u32,
            tokens: stats.iter().map(|c| c.count).sum(),
            mean_kld: mean,
            half_width: half,
            kld_p99: pct(0.99),
            kld_p99_9: pct(0.999),
            kld_max: summary.max_kld,
            ..Default::default()
        })
    })
    .await?;
    result.model_bytes = model_bytes;
    result.seconds = start.elapsed().as_secs_f64();
    Ok(result)
}

/// The mean KL divergence over the chunks' tokens and its 95 % interval's half-width over chunks (0 with one).
fn estimate(stats: &[ChunkStats]) -> Result<(f64, f64), Failure> {
    let tokens: u64 = stats.iter().map(|c| c.count).sum();
    if tokens == 0 {
        return Err(Failure::input("search/probe: no token scored"));
    }
    let mean = stats.iter().map(|c| c.sum_kld).sum::<f64>() / tokens as f64;
    if stats.len() < 2 {
        return Ok((mean, 0.0));
    }
    let iv = mean_interval(&kld_chunks(stats), 0.95).map_err(|e| Failure::input(e.0))?;
    Ok((mean, (iv.high - iv.low) / 2.0))
}
