//! `quantfarm merge BASE ADAPTER OUT`: a LoRA/DoRA adapter (PEFT or mlx-lm) merged exactly into an HF safetensors
//! base: computed in f64, rounded once to the base dtype, every adapter tensor used once and every shape checked
//! before anything is written.

use anyhow::{Context, Result};
use quantfarm_store::Location;
use quantfarm_tensors::merge::{adapter_to_gguf, merge_adapter, MergeOptions};

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
    /// Write bf16/f16 vectors and matrices as F32: the merge rounded to f32 instead of the base's dtype, the model
    /// the merge check compares with the base plus the adapter at run time.
    #[arg(long)]
    f32: bool,
}

pub async fn run(args: Args) -> Result<()> {
    let opts = MergeOptions {
        budget: args.budget,
        overwrite: args.overwrite,
        base_name: args.base_name.clone(),
        widen: args.f32,
    };
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

/// `quantfarm lora-gguf BASE ADAPTER OUT.gguf`: the adapter as a GGUF LoRA for `llama-server --lora`.
#[derive(clap::Args)]
pub struct LoraArgs {
    /// The HF base checkpoint folder the adapter was trained on (its config.json names the architecture).
    base: String,
    /// The adapter folder (PEFT or mlx-lm).
    adapter: String,
    /// The GGUF LoRA file to write.
    output: String,
    /// The base model's name when its folder does not record it (see `merge --base-name`).
    #[arg(long)]
    base_name: Option<String>,
    /// Replace an existing output.
    #[arg(long)]
    overwrite: bool,
}

pub async fn lora_gguf(args: LoraArgs) -> Result<()> {
    let opts = MergeOptions { budget: 0, overwrite: args.overwrite, base_name: args.base_name.clone(), widen: false };
    let c = adapter_to_gguf(
        &Location::parse(&args.base)?,
        &Location::parse(&args.adapter)?,
        &Location::parse(&args.output)?,
        &opts,
    )
    .await
    .with_context(|| format!("cannot convert {} to a GGUF LoRA", args.adapter))?;
    println!("{}  {}  {}", c.sha256, human(c.bytes), c.location);
    Ok(())
}

#[derive(clap::Args)]
pub struct AdapterArgs {
    /// The adapter folder (PEFT or mlx-lm).
    adapter: String,
    /// The output folder.
    output_dir: String,
    /// The format to write: peft or mlx-lm.
    #[arg(long, value_parser = ["peft", "mlx-lm"])]
    to: String,
    /// The HF base it was trained on: the adapter is checked against it (keys, shapes, recorded base), and mlx-lm's
    /// `num_layers` counts its layers. Needed for --to mlx-lm.
    #[arg(long)]
    base: Option<String>,
    /// The base's identity, for the recorded-base check and the converted adapter's record.
    #[arg(long)]
    base_name: Option<String>,
    /// Replace existing outputs.
    #[arg(long)]
    overwrite: bool,
}

pub async fn convert_adapter(args: AdapterArgs) -> Result<()> {
    use quantfarm_tensors::merge::{convert_adapter_folder, AdapterFormat};
    let to = if args.to == "peft" { AdapterFormat::Peft } else { AdapterFormat::MlxLm };
    let opts =
        MergeOptions { budget: 64 << 20, overwrite: args.overwrite, base_name: args.base_name.clone(), widen: false };
    let base = args.base.as_deref().map(Location::parse).transpose()?;
    let done = convert_adapter_folder(
        &Location::parse(&args.adapter)?,
        to,
        base.as_ref(),
        &Location::parse(&args.output_dir)?,
        &opts,
    )
    .await
    .with_context(|| format!("cannot convert {} to a {} adapter", args.adapter, to.name()))?;
    for c in &done {
        println!("{}  {}  {}", c.sha256, human(c.bytes), c.location);
    }
    Ok(())
}
