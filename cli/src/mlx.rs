//! `quantfarm mlx`: a Hugging Face checkpoint to an MLX affine-quantized checkpoint, the tensors and config that
//! `mlx_lm.convert --hf-path IN -q --q-bits B --q-group-size G` writes (mlx-lm's choice of quantized modules,
//! `mlx.core.quantize`'s arithmetic and packing); with `--unquantized`, what it writes without `-q` (the model's
//! parameters in its config's dtype, in mlx-lm's layout); with `--recipe mixed_4_6`, what `--quant-predicate
//! mixed_4_6` writes (some modules at more bits, as `quantfarm_quant::mlx_recipe` says); with `--mode mxfp4`, what
//! `--q-mode mxfp4` writes (also `nvfp4`, `mxfp8`: `quantfarm_quant::mlx_fp`).

use anyhow::{Context, Result};
use quantfarm_quant::mlx_file::{quantize_mlx_checkpoint, MlxOptions, MlxScheme};
use quantfarm_quant::mlx_fp::FpMode;
use quantfarm_quant::mlx_recipe::MixedRecipe;
use quantfarm_store::Location;
use quantfarm_tensors::TensorSource;

use crate::units::{human, parse_size};

#[derive(clap::Args)]
pub struct Args {
    /// The HF checkpoint folder (config.json, *.safetensors, tokenizer files): a path or s3:// URL.
    input: String,
    /// The output folder.
    output_dir: String,
    /// Bits per weight: 2, 3, 4, 5, 6 or 8.
    #[arg(long, default_value_t = 4)]
    bits: u32,
    /// Weights per scale/bias group: 32, 64 or 128.
    #[arg(long, default_value_t = 64)]
    group_size: usize,
    /// mlx-lm's mixed-bit recipe (`--quant-predicate`): mixed_2_6, mixed_3_4, mixed_3_6 or mixed_4_6 (the low and
    /// high bits; llama.cpp Q4_K_M's choice of modules that get the high ones).
    #[arg(long, conflicts_with = "bits", value_parser = parse_recipe)]
    recipe: Option<MixedRecipe>,
    /// A floating-point mode (`--q-mode`): mxfp4 (e2m1 values, a power-of-two scale per 32), nvfp4 (e2m1, an e4m3
    /// scale per 16) or mxfp8 (e4m3, a power-of-two scale per 32); each has its own bits and group size.
    #[arg(long, conflicts_with_all = ["bits", "group_size", "recipe"], value_parser = parse_mode)]
    mode: Option<FpMode>,
    /// Write the model's parameters unquantized, in the config's dtype (`mlx_lm.convert` without -q): for a model
    /// mlx-lm cannot load from its HF layout (gpt-oss fine-tunes saved in bf16).
    #[arg(long, conflicts_with_all = ["bits", "group_size", "recipe", "mode"])]
    unquantized: bool,
    /// Replace existing outputs.
    #[arg(long)]
    overwrite: bool,
    /// Memory for tensor data held at once (smaller chunks stay in cache: 32 MiB was faster than 256 MiB).
    #[arg(long, default_value = "32MiB", value_parser = parse_size)]
    budget: u64,
}

pub async fn run(args: Args) -> Result<()> {
    let src = TensorSource::open(&Location::parse(&args.input)?).await?;
    let dst = Location::parse(&args.output_dir)?;
    let (base, what) = match (args.unquantized, args.recipe, args.mode) {
        (true, ..) => (MlxOptions::unquantized(), "unquantized".to_string()),
        (false, Some(r), _) => (MlxOptions::mixed(r, args.group_size), r.to_string()),
        (false, None, Some(m)) => (MlxOptions::fp(m), m.name().to_string()),
        (false, None, None) => (MlxOptions::new(args.bits, args.group_size), format!("{}-bit", args.bits)),
    };
    let opts = MlxOptions { budget: args.budget, overwrite: args.overwrite, ..base };
    let done = quantize_mlx_checkpoint(&src, &dst, &opts)
        .await
        .with_context(|| format!("cannot convert {} to MLX ({what})", args.input))?;
    match opts.quant {
        Some(q) => match q.scheme {
            MlxScheme::Mixed(r) => {
                println!("{} modules quantized by {r} (group size {})", done.quantized, q.group_size)
            }
            MlxScheme::Fp(m) => println!("{} modules quantized to {}", done.quantized, m.name()),
            MlxScheme::Affine => {
                println!("{} modules quantized to {} bits (group size {})", done.quantized, q.bits, q.group_size)
            }
        },
        None => println!("unquantized: {} parameters", done.total_parameters),
    }
    for c in &done.files {
        println!("{}  {}  {}", c.sha256, human(c.bytes), c.location);
    }
    Ok(())
}

fn parse_recipe(s: &str) -> Result<MixedRecipe, String> {
    MixedRecipe::parse(s).ok_or_else(|| {
        let names: Vec<&str> = MixedRecipe::ALL.iter().map(|r| r.name()).collect();
        format!("{s:?} is not one of mlx-lm's recipes ({})", names.join(", "))
    })
}

fn parse_mode(s: &str) -> Result<FpMode, String> {
    FpMode::parse(s).ok_or_else(|| format!("{s:?} is not one of mlx's floating-point modes (mxfp4, nvfp4, mxfp8)"))
}
