//! `quantfarm verify SRC OUT`: recompute every tensor of OUT from SRC and compare it, plus the structure around the
//! weights. Exit status 0 when OUT is what the conversion (or merge, with --adapter) makes, 1 when it is not, 2 on an
//! error (unreadable input, a direction no conversion makes).

use anyhow::{Context, Result};
use quantfarm_quant::verify::{verify, VerifyOptions};
use quantfarm_store::Location;
use quantfarm_tensors::verify::Verdict;

use crate::units::parse_size;

#[derive(clap::Args)]
pub struct Args {
    /// What OUT was made from: an HF or MLX folder, a GGUF file (a path or s3:// URL); the base with --adapter.
    src: String,
    /// The output to check: a GGUF file, an HF or MLX folder.
    out: String,
    /// OUT is SRC with this adapter (PEFT or mlx-lm folder) merged in.
    #[arg(long)]
    adapter: Option<String>,
    /// The base's identity for the adapter's recorded-base check (as `quantfarm merge --base-name`).
    #[arg(long)]
    base_name: Option<String>,
    /// Memory for tensor data held at once.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    budget: u64,
    /// Print every tensor's verdict, not only those that are not identical: the global `-v/--verbose`.
    #[arg(skip)]
    pub verbose: bool,
    /// Print the outcome as JSON.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: Args) -> Result<u8> {
    let src = Location::parse(&args.src)?;
    let out = Location::parse(&args.out)?;
    let opts = VerifyOptions {
        budget: args.budget,
        adapter: args.adapter.as_deref().map(Location::parse).transpose()?,
        base_name: args.base_name.clone(),
    };
    let v =
        verify(&src, &out, &opts).await.with_context(|| format!("cannot verify {} against {}", args.out, args.src))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v.to_json())?);
    } else {
        println!("{}: {} against {}", v.direction, args.out, args.src);
        for t in &v.tensors {
            if args.verbose || t.verdict != Verdict::Identical {
                println!("  {}  <-  {}  {}", t.name, t.source, t.verdict);
            }
        }
        for c in &v.checked {
            println!("  ok: {c}");
        }
        for p in &v.problems {
            println!("  PROBLEM: {p}");
        }
        let (identical, within, differing) = v.counts();
        println!(
            "{}: {identical} tensors identical, {within} within one quantization step, {differing} differ; {} problems",
            if v.passed() { "PASSED" } else { "FAILED" },
            v.problems.len()
        );
    }
    Ok(if v.passed() { 0 } else { 1 })
}
