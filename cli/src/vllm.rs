//! `quantfarm vllm`: a Hugging Face bf16 checkpoint to the compressed-tensors checkpoint llm-compressor writes for
//! vLLM, FP8_DYNAMIC or W4A16 (round to nearest, no calibration data): the Linear weights' tensors and
//! `quantization_config` are llm-compressor's (`quantfarm_quant::vllm_file`); vLLM reads the format from
//! `config.json`, so `vllm serve OUT_DIR` needs no `--quantization` flag.

use anyhow::{Context, Result};
use quantfarm_quant::vllm_file::{write_vllm_checkpoint, Anchor, VllmOptions, VllmScheme};
use quantfarm_store::Location;

use crate::units::{human, parse_size};

#[derive(Clone, Copy, clap::ValueEnum)]
enum Scheme {
    /// 8-bit float weights, a scale per output row; activations quantized per token at run time.
    #[value(name = "FP8_DYNAMIC")]
    Fp8Dynamic,
    /// 4-bit integer weights, a scale per group of --group-size input columns; 16-bit activations.
    #[value(name = "W4A16")]
    W4A16,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Like {
    /// llm-compressor's `oneshot`: tensors left unquantized in the config's dtype; an exact -0.0 weight +0 in FP8.
    Oneshot,
    /// llm-compressor's `model_free_ptq`: tensors left unquantized as stored; -0.0 stays -0.
    ModelFree,
}

#[derive(clap::Args)]
pub struct Args {
    /// The HF checkpoint folder (config.json, *.safetensors, tokenizer files): a path or s3:// URL.
    input: String,
    /// The output folder.
    output_dir: String,
    /// The quantization scheme, as llm-compressor names it.
    #[arg(long, value_enum)]
    scheme: Scheme,
    /// W4A16's group of input columns per scale: it must divide every quantized weight's columns (SmolLM2's 576
    /// takes 32 or 64, not 128).
    #[arg(long, default_value_t = 64)]
    group_size: u32,
    /// Modules left unquantized, by full name or `re:PATTERN` (matched from the name's start, as compressed-tensors
    /// matches; repeat the flag for more). The default, lm_head, is what vLLM's loaders and llm-compressor's examples
    /// expect; giving the flag replaces it.
    #[arg(long, default_values_t = ["lm_head".to_string()])]
    ignore: Vec<String>,
    /// Which of llm-compressor's entry points to make the checkpoint like (they quantize the same weights to the
    /// same bytes).
    #[arg(long, value_enum, default_value = "oneshot")]
    like: Like,
    /// Check the checkpoint (formats, dtypes, group divisibility) and say what would be quantized; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Replace existing outputs.
    #[arg(long)]
    overwrite: bool,
    /// Memory for tensor data held at once.
    #[arg(long, default_value = "32MiB", value_parser = parse_size)]
    budget: u64,
}

pub async fn run(args: Args) -> Result<()> {
    let scheme = match args.scheme {
        Scheme::Fp8Dynamic => VllmScheme::Fp8Dynamic,
        Scheme::W4A16 => VllmScheme::W4A16 { group_size: args.group_size },
    };
    let like = match args.like {
        Like::Oneshot => Anchor::Oneshot,
        Like::ModelFree => Anchor::ModelFree,
    };
    let opts = VllmOptions { scheme, like, ignore: args.ignore, budget: args.budget, overwrite: args.overwrite };
    let src = Location::parse(&args.input)?;
    if args.dry_run {
        let plan = quantfarm_quant::vllm_file::check(&src, &opts)
            .await
            .with_context(|| format!("{} cannot be made {}", args.input, scheme.name()))?;
        println!("{} modules would be quantized to {}:", plan.len(), scheme.name());
        for m in plan {
            println!("  {m}");
        }
        return Ok(());
    }
    let dst = Location::parse(&args.output_dir)?;
    let done = write_vllm_checkpoint(&src, &dst, &opts)
        .await
        .with_context(|| format!("cannot make the {} checkpoint of {}", scheme.name(), args.input))?;
    println!("{} modules quantized to {}", done.quantized.len(), scheme.name());
    for c in &done.files {
        println!("{}  {}  {}", c.sha256, human(c.bytes), c.location);
    }
    Ok(())
}
