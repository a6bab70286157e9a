//! `quantfarm inspect`: what a model file holds, from headers only (and, with `--read`, a full read of every tensor
//! within a memory budget, reporting throughput and a sha256 per tensor).

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context, Result};
use quantfarm_store::Location;
use quantfarm_tensors::{TensorSource, TensorType};
use serde_json::{json, Map, Value as Json};

use crate::units::{human, parse_size};

#[derive(clap::Args)]
pub struct Args {
    /// A path, file://PATH, or s3://BUCKET/KEY (endpoint and credentials from AWS_* variables).
    location: String,
    /// List every tensor (name, type, shape, bytes).
    #[arg(long)]
    tensors: bool,
    /// Print every metadata key and value.
    #[arg(long)]
    metadata: bool,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
    /// Read every tensor's bytes (in reads of at most --budget bytes into one buffer) and report the throughput.
    #[arg(long)]
    read: bool,
    /// With --read: also a sha256 of every tensor's stored bytes (costs CPU; leave it off to measure I/O).
    #[arg(long, requires = "read")]
    sha256: bool,
    /// Memory budget for --read.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    budget: u64,
}

struct TypeStats {
    tensors: u64,
    elements: u64,
    bytes: u64,
}

pub async fn run(args: Args) -> Result<()> {
    let loc = Location::parse(&args.location)?;
    let src = TensorSource::open(&loc).await.with_context(|| format!("cannot open {}", args.location))?;
    let entries = src.tensors();
    let mut by_type: BTreeMap<String, TypeStats> = BTreeMap::new();
    let (mut elements, mut bytes) = (0u64, 0u64);
    for e in entries {
        let s = by_type.entry(e.ty.to_string()).or_insert(TypeStats { tensors: 0, elements: 0, bytes: 0 });
        s.tensors += 1;
        s.elements += e.elements();
        s.bytes += e.bytes;
        elements += e.elements();
        bytes += e.bytes;
    }
    let bpw = if elements > 0 { bytes as f64 * 8.0 / elements as f64 } else { 0.0 };
    let read = if args.read { Some(read_all(&src, args.budget, args.sha256).await?) } else { None };

    if args.json {
        let mut out = Map::new();
        out.insert("location".into(), json!(args.location));
        out.insert("format".into(), json!(src.format().name()));
        out.insert(
            "files".into(),
            Json::Array(src.files().iter().map(|b| json!({"name": b.name(), "bytes": b.len()})).collect()),
        );
        out.insert("architecture".into(), json!(src.architecture()));
        if let Some(g) = src.gguf() {
            out.insert("gguf_version".into(), json!(g.header().version));
            out.insert("alignment".into(), json!(g.header().alignment));
        }
        out.insert("tensor_count".into(), json!(entries.len()));
        out.insert("parameters".into(), json!(elements));
        out.insert("bytes".into(), json!(bytes));
        out.insert("bits_per_weight".into(), json!(bpw));
        let types: Map<String, Json> = by_type
            .iter()
            .map(|(k, s)| (k.clone(), json!({"tensors": s.tensors, "parameters": s.elements, "bytes": s.bytes})))
            .collect();
        out.insert("types".into(), Json::Object(types));
        if args.metadata {
            out.insert("metadata".into(), Json::Object(src.metadata()));
        }
        if args.tensors {
            let list = entries
                .iter()
                .map(|e| {
                    let mut t = json!({"name": e.name, "type": e.ty.to_string(), "shape": e.shape, "bytes": e.bytes});
                    if matches!(e.ty, TensorType::Ggml(_)) {
                        t["ne"] = json!(e.shape.iter().rev().collect::<Vec<_>>());
                    }
                    t
                })
                .collect();
            out.insert("tensors".into(), Json::Array(list));
        }
        if let Some(r) = &read {
            out.insert("read".into(), r.to_json());
        }
        println!("{}", serde_json::to_string_pretty(&Json::Object(out))?);
        return Ok(());
    }

    println!("location:      {}", args.location);
    let files = src.files();
    println!(
        "format:        {} ({} file{}, {})",
        src.format().name(),
        files.len(),
        if files.len() == 1 { "" } else { "s" },
        human(files.iter().map(|b| b.len()).sum())
    );
    println!("architecture:  {}", src.architecture().as_deref().unwrap_or("(not stated)"));
    println!("tensors:       {}", entries.len());
    println!("parameters:    {elements} ({:.1} M)", elements as f64 / 1e6);
    println!("tensor bytes:  {bytes} ({})", human(bytes));
    println!("bits/weight:   {bpw:.4}");
    println!("types:");
    for (k, s) in &by_type {
        let share = if bytes > 0 { 100.0 * s.bytes as f64 / bytes as f64 } else { 0.0 };
        println!(
            "  {k:<14} {:>5} tensors {:>14} params {:>12} ({share:5.1}% of bytes)",
            s.tensors,
            s.elements,
            human(s.bytes)
        );
    }
    if args.metadata {
        println!("metadata:");
        for (k, v) in src.metadata() {
            println!("  {k} = {}", summarize(&v));
        }
    }
    if args.tensors {
        println!("tensors:");
        let width = entries.iter().map(|e| e.name.len()).max().unwrap_or(0);
        for e in entries {
            println!("  {:<width$}  {:<12} {:<22} {:>12}", e.name, e.ty.to_string(), format!("{:?}", e.shape), e.bytes);
        }
    }
    if let Some(r) = &read {
        println!(
            "read:          {} in {:.3} s = {:.1} MiB/s, largest read {} (budget {})",
            human(r.bytes),
            r.seconds,
            r.bytes as f64 / (1 << 20) as f64 / r.seconds.max(1e-9),
            human(r.largest_read),
            human(args.budget)
        );
    }
    Ok(())
}

/// A value for one line: long arrays show their length and first items.
fn summarize(v: &Json) -> String {
    match v {
        Json::Array(a) if a.len() > 8 => {
            let head: Vec<String> = a.iter().take(4).map(|x| x.to_string()).collect();
            format!("[{}, … ({} items)]", head.join(", "), a.len())
        }
        Json::String(s) if s.chars().count() > 120 => {
            format!("{:?}… ({} chars)", s.chars().take(100).collect::<String>(), s.chars().count())
        }
        _ => v.to_string(),
    }
}

struct ReadStats {
    bytes: u64,
    seconds: f64,
    largest_read: u64,
    sha256: Vec<(String, String)>,
}

impl ReadStats {
    fn to_json(&self) -> Json {
        json!({
            "bytes": self.bytes,
            "seconds": self.seconds,
            "mib_per_s": self.bytes as f64 / (1 << 20) as f64 / self.seconds.max(1e-9),
            "largest_read": self.largest_read,
            "sha256": self.sha256.iter().map(|(n, h)| (n.clone(), Json::String(h.clone()))).collect::<Map<String, Json>>(),
        })
    }
}

/// Reads every tensor in chunks of at most `budget` bytes into one reused buffer.
async fn read_all(src: &TensorSource, budget: u64, hash: bool) -> Result<ReadStats> {
    use sha2::{Digest, Sha256};
    let start = Instant::now();
    let mut buf: Vec<u8> = Vec::new();
    let mut stats = ReadStats { bytes: 0, seconds: 0.0, largest_read: 0, sha256: Vec::new() };
    for e in src.tensors() {
        let mut h = Sha256::new();
        for r in src.chunks(e, budget)? {
            let n = (r.end - r.start) as usize;
            // Grow only: re-zeroing the buffer for every smaller-then-larger chunk would double the memory traffic.
            if buf.len() < n {
                buf.resize(n, 0);
            }
            src.read_range(&e.name, r.start, &mut buf[..n]).await?;
            if hash {
                h.update(&buf[..n]);
            }
            stats.bytes += n as u64;
            stats.largest_read = stats.largest_read.max(n as u64);
        }
        if hash {
            stats.sha256.push((e.name.clone(), quantfarm_store::hex(&h.finalize())));
        }
    }
    stats.seconds = start.elapsed().as_secs_f64();
    Ok(stats)
}
