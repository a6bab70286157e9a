//! `quantfarm convert`: a Hugging Face safetensors checkpoint to GGUF (bf16, f16 or f32), as `convert_hf_to_gguf.py
//! --outtype …` writes it (tensor names, permutations, offsets, metadata and tokenizer keys from `mappings/*.yaml`),
//! in one file or llama.cpp split files. An MLX checkpoint converts too, its affine weights dequantized as MLX does.
//! A GGUF converts back to an HF checkpoint (`--to hf`): weights dequantized, permutations and offsets undone,
//! config.json and the tokenizer files rebuilt from its keys.

use anyhow::{Context, Result};
use quantfarm_store::Location;
use quantfarm_tensors::convert::{
    convert_hf_to_gguf, output_file_name, plan_gguf_to_hf, plan_gguf_to_mlx, plan_hf_to_gguf_with, plan_mlx_to_hf,
    split_ranges, write_hf, ConvertOptions, GgufPlan, Mtp, OutType, SplitRule,
};
use quantfarm_tensors::gguf::Value;
use quantfarm_tensors::{Dtype, Format};
use quantfarm_tensors::{TensorSource, TensorType};

use crate::units::{human, parse_size};

#[derive(clap::Args)]
pub struct Args {
    /// The HF or MLX checkpoint folder (config.json, tokenizer files, *.safetensors): a path or s3:// URL.
    input: String,
    /// The output: a file `NAME.gguf`, or a folder (files named by --prefix, split files numbered).
    output: String,
    /// Output file name prefix in an output folder (default: the input folder's name).
    #[arg(long)]
    prefix: Option<String>,
    /// The target format: gguf (from an HF or MLX folder), hf (from a GGUF, or an MLX folder: dequantized as
    /// `mlx_lm.convert --dequantize` does) or mlx (from a GGUF). Default: hf for a GGUF source
    /// written to a folder, else gguf.
    #[arg(long, value_parser = ["gguf", "hf", "mlx"])]
    to: Option<String>,
    /// MLX bits (--to mlx): auto (from the GGUF's dominant weight type: Q2→2, Q3→3, Q4→4, Q5→5, Q6→6, Q8→8;
    /// F16/BF16/F32 sources stay unquantized) or 2, 3, 4, 5, 6, 8.
    #[arg(long, default_value = "auto")]
    bits: String,
    /// MLX weights per scale/bias group (--to mlx): 32, 64 or 128.
    #[arg(long, default_value_t = 64)]
    group_size: usize,
    /// The type of the weights (GGUF: 1-D tensors and norms are F32 whatever it is; HF: every tensor).
    #[arg(long, default_value = "bf16", value_parser = parse_outtype)]
    outtype: OutType,
    /// Split into files of at most N tensors (gguf-split's --split-max-tensors).
    #[arg(long, conflicts_with = "split_max_bytes")]
    split_max_tensors: Option<usize>,
    /// Split into files of at most this many tensor bytes (e.g. 2GB).
    #[arg(long, value_parser = parse_size)]
    split_max_bytes: Option<u64>,
    /// Leave out the multi-token-prediction head (Qwen3.5's `mtp.*` blocks), as convert_hf_to_gguf.py --no-mtp
    /// does: a smaller GGUF without llama.cpp's speculative-decoding blocks. By default they are kept.
    #[arg(long)]
    no_mtp: bool,
    /// Replace existing outputs.
    #[arg(long)]
    overwrite: bool,
    /// Print the whole plan (metadata, and per tensor its source, operations, destination, type, shape and bytes,
    /// file by file) and write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Memory for tensor data held at once.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    budget: u64,
}

fn parse_outtype(s: &str) -> std::result::Result<OutType, String> {
    OutType::parse(s).ok_or_else(|| format!("{s:?}: expected bf16, f16, f32 or q8_0"))
}

pub async fn run(args: Args) -> Result<()> {
    let src = Location::parse(&args.input)?;
    let to_hf = match args.to.as_deref() {
        Some(t) => t == "hf",
        None => args.input.ends_with(".gguf") && !args.output.ends_with(".gguf"),
    };
    if args.to.as_deref() == Some("mlx") {
        return to_mlx_run(&args, &src).await;
    }
    if to_hf {
        return to_hf_run(&args, &src).await;
    }
    // DST ending in .gguf names the file: its folder is the output folder and its stem the prefix.
    let (output_dir, file_prefix) = match args.output.strip_suffix(".gguf") {
        Some(stem) => {
            if args.prefix.is_some() {
                anyhow::bail!("--prefix names files in an output folder; {} already names the file", args.output);
            }
            match stem.rsplit_once('/') {
                Some((dir, name)) => {
                    (if dir.is_empty() { "/".to_string() } else { dir.to_string() }, Some(name.to_string()))
                }
                None => (".".to_string(), Some(stem.to_string())),
            }
        }
        None => (args.output.clone(), None),
    };
    let prefix = match file_prefix.or_else(|| args.prefix.clone()) {
        Some(p) => p,
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
    let dst = Location::parse(&output_dir)?;
    let options = ConvertOptions { out: args.outtype, mtp: if args.no_mtp { Mtp::Drop } else { Mtp::Keep } };
    if args.dry_run {
        let source = TensorSource::open(&src).await?;
        let plan =
            plan_hf_to_gguf_with(&source, options).await.with_context(|| format!("cannot convert {}", args.input))?;
        print!("{}", describe(&plan, &args.input, &dst, &prefix, rule));
        return Ok(());
    }
    let done = convert_hf_to_gguf(&src, &dst, &prefix, options, rule, args.budget, args.overwrite)
        .await
        .with_context(|| format!("cannot convert {}", args.input))?;
    for c in &done {
        println!("{}  {}  {}", c.sha256, human(c.bytes), c.location);
    }
    Ok(())
}

/// GGUF → HF checkpoint folder.
async fn to_hf_run(args: &Args, src: &Location) -> Result<()> {
    let dtype = match args.outtype {
        OutType::Bf16 => Dtype::BF16,
        OutType::F16 => Dtype::F16,
        OutType::F32 => Dtype::F32,
        OutType::Q8_0 => anyhow::bail!("--outtype q8_0 is for GGUF outputs; an HF checkpoint is bf16, f16 or f32"),
    };
    let source = TensorSource::open(src).await?;
    let dst = Location::parse(&args.output)?;
    let plan = match source.format() {
        Format::Gguf => plan_gguf_to_hf(&source, dtype).await,
        // mlx_lm.convert --dequantize: each weight in its scales' dtype, as mx.dequantize computes it.
        Format::Mlx => plan_mlx_to_hf(&source),
        other => anyhow::bail!("{}: --to hf converts a GGUF or MLX model; this is {}", args.input, other.name()),
    }
    .with_context(|| format!("cannot convert {}", args.input))?;
    if args.dry_run {
        println!("{} -> {}: {} tensors ({dtype})", args.input, dst, plan.tensors.len());
        print_tensor_ops(&source, &plan)?;
        return Ok(());
    }
    let done = write_hf(&source, &plan, &dst, args.budget, args.overwrite)
        .await
        .with_context(|| format!("cannot convert {} to an HF checkpoint", args.input))?;
    for c in &done {
        println!("{}  {}  {}", c.sha256, human(c.bytes), c.location);
    }
    Ok(())
}

/// The plan's config.json and, per tensor, its name, shape, source and operations.
fn print_tensor_ops(source: &TensorSource, plan: &quantfarm_tensors::convert::HfPlan) -> Result<()> {
    println!("config.json = {}", serde_json::Value::Object(plan.config.clone()));
    for t in &plan.tensors {
        let mut ops = vec![format!("{} -> {}", source.entry(&t.source)?.ty, t.dtype)];
        if let Some(h) = t.unpermute_heads {
            ops.push(format!("unpermute rows in {h} heads"));
        }
        if let Some(o) = t.reorder {
            let axis = if o.rows { "rows" } else { "columns" };
            ops.push(format!("v-heads grouped ({} groups of {}, {} {axis} each)", o.groups, o.per_group, o.block));
        }
        if let Some(f) = t.values {
            ops.push(format!("undo {f:?}"));
        }
        if let Some(o) = t.offset {
            ops.push(format!("subtract {o} (f32)"));
        }
        if plan.quantize_3d.iter().any(|m| t.name.strip_suffix(".weight") == Some(m.as_str())) {
            ops.push("quantized as experts".into());
        }
        if let Some((_, bits, group)) =
            plan.quant_overrides.iter().find(|o| t.name.strip_suffix(".weight") == Some(o.0.as_str()))
        {
            ops.push(format!("quantized at {bits} bits, groups of {group}"));
        }
        println!("  {}  {:?}  <-  {}  {}", t.name, t.shape, t.source, ops.join(", "));
    }
    Ok(())
}

/// The MLX bits `--bits auto` picks for a GGUF: the family of the weight type holding the most bytes among 2-D
/// tensors (ties by name), or None for a float source (kept unquantized).
fn auto_bits(source: &TensorSource) -> Result<Option<u32>> {
    let mut bytes: std::collections::BTreeMap<String, u64> = Default::default();
    for e in source.tensors() {
        if e.shape.len() == 2 {
            *bytes.entry(e.ty.to_string()).or_default() += e.bytes;
        }
    }
    let dominant =
        bytes.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).map(|(t, _)| t.clone()).unwrap_or_default();
    let family = dominant.trim_start_matches("IQ").trim_start_matches('Q');
    Ok(match family.chars().next() {
        _ if matches!(dominant.as_str(), "F32" | "F16" | "BF16") => None,
        Some(c @ ('2' | '3' | '4' | '5' | '6' | '8')) => Some(c.to_digit(10).expect("a digit")),
        _ => anyhow::bail!("--bits auto cannot map the dominant weight type {dominant}; give --bits"),
    })
}

/// GGUF → MLX: each tensor is converted as GGUF → HF bf16 converts it and quantized as it streams (as
/// `mlx_lm.convert -q` would quantize that checkpoint), within the budget and with no copy on disk; kept as bf16
/// when not quantizing.
async fn to_mlx_run(args: &Args, src: &Location) -> Result<()> {
    let source = TensorSource::open(src).await?;
    if source.format() != Format::Gguf {
        anyhow::bail!("{}: --to mlx converts a GGUF model; this is {}", args.input, source.format().name());
    }
    let bits = match args.bits.as_str() {
        "auto" => auto_bits(&source)?,
        b => Some(
            b.parse::<u32>()
                .ok()
                .filter(|b| [2, 3, 4, 5, 6, 8].contains(b))
                .ok_or_else(|| anyhow::anyhow!("--bits {b}: expected auto, 2, 3, 4, 5, 6 or 8"))?,
        ),
    };
    if bits == Some(3) {
        eprintln!(
            "warning: 3-bit MLX weights lose much of a model's accuracy (gguf2mlx-stream measured ARC-Challenge 48% \
             -> 29-31% on Llama-3.2-1B); measure the result before publishing it"
        );
    }
    let dst = Location::parse(&args.output)?;
    let plan =
        plan_gguf_to_mlx(&source, Dtype::BF16).await.with_context(|| format!("cannot convert {}", args.input))?;
    if args.dry_run {
        println!(
            "{} -> {} (MLX, {}): {} tensors, each converted as GGUF -> HF bf16 and quantized as it streams",
            args.input,
            dst,
            bits.map_or("bf16".to_string(), |b| format!("{b}-bit, groups of {}", args.group_size)),
            plan.tensors.len()
        );
        print_tensor_ops(&source, &plan)?;
        return Ok(());
    }
    let Some(bits) = bits else {
        let done = write_hf(&source, &plan, &dst, args.budget, args.overwrite).await?;
        for c in &done {
            println!("{}  {}  {}", c.sha256, human(c.bytes), c.location);
        }
        return Ok(());
    };
    let opts = quantfarm_quant::mlx_file::MlxOptions {
        budget: args.budget,
        overwrite: args.overwrite,
        ..quantfarm_quant::mlx_file::MlxOptions::new(bits, args.group_size)
    };
    let done = quantfarm_quant::mlx_file::gguf_to_mlx(&source, &plan, &dst, &opts)
        .await
        .with_context(|| format!("cannot quantize {} to MLX {bits}-bit", args.input))?;
    println!("{} modules quantized to {bits} bits (group size {})", done.quantized, args.group_size);
    for c in &done.files {
        println!("{}  {}  {}", c.sha256, human(c.bytes), c.location);
    }
    Ok(())
}

/// The plan as text: what would be written where, before any weight moves.
fn describe(plan: &GgufPlan, input: &str, dst: &Location, prefix: &str, rule: Option<SplitRule>) -> String {
    use std::fmt::Write;
    let ranges = split_ranges(&plan.nbytes(), rule);
    let total: u64 = plan.nbytes().iter().sum();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "plan {input} -> {dst}: {} tensors, {} in {} file(s); digest {}",
        plan.tensors.len(),
        human(total),
        ranges.len(),
        plan.digest()
    );
    let _ = writeln!(out, "metadata ({} keys):", plan.metadata.len());
    for (k, v) in &plan.metadata {
        let _ = writeln!(out, "  {k} = {}", brief(v));
    }
    for (i, r) in ranges.iter().enumerate() {
        let bytes: u64 = plan.tensors[r.clone()].iter().map(|t| t.nbytes).sum();
        let _ = writeln!(
            out,
            "file {}: {} ({} tensors, {})",
            i + 1,
            output_file_name(prefix, i, ranges.len()),
            r.len(),
            human(bytes)
        );
        for t in &plan.tensors[r.clone()] {
            let mut ops = Vec::new();
            match t.source_type {
                TensorType::MlxAffine { bits, group_size, .. } => {
                    ops.push(format!("dequantize (MLX {bits}-bit, groups of {group_size})"))
                }
                TensorType::MlxFp { mode } => ops.push(format!("dequantize (MLX {})", mode.name())),
                TensorType::Dtype(_) | TensorType::Ggml(_) => {}
            }
            if let Some(h) = t.permute_heads {
                ops.push(format!("permute rows in {h} heads"));
            }
            if let Some(o) = t.offset {
                ops.push(format!("add {o} (f32)"));
            }
            let from = match t.source_type {
                TensorType::Dtype(d) => d.to_string(),
                _ => "F32".into(),
            };
            ops.push(if from == t.ty.to_string() { "copy".into() } else { format!("{from} -> {}", t.ty) });
            let shape: Vec<String> = t.ne.iter().map(u64::to_string).collect();
            let _ = writeln!(
                out,
                "  {}  {}  [{}]  {} bytes  <-  {} ({})  {}",
                t.name,
                t.ty,
                shape.join(", "),
                t.nbytes,
                t.source,
                t.source_type,
                ops.join(", ")
            );
        }
    }
    out
}

/// A metadata value in a line: scalars as they are, arrays by length and first elements.
fn brief(v: &Value) -> String {
    let j = v.to_json();
    match j.as_array() {
        Some(a) if a.len() > 4 => {
            let head: Vec<String> = a.iter().take(3).map(|x| x.to_string()).collect();
            format!("[{}, ... ({} items)]", head.join(", "), a.len())
        }
        _ => {
            let s = j.to_string();
            if s.chars().count() > 120 {
                format!("{}... ({} chars)", s.chars().take(100).collect::<String>(), s.chars().count())
            } else {
                s
            }
        }
    }
}
