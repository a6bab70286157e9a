//! `quantfarm`: prove that every quantized artifact of a fine-tune still behaves like the model that was trained.

mod cp;
mod inspect;
mod quantize;
mod units;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "quantfarm",
    version,
    about = "Release farm for fine-tuned language models: convert, quantize, and prove parity"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a model's format, architecture, metadata and tensors (GGUF file or split, safetensors file or folder,
    /// MLX folder; a path, file:// or s3://bucket/key).
    Inspect(inspect::Args),
    /// Copy a model file or folder between a path, file:// and s3:// (staged: nothing partial is ever visible).
    Cp(cp::Args),
    /// Quantize a GGUF model to a llama-quantize file type (same bytes as llama-quantize).
    Quantize(quantize::Args),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("QUANTFARM_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let result: Result<()> = rt.block_on(async {
        match cli.command {
            Command::Inspect(args) => inspect::run(args).await,
            Command::Cp(args) => cp::run(args).await,
            Command::Quantize(args) => quantize::run(args).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
