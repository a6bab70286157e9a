//! The evaluation executors: the KL-divergence pass spread over the farm (llama-perplexity's, in
//! `tools/perplexity/perplexity.cpp`), in llama.cpp through `quantfarm-eval`.
//!
//! `kld/plan` tokenizes the text with the reference's vocabulary and counts its chunks; each `kld-base` task runs
//! the reference over one group of chunks (the chunks llama-perplexity decodes together) and stores their base
//! logits as a base-logits file of their own; each `kld` task scores one model on one group against that file and
//! returns the chunks' sufficient statistics, which the coordinator merges. A group is never split: llama.cpp's
//! logits for a chunk depend on which chunks share its decode, and only llama-perplexity's grouping gives its
//! figures exactly.
//!
//! `imatrix/plan` is the same plan over the calibration text; each `imatrix/G` task collects one group's importance
//! statistics (as llama-imatrix does) into a part, and `imatrix/merge` adds the parts in chunk order.
//!
//! Models and base files are read where they lie when the store is a local folder, else fetched into the scratch
//! folder first (llama.cpp reads files). llama.cpp maps the model's weights: that memory is outside the worker's
//! tensor budget.

use std::io::BufWriter;
use std::path::{Path, PathBuf};

use quantfarm_eval::imatrix::{collect as collect_imatrix, CollectOptions};
use quantfarm_eval::kld::base_file::{BaseFile, BaseHeader};
use quantfarm_eval::kld::{check_compatible, chunks_per_decode, score_against, session_for, tokenize_text, write_base};
use quantfarm_eval::prepare::prepare;
use quantfarm_eval::{LoadOptions, Model};
use quantfarm_proto::{self as pb, FailureKind};
use quantfarm_quant::imatrix::sums::ImatrixSums;
use quantfarm_store::Blob;
use quantfarm_store::{Location, StagedSink};
use quantfarm_tensors::gguf::split::{parse_split_file_name, split_file_name};
use sha2::{Digest, Sha256};

use crate::exec::{hash_object, location, Env, Failure};

impl From<quantfarm_eval::Error> for Failure {
    fn from(e: quantfarm_eval::Error) -> Failure {
        use quantfarm_eval::Error as E;
        let kind = match &e {
            E::Io { .. } | E::Endpoint { .. } => FailureKind::Transient,
            _ => FailureKind::Input,
        };
        Failure::new(kind, e.to_string())
    }
}

fn transient(what: impl std::fmt::Display, e: impl std::fmt::Display) -> Failure {
    Failure::new(FailureKind::Transient, format!("{what}: {e}"))
}

/// A scratch folder for one task's fetched files, removed with it.
pub(crate) fn task_dir(env: &Env) -> Result<tempfile::TempDir, Failure> {
    std::fs::create_dir_all(&env.scratch).map_err(|e| transient(env.scratch.display(), e))?;
    tempfile::Builder::new().prefix("eval-").tempdir_in(&env.scratch).map_err(|e| transient(env.scratch.display(), e))
}

/// Copies one object to a local file, in pieces of at most `budget` bytes.
async fn download(from: &Location, to: &Path, budget: u64) -> Result<(), Failure> {
    use std::io::Write;
    let blob = Blob::open(from).await?;
    let mut out = BufWriter::new(std::fs::File::create(to).map_err(|e| transient(to.display(), e))?);
    let mut buf = vec![0u8; budget.clamp(1 << 16, 64 << 20).min(blob.len().max(1)) as usize];
    let mut off = 0;
    while off < blob.len() {
        let n = buf.len().min((blob.len() - off) as usize);
        blob.read_at(off, &mut buf[..n]).await?;
        out.write_all(&buf[..n]).map_err(|e| transient(to.display(), e))?;
        off += n as u64;
    }
    out.flush().map_err(|e| transient(to.display(), e))
}

/// A local path for the model at `url`: a GGUF file (with its split siblings) or a checkpoint folder.
pub(crate) async fn local_model(url: &str, dir: &Path, env: &Env) -> Result<PathBuf, Failure> {
    let loc = location(url)?;
    if let Some(p) = loc.local_path() {
        return Ok(p.to_path_buf());
    }
    if loc.is_dir().await? {
        let folder = dir.join(loc.file_name());
        std::fs::create_dir_all(&folder).map_err(|e| transient(folder.display(), e))?;
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
pub(crate) async fn local_file(url: &str, dir: &Path, env: &Env) -> Result<PathBuf, Failure> {
    let loc = location(url)?;
    if let Some(p) = loc.local_path() {
        return Ok(p.to_path_buf());
    }
    let path = dir.join(loc.file_name());
    download(&loc, &path, env.budget).await?;
    Ok(path)
}

/// Reads a small input file (a text, a prompt set, a probe suite) whole, with its sha256.
async fn read_text(url: &str) -> Result<(String, String), Failure> {
    let loc = location(url)?;
    let blob = Blob::open(&loc).await?;
    let mut bytes = vec![0u8; blob.len() as usize];
    blob.read_at(0, &mut bytes).await?;
    let sha = quantfarm_store::hex(&Sha256::digest(&bytes));
    let text = String::from_utf8(bytes).map_err(|e| Failure::input(format!("{url}: the text is not UTF-8: {e}")))?;
    Ok((text, sha))
}

fn tokens_sha256(tokens: &[i32]) -> String {
    let mut h = Sha256::new();
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    quantfarm_store::hex(&h.finalize())
}

/// Runs blocking llama.cpp work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, Failure> + Send + 'static) -> Result<T, Failure> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Failure::new(FailureKind::Internal, format!("the evaluation thread failed: {e}")))?
}

/// A GGUF model with the worker's threads; with a GGUF LoRA applied at run time at scale 1 when `lora` is given.
fn load(path: &Path, lora: Option<PathBuf>, env: &Env) -> Result<Model, Failure> {
    let opts = LoadOptions { threads: env.threads, lora: lora.map(|l| (l, 1.0)), ..LoadOptions::default() };
    Ok(Model::load(path, &opts)?)
}

fn settings(s: &Option<pb::KldSettings>) -> Result<&pb::KldSettings, Failure> {
    s.as_ref().ok_or_else(|| Failure::input("the task has no KL-divergence settings"))
}

/// The text's whole chunks as the reference tokenizes them.
fn tokenize(model: &Model, text: &str, s: &pb::KldSettings) -> Result<BaseHeader, Failure> {
    let max = (s.max_chunks > 0).then_some(s.max_chunks as usize);
    Ok(tokenize_text(model, text, s.ctx, max)?)
}

/// [`tokenize`], refusing tokens other than the plan's (the text or the tokenizer changed since).
fn tokenize_as_planned(model: &Model, text: &str, s: &pb::KldSettings, planned: &str) -> Result<BaseHeader, Failure> {
    let header = tokenize(model, text, s)?;
    let sha = tokens_sha256(&header.tokens);
    if sha != planned {
        return Err(Failure::input(format!(
            "{}: the text's tokens changed since the release was planned (sha256 {sha}, planned {planned})",
            s.text
        )));
    }
    Ok(header)
}

pub async fn kld_plan(t: &pb::KldPlanTask, env: &Env) -> Result<pb::KldPlanResult, Failure> {
    let s = settings(&t.settings)?.clone();
    let dir = task_dir(env)?;
    let reference = local_model(&t.reference, dir.path(), env).await?;
    let (text, text_sha256) = read_text(&s.text).await?;
    let env = env.clone();
    blocking(move || {
        let model = load(&reference, None, &env)?;
        let header = tokenize(&model, &text, &s)?;
        // Refuses a batch that is neither below nor a multiple of the context, as llama-perplexity does.
        session_for(&model, s.ctx, s.batch)?;
        drop(dir);
        Ok(pb::KldPlanResult {
            n_chunks: header.n_chunk() as u32,
            n_seq: chunks_per_decode(s.ctx, s.batch),
            n_vocab: header.n_vocab,
            text_sha256,
            tokens_sha256: tokens_sha256(&header.tokens),
        })
    })
    .await
}

/// Writes the base-logits part of one chunk group to `out` (staged; a failed run leaves nothing there).
async fn write_base_part(t: &pb::KldBaseTask, out: &Location, env: &Env) -> Result<(String, u64), Failure> {
    let s = settings(&t.settings)?.clone();
    let dir = task_dir(env)?;
    let reference = local_model(&t.reference, dir.path(), env).await?;
    let (text, _) = read_text(&s.text).await?;
    let local = dir.path().join("base.logits");
    let (first, count, expect) = (t.first_chunk as usize, t.n_chunks as usize, t.tokens_sha256.clone());
    let (env2, local2) = (env.clone(), local.clone());
    blocking(move || {
        let model = load(&reference, None, &env2)?;
        let header = tokenize_as_planned(&model, &text, &s, &expect)?;
        if count == 0 || first + count > header.n_chunk() {
            return Err(Failure::input(format!(
                "chunks {first}..{}: the text has {} chunks",
                first + count,
                header.n_chunk()
            )));
        }
        let part = header.part(first..first + count);
        let mut session = session_for(&model, s.ctx, s.batch)?;
        let name = local2.display().to_string();
        let mut w = BufWriter::new(std::fs::File::create(&local2).map_err(|e| transient(&name, e))?);
        write_base(&mut session, &part, chunks_per_decode(s.ctx, s.batch) as usize, &name, &mut w, |_, _| {})?;
        Ok(())
    })
    .await?;
    let done = upload(&local, out, env).await?;
    drop(dir);
    Ok(done)
}

/// Copies a local file into the store through the staged sink (nothing is visible there until it is whole);
/// returns its sha256 and bytes.
pub(crate) async fn upload(path: &Path, out: &Location, env: &Env) -> Result<(String, u64), Failure> {
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
    Ok((c.sha256, c.bytes))
}

pub async fn kld_base(t: &pb::KldBaseTask, env: &Env) -> Result<pb::ArtifactResult, Failure> {
    crate::exec::produce(&t.output, env, |out| async move { write_base_part(t, &out, env).await }).await
}

pub async fn kld(t: &pb::KldTask, env: &Env) -> Result<pb::KldResult, Failure> {
    let dir = task_dir(env)?;
    let (sha, _) = hash_object(&location(&t.base)?, env.budget).await?;
    if sha != t.base_sha256 {
        return Err(Failure::corrupt(&t.base, &sha, &t.base_sha256));
    }
    let base_path = local_file(&t.base, dir.path(), env).await?;
    let model_path = local_model(&t.model, dir.path(), env).await?;
    let (first, batch, env) = (t.first_chunk, t.batch, env.clone());
    blocking(move || {
        let (model, note) = load_prepared(&model_path, None, dir.path(), &env)?;
        let mut base = BaseFile::open(&base_path)?;
        let name = base.name.clone();
        check_compatible(&base.header, &name, &model, None)?;
        let (n_ctx, n_chunk) = (base.header.n_ctx, base.header.n_chunk());
        let mut session = session_for(&model, n_ctx, batch)?;
        let chunks: Vec<usize> = (0..n_chunk).collect();
        let mut out = Vec::with_capacity(n_chunk);
        score_against(&mut session, &mut base, &chunks, chunks_per_decode(n_ctx, batch) as usize, |mut c| {
            c.chunk += first;
            out.push(pb::KldChunkStats::from(&c));
            Ok(())
        })?;
        drop(dir);
        Ok(pb::KldResult { chunks: out, note: note.unwrap_or_default() })
    })
    .await
}

/// A model ready for llama.cpp: loaded from a GGUF file, or from the exact conversion of an MLX folder; with a GGUF
/// LoRA applied at run time at scale 1 when `lora` is given.
fn load_prepared(
    path: &Path,
    lora: Option<PathBuf>,
    workdir: &Path,
    env: &Env,
) -> Result<(Model, Option<String>), Failure> {
    let prepared = prepare(path, Some(workdir))?;
    let model = load(&prepared.path, lora, env)?;
    Ok((model, prepared.note.clone()))
}

pub async fn greedy(t: &pb::GreedyTask, env: &Env) -> Result<pb::GreedyResult, Failure> {
    use quantfarm_eval::greedy::{agreement, parse_prompts, run_prompts};
    if t.n_shares == 0 || t.share >= t.n_shares {
        return Err(Failure::input(format!("greedy share {} of {}: no such share", t.share, t.n_shares)));
    }
    let dir = task_dir(env)?;
    let model_path = local_model(&t.model, dir.path(), env).await?;
    let lora = if t.lora.is_empty() { None } else { Some(local_file(&t.lora, dir.path(), env).await?) };
    let (text, _) = read_text(&t.prompts).await?;
    let (t, env) = (t.clone(), env.clone());
    blocking(move || {
        let prompts = parse_prompts(&t.prompts, &text)?;
        let mine: Vec<usize> = (0..prompts.len()).filter(|i| i % t.n_shares as usize == t.share as usize).collect();
        let selected: Vec<_> = mine.iter().map(|&i| prompts[i].clone()).collect();
        let (model, note) = load_prepared(&model_path, lora, dir.path(), &env)?;
        let runs = run_prompts(&model, &selected, t.max_tokens as usize, t.ctx)?;
        let mut result = pb::GreedyResult { note: note.unwrap_or_default(), ..Default::default() };
        if t.reference.is_empty() {
            result.continuations = mine
                .iter()
                .zip(runs)
                .map(|(&index, (prompt_tokens, steps))| pb::GreedyContinuation {
                    index: index as u32,
                    prompt_tokens,
                    tokens: steps.iter().map(|s| s.token).collect(),
                    margins: steps.iter().map(|s| s.margin).collect(),
                })
                .collect();
            return Ok(result);
        }
        for (&index, (prompt_tokens, steps)) in mine.iter().zip(runs) {
            let r = t.reference.iter().find(|r| r.index as usize == index).ok_or_else(|| {
                Failure::input(format!("{}: prompt {index} has no reference continuation", t.prompts))
            })?;
            if r.prompt_tokens != prompt_tokens {
                return Err(Failure::input(format!(
                    "{}: prompt {index} renders to other tokens for {} than for the reference (another template or tokenizer)",
                    t.prompts, t.model
                )));
            }
            let tokens: Vec<i32> = steps.iter().map(|s| s.token).collect();
            // Both continuations are spelled out with this model's vocabulary: the prompt tokens agree, so it is
            // the reference's too.
            let a = agreement(
                index,
                (&r.tokens, &r.margins, model.detokenize(&r.tokens)),
                (&tokens, model.detokenize(&tokens)),
            );
            result.agreements.push(pb::PromptAgreement {
                index: index as u32,
                identical: a.identical,
                reference_tokens: a.reference_tokens as u32,
                model_tokens: a.model_tokens as u32,
                common_prefix: a.common_prefix as u32,
                prefix_fraction: a.prefix_fraction,
                first_difference: a.first_difference.map_or(-1, |d| d as i32),
                reference_margin: a.reference_margin.unwrap_or(f32::NAN),
                reference_text: a.reference_text,
                model_text: a.model_text,
            });
        }
        Ok(result)
    })
    .await
}

pub async fn probe(t: &pb::ProbeTask, env: &Env) -> Result<pb::ProbeResult, Failure> {
    use quantfarm_eval::probe::{run_suite, Suite};
    use quantfarm_eval::responders::Builtin;
    let dir = task_dir(env)?;
    let model_path = local_model(&t.model, dir.path(), env).await?;
    let (text, _) = read_text(&t.suite).await?;
    let (t, env) = (t.clone(), env.clone());
    blocking(move || {
        let suite = Suite::parse(&t.suite, &text)?;
        let (model, note) = load_prepared(&model_path, None, dir.path(), &env)?;
        let mut responder = Builtin::new(&model, t.ctx)?;
        let report = run_suite(&suite, &mut responder)?;
        Ok(pb::ProbeResult {
            suite: report.suite.clone(),
            passed: report.passed as u32,
            failed: report.failed as u32,
            truncated: report.truncated as u32,
            mean_score: report.mean_score,
            score_spread: report.score_spread,
            pass_scores: report.pass_scores.clone(),
            report_json: serde_json::to_string(&report)
                .map_err(|e| Failure::new(FailureKind::Internal, format!("probe report: {e}")))?,
            note: note.unwrap_or_default(),
        })
    })
    .await
}

/// An imatrix error as a task failure: the store's errors keep their kind, the file's are the input's.
fn imatrix_failure(e: quantfarm_quant::imatrix::ImatrixError) -> Failure {
    match e {
        quantfarm_quant::imatrix::ImatrixError::Tensors(e) => Failure::from(e),
        other => Failure::input(other.to_string()),
    }
}

/// `imatrix/G`: the importance statistics of one chunk group of the calibration text, as an imatrix part.
pub async fn imatrix_part(t: &pb::ImatrixTask, env: &Env) -> Result<pb::ArtifactResult, Failure> {
    crate::exec::produce(&t.output, env, |out| async move { write_imatrix_part(t, &out, env).await }).await
}

async fn write_imatrix_part(t: &pb::ImatrixTask, out: &Location, env: &Env) -> Result<(String, u64), Failure> {
    let s = settings(&t.settings)?.clone();
    let dir = task_dir(env)?;
    let reference = local_model(&t.reference, dir.path(), env).await?;
    let (text, _) = read_text(&s.text).await?;
    let (first, count, expect) = (t.first_chunk as usize, t.n_chunks as usize, t.tokens_sha256.clone());
    let (env2, dataset) = (env.clone(), t.dataset.clone());
    let part = blocking(move || {
        let model = load(&reference, None, &env2)?;
        let header = tokenize_as_planned(&model, &text, &s, &expect)?;
        let bos = model.add_bos().then(|| model.bos());
        drop(model);
        let opts = CollectOptions { threads: env2.threads, batch: s.batch, ..CollectOptions::default() };
        let mut parts = collect_imatrix(&reference, &opts, &header, bos, first, count, &[dataset])?;
        drop(dir);
        match parts.len() {
            1 => Ok(parts.remove(0)),
            n => Err(Failure::input(format!("chunks {first}..{}: {n} decode groups, a task takes one", first + count))),
        }
    })
    .await?;
    let done = part.write(out, true, false).await.map_err(imatrix_failure)?;
    Ok((done.sha256, done.bytes))
}

/// `imatrix/merge`: the parts, each checked against its task's sha256, added in chunk order into llama.cpp's GGUF
/// imatrix. Chunk order, not arrival order: the file is the same however the groups were spread.
pub async fn imatrix_merge(t: &pb::ImatrixMergeTask, env: &Env) -> Result<pb::ArtifactResult, Failure> {
    crate::exec::produce(&t.output, env, |out| async move {
        let mut sums = ImatrixSums::default();
        for a in &t.parts {
            let loc = location(&a.url)?;
            let (sha, _) = hash_object(&loc, env.budget).await?;
            if sha != a.sha256 {
                return Err(Failure::corrupt(&a.url, &sha, &a.sha256));
            }
            let part = ImatrixSums::load(&loc).await.map_err(imatrix_failure)?;
            sums.append(&part, &a.url).map_err(imatrix_failure)?;
        }
        if sums.entries.is_empty() {
            return Err(Failure::input("imatrix/merge: no part holds any statistics"));
        }
        let done = sums.write(&out, false, false).await.map_err(imatrix_failure)?;
        Ok((done.sha256, done.bytes))
    })
    .await
}
