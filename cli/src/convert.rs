//! `quantfarm convert`: a Hugging Face safetensors checkpoint to GGUF (bf16, f16 or f32), as `convert_hf_to_gguf.py
//! --outtype …` writes it (tensor names, permutations, offsets, metadata and tokenizer keys from `mappings/*.yaml`),
//! in one file or llama.cpp split files. An MLX checkpoint converts too, its affine weights dequantized as MLX does.

use anyhow::{Context, Result};
use quantfarm_tensors::convert::{
    convert_hf_to_gguf, output_file_name, plan_hf_to_gguf, split_ranges, GgufPlan, OutType, SplitRule,
};
use quantfarm_tensors::gguf::Value;
use quantfarm_tensors::{Location, TensorSource, TensorType};

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
    /// The type of the weights (1-D tensors and norms are F32 whatever it is).
    #[arg(long, default_value = "bf16", value_parser = parse_outtype)]
    outtype: OutType,
    /// Split into files of at most N tensors (gguf-split's --split-max-tensors).
    #[arg(long, conflicts_with = "split_max_bytes")]
    split_max_tensors: Option<usize>,
    /// Split into files of at most this many tensor bytes (e.g. 2GB).
    #[arg(long, value_parser = parse_size)]
    split_max_bytes: Option<u64>,
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
    OutType::parse(s).ok_or_else(|| format!("{s:?}: expected bf16, f16 or f32"))
}

pub async fn run(args: Args) -> Result<()> {
    let src = Location::parse(&args.input)?;
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
    if args.dry_run {
        let source = TensorSource::open(&src).await?;
        let plan =
            plan_hf_to_gguf(&source, args.outtype).await.with_context(|| format!("cannot convert {}", args.input))?;
        print!("{}", describe(&plan, &args.input, &dst, &prefix, rule));
        return Ok(());
    }
    let done = convert_hf_to_gguf(&src, &dst, &prefix, args.outtype, rule, args.budget, args.overwrite)
        .await
        .with_context(|| format!("cannot convert {}", args.input))?;
    for c in &done {
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
            if let TensorType::MlxAffine { bits, group_size, .. } = t.source_type {
                ops.push(format!("dequantize (MLX {bits}-bit, groups of {group_size})"));
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
