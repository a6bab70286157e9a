//! What users read besides `report.json`: `report.md` (terminals, PR comments), `report.html` (one self-contained
//! page: inline CSS and SVG, no script, nothing fetched) and the model card `README.md` for a model repository.
//!
//! Every view is a pure function of the signed report, so it can be made again from a report file
//! (`quantfarm report render`) and says nothing the report does not.

pub mod card;
pub mod html;
pub mod markdown;
mod svg;

use serde_json::Value;

/// A view's files, by name (`report.md`, `report.html`, `README.md`).
pub fn render_all(report: &Value) -> Vec<(&'static str, String)> {
    vec![
        ("report.md", markdown::render(report)),
        ("report.html", html::render(report)),
        ("README.md", card::render(report)),
    ]
}

/// The report's artifacts, each with the figures the views show.
pub(crate) struct Row<'a> {
    pub a: &'a Value,
    pub name: &'a str,
    pub file_type: &'a str,
    pub bytes: u64,
    pub bpw: f64,
    /// Mean KLD and its uncertainty, when measured.
    pub kld: Option<(f64, f64)>,
    pub greedy: Option<(u64, u64)>,
    /// Probe pass rate and spread, when some answer could be scored.
    pub probe: Option<(f64, f64)>,
    /// Probe answers cut off by their token cap, when the probes ran.
    pub truncated: Option<u64>,
}

pub(crate) fn rows(report: &Value) -> Vec<Row<'_>> {
    report["artifacts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| Row {
            a,
            name: a["name"].as_str().unwrap_or(""),
            file_type: a["file_type"].as_str().unwrap_or(""),
            bytes: a["bytes"].as_u64().unwrap_or(0),
            bpw: a["bits_per_weight"].as_f64().unwrap_or(0.0),
            kld: a["kld"]["mean_kld"].as_f64().map(|m| (m, a["kld"]["mean_kld_unc"].as_f64().unwrap_or(0.0))),
            greedy: a["greedy"]["n"].as_u64().map(|n| (a["greedy"]["identical"].as_u64().unwrap_or(0), n)),
            probe: crate::report::scored_probes(&a["probes"]),
            truncated: a["probes"]["truncated"].as_u64(),
        })
        .collect()
}

/// The reference's probe pass rate and spread (the GGUF BF16 row carries its own results), when scored.
pub(crate) fn reference_probe(report: &Value) -> Option<(f64, f64)> {
    rows(report).iter().find(|r| r.file_type == "BF16").and_then(|r| r.probe)
}

/// One input of a gate as the views show it: its value (numbers as `fmt_num` prints them), or why it is missing.
pub(crate) enum Input {
    Value(String),
    Missing(String),
}

/// A gate's inputs, in the report's order.
pub(crate) fn gate_inputs(g: &Value) -> Vec<(&str, Input)> {
    g["inputs"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let input = match v {
                Value::Object(o) => Input::Missing(o.get("missing").and_then(Value::as_str).unwrap_or("").to_string()),
                Value::Number(n) => Input::Value(n.as_f64().map_or(n.to_string(), crate::gates::expr::fmt_num)),
                v => Input::Value(v.to_string()),
            };
            (k.as_str(), input)
        })
        .collect()
}

/// A probe cell: the pass rate ± spread, or why there is none.
pub(crate) fn probe_cell(r: &Row<'_>) -> String {
    match (r.probe, r.truncated) {
        (Some((m, s)), _) => format!("{:.1} ± {:.1} %", 100.0 * m, 100.0 * s),
        (None, Some(t)) => format!("no score ({t} truncated)"),
        (None, None) => "—".to_string(),
    }
}

pub(crate) fn verdict(report: &Value) -> &str {
    match report["verdict"].as_str() {
        Some("released") => "released",
        Some("gate_failed") => "gate failed",
        _ => "unknown",
    }
}

/// Bytes as people read them: 1.23 GB, 456.7 MB, 12.3 kB (decimal units, as model hubs list files).
pub(crate) fn size(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{bytes} B")
    }
}

/// A figure or "—" when it was not measured.
pub(crate) fn or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "—".to_string())
}

/// Each identity-chain step: what it is, then its files (url, sha256, bytes).
pub(crate) fn identity_chain(report: &Value) -> Vec<(String, Vec<(String, String, u64)>)> {
    let mut out = Vec::new();
    let src = &report["source"];
    if let Some(url) = src["url"].as_str() {
        out.push((
            format!(
                "source ({}, {})",
                src["format"].as_str().unwrap_or("?"),
                src["architecture"].as_str().unwrap_or("?")
            ),
            vec![(
                url.to_string(),
                src["identity"].as_str().unwrap_or("").to_string(),
                src["bytes"].as_u64().unwrap_or(0),
            )],
        ));
    }
    let adapter = &report["adapter"];
    if let Some(files) = adapter["files"].as_array().filter(|f| !f.is_empty()) {
        let files = files
            .iter()
            .map(|f| {
                let url = f["url"].as_str().unwrap_or("").to_string();
                (url, f["sha256"].as_str().unwrap_or("").to_string(), f["bytes"].as_u64().unwrap_or(0))
            })
            .collect();
        out.push((format!("adapter ({})", adapter["format"].as_str().unwrap_or("?")), files));
    } else if let Some(a) = adapter["url"].as_str().or_else(|| report["release"]["spec"]["adapter"].as_str()) {
        out.push(("adapter".to_string(), vec![(a.to_string(), String::new(), 0)]));
    }
    for r in rows(report) {
        let step = match r.file_type {
            "merged" => "merged (HF safetensors)".to_string(),
            "BF16" => "converted (GGUF BF16, the reference)".to_string(),
            t if t.starts_with("MLX-") => format!("quantized ({t})"),
            t => format!("quantized (GGUF {t})"),
        };
        let files = r.a["files"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|f| {
                (
                    f["url"].as_str().unwrap_or("").to_string(),
                    f["sha256"].as_str().unwrap_or("").to_string(),
                    f["bytes"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        out.push((step, files));
    }
    out
}

#[cfg(test)]
pub(crate) mod sample {
    use serde_json::{json, Value};

    /// A report shaped like the coordinator's, with two measured levels and one unmeasured, for the views' tests.
    pub fn report() -> Value {
        let kld = |m: f64| {
            json!({"mean_kld": m, "mean_kld_unc": m / 50.0, "median_kld": m / 2.0, "max_kld": m * 40.0,
                   "kld_p99": m * 8.0, "kld_p95": m * 4.0, "kld_p90": m * 3.0, "kld_p10": m / 10.0,
                   "kld_p5": m / 20.0, "kld_p1": m / 100.0, "kld_p99_9": m * 20.0, "same_top_p": 100.0 - m * 200.0,
                   "same_top_p_unc": 0.3, "mean_ppl_q": 18.3 * (1.0 + m), "mean_ppl_base": 18.29,
                   "mean_ppl_ratio": 1.0 + m, "rms_dp": m * 60.0, "n_chunks": 14, "n_tokens": 3570})
        };
        let probes = |s: f64| {
            json!({"mean_score": s, "score_spread": 0.05, "passed": 5, "failed": 2, "truncated": 1,
                   "reference_mean_score": 0.75, "reference_score_spread": 0.04})
        };
        let greedy = |k: u64| {
            json!({"n": 20, "identical": k, "agree": k as f64 / 20.0, "mean_prefix_fraction": 0.9, "complete": true,
                   "disagreements": [{"index": 3, "first_difference": 17, "reference_margin": 0.012}]})
        };
        let file = |n: &str, b: u64| json!({"url": format!("s3://farm/r1/{n}"), "sha256": "0f".repeat(32), "bytes": b});
        json!({
            "format": "quantfarm-report/1",
            "quantfarm_version": "0.1.0",
            "release": {"id": "r1", "name": "smollm2-<tuned>", "spec_file": "release.yaml", "spec_sha256": "aa".repeat(32),
                        "spec": {"name": "smollm2", "card": {"license": "apache-2.0", "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}}},
            "source": {"url": "s3://models/smollm2", "format": "hf", "architecture": "llama", "identity": "bb".repeat(32), "bytes": 269060000},
            "merge_check": {"greedy": {"n": 20, "identical": 20, "agree": 1.0, "mean_prefix_fraction": 1.0, "complete": true, "disagreements": []}},
            "evaluation": {"text": "texts/gpl3.txt", "text_sha256": "cc".repeat(32), "ctx": 512, "n_chunks": 14, "n_prompts": 20, "max_tokens": 64},
            "artifacts": [
                {"name": "SmolLM2-BF16", "file_type": "BF16", "container": "gguf", "bytes": 270000000, "bits_per_weight": 16.0,
                 "files": [file("SmolLM2-BF16.gguf", 270000000)], "verified": true, "kld": null, "greedy": null,
                 "probes": {"mean_score": 0.75, "score_spread": 0.04, "pass_scores": [0.75], "passed": 6, "failed": 2, "truncated": 0}},
                {"name": "SmolLM2-Q8_0", "file_type": "Q8_0", "container": "gguf", "bytes": 145000000, "bits_per_weight": 8.5,
                 "files": [file("SmolLM2-Q8_0.gguf", 145000000)], "verified": true, "kld": kld(0.0045), "greedy": greedy(19), "probes": probes(0.75)},
                {"name": "SmolLM2-Q4_K_M", "file_type": "Q4_K_M", "container": "gguf", "bytes": 105000000, "bits_per_weight": 5.3,
                 "files": [file("SmolLM2-Q4_K_M.gguf", 105000000)], "verified": true, "kld": kld(0.0635), "greedy": greedy(9), "probes": probes(0.5)},
                {"name": "SmolLM2-Q6_K", "file_type": "Q6_K", "container": "gguf", "bytes": 138000000, "bits_per_weight": 6.6,
                 "files": [file("SmolLM2-Q6_K.gguf", 138000000)], "verified": true, "kld": null, "greedy": null, "probes": null},
            ],
            "gates": [
                {"name": "measured", "level": "Q6_K", "check": "kld.mean and probe results measured", "source": "built-in",
                 "inputs": {"kld.mean": {"missing": "not measured: evaluation.skip lists it"}}, "passed": false,
                 "detail": "Q6_K: not measured: no KL-divergence figure"},
                {"name": "kld", "level": "Q4_K_M", "check": "kld.mean <= default.kld.mean", "source": "default",
                 "inputs": {"kld.mean": 0.0635, "default.kld.mean": 0.1}, "threshold": 0.1, "passed": true,
                 "detail": "Q4_K_M: kld.mean = 0.0635 <= default.kld.mean = 0.1"},
            ],
            "verdict": "gate_failed",
            "signature": {"fingerprint": "SHA256:0123456789abcdef0123456789abcdef"},
        })
    }
}
