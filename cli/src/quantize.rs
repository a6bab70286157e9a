//! `quantfarm quantize`: a GGUF model to a llama-quantize file type, with the same bytes llama-quantize writes.

use anyhow::{Context, Result};
use std::sync::Arc;

use quantfarm_quant::file::{quantize_gguf, Options};
use quantfarm_quant::imatrix::Imatrix;
use quantfarm_quant::FileType;
use quantfarm_store::Location;
use quantfarm_tensors::{GgmlType, TensorSource};

use crate::units::{human, parse_size};

#[derive(clap::Args)]
pub struct Args {
    /// The input GGUF (the first file of a split opens the whole split).
    input: String,
    /// The output GGUF.
    output: String,
    /// File type, e.g. Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q4_0, F16, BF16 (types that need a quantizer quantfarm lacks yet are
    /// refused, naming the first tensor that would need it).
    #[arg(value_parser = parse_ftype)]
    ftype: FileType,
    /// Allow changing the type of tensors that are already quantized.
    #[arg(long)]
    allow_requantize: bool,
    /// Replace an existing output.
    #[arg(long)]
    overwrite: bool,
    /// Memory for values being quantized.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    budget: u64,
    /// Importance matrix (llama-imatrix's GGUF or legacy .dat; a path or s3:// URL), as llama-quantize's
    /// `--imatrix`: used for every tensor it has an entry for, and recorded as `quantize.imatrix.*`.
    #[arg(long, value_name = "FILE")]
    imatrix: Option<String>,
    /// Quantization threads (default: all cores). The output does not depend on it.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    threads: Option<u64>,
    /// As llama-quantize's `--pure`: no mixture rules; every quantizable tensor gets the file type's default type
    /// (norms and other 1-D tensors stay as they are, rows that are not whole blocks still fall back).
    #[arg(long)]
    pure: bool,
    /// As llama-quantize's `--output-tensor-type`: this ggml type (e.g. q8_0, q6_K, f16) for output.weight, used as
    /// given (no fallback); a tied token_embd gets it too (unless --pure).
    #[arg(long, value_name = "TYPE", value_parser = parse_ggml_type)]
    output_tensor_type: Option<GgmlType>,
    /// As llama-quantize's `--token-embedding-type`: this ggml type for token_embd.weight, used as given.
    #[arg(long, value_name = "TYPE", value_parser = parse_ggml_type)]
    token_embedding_type: Option<GgmlType>,
    /// As llama-quantize's `--leave-output-tensor`: output.weight keeps its input type.
    #[arg(long)]
    leave_output_tensor: bool,
}

/// llama-quantize's `parse_ggml_type`: a `ggml_type_name`, case-insensitively.
fn parse_ggml_type(s: &str) -> Result<GgmlType, String> {
    GgmlType::from_name(s).ok_or_else(|| {
        let names: Vec<_> = GgmlType::ALL.iter().map(|t| t.name()).collect();
        format!("unknown ggml type {s:?} (one of {})", names.join(", "))
    })
}

fn parse_ftype(s: &str) -> Result<FileType, String> {
    FileType::from_name(s).ok_or_else(|| {
        let names: Vec<_> = FileType::ALL.iter().map(|f| f.name()).collect();
        format!("unknown file type {s:?} (one of {})", names.join(", "))
    })
}

pub async fn run(args: Args) -> Result<()> {
    let src = TensorSource::open(&Location::parse(&args.input)?)
        .await
        .with_context(|| format!("cannot open {}", args.input))?;
    let imatrix = match &args.imatrix {
        None => None,
        Some(f) => {
            let mut im = Imatrix::load(&Location::parse(f)?).await?;
            // llama-quantize records the argument as given.
            im.file = f.clone();
            Some(Arc::new(im))
        }
    };
    let opts = Options {
        ftype: args.ftype,
        allow_requantize: args.allow_requantize,
        budget: args.budget,
        overwrite: args.overwrite,
        imatrix,
        threads: args.threads.map(|n| n as usize),
        pure: args.pure,
        output_tensor_type: args.output_tensor_type,
        token_embedding_type: args.token_embedding_type,
        leave_output_tensor: args.leave_output_tensor,
    };
    let q = quantize_gguf(&src, &Location::parse(&args.output)?, &opts).await?;
    let mut counts = std::collections::BTreeMap::new();
    for c in &q.choices {
        *counts.entry(c.ty.name()).or_insert(0) += 1;
    }
    let fallbacks = q.choices.iter().filter(|c| c.fell_back).count();
    let types: Vec<String> = counts.iter().map(|(t, n)| format!("{t}: {n}")).collect();
    println!("{}  {}  {}", q.committed.sha256, human(q.committed.bytes), q.committed.location);
    println!(
        "{} as {}: {} ({fallbacks} tensors fell back: rows not whole blocks)",
        args.input,
        args.ftype,
        types.join(", ")
    );
    Ok(())
}
