//! `quantfarm merge BASE ADAPTER OUT`: a LoRA/DoRA adapter (PEFT or mlx-lm) merged exactly into an HF safetensors
//! base: computed in f64, rounded once to the base dtype, every adapter tensor used once and every shape checked
//! before anything is written.

use anyhow::{Context, Result};
use quantfarm_tensors::merge::{merge_adapter, MergeOptions};
use quantfarm_tensors::Location;

use crate::units::{human, parse_size};

#[derive(clap::Args)]
pub struct Args {
    /// The HF base checkpoint folder (config.json, *.safetensors, tokenizer files): a path or s3:// URL.
    base: String,
    /// The adapter folder: adapter_config.json with adapter_model.safetensors (PEFT) or adapters.safetensors
    /// (mlx-lm).
    adapter: String,
    /// The output folder (the merged HF checkpoint).
    output_dir: String,
    /// The base model's name (e.g. HuggingFaceTB/SmolLM2-135M-Instruct) when its folder does not record it; it
    /// must match the base the adapter records.
    #[arg(long)]
    base_name: Option<String>,
    /// Replace existing outputs.
    #[arg(long)]
    overwrite: bool,
    /// Memory for tensor data held at once.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    budget: u64,
}

pub async fn run(args: Args) -> Result<()> {
    let opts = MergeOptions { budget: args.budget, overwrite: args.overwrite, base_name: args.base_name.clone() };
    let done = merge_adapter(
        &Location::parse(&args.base)?,
        &Location::parse(&args.adapter)?,
        &Location::parse(&args.output_dir)?,
        &opts,
    )
    .await
    .with_context(|| format!("cannot merge {} into {}", args.adapter, args.base))?;
    println!(
        "{} adapter: {} tensors changed{}",
        done.format.name(),
        done.changed.len(),
        if done.untied { "; the output embedding was untied (tie_word_embeddings: false)" } else { "" }
    );
    for c in &done.files {
        println!("{}  {}  {}", c.sha256, human(c.bytes), c.location);
    }
    Ok(())
}
