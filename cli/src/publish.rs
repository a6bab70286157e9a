//! `quantfarm publish REPORT DIR`: a release as one folder ready for `hf upload --private REPO DIR` — the model card
//! (`README.md`), the signed report and its views, every artifact's files where `Artifact::published_path` puts them
//! (GGUF files at the top; MLX, vLLM and merged HF checkpoints in a folder named after the artifact, which
//! `mlx_lm.load` and `vllm serve` take), `SHA256SUMS` over all of it (`sha256sum -c SHA256SUMS`), and `VERIFY.md`
//! with the commands that check the signature and the bytes. Nothing is uploaded.
//!
//! The report's signature is checked first (against `--pubkey` when given). Each file is streamed from wherever the
//! farm stored it (a path or `s3://`), hashed on the way, and committed only when its sha256 and size are the ones
//! the signed report records: a changed or truncated artifact is an error naming it, and leaves nothing under its
//! name. Existing files are replaced only with `--overwrite`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use quantfarm_report::model::{Artifact, FileRef, Report};
use quantfarm_report::signing;
use quantfarm_store::{hex, Blob, Digest, Location, StagedSink};
use sha2::{Digest as _, Sha256};

use crate::units::{human, parse_size};

#[derive(clap::Args)]
pub struct Args {
    /// The signed report (`report.json`: a path or URL); the views beside it are published with it.
    report: String,
    /// The folder to assemble the release in.
    dir: PathBuf,
    /// The key the report must be signed by (a public key file, or `quantfarm-ed25519-public:...`). Without it the
    /// signature is checked against the key the report records (integrity only).
    #[arg(long)]
    pubkey: Option<String>,
    /// Leave out the artifacts a gate failed for (their rows stay in the report and the card).
    #[arg(long)]
    passed_only: bool,
    /// Replace files already in DIR.
    #[arg(long)]
    overwrite: bool,
    /// Bytes read per piece.
    #[arg(long, default_value = "8MiB", value_parser = parse_size)]
    budget: u64,
}

/// The files beside `report.json` that are published as they are (when present).
const BESIDE: [&str; 4] = ["report.intoto.json", "report.html", "report.md", "signer.pub"];

pub async fn run(args: Args) -> Result<()> {
    let report_loc = Location::parse(&args.report)?;
    let text = read_all(&report_loc).await?;
    let value: serde_json::Value =
        serde_json::from_slice(&text).with_context(|| format!("report {report_loc} is not valid JSON"))?;
    let pinned = crate::keys::pinned_key(args.pubkey.as_deref())?;
    let verified = signing::verify_report(&value, pinned.as_ref())
        .with_context(|| format!("{report_loc}: the signature does not hold; nothing was published"))?;
    let report: Report = quantfarm_report::parse(std::str::from_utf8(&text).unwrap_or_default())
        .map_err(|e| anyhow::anyhow!("report {report_loc} is not a {} report: {e}", quantfarm_report::FORMAT))?;

    let failed_levels: Vec<&str> =
        report.gates.iter().filter(|g| !g.passed).filter_map(|g| g.level.as_deref()).collect();
    let mut plan: BTreeMap<String, (&Artifact, usize)> = BTreeMap::new();
    let mut left_out = Vec::new();
    for a in &report.artifacts {
        if args.passed_only && failed_levels.contains(&a.file_type.as_str()) {
            left_out.push(a.name.as_str());
            continue;
        }
        for (i, f) in a.files.iter().enumerate() {
            let path = a.published_path(f).with_context(|| {
                format!("artifact {:?}: file {} has no plain name to publish it under", a.name, f.url)
            })?;
            if let Some((other, _)) = plan.insert(path.clone(), (a, i)) {
                bail!("artifacts {:?} and {:?} would both publish {path}", other.name, a.name);
            }
        }
    }

    let dir = Location::local(&args.dir);
    let mut sums: Vec<(String, String)> = Vec::new();
    for (path, (a, i)) in &plan {
        let f = &a.files[*i];
        let from = Location::parse(&f.url)?;
        let copied = match path.strip_suffix('/') {
            Some(folder) => {
                let apart = a.listed_apart(f);
                copy_folder(&from, &dir.child(folder)?, f, &apart, args.budget, args.overwrite).await
            }
            None => copy_checked(&from, &dir.child(path)?, f, args.budget, args.overwrite)
                .await
                .map(|(sha, bytes)| vec![(String::new(), sha, bytes)]),
        }
        .with_context(|| format!("artifact {:?}: cannot publish {}", a.name, f.url))?;
        for (file, sha256, bytes) in copied {
            let path = format!("{path}{file}");
            println!("{sha256}  {:>10}  {path}", human(bytes));
            sums.push((path, sha256));
        }
    }

    // The per-token KL-divergence values the report's paired comparisons are computed from (`quantfarm report
    // diff` pairs two releases' rungs with them), checked against the report's sha256.
    if let Some(values) = report.paired.as_ref().map(|p| &p.values) {
        let name = quantfarm_coordinator::report::VALUES_FILE;
        let (sha256, bytes) =
            copy_checked(&Location::parse(&values.url)?, &dir.child(name)?, values, args.budget, args.overwrite)
                .await
                .with_context(|| format!("cannot publish {}", values.url))?;
        println!("{sha256}  {:>10}  {name}", human(bytes));
        sums.push((name.to_string(), sha256));
    }

    // The report as signed, the files beside it, and the card rendered from it.
    let mut meta: Vec<(String, Vec<u8>)> = vec![("report.json".into(), text.clone())];
    for name in BESIDE {
        let Ok(loc) = report_loc.sibling(name) else { continue };
        match Blob::open(&loc).await {
            Ok(_) => meta.push((name.into(), read_all(&loc).await?)),
            Err(quantfarm_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e).with_context(|| format!("cannot read {loc}")),
        }
    }
    let card = quantfarm_report::views::render_all(&report)
        .into_iter()
        .find(|(file, _)| *file == "README.md")
        .map(|(_, body)| body)
        .context("the report's views have no model card")?;
    meta.push(("README.md".into(), card.into_bytes()));
    meta.push(("VERIFY.md".into(), verify_text(&report, &verified.fingerprint, pinned.is_some()).into_bytes()));
    for (name, bytes) in &meta {
        let sha256 = hex(&Sha256::digest(bytes));
        write_file(&dir.child(name)?, bytes, args.overwrite).await?;
        sums.push((name.clone(), sha256));
    }
    sums.sort();
    let mut listing = String::new();
    for (path, sha256) in &sums {
        let _ = writeln!(listing, "{sha256}  {path}");
    }
    write_file(&dir.child("SHA256SUMS")?, listing.as_bytes(), args.overwrite).await?;

    let total: u64 = plan.values().map(|(a, i)| a.files[*i].bytes).sum();
    println!(
        "published release {} ({} artifacts, {} files, {}) in {}",
        report.release.id,
        report.artifacts.len() - left_out.len(),
        plan.len(),
        human(total),
        args.dir.display()
    );
    if !left_out.is_empty() {
        println!("left out (a gate failed): {}", left_out.join(", "));
    }
    println!("upload it: hf upload --private REPO {}", args.dir.display());
    Ok(())
}

/// Copies every file of folder `from` but those listed `apart` (published as files of their own) into folder `to`,
/// each staged and hashed; commits them only when their folder digest is the one the report records (else aborts
/// them all). Returns each file's (name, sha256, bytes).
async fn copy_folder(
    from: &Location,
    to: &Location,
    want: &FileRef,
    apart: &[&str],
    budget: u64,
    overwrite: bool,
) -> Result<Vec<(String, String, u64)>> {
    let mut names: Vec<String> = from.list().await?.into_iter().filter(|n| !apart.contains(&n.as_str())).collect();
    names.sort();
    let mut staged = Vec::with_capacity(names.len());
    let mut files = Vec::with_capacity(names.len());
    for name in &names {
        match stage_hashed(&from.child(name)?, &to.child(name)?, budget, overwrite).await {
            Ok((sink, sha256, bytes)) => {
                staged.push(sink);
                files.push((name.clone(), sha256, bytes));
            }
            Err(e) => {
                for sink in staged {
                    sink.abort().await.ok();
                }
                return Err(e);
            }
        }
    }
    let got = Digest::of_folder(files.clone());
    if got.sha256 != want.sha256 || got.bytes != want.bytes {
        for sink in staged {
            sink.abort().await.ok();
        }
        bail!(
            "{from} has folder digest {} ({} bytes in {} files); the signed report records {} ({} bytes)",
            got.sha256,
            got.bytes,
            names.len(),
            want.sha256,
            want.bytes
        );
    }
    for (sink, name) in staged.into_iter().zip(&names) {
        sink.commit()
            .await
            .with_context(|| format!("cannot commit {}", to.child(name).map(|l| l.to_string()).unwrap_or_default()))?;
    }
    Ok(files)
}

/// Streams `from` into a staged (uncommitted) file at `to`, hashing it: the sink, its sha256 and bytes.
async fn stage_hashed(
    from: &Location,
    to: &Location,
    budget: u64,
    overwrite: bool,
) -> Result<(StagedSink, String, u64)> {
    let blob = Blob::open(from).await?;
    let mut sink = StagedSink::create(to, overwrite).await?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; budget.min(blob.len()).max(1) as usize];
    let mut off = 0;
    while off < blob.len() {
        let n = (blob.len() - off).min(buf.len() as u64) as usize;
        let piece = &mut buf[..n];
        let read = blob.read_at(off, piece).await;
        let written = match read {
            Ok(()) => {
                hash.update(&piece[..]);
                sink.write(piece).await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            sink.abort().await.ok();
            return Err(e.into());
        }
        off += n as u64;
    }
    Ok((sink, hex(&hash.finalize()), blob.len()))
}

/// Streams `from` to `to`, hashing it; commits only when the bytes are the ones the report records, else aborts.
async fn copy_checked(
    from: &Location,
    to: &Location,
    want: &FileRef,
    budget: u64,
    overwrite: bool,
) -> Result<(String, u64)> {
    let (sink, sha256, bytes) = stage_hashed(from, to, budget, overwrite).await?;
    if sha256 != want.sha256 || bytes != want.bytes {
        sink.abort().await.ok();
        bail!(
            "{from} has sha256 {sha256} ({bytes} bytes); the signed report records {} ({} bytes)",
            want.sha256,
            want.bytes
        );
    }
    let c = sink.commit().await.with_context(|| format!("cannot commit {to}"))?;
    Ok((c.sha256, c.bytes))
}

async fn read_all(loc: &Location) -> Result<Vec<u8>> {
    let blob = Blob::open(loc).await.with_context(|| format!("cannot open {loc}"))?;
    Ok(blob.read_vec(0, blob.len()).await?)
}

async fn write_file(to: &Location, bytes: &[u8], overwrite: bool) -> Result<()> {
    let mut sink = StagedSink::create(to, overwrite).await?;
    sink.write(bytes).await?;
    sink.commit().await.with_context(|| format!("cannot commit {to}"))?;
    Ok(())
}

/// `VERIFY.md`: how a reader checks what they downloaded.
fn verify_text(report: &Report, fingerprint: &str, pinned: bool) -> String {
    format!(
        "# Verifying release {id}\n\n\
         1. The files are the ones published: `sha256sum -c SHA256SUMS` (every artifact's sha256 is also in the \
         signed `report.json`, and in the card's file table).\n\
         2. The parity report is untampered and signed by the farm's key (fingerprint `{fingerprint}`{how}): \
         `quantfarm report verify report.json --pubkey FARM.pub` (or `report.intoto.json`, the same report as an \
         in-toto attestation in a DSSE envelope), with the farm's public key obtained from its owner, not from this \
         folder.\n\
         3. Each artifact is what its input gives: `quantfarm verify SOURCE ARTIFACT` recomputes it (a GGUF quant: \
         `quantfarm quantize` of the BF16 with the type mix the report lists) and compares bytes.\n",
        id = report.release.id,
        how = if pinned { ", checked against the key given when publishing" } else { "" },
    )
}
