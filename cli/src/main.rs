//! `quantfarm`: prove that every quantized artifact of a fine-tune still behaves like the model that was trained.

#![forbid(unsafe_code)]

mod choice;
mod convert;
mod cp;
mod diff;
mod eval;
mod farm;
mod imatrix;
mod inspect;
mod keys;
mod merge;
mod mlx;
mod publish;
mod quantize;
mod units;
mod verify;
mod vllm;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "quantfarm",
    version,
    about = "Release farm for fine-tuned language models: convert, quantize, and prove parity"
)]
struct Cli {
    /// Say more: -v shows quantfarm's progress log and the runtime's own (llama.cpp's) log lines (and `verify`
    /// every tensor's verdict), -vv everything at debug level. QUANTFARM_LOG (a tracing filter such as
    /// `warn,llama.cpp=debug`) overrides it.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
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
    /// Convert between HF, GGUF and MLX: HF or MLX → GGUF (the bytes convert_hf_to_gguf.py writes), GGUF → HF or MLX
    /// (dequantized, permutations undone, tokenizer rebuilt), MLX → HF (as mlx_lm.convert --dequantize).
    Convert(convert::Args),
    /// Quantize a Hugging Face checkpoint to MLX affine bits (the checkpoint mlx_lm.convert -q writes).
    Mlx(mlx::Args),
    /// Quantize a Hugging Face bf16 checkpoint for vLLM: FP8_DYNAMIC or W4A16, the compressed-tensors checkpoint
    /// llm-compressor writes (round to nearest, no calibration data).
    Vllm(vllm::Args),
    /// Merge a LoRA/DoRA adapter (PEFT or mlx-lm) into an HF base exactly (f64, rounded once).
    Merge(merge::Args),
    /// Convert a LoRA/DoRA adapter between PEFT and mlx-lm (factors transposed, same bytes per value).
    Adapter(merge::AdapterArgs),
    /// Check an output against its source: every tensor recomputed and compared (bytes, or within one quantization
    /// step for MLX affine), metadata, config and tokenizer files. Exit status 0 passed, 1 failed, 2 error.
    Verify(verify::Args),
    /// Convert a LoRA adapter (PEFT or mlx-lm) to a GGUF LoRA for llama.cpp (`llama-server --lora`).
    LoraGguf(merge::LoraArgs),
    /// Make a release: a coordinator and local workers in this process (gRPC over loopback), a local store.
    /// Exit status 0 released, 1 a gate failed, 2 error.
    Run(farm::RunArgs),
    /// Serve the farm: accept releases, schedule their tasks onto workers, sign reports.
    Coordinator(farm::CoordinatorArgs),
    /// Work for a coordinator: lease tasks, run them, report results.
    Worker(farm::WorkerArgs),
    /// Submit a release to a coordinator; with --watch, exit status 0 released, 1 a gate failed, 2 error.
    Submit(farm::SubmitArgs),
    /// Follow a submitted release to its verdict (exit status as `submit --watch`).
    Watch(farm::WatchArgs),
    /// Cancel a release (its running tasks are stopped; a finished release is left as it is).
    Cancel(farm::WatchArgs),
    /// KL divergence of a model against a reference, by llama-perplexity's procedure (same chunks, same base-logits
    /// file, same final figures).
    Kld(eval::KldArgs),
    /// Merge per-chunk KL-divergence statistics (from `kld --chunk-stats` or workers) into the final figures.
    KldMerge(eval::KldMergeArgs),
    /// An importance matrix for the quantizers, collected in llama.cpp as llama-imatrix collects it (its GGUF format).
    Imatrix(imatrix::Args),
    /// Greedy agreement of a model with a reference (optionally with a run-time LoRA) on a prompt set.
    /// Exit status 0 all identical, 1 some differ, 2 error.
    Greedy(eval::GreedyArgs),
    /// Run a task-probe suite on the built-in runtime or an OpenAI-compatible server. Exit 0 none failed, 1 some
    /// failed, 2 error.
    Probe(eval::ProbeArgs),
    /// Multiple-choice accuracy as `llama-perplexity --multiple-choice` scores it (its binary task files, or a
    /// question set in YAML), and `pack` to write a question set in that format
    #[command(subcommand)]
    Choice(choice::ChoiceCommand),
    /// Make an ed25519 signing key for reports.
    Keygen(keys::KeygenArgs),
    /// Signed reports.
    #[command(subcommand)]
    Report(ReportCommand),
    /// Assemble a release in one folder ready for `hf upload --private`: the model card, the signed report and its
    /// views, every artifact's files (checked against the report's sha256), SHA256SUMS and VERIFY.md.
    Publish(publish::Args),
}

#[derive(Subcommand)]
enum ReportCommand {
    /// Check a report's signature (report.json, or the DSSE envelope report.intoto.json): exit 0 only for an
    /// untampered report.
    Verify(keys::VerifyArgs),
    /// Write a report's views (report.md, report.html, the model card README.md) from report.json.
    Render(keys::RenderArgs),
    /// What changed between two releases: per rung its files and tensor types, its KL divergence paired token by
    /// token (where both measured the same text), greedy and probe flips, and the gates whose verdict changed.
    /// Markdown on stdout; --html and --json write the same diff as a page and as data.
    Diff(diff::DiffArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let verbose = cli.verbose;
    // llama.cpp's log is at debug level under the target `llama.cpp` (quantfarm_eval's runtime log).
    let default_filter = match verbose {
        0 => "warn",
        1 => "info,llama.cpp=debug",
        _ => "debug",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("QUANTFARM_LOG").unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let result: Result<u8> = rt.block_on(async {
        let ok = |r: Result<()>| r.map(|()| 0);
        match cli.command {
            Command::Inspect(args) => ok(inspect::run(args).await),
            Command::Cp(args) => ok(cp::run(args).await),
            Command::Quantize(args) => ok(quantize::run(args).await),
            Command::Convert(args) => ok(convert::run(args).await),
            Command::Mlx(args) => ok(mlx::run(args).await),
            Command::Vllm(args) => ok(vllm::run(args).await),
            Command::Publish(args) => ok(publish::run(args).await),
            Command::Merge(args) => ok(merge::run(args).await),
            Command::LoraGguf(args) => ok(merge::lora_gguf(args).await),
            Command::Verify(mut args) => {
                args.verbose = verbose > 0;
                verify::run(args).await
            }
            Command::Adapter(args) => ok(merge::convert_adapter(args).await),
            Command::Run(args) => farm::run(args).await,
            Command::Coordinator(args) => ok(farm::coordinator(args).await),
            Command::Worker(args) => ok(farm::worker(args).await),
            Command::Submit(args) => farm::submit(args).await,
            Command::Watch(args) => farm::watch(args).await,
            Command::Cancel(args) => farm::cancel(args).await,
            Command::Kld(args) => eval::on_thread(|| eval::kld(args)),
            Command::KldMerge(args) => eval::kld_merge(args),
            Command::Imatrix(args) => eval::on_thread(|| imatrix::run(args).map(|()| 0)),
            Command::Greedy(args) => eval::on_thread(|| eval::greedy(args)),
            Command::Probe(args) => eval::on_thread(|| eval::probe(args)),
            Command::Choice(choice::ChoiceCommand::Score(args)) => ok(eval::on_thread(|| choice::score(args))),
            Command::Choice(choice::ChoiceCommand::Pack(args)) => ok(choice::pack(args)),
            Command::Keygen(args) => ok(keys::keygen(args)),
            Command::Report(ReportCommand::Verify(args)) => keys::verify(args).map(|valid| if valid { 0 } else { 1 }),
            Command::Report(ReportCommand::Render(args)) => ok(keys::render(args)),
            Command::Report(ReportCommand::Diff(args)) => ok(diff::run(args)),
        }
    });
    // Drop the runtime without waiting for blocked tasks (a lease long-poll) to notice.
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    match result {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    /// clap checks the whole command line's definition (names unique across global and subcommand arguments, value
    /// types matching their accessors) only when asked, or when a user hits the broken subcommand.
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
