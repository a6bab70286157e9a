//! `quantfarm cp`: copy a model file, or the files of a model folder, between locations (path, file://, s3://)
//! through the staged sink — in pieces within a memory budget, invisible at the destination until complete, and
//! never replacing an existing file without `--overwrite`. Prints each copy's size and sha256.

use anyhow::{Context, Result};
use quantfarm_store::Blob;
use quantfarm_store::{Location, StagedSink};

use crate::units::{human, parse_size};

#[derive(clap::Args)]
pub struct Args {
    /// A file or a folder (its files, not subfolders, are copied).
    src: String,
    /// The destination file, or folder when SRC is a folder.
    dst: String,
    /// Replace existing files.
    #[arg(long)]
    overwrite: bool,
    /// Bytes read per piece.
    #[arg(long, default_value = "8MiB", value_parser = parse_size)]
    budget: u64,
}

pub async fn run(args: Args) -> Result<()> {
    let src = Location::parse(&args.src)?;
    let dst = Location::parse(&args.dst)?;
    let pairs = if src.is_dir().await? {
        let mut v = Vec::new();
        for name in src.list().await? {
            v.push((src.child(&name)?, dst.child(&name)?));
        }
        v
    } else {
        vec![(src, dst)]
    };
    for (from, to) in pairs {
        let blob = Blob::open(&from).await?;
        let mut sink = StagedSink::create(&to, args.overwrite).await?;
        let mut buf = vec![0u8; args.budget.min(blob.len()).max(1) as usize];
        let mut off = 0;
        while off < blob.len() {
            let n = (blob.len() - off).min(buf.len() as u64) as usize;
            blob.read_at(off, &mut buf[..n]).await?;
            sink.write(&buf[..n]).await?;
            off += n as u64;
        }
        let c = sink.commit().await.with_context(|| format!("cannot commit {to}"))?;
        println!("{}  {:>10}  {}", c.sha256, human(c.bytes), c.location);
    }
    Ok(())
}
