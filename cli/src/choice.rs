//! `quantfarm choice`: multiple-choice accuracy as `llama-perplexity --multiple-choice` scores it
//! (`quantfarm_eval::choice`), on llama-perplexity's own binary task files or on a question set written as YAML
//! (`quantfarm choice pack` writes the binary form; docs/formats.md describes both).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use quantfarm_eval::choice::{read_any, score_tasks, summarize, write_tasks, ChoiceTask};

#[derive(clap::Subcommand)]
pub enum ChoiceCommand {
    /// Score a model: each task's answer chosen by log-likelihood, and the accuracy, as llama-perplexity
    /// --multiple-choice prints them (exit 0)
    Score(ScoreArgs),
    /// Write a question set (YAML) in llama-perplexity's binary multiple-choice format
    Pack(PackArgs),
}

#[derive(clap::Args)]
pub struct ScoreArgs {
    /// The model: a GGUF file, or an HF or MLX folder (converted exactly first).
    model: PathBuf,
    /// The tasks: llama-perplexity's binary format (`--multiple-choice -bf FILE`), or a question set in YAML.
    tasks: PathBuf,
    /// Tokens per sequence (llama-perplexity's -c).
    #[arg(long, default_value_t = 512)]
    ctx: u32,
    /// Tokens per decode (llama-perplexity's -b).
    #[arg(long, default_value_t = 2048)]
    batch: u32,
    /// Sequences decoded together (llama-perplexity's -np; it takes at least 4).
    #[arg(long, default_value_t = 4)]
    parallel: u32,
    /// Decoding threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Print one JSON object: every task's chosen answer and scores, and the figures.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct PackArgs {
    /// The question set (YAML: `tasks: [{question, answers: [...], correct: INDEX}]`).
    input: PathBuf,
    /// The binary task file to write.
    output: PathBuf,
}

/// Reads tasks from `path`: a question set when it ends in `.yaml`/`.yml`, else llama-perplexity's binary format.
fn tasks_of(path: &Path) -> Result<Vec<ChoiceTask>> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {name}"))?;
    Ok(read_any(&bytes, &name)?)
}

pub fn pack(args: PackArgs) -> Result<()> {
    let tasks = tasks_of(&args.input)?;
    if args.output.exists() {
        bail!("{}: exists; refusing to replace it", args.output.display());
    }
    let staged = args.output.with_extension("partial");
    std::fs::write(&staged, write_tasks(&tasks)).with_context(|| format!("cannot write {}", staged.display()))?;
    std::fs::rename(&staged, &args.output).with_context(|| format!("cannot write {}", args.output.display()))?;
    println!("{} tasks written to {}", tasks.len(), args.output.display());
    Ok(())
}

pub fn score(args: ScoreArgs) -> Result<()> {
    let tasks = tasks_of(&args.tasks)?;
    let parallel = args.parallel.max(4);
    let (model, note) = crate::eval::load(&args.model, args.threads, None)?;
    if let Some(n) = note {
        eprintln!("{n}");
    }
    let scores = score_tasks(&model, &tasks, args.ctx, args.batch, parallel)?;
    let s = summarize(&scores);
    if args.json {
        let tasks: Vec<serde_json::Value> = scores
            .iter()
            .map(|t| serde_json::json!({"chosen": t.chosen, "correct": t.correct, "log_probs": t.log_probs}))
            .collect();
        let out = serde_json::json!({
            "n_tasks": s.n_tasks, "n_correct": s.n_correct,
            "accuracy": s.accuracy.0, "accuracy_unc": s.accuracy.1,
            "chance": s.chance.0, "chance_unc": s.chance.1,
            "final_result": format!("{:.4} +/- {:.4}", s.accuracy.0, s.accuracy.1),
            "tasks": tasks,
        });
        println!("{out}");
        return Ok(());
    }
    // llama-perplexity's own lines: the running accuracy per task, then the final figures.
    println!("task\tacc_norm");
    let mut correct = 0;
    for (i, t) in scores.iter().enumerate() {
        correct += usize::from(t.correct);
        println!("{}\t{:.8}", i + 1, 100.0 * correct as f64 / (i + 1) as f64);
    }
    println!("Final result: {:.4} +/- {:.4}", s.accuracy.0, s.accuracy.1);
    println!("Random chance: {:.4} +/- {:.4}", s.chance.0, s.chance.1);
    Ok(())
}
