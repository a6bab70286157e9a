//! `quantfarm quantize`: a GGUF model to a llama-quantize file type, with the same bytes llama-quantize writes.

use anyhow::{Context, Result};
use std::sync::Arc;

use quantfarm_quant::edits::{KvOverride, Prune};
use quantfarm_quant::file::{plan_gguf, quantize_gguf, quantize_gguf_keep_split, Options, Plan};
use quantfarm_quant::imatrix::Imatrix;
use quantfarm_quant::mixture::TensorType;
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
    /// As llama-quantize's `--tensor-type PATTERN=TYPE` (repeatable): tensors whose name contains a match of the
    /// regex PATTERN (lower-cased; unanchored, so `attn_q` also matches `attn_qkv`) get TYPE instead of the mixture
    /// rules' choice (then the fallback for rows that are not whole blocks); the first matching entry wins.
    #[arg(long = "tensor-type", value_name = "PATTERN=TYPE")]
    tensor_type: Vec<String>,
    /// As llama-quantize's `--tensor-type-file`: a file of whitespace-separated PATTERN=TYPE entries (no comments),
    /// taken at this option's place among the --tensor-type entries.
    #[arg(long = "tensor-type-file", value_name = "FILE")]
    tensor_type_file: Vec<String>,
    /// As llama-quantize's `--override-kv KEY=TYPE:VALUE` (repeatable; TYPE int, float, bool or str): set KEY in
    /// the output's metadata (an int as u32 of its absolute value, a float as f32, as llama-quantize writes them);
    /// the mixture rules read an overridden hyperparameter (e.g. `llama.block_count`) as the model loader does.
    #[arg(long = "override-kv", value_name = "KEY=TYPE:VALUE", value_parser = parse_override)]
    override_kv: Vec<KvOverride>,
    /// As llama-quantize's `--prune-layers L0,L1,...`: drop those blocks (`blk.N.*`), renumber the later ones and
    /// set the block count; the importance matrix is read by the tensors' old names.
    #[arg(long, value_name = "L0,L1,...", value_parser = parse_prune)]
    prune_layers: Option<Prune>,
    /// As llama-quantize's `--keep-split`: one output file per input split file, the tensors in input-file order
    /// (which the mixture rules' layer counters follow), named OUTPUT-00001-of-0000N.gguf after OUTPUT less its
    /// `.gguf`, even for a one-file input.
    #[arg(long)]
    keep_split: bool,
    /// As llama-quantize's `--dry-run`: print each tensor's type and size and the totals, write nothing (a type
    /// that needs an importance matrix none was given for is a warning, not an error). OUTPUT is not touched.
    #[arg(long)]
    dry_run: bool,
}

/// The `--tensor-type` and `--tensor-type-file` entries in command-line order (each file read where it appears), as
/// llama-quantize appends them while it walks its arguments.
fn tensor_types(args: &Args) -> Result<Vec<TensorType>> {
    // clap keeps each option's values in order but not their interleaving: recover it from the raw arguments.
    let mut kinds = Vec::new();
    for a in std::env::args_os() {
        let a = a.to_string_lossy();
        if a == "--tensor-type-file" || a.starts_with("--tensor-type-file=") {
            kinds.push(true);
        } else if a == "--tensor-type" || a.starts_with("--tensor-type=") {
            kinds.push(false);
        }
    }
    if kinds.len() != args.tensor_type.len() + args.tensor_type_file.len() {
        // Not called from this process's command line (or an abbreviation): patterns first, then files.
        kinds = vec![false; args.tensor_type.len()];
        kinds.extend(vec![true; args.tensor_type_file.len()]);
    }
    let (mut specs, mut files) = (args.tensor_type.iter(), args.tensor_type_file.iter());
    let mut out = Vec::new();
    for is_file in kinds {
        if is_file {
            if let Some(f) = files.next() {
                let text = std::fs::read_to_string(f).with_context(|| format!("cannot read --tensor-type-file {f}"))?;
                out.extend(TensorType::parse_file(&text).with_context(|| format!("in --tensor-type-file {f}"))?);
            }
        } else if let Some(spec) = specs.next() {
            out.push(TensorType::parse(spec)?);
        }
    }
    Ok(out)
}

/// llama-quantize's `parse_ggml_type`: a `ggml_type_name`, case-insensitively.
fn parse_ggml_type(s: &str) -> Result<GgmlType, String> {
    GgmlType::from_name(s).ok_or_else(|| {
        let names: Vec<_> = GgmlType::ALL.iter().map(|t| t.name()).collect();
        format!("unknown ggml type {s:?} (one of {})", names.join(", "))
    })
}

fn parse_override(s: &str) -> Result<KvOverride, String> {
    KvOverride::parse(s).map_err(|e| e.to_string())
}

fn parse_prune(s: &str) -> Result<Prune, String> {
    Prune::parse(s).map_err(|e| e.to_string())
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
        tensor_types: tensor_types(&args)?,
        kv_overrides: args.override_kv.clone(),
        prune: args.prune_layers.clone().unwrap_or_default(),
        keep_split: args.keep_split,
    };
    if args.dry_run {
        let plan = plan_gguf(&src, &opts)?;
        // llama-quantize numbers the lines out of the input's tensor count (pruned ones included).
        let n_input = src.gguf().map_or(plan.choices.len(), |g| g.tensors().count());
        print_dry_run(&plan, &opts, n_input);
        return Ok(());
    }
    let dst = Location::parse(&args.output)?;
    let files = if args.keep_split {
        quantize_gguf_keep_split(&src, &dst, &opts).await?
    } else {
        vec![quantize_gguf(&src, &dst, &opts).await?]
    };
    let choices: Vec<_> = files.iter().flat_map(|q| q.choices.iter().cloned()).collect();
    warn_unmatched(&opts, &choices);
    let mut counts = std::collections::BTreeMap::new();
    for c in &choices {
        *counts.entry(c.ty.name()).or_insert(0) += 1;
    }
    let fallbacks = choices.iter().filter(|c| c.fell_back).count();
    let types: Vec<String> = counts.iter().map(|(t, n)| format!("{t}: {n}")).collect();
    for q in &files {
        println!("{}  {}  {}", q.committed.sha256, human(q.committed.bytes), q.committed.location);
    }
    println!(
        "{} as {}: {} ({fallbacks} tensors fell back: rows not whole blocks)",
        args.input,
        args.ftype,
        types.join(", ")
    );
    Ok(())
}

/// llama-quantize says nothing about a `--tensor-type` pattern that names no tensor (a typo, a tensor that the
/// float file types or the never-quantized list keep, an earlier pattern that always wins); quantfarm warns.
fn warn_unmatched(opts: &Options, choices: &[quantfarm_quant::mixture::Choice]) {
    for (i, t) in opts.tensor_types.iter().enumerate() {
        if !choices.iter().any(|c| c.pattern == Some(i)) {
            eprintln!(
                "warning: --tensor-type {}={} decided no tensor (no quantized tensor's name matches it before an \
                 earlier entry does)",
                t.pattern,
                t.ty.name()
            );
        }
    }
}

/// `--dry-run`: every tensor as llama-quantize lists it (name, shape, input type, and size in → size out with the
/// new type), then the totals as llama-quantize prints them (MiB and bits per weight).
fn print_dry_run(plan: &Plan, opts: &Options, n: usize) {
    let mib = |b: u64| b as f64 / 1024.0 / 1024.0;
    let (mut total_in, mut total_out, mut elements) = (0u64, 0u64, 0u64);
    for (i, ((c, d), (&bytes, &el))) in
        plan.choices.iter().zip(&plan.descs).zip(plan.input_bytes.iter().zip(&plan.elements)).enumerate()
    {
        let ne0 = d.dims.first().copied().unwrap_or(1).max(1);
        let out = c.ty.row_bytes(ne0).unwrap_or(0) * (el / ne0);
        let shape: Vec<String> = d.dims.iter().map(|x| x.to_string()).collect();
        let from = plan.input_types[i];
        if from == c.ty {
            println!(
                "[{:4}/{n:4}] {:<36} - [{}], type = {:>6}, size = {:8.3} MiB",
                i + 1,
                c.name,
                shape.join(", "),
                from.name(),
                mib(out)
            );
        } else {
            println!(
                "[{:4}/{n:4}] {:<36} - [{}], type = {:>6}, size = {:8.2} MiB -> {:8.2} MiB ({})",
                i + 1,
                c.name,
                shape.join(", "),
                from.name(),
                mib(bytes),
                mib(out),
                c.ty.name()
            );
        }
        total_in += bytes;
        total_out += out;
        elements += el;
    }
    let bpw = |b: u64| b as f64 * 8.0 / elements.max(1) as f64;
    println!("model size  = {:8.2} MiB ({:.2} BPW)", mib(total_in), bpw(total_in));
    println!("quant size  = {:8.2} MiB ({:.2} BPW)", mib(total_out), bpw(total_out));
    let fell_back = plan.choices.iter().filter(|c| c.fell_back).count();
    if fell_back > 0 {
        println!("{fell_back} of {n} tensor(s) required fallback quantization");
    }
    if !plan.need_imatrix.is_empty() {
        eprintln!(
            "warning: dry run completed, but making this file needs an importance matrix (--imatrix) for {} \
             tensor(s), the first {}",
            plan.need_imatrix.len(),
            plan.need_imatrix[0]
        );
    }
    warn_unmatched(opts, &plan.choices);
}
