//! `quantfarm convert`: a Hugging Face safetensors checkpoint to GGUF BF16, as `convert_hf_to_gguf.py --outtype
//! bf16` writes it (tensor names, q/k permutation, metadata and tokenizer keys from `mappings/*.yaml`), in one
//! file or llama.cpp split files. An MLX checkpoint converts too, its affine weights dequantized as MLX does.

use anyhow::{Context, Result};
use quantfarm_tensors::convert::{convert_hf_to_gguf, SplitRule};
use quantfarm_tensors::{Location, TensorSource};

use crate::units::{human, parse_size};

#[derive(clap::Args)]
pub struct Args {
    /// The HF or MLX checkpoint folder (config.json, tokenizer files, *.safetensors): a path or s3:// URL.
    input: String,
    /// The output folder.
    output_dir: String,
    /// Output file name prefix (default: the input folder's name).
    #[arg(long)]
    prefix: Option<String>,
    /// Split into files of at most N tensors (gguf-split's --split-max-tensors).
    #[arg(long, conflicts_with = "split_max_bytes")]
    split_max_tensors: Option<usize>,
    /// Split into files of at most this many tensor bytes (e.g. 2GB).
    #[arg(long, value_parser = parse_size)]
    split_max_bytes: Option<u64>,
    /// Replace existing outputs.
    #[arg(long)]
    overwrite: bool,
    /// Memory for tensor data held at once.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    budget: u64,
}

pub async fn run(args: Args) -> Result<()> {
    let src = Location::parse(&args.input)?;
    let prefix = match &args.prefix {
        Some(p) => p.clone(),
        None => {
            let s = TensorSource::open(&src).await?;
            let name = s.location().file_name().to_string();
            if name.is_empty() {
                "model".into()
            } else {
                name
            }
        }
    };
    let rule = match (args.split_max_tensors, args.split_max_bytes) {
        (Some(n), _) => Some(SplitRule::MaxTensors(n)),
        (None, Some(b)) => Some(SplitRule::MaxBytes(b)),
        _ => None,
    };
    let dst = Location::parse(&args.output_dir)?;
    let done = convert_hf_to_gguf(&src, &dst, &prefix, rule, args.budget, args.overwrite)
        .await
        .with_context(|| format!("cannot convert {}", args.input))?;
    for c in &done {
        println!("{}  {}  {}", c.sha256, human(c.bytes), c.location);
    }
    Ok(())
}
