//! `peer-kld/…`: peer runtimes as tasks: llama.cpp's own `llama-perplexity` run on the release's files, so the figures it prints
//! stand beside quantfarm's in the report (link 2 of the parity method across real runtimes). The base run writes
//! its base-logits file into the store; each KLD run reads it and its printed final statistics are parsed back.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use quantfarm_proto::{self as pb, task_result, FailureKind, WorkerKind};
use quantfarm_store::{Digest, Location};

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{exists, hash_object, local_file, local_model, task_dir};
use crate::outputs::upload;
use crate::runtimes::find_tool;

pub struct PeerKld;

impl Executor for PeerKld {
    type Task = pb::PeerKldTask;
    const KIND: WorkerKind = WorkerKind::Peer;

    async fn run(t: &pb::PeerKldTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::PeerKld(peer_kld(t, env).await?))
    }
}

/// Tools a `PeerKldTask` may name.
pub const TOOLS: [&str; 1] = ["llama-perplexity"];

/// What the tool printed: its results on stdout, its timestamped log on stderr.
struct Printed {
    stdout: String,
    stderr: String,
}

/// Runs the tool, returning what it printed; a failure carries the end of its output.
async fn run_tool(tool: &Path, args: Vec<std::ffi::OsString>) -> Result<Printed, Failure> {
    let mut cmd = Command::new(tool);
    cmd.args(&args);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .map_err(|e| Failure::internal(format!("{}: {e}", tool.display())))?
        .map_err(|e| Failure::internal(format!("cannot run {}: {e}", tool.display())))?;
    let printed = Printed {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    if !out.status.success() {
        let all = format!("{}{}", printed.stdout, printed.stderr);
        let tail: String =
            all.lines().rev().take(12).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
        return Err(Failure::input(format!("{} failed ({}):\n{tail}", tool.display(), out.status)));
    }
    Ok(printed)
}

/// llama-perplexity's final statistics: every `label: value` line after "Perplexity statistics", the label's runs
/// of spaces collapsed ("Mean    KLD" → "Mean KLD"), the value the first number (without a trailing %). `output` is
/// what it printed on stdout: its log on stderr has `label: value` lines too (`0.00.703.930 I kl_divergence: 0.12
/// seconds per pass`), which are not figures.
pub fn parse_final_figures(output: &str) -> HashMap<String, f64> {
    let mut figures = HashMap::new();
    let Some(start) = output.find("====== Perplexity statistics ======") else { return figures };
    for line in output[start..].lines() {
        let Some((label, rest)) = line.split_once(':') else { continue };
        let label = label.split_whitespace().collect::<Vec<_>>().join(" ");
        let value = rest.split_whitespace().next().map(|v| v.trim_end_matches('%'));
        if let Some(v) = value.and_then(|v| v.parse::<f64>().ok()) {
            if !label.is_empty() {
                figures.insert(label, v);
            }
        }
    }
    figures
}

/// The tool's version as it prints it (`build: 4567 (abcdef0) ...` in older llama.cpp builds, `version: 0.5.0-dev
/// (build 0, commit unknown)` in newer ones).
fn version_line(printed: &Printed) -> Option<String> {
    [&printed.stdout, &printed.stderr]
        .into_iter()
        .flat_map(|o| o.lines())
        .map(str::trim)
        .find(|l| l.starts_with("build:") || l.starts_with("version:"))
        .map(str::to_string)
}

fn name_of(p: &Path) -> String {
    p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
}

async fn peer_kld(t: &pb::PeerKldTask, env: &Env) -> Result<pb::PeerKldResult, Failure> {
    if !TOOLS.contains(&t.tool.as_str()) {
        return Err(Failure::input(format!("peer tool {:?}: expected one of {}", t.tool, TOOLS.join(", "))));
    }
    let tool = find_tool(&t.tool).ok_or_else(|| {
        Failure::new(
            FailureKind::Transient,
            format!("{} is not on PATH or in $QUANTFARM_LLAMA_BIN on this worker", t.tool),
        )
    })?;
    let s = t.settings.clone().ok_or_else(|| Failure::input("the task has no KL-divergence settings"))?;
    let dir = task_dir(env)?;
    let model = local_model(&t.model, dir.path(), env).await?;
    let mut args: Vec<std::ffi::OsString> = vec!["-m".into(), model.clone().into()];
    for (flag, v) in [("-c", s.ctx), ("-b", s.batch), ("-t", env.threads as u32)] {
        args.push(flag.into());
        args.push(v.to_string().into());
    }
    let base_run = t.base.is_empty();
    let base_path = if base_run {
        let text = local_file(&s.text, dir.path(), env).await?;
        args.extend(["-f".into(), text.into()]);
        if s.max_chunks > 0 {
            args.extend(["--chunks".into(), s.max_chunks.to_string().into()]);
        }
        dir.path().join("peer-base.logits")
    } else {
        let Digest { sha256: sha, .. } = hash_object(&Location::parse(&t.base)?, env.budget).await?;
        if sha != t.base_sha256 {
            return Err(Failure::input(format!(
                "{}: the base logits changed since they were written (sha256 {sha}, expected {})",
                t.base, t.base_sha256
            )));
        }
        local_file(&t.base, dir.path(), env).await?
    };
    args.extend(["--kl-divergence-base".into(), base_path.clone().into()]);
    if !base_run {
        args.push("--kl-divergence".into());
    }
    let command = std::iter::once(t.tool.clone())
        .chain(args.iter().map(|a| {
            let p = Path::new(a);
            if p.is_absolute() {
                name_of(p)
            } else {
                a.to_string_lossy().into_owned()
            }
        }))
        .collect::<Vec<_>>()
        .join(" ");
    let printed = run_tool(&tool, args).await?;
    let version = match version_line(&printed) {
        Some(v) => v,
        // Builds that no longer log their version on a run say it when asked.
        None => version_line(&run_tool(&tool, vec!["--version".into()]).await?).unwrap_or_default(),
    };
    let mut result = pb::PeerKldResult { tool: t.tool.clone(), version, command, ..Default::default() };
    if base_run {
        let out = Location::parse(&t.output)?;
        let Digest { sha256, bytes } = if exists(&out).await {
            hash_object(&out, env.budget).await?
        } else {
            upload(&base_path, &out, env).await?
        };
        result.base = Some(pb::Artifact { url: out.to_string(), sha256, bytes, types: vec![] });
    } else {
        result.figures = parse_final_figures(&printed.stdout);
        if !result.figures.contains_key("Mean KLD") {
            return Err(Failure::internal(format!("{}: printed no final KL-divergence statistics", t.tool)));
        }
    }
    drop(dir);
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_figures_are_parsed_by_label() {
        let out =
            "chunk ...\n====== Perplexity statistics ======\nMean PPL(Q)                   :  19.033198 ±   0.900000\n\
                   Cor(ln(PPL(Q)), ln(PPL(base))):  99.20%\n\n====== KL divergence statistics ======\n\
                   Mean    KLD:   0.063426 ±   0.001234\n99.9%   KLD:   1.234567\n\
                   Same top p:  86.162 ±  0.409 %\nllama_perf_context_print: load time = 1.0 ms\n";
        let f = parse_final_figures(out);
        assert_eq!(f["Mean PPL(Q)"], 19.033198);
        assert_eq!(f["Cor(ln(PPL(Q)), ln(PPL(base)))"], 99.20);
        assert_eq!(f["Mean KLD"], 0.063426);
        assert_eq!(f["99.9% KLD"], 1.234567);
        assert_eq!(f["Same top p"], 86.162);
        assert!(!f.contains_key("llama_perf_context_print"));
    }
}
