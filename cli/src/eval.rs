//! `quantfarm kld`, `greedy` and `probe`: links 1–4 of the parity method on one machine, in llama.cpp.
//! They run on their own thread (llama.cpp blocks; conversions of non-GGUF inputs bring their own async runtime).

use std::fs::File;
use std::io::{BufWriter, Read};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use quantfarm_eval::greedy::{compare, read_prompts, run_prompts, GreedyReport};
use quantfarm_eval::kld::base_file::BaseFile;
use quantfarm_eval::kld::stats::{ChunkStats, KldSummary};
use quantfarm_eval::kld::{self, check_compatible, score_against, session_for, tokenize_text, write_base};
use quantfarm_eval::prepare::prepare;
use quantfarm_eval::probe::{run_suite, Suite};
use quantfarm_eval::responders::{Builtin, Endpoint};
use quantfarm_eval::{LoadOptions, Model};

#[derive(clap::Args)]
pub struct KldArgs {
    /// The reference (bf16) model: a GGUF file, or an HF or MLX folder (converted exactly first). Not needed with
    /// --base.
    #[arg(long)]
    reference: Option<PathBuf>,
    /// The model measured against it: a GGUF file, an HF or MLX folder. Without it, `--save-base` only writes the
    /// reference's base logits (the base pass alone, as `llama-perplexity --kl-divergence-base` without
    /// `--kl-divergence`).
    #[arg(long, required_unless_present = "save_base")]
    model: Option<PathBuf>,
    /// The evaluation text. With --base, its tokens are checked against the file's.
    #[arg(long)]
    text: Option<PathBuf>,
    /// Tokens per chunk (llama-perplexity's -c).
    #[arg(long, default_value_t = kld::DEFAULT_CTX)]
    ctx: u32,
    /// Tokens decoded per batch (llama-perplexity's -b); batch/ctx chunks are decoded together.
    #[arg(long, default_value_t = kld::DEFAULT_BATCH)]
    batch: u32,
    /// Evaluate only the first N chunks.
    #[arg(long)]
    chunks: Option<usize>,
    /// Write the reference's base logits here (llama-perplexity's format; refuses to replace a file).
    #[arg(long, conflicts_with = "base")]
    save_base: Option<PathBuf>,
    /// Read the reference's base logits from this file (ours or llama-perplexity's) instead of running it.
    #[arg(long)]
    base: Option<PathBuf>,
    /// Evaluate only share `K/N` of the chunks: the groups of batch/ctx chunks decoded together (llama-perplexity's
    /// grouping) whose index `g` has `g % N == K`. Merge the shares' `--chunk-stats` with `quantfarm kld-merge`.
    #[arg(long, value_parser = parse_shard)]
    shard: Option<(usize, usize)>,
    /// Write the per-chunk statistics (JSON lines), to merge with `quantfarm kld-merge`.
    #[arg(long)]
    chunk_stats: Option<PathBuf>,
    /// Decoding threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Print one JSON object with every figure.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct KldMergeArgs {
    /// Per-chunk statistics files (`kld --chunk-stats`, or farm results), in any order.
    #[arg(required = true)]
    stats: Vec<PathBuf>,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct GreedyArgs {
    /// The reference model (a GGUF file, an HF or MLX folder).
    #[arg(long)]
    reference: PathBuf,
    /// A GGUF LoRA applied to the reference at run time, unmerged (the merge check: base + adapter vs merged).
    #[arg(long)]
    reference_lora: Option<PathBuf>,
    /// The LoRA's scale.
    #[arg(long, default_value_t = 1.0)]
    lora_scale: f32,
    /// The model compared with it.
    #[arg(long)]
    model: PathBuf,
    /// A JSON array of prompts: strings (one user turn), {"messages": [...]}, or {"prompt": "raw text"}.
    #[arg(long)]
    prompts: PathBuf,
    /// Token cap per continuation.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Context size.
    #[arg(long, default_value_t = 2048)]
    ctx: u32,
    #[arg(long, default_value_t = 0)]
    threads: usize,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["model", "endpoint"])))]
pub struct ProbeArgs {
    /// The probe suite (YAML).
    #[arg(long)]
    suite: PathBuf,
    /// Run on the built-in runtime with this model.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Run on an OpenAI-compatible server (llama-server, mlx_lm.server, vLLM): its base URL.
    #[arg(long)]
    endpoint: Option<String>,
    /// The model name sent to the server.
    #[arg(long)]
    served_model: Option<String>,
    #[arg(long, default_value_t = 4096)]
    ctx: u32,
    #[arg(long, default_value_t = 0)]
    threads: usize,
    #[arg(long)]
    json: bool,
}

/// Runs `f` on its own thread and returns its result.
pub fn on_thread<T: Send>(f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|s| s.spawn(f).join().unwrap_or_else(|_| bail!("the evaluation thread panicked")))
}

pub(crate) fn load(path: &Path, threads: usize, lora: Option<(PathBuf, f32)>) -> Result<(Model, Option<String>)> {
    let prepared = prepare(path, None)?;
    let opts = LoadOptions { threads, lora, ..LoadOptions::default() };
    let model = Model::load(&prepared.path, &opts)?;
    // The converted file can go: llama.cpp holds the weights (read, or mapped and kept mapped after unlink).
    Ok((model, prepared.note))
}

pub fn kld(args: KldArgs) -> Result<u8> {
    let text = match &args.text {
        Some(p) => Some(std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?),
        None => None,
    };
    // The base logits: read, or computed from the reference into a file (the one asked for, or a temporary one).
    let tmp = tempfile::Builder::new().prefix("quantfarm-base-").tempdir()?;
    let base_path = match (&args.base, &args.reference) {
        (Some(b), _) => b.clone(),
        (None, Some(reference)) => {
            let Some(text) = &text else { bail!("--text is needed to run the reference (or give --base FILE)") };
            let out = args.save_base.clone().unwrap_or_else(|| tmp.path().join("base.logits"));
            save_base(reference, text, &out, &args)?;
            out
        }
        (None, None) => bail!("give --reference REF (and --text) or --base FILE"),
    };
    let Some(model_path) = &args.model else {
        // The base pass alone: the file is written.
        return Ok(0);
    };
    let mut base = BaseFile::open(&base_path)?;
    let base_name = base.name.clone();
    let header = base.header.clone();

    let (model, note) = load(model_path, args.threads, None)?;
    if let Some(n) = note {
        eprintln!("{}: {n}", model_path.display());
    }
    check_compatible(&header, &base_name, &model, Some(args.ctx))?;
    if let (Some(text), Some(_)) = (&text, &args.base) {
        let ours = tokenize_text(&model, text, header.n_ctx, Some(header.n_chunk()))?;
        if ours.tokens != header.tokens {
            let at = ours.tokens.iter().zip(&header.tokens).position(|(a, b)| a != b);
            bail!(
                "{base_name}: its tokens are not {}'s tokenization of {} (first difference at token {}): another text or tokenizer",
                model.name(),
                args.text.as_ref().map_or(String::new(), |p| p.display().to_string()),
                at.map_or("(length)".to_string(), |i| i.to_string())
            );
        }
    }
    let n_chunk = args.chunks.map_or(header.n_chunk(), |c| c.min(header.n_chunk()));
    // A share is whole groups of n_seq chunks, grouped as llama-perplexity groups them: llama.cpp's logits for a
    // chunk depend on which chunks share its decode (3 sequences in a batch give other figures than 4, 2 or 1), so
    // only the same grouping makes shares merge into exactly the figures of one run.
    let n_seq = (args.batch / header.n_ctx).max(1) as usize;
    let chunks: Vec<usize> = (0..n_chunk).filter(|i| args.shard.is_none_or(|(k, n)| (i / n_seq) % n == k)).collect();
    let mut session = session_for(&model, header.n_ctx, args.batch)?;
    let mut stats = Vec::new();
    let started = std::time::Instant::now();
    eprintln!("chunk  mean KLD (running)   same top (running)");
    score_against(&mut session, &mut base, &chunks, n_seq, |s| {
        stats.push(s);
        let (n, kld, same) =
            stats.iter().fold((0u64, 0f64, 0u64), |a, s| (a.0 + s.count, a.1 + s.sum_kld, a.2 + s.n_same_top));
        eprintln!("{:5}  {:10.5}            {:6.3} %", stats.len(), kld / n as f64, 100.0 * same as f64 / n as f64);
        Ok(())
    })?;
    let secs = started.elapsed().as_secs_f64();
    let tokens = (chunks.len() * header.n_ctx as usize) as f64;
    eprintln!("kld pass: {} chunks, {:.1} s, {:.1} tokens/s", chunks.len(), secs, tokens / secs);
    if let Some(p) = &args.chunk_stats {
        write_chunk_stats(p, &stats)?;
        if args.shard.is_some() {
            return Ok(0);
        }
    }
    print_summary(&KldSummary::merge(&stats)?, args.json)?;
    Ok(0)
}

/// Runs the reference over the text and writes the base-logits file, staged: a failed run leaves nothing.
fn save_base(reference: &Path, text: &str, out: &Path, args: &KldArgs) -> Result<()> {
    if out.exists() {
        bail!("{}: already exists (refusing to replace a base-logits file; remove it first)", out.display());
    }
    let (model, note) = load(reference, args.threads, None)?;
    if let Some(n) = note {
        eprintln!("{}: {n}", reference.display());
    }
    let header = tokenize_text(&model, text, args.ctx, args.chunks)?;
    let dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut staged = tempfile::Builder::new().prefix(".base-").tempfile_in(dir)?;
    let mut w = BufWriter::new(staged.as_file_mut());
    let mut session = session_for(&model, args.ctx, args.batch)?;
    let n_seq = (args.batch / args.ctx).max(1) as usize;
    let started = std::time::Instant::now();
    let name = out.display().to_string();
    let pass = write_base(&mut session, &header, n_seq, &name, &mut w, |chunk, p| {
        eprint!("[{}]{:.4},", chunk + 1, p.ppl());
    })?;
    eprintln!();
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "base pass: {} chunks, {:.1} s, {:.1} tokens/s; PPL(base) = {:.4}",
        header.n_chunk(),
        secs,
        header.tokens.len() as f64 / secs,
        pass.ppl()
    );
    drop(w);
    staged.as_file().sync_all()?;
    staged.persist_noclobber(out).map_err(|e| e.error).with_context(|| format!("cannot write {}", out.display()))?;
    Ok(())
}

fn write_chunk_stats(path: &Path, stats: &[ChunkStats]) -> Result<()> {
    let mut out = String::new();
    for s in stats {
        out.push_str(&serde_json::to_string(s)?);
        out.push('\n');
    }
    std::fs::write(path, out).with_context(|| format!("cannot write {}", path.display()))
}

fn print_summary(s: &KldSummary, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&s.to_json())?);
    } else {
        print!("{}", s.llama_text());
    }
    Ok(())
}

pub fn kld_merge(args: KldMergeArgs) -> Result<u8> {
    let mut stats = Vec::new();
    for p in &args.stats {
        let mut text = String::new();
        File::open(p)
            .and_then(|mut f| f.read_to_string(&mut text))
            .with_context(|| format!("cannot read {}", p.display()))?;
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let s: ChunkStats = serde_json::from_str(line)
                .with_context(|| format!("{}: line {}: not chunk statistics", p.display(), i + 1))?;
            stats.push(s);
        }
    }
    print_summary(&KldSummary::merge(&stats)?, args.json)?;
    Ok(0)
}

pub fn greedy(args: GreedyArgs) -> Result<u8> {
    let prompts = read_prompts(&args.prompts)?;
    let lora = args.reference_lora.clone().map(|p| (p, args.lora_scale));
    let (reference, _) = load(&args.reference, args.threads, lora)?;
    let r = run_prompts(&reference, &prompts, args.max_tokens, args.ctx)?;
    let (model, _) = load(&args.model, args.threads, None)?;
    let m = run_prompts(&model, &prompts, args.max_tokens, args.ctx)?;
    let mut agreements = Vec::new();
    for (i, ((rp, rs), (mp, ms))) in r.iter().zip(&m).enumerate() {
        if rp != mp {
            bail!(
                "prompt {i}: {} and {} tokenize the rendered prompt differently ({} vs {} tokens): not the same tokenizer or template",
                reference.name(),
                model.name(),
                rp.len(),
                mp.len()
            );
        }
        agreements.push(compare(i, (&reference, rs), (&model, ms)));
    }
    let report = GreedyReport::from_prompts(agreements, args.max_tokens);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.text());
    }
    Ok(if report.identical == report.n { 0 } else { 1 })
}

pub fn probe(args: ProbeArgs) -> Result<u8> {
    let suite = Suite::read(&args.suite)?;
    let report = match (&args.model, &args.endpoint) {
        (Some(path), _) => {
            let (model, _) = load(path, args.threads, None)?;
            let mut r = Builtin::new(&model, args.ctx)?;
            run_suite(&suite, &mut r)?
        }
        (None, Some(url)) => {
            let mut r = Endpoint::new(url, args.served_model.as_deref())?;
            run_suite(&suite, &mut r)?
        }
        (None, None) => bail!("give --model or --endpoint"),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.text());
    }
    Ok(if report.failed == 0 { 0 } else { 1 })
}

fn parse_shard(s: &str) -> std::result::Result<(usize, usize), String> {
    let bad = || format!("{s:?}: expected K/N with K < N, e.g. 0/3");
    let (k, n) = s.split_once('/').ok_or_else(bad)?;
    let (k, n) = (k.parse::<usize>().map_err(|_| bad())?, n.parse::<usize>().map_err(|_| bad())?);
    if n == 0 || k >= n {
        return Err(bad());
    }
    Ok((k, n))
}
