//! `quantfarm imatrix`: an importance matrix for the quantizers in one step, collected in llama.cpp as
//! `llama-imatrix` collects it, written in its GGUF format. The farm computes the same parts on workers
//! (`imatrix/G` tasks) and merges them in the same order, so both give the same bytes. For a mixture of experts it
//! then prints, per expert weight, the experts no calibration token reached and the share that had tokens, as
//! llama-imatrix warns ("partial data"): llama-quantize gives those experts' columns an importance of 1.

use std::path::PathBuf;

use anyhow::{Context, Result};
use quantfarm_eval::imatrix::{collect, CollectOptions};
use quantfarm_eval::kld::{self, tokenize_text};
use quantfarm_eval::prepare::prepare;
use quantfarm_eval::{LoadOptions, Model};
use quantfarm_quant::imatrix::sums::ImatrixSums;
use quantfarm_store::Location;

#[derive(clap::Args)]
pub struct Args {
    /// The model the activations come from (the bf16 GGUF the quants are made from; an HF or MLX folder is
    /// converted exactly first).
    #[arg(long)]
    model: PathBuf,
    /// The calibration text. Its name is recorded as given (`imatrix.datasets`), as llama-imatrix records `-f`.
    #[arg(long)]
    text: PathBuf,
    /// Tokens per chunk (llama-imatrix's -c).
    #[arg(long, default_value_t = kld::DEFAULT_CTX)]
    ctx: u32,
    /// Tokens decoded per batch (-b); batch/ctx chunks are decoded together.
    #[arg(long, default_value_t = kld::DEFAULT_BATCH)]
    batch: u32,
    /// Use only the first N chunks (all by default).
    #[arg(long)]
    chunks: Option<usize>,
    /// Also collect `output.weight` (--process-output).
    #[arg(long)]
    process_output: bool,
    /// Add the squares as llama-imatrix does, in one f32 running sum per column: llama-imatrix's bytes on the same
    /// machine (the default sums in f64 per decode group and adds the groups in order: more exact, and what the
    /// farm computes, spread over workers, with the same bytes).
    #[arg(long)]
    f32_running_sums: bool,
    /// Credit every expert of a mixture-of-experts layer on every token, as llm-compressor's
    /// `calibrate_all_experts` (llama-imatrix has no such option): no expert is left without data. The unrouted
    /// experts' gate and up projections are computed on the CPU (a dense forward over all experts).
    #[arg(long)]
    all_experts: bool,
    /// Decoding threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// The imatrix file to write (llama.cpp's GGUF imatrix; refuses to replace a file).
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
}

pub fn run(args: Args) -> Result<()> {
    let text = std::fs::read_to_string(&args.text).with_context(|| format!("cannot read {}", args.text.display()))?;
    let prepared = prepare(&args.model, None)?;
    let model = Model::load(&prepared.path, &LoadOptions { threads: args.threads, ..LoadOptions::default() })?;
    let header = tokenize_text(&model, &text, args.ctx, args.chunks)
        .with_context(|| format!("calibration text {}", args.text.display()))?;
    let bos = model.add_bos().then(|| model.bos());
    drop(model);
    let opts = CollectOptions {
        threads: args.threads,
        batch: args.batch,
        process_output: args.process_output,
        f32_running_sums: args.f32_running_sums,
        all_experts: args.all_experts,
        ..CollectOptions::default()
    };
    let datasets = vec![args.text.display().to_string()];
    let t0 = std::time::Instant::now();
    let parts = collect(&prepared.path, &opts, &header, bos, 0, header.n_chunk(), &datasets)?;
    let secs = t0.elapsed().as_secs_f64();
    let mut sums = ImatrixSums::default();
    for (i, p) in parts.iter().enumerate() {
        sums.append(p, &format!("part {i}"))?;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let out = Location::local(&args.output);
    let done = rt.block_on(sums.write(&out, false, false))?;
    let tokens = header.n_chunk() * args.ctx as usize;
    println!(
        "{}: {} entries, {} chunks of {} tokens ({tokens} tokens in {secs:.1} s, {:.1} tok/s), sha256 {}",
        args.output.display(),
        sums.entries.len(),
        sums.chunk_count,
        sums.chunk_size,
        tokens as f64 / secs,
        done.sha256
    );
    // The experts no calibration token reached, per mixture-of-experts weight: what llama-imatrix warns about
    // ("has partial data"); llama-quantize gives their columns an importance of 1.
    let coverage = sums.expert_coverage();
    let partial: Vec<_> = coverage.iter().filter(|c| !c.unrouted.is_empty()).collect();
    for c in &partial {
        let list = c.unrouted.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        println!(
            "{}: partial data ({:.2}%): {} of {} experts had no tokens ({list})",
            c.weight,
            c.percent(),
            c.unrouted.len(),
            c.experts
        );
    }
    if !coverage.is_empty() && partial.is_empty() {
        println!("experts: every expert of the {} mixture-of-experts weights had tokens", coverage.len());
    }
    Ok(())
}
