//! What users read besides `report.json`: `report.md` (terminals, PR comments), `report.html` (one self-contained
//! page: inline CSS and SVG, no script, nothing fetched) and the model card `README.md` for a model repository.
//!
//! Every view is a pure function of the signed report, so it can be made again from a report file
//! (`quantfarm report render`) and says nothing the report does not.

pub mod card;
pub mod html;
pub mod markdown;
mod svg;

use crate::model::{Artifact, GateInput, GateRecord, KldFigures, Report};

/// A view's files, by name (`report.md`, `report.html`, `README.md`).
pub fn render_all(report: &Report) -> Vec<(&'static str, String)> {
    vec![
        ("report.md", markdown::render(report)),
        ("report.html", html::render(report)),
        ("README.md", card::render(report)),
    ]
}

/// The report's artifacts, each with the figures the views show.
pub(crate) struct Row<'a> {
    pub a: &'a Artifact,
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
    pub truncated: Option<u32>,
}

pub(crate) fn rows(report: &Report) -> Vec<Row<'_>> {
    report
        .artifacts
        .iter()
        .map(|a| Row {
            a,
            name: &a.name,
            file_type: &a.file_type,
            bytes: a.bytes,
            bpw: a.bits_per_weight,
            kld: fig(a.kld_figures(), |k| k.mean_kld)
                .map(|m| (m, fig(a.kld_figures(), |k| k.mean_kld_unc).unwrap_or(0.0))),
            greedy: a.greedy.as_ref().map(|g| (g.identical, g.n)),
            probe: a.probes.as_ref().and_then(|p| p.scored()),
            truncated: a.probes.as_ref().map(|p| p.truncated),
        })
        .collect()
}

/// A KL-divergence figure, when the level was measured and the figure is finite (a non-finite one is written as
/// `null`, and shown as not measured).
pub(crate) fn fig(k: Option<&KldFigures>, f: fn(&KldFigures) -> f64) -> Option<f64> {
    k.map(f).filter(|v| v.is_finite())
}

/// The reference's probe pass rate and spread (the GGUF BF16 row carries its own results), when scored.
pub(crate) fn reference_probe(report: &Report) -> Option<(f64, f64)> {
    rows(report).iter().find(|r| r.file_type == "BF16").and_then(|r| r.probe)
}

/// One input of a gate as the views show it: its value (numbers as `fmt_num` prints them), or why it is missing.
pub(crate) enum Input {
    Value(String),
    Missing(String),
}

/// A gate's inputs, in the report's order.
pub(crate) fn gate_inputs(g: &GateRecord) -> Vec<(&str, Input)> {
    g.inputs
        .iter()
        .map(|(k, v)| {
            let input = match v {
                GateInput::Missing { missing } => Input::Missing(missing.clone()),
                GateInput::Number(n) => Input::Value(crate::gates::expr::fmt_num(*n)),
                GateInput::Flag(b) => Input::Value(b.to_string()),
                // As JSON shows a string: quoted.
                GateInput::Text(t) => Input::Value(serde_json::Value::from(t.as_str()).to_string()),
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

/// A model's probe results on mlx_lm.server, as [`probe_cell`] shows llama.cpp's.
pub(crate) fn mlx_lm_probes(s: &crate::model::MlxLmSubject) -> String {
    probes_cell(s.probes.as_ref())
}

/// A probe summary's pass rate and spread, or why it has none.
pub(crate) fn probes_cell(p: Option<&crate::model::ProbeSummary>) -> String {
    match p {
        Some(p) => match p.scored() {
            Some((m, sd)) => format!("{:.1} ± {:.1} %", 100.0 * m, 100.0 * sd),
            None => format!("no score ({} truncated)", p.truncated),
        },
        None => "—".to_string(),
    }
}

pub(crate) fn verdict(report: &Report) -> &'static str {
    report.verdict.words()
}

/// The signer's fingerprint, or `unsigned`.
pub(crate) fn signer(report: &Report) -> &str {
    report.signature.as_ref().map_or("unsigned", |s| s.fingerprint.as_str())
}

/// A figure that may be unknown, as the report's JSON shows it (`null` when unknown).
pub(crate) fn or_null<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "null".to_string(), |v| v.to_string())
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
/// The paired comparisons as table cells (each rung against the next larger one): the two rungs, the mean paired
/// difference, its interval, the standard error reading the two rungs' own intervals side by side would suggest
/// against the paired one, and whether they are told apart; and the heading's sentence.
pub(crate) fn paired_rows(report: &Report) -> Option<(String, Vec<[String; 5]>)> {
    let p = report.paired.as_ref()?;
    let pct = 100.0 * p.confidence;
    let about = format!(
        "Each rung against the next larger one, token by token on the same tokens: the mean of (its KL divergence − \
         the larger's), with a {pct:.0} % interval over chunks (docs/statistics.md). Two rungs' own ± read side by \
         side overstate the uncertainty of their difference; the paired one is what tells them apart."
    );
    let rows = p
        .pairs
        .iter()
        .map(|c| {
            [
                format!("{} vs {}", c.smaller, c.larger),
                format!("{:+.6}", c.diff.mean),
                format!("[{:+.6}, {:+.6}]", c.diff.low, c.diff.high),
                format!("{:.6} (unpaired {:.6})", c.diff.se_chunks, c.se_unpaired),
                if c.distinguishable {
                    if c.diff.mean > 0.0 {
                        "yes: the smaller loses more"
                    } else {
                        "yes: the smaller loses less"
                    }
                } else {
                    "no: within the interval"
                }
                .to_string(),
            ]
        })
        .collect();
    Some((about, rows))
}

/// The sequential measurement (`evaluation.stop`) as table cells: each rung, the chunks measured of the text's, why
/// it stopped, its mean and interval, the thresholds it was decided against; and the heading's sentence.
pub(crate) fn sequential_rows(report: &Report) -> Option<(String, Vec<[String; 5]>)> {
    let s = report.sequential.as_ref()?;
    let about = format!(
        "Each rung's chunk groups measured in one seeded stratified order, stopped once every gate on its mean KL \
         divergence has its verdict at {:.0} % confidence (the chance that a stopped rung's interval misses its \
         full-text mean is at most {:.0} %; docs/statistics.md). A complete rung's figures are llama-perplexity's.",
        100.0 * s.confidence,
        100.0 * (1.0 - s.confidence)
    );
    let rows = s
        .rungs
        .iter()
        .map(|r| {
            let interval =
                if r.stopped == "complete" { "exact".to_string() } else { format!("[{:.6}, {:.6}]", r.low, r.high) };
            let thresholds = r.thresholds.iter().map(|t| crate::gates::expr::fmt_num(*t)).collect::<Vec<_>>();
            let why = match &r.note {
                Some(n) => format!("{} ({n})", r.stopped),
                None => r.stopped.clone(),
            };
            [
                r.file_type.clone(),
                format!("{} of {}", r.chunks, r.of_chunks),
                why,
                format!("{:.6} {interval}", r.mean),
                if thresholds.is_empty() { "—".to_string() } else { thresholds.join(", ") },
            ]
        })
        .collect();
    Some((about, rows))
}

/// The searched rungs as table cells (rung, target, budget and bytes taken, bits per weight, predicted and measured
/// mean KLD), and the heading's sentence: what the sensitivities were measured on and what they cost.
pub(crate) fn search_rows(report: &Report) -> Option<(String, Vec<[String; 6]>)> {
    let s = report.search.as_ref()?;
    let e = &s.sensitivity;
    let cost = if e.reused {
        format!(
            "reused from {} (measured by an earlier release of the same reference: nothing measured again)",
            e.url.as_deref().unwrap_or("the store")
        )
    } else {
        format!("{:.1} task-seconds, probe models of {} in all", e.probe_seconds, size(e.probe_model_bytes))
    };
    let about = format!(
        "Each searched rung's recipe is the set of types with the least summed mean KL divergence within its budget, \
         from {} probes of {} tensor groups ({} layer ranges per role; candidates {}), each group quantized alone and \
         scored on {} to ± {:.0} % (at most {} chunks of {}): {cost}. The recipe is llama-quantize's own \
         (`llama_quantize_args`); the frontier below sets every measured rung's size against its KL divergence.",
        e.probes,
        e.groups,
        e.layers,
        e.candidates.join(", "),
        e.text,
        100.0 * e.precision,
        e.chunks,
        e.ctx
    );
    let measured = |name: &str| s.frontier.iter().find(|p| p.name == name).and_then(|p| p.kld_mean);
    let rows = s
        .rungs
        .iter()
        .map(|r| match &r.error {
            Some(err) => [r.name.clone(), r.target.clone(), "—".into(), "—".into(), "—".into(), err.clone()],
            None => [
                r.name.clone(),
                r.target.clone(),
                format!("{} of {}", or_dash(r.bytes.map(size)), or_dash(r.budget_bytes.map(size))),
                or_dash(r.bits_per_weight.map(|b| format!("{b:.4}"))),
                or_dash(r.predicted_kld.map(|k| format!("{k:.6}"))),
                or_dash(measured(&r.name).map(|k| format!("{k:.6}"))),
            ],
        })
        .collect();
    Some((about, rows))
}

/// The header cells of [`search_rows`].
pub(crate) const SEARCH_HEADER: [&str; 6] =
    ["Rung", "Target", "Tensor bytes (of budget)", "Bits/weight", "Predicted mean KLD", "Measured mean KLD"];

/// The frontier: every GGUF rung measured, smallest first (searched ones marked).
pub(crate) fn frontier_rows(report: &Report) -> Vec<[String; 4]> {
    let Some(s) = &report.search else { return Vec::new() };
    s.frontier
        .iter()
        .map(|p| {
            [
                if p.searched { format!("{} (searched)", p.name) } else { p.name.clone() },
                format!("{:.4}", p.bits_per_weight),
                or_dash(p.kld_mean.map(|k| format!("{k:.6}"))),
                or_dash(p.kld_p99_9.map(|k| format!("{k:.6}"))),
            ]
        })
        .collect()
}

/// The header cells of [`frontier_rows`].
pub(crate) const FRONTIER_HEADER: [&str; 4] = ["Rung", "Bits/weight", "Mean KLD", "99.9 % KLD"];

/// The importance matrix's expert coverage (computed for a mixture-of-experts model) as table cells: each weight with
/// experts no calibration token reached, its share with tokens and those experts; and the heading's sentence (which
/// says so when every expert was reached).
pub(crate) fn coverage_rows(report: &Report) -> Option<(String, Vec<[String; 3]>)> {
    let (text, chunks, all, cov) = report.artifacts.iter().find_map(|a| match &a.imatrix {
        Some(crate::model::Imatrix::Computed { text, chunks, all_experts, experts: Some(cov), .. })
            if cov.weights > 0 =>
        {
            Some((text, *chunks, *all_experts, cov))
        }
        _ => None,
    })?;
    let on = match chunks {
        Some(n) => format!("{text} ({n} chunks)"),
        None => text.clone(),
    };
    let about = if all && cov.partial.is_empty() {
        format!(
            "Every expert of the {} mixture-of-experts weights was credited on every token of the calibration text \
             {on} (imatrix.all_experts, as llm-compressor's calibrate_all_experts).",
            cov.weights
        )
    } else if cov.partial.is_empty() {
        format!("The calibration text {on} reached every expert of the {} mixture-of-experts weights.", cov.weights)
    } else {
        format!(
            "The calibration text {on} left experts without a token in {} of the {} mixture-of-experts weights:              llama-quantize gives their columns an importance of 1 (no data), as llama-imatrix warns (partial data).",
            cov.partial.len(),
            cov.weights
        )
    };
    let rows = cov
        .partial
        .iter()
        .map(|p| {
            let unrouted: Vec<String> = p.unrouted.iter().map(u32::to_string).collect();
            [p.weight.clone(), format!("{:.2} % of {}", p.percent, p.experts), unrouted.join(", ")]
        })
        .collect();
    Some((about, rows))
}

/// The header cells of [`coverage_rows`].
pub(crate) const COVERAGE_HEADER: [&str; 3] = ["Weight", "Experts with tokens", "Experts without"];

/// The header cells of [`sequential_rows`].
pub(crate) const SEQUENTIAL_HEADER: [&str; 5] =
    ["Rung", "Chunks measured", "Stopped", "Mean KLD and interval", "Thresholds"];

/// Each artifact's multiple-choice results as table cells: accuracy (percent ± percent), correct of tasks, tasks
/// whose answer changed against the reference's, now wrong, now right.
pub(crate) fn choice_rows(report: &Report) -> Vec<[String; 5]> {
    let list = |v: &Option<Vec<u32>>| match v {
        None => "—".to_string(),
        Some(v) if v.is_empty() => "none".to_string(),
        Some(v) => format!("{} ({})", v.len(), v.iter().map(|i| (i + 1).to_string()).collect::<Vec<_>>().join(", ")),
    };
    report
        .artifacts
        .iter()
        .filter_map(|a| {
            let c = a.choices.as_ref()?;
            Some([
                a.name.clone(),
                format!("{:.2} ± {:.2} % ({}/{})", 100.0 * c.accuracy, 100.0 * c.accuracy_unc, c.n_correct, c.n_tasks),
                list(&c.changed),
                list(&c.now_wrong),
                list(&c.now_right),
            ])
        })
        .collect()
}

/// The third parties' files as table cells: the file, its size and bits per weight, its mean KLD and same top p, the
/// farm's rung nearest in size, and the paired difference with it.
pub(crate) fn third_party_rows(report: &Report) -> Vec<[String; 6]> {
    let pct = report.paired.as_ref().map_or(95.0, |p| 100.0 * p.confidence);
    report
        .third_party
        .iter()
        .map(|t| {
            let name = t.url.rsplit('/').next().unwrap_or(&t.url).to_string();
            let size = t.file.as_ref().map_or("—".to_string(), |f| {
                format!("{}{}", size(f.bytes), t.bits_per_weight.map_or(String::new(), |b| format!(", {b:.2} bpw")))
            });
            let k = match &t.kld {
                crate::model::Kld::Measured(k) => {
                    format!("{:.6} ± {:.6}", k.mean_kld, k.mean_kld_unc)
                }
                crate::model::Kld::Unmeasured { error } => error.clone(),
            };
            let same_top = match &t.kld {
                crate::model::Kld::Measured(k) => format!("{:.2} %", k.same_top_p),
                crate::model::Kld::Unmeasured { .. } => "—".to_string(),
            };
            let paired = match (&t.paired, t.distinguishable) {
                (Some(p), Some(d)) => format!(
                    "{:+.6} [{:+.6}, {:+.6}] at {pct:.0} %{}",
                    p.mean,
                    p.low,
                    p.high,
                    if d { "" } else { ": not told apart" }
                ),
                _ => "—".to_string(),
            };
            [name, size, k, same_top, t.nearest.clone().unwrap_or_else(|| "—".into()), paired]
        })
        .collect()
}

/// The header cells of [`third_party_rows`].
pub(crate) const THIRD_PARTY_HEADER: [&str; 6] =
    ["File", "Size", "Mean KLD", "Same top p", "Nearest farm rung", "ΔKLD vs it, paired"];

/// The header cells of [`choice_rows`].
pub(crate) const CHOICE_HEADER: [&str; 5] =
    ["Artifact", "Accuracy", "Answers changed vs reference", "Now wrong", "Now right"];

/// The header cells of [`paired_rows`].
pub(crate) const PAIRED_HEADER: [&str; 5] = ["Rungs", "Δ mean KLD", "Interval", "Standard error", "Distinguishable"];

pub(crate) fn or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "—".to_string())
}

/// A file of an identity-chain step: url, sha256, bytes.
pub(crate) type ChainFile = (String, String, u64);

/// Each identity-chain step: what it is, then its files (url, sha256, bytes).
pub(crate) fn identity_chain(report: &Report) -> Vec<(String, Vec<ChainFile>)> {
    let mut out = Vec::new();
    let src = &report.source;
    out.push((
        format!("source ({}, {})", src.format.as_deref().unwrap_or("?"), src.architecture.as_deref().unwrap_or("?")),
        vec![(src.url.clone(), src.identity.clone().unwrap_or_default(), src.bytes.unwrap_or(0))],
    ));
    let adapter = report.adapter.as_ref();
    match adapter.and_then(|a| a.files.as_ref()).filter(|f| !f.is_empty()) {
        Some(files) => {
            let files = files.iter().map(|f| (f.url.clone(), f.sha256.clone(), f.bytes)).collect();
            let format = adapter.and_then(|a| a.format.as_deref()).unwrap_or("?");
            out.push((format!("adapter ({format})"), files));
        }
        None => {
            if let Some(a) = adapter.map(|a| a.url.as_str()).or_else(|| report.release.spec_str("adapter")) {
                out.push(("adapter".to_string(), vec![(a.to_string(), String::new(), 0)]));
            }
        }
    }
    for r in rows(report) {
        let step = match r.file_type {
            "merged" => "merged (HF safetensors)".to_string(),
            "BF16" => "converted (GGUF BF16, the reference)".to_string(),
            t if t.starts_with("MLX-") => format!("quantized ({t})"),
            t => format!("quantized (GGUF {t})"),
        };
        let files = r.a.files.iter().map(|f| (f.url.clone(), f.sha256.clone(), f.bytes)).collect();
        out.push((step, files));
    }
    out
}

#[cfg(test)]
pub(crate) mod sample {
    use serde_json::{json, Value};

    use crate::model::Report;

    /// Every KL-divergence figure, scaled from a mean.
    fn kld(m: f64) -> Value {
        let figures = [
            ("mean_kld", m),
            ("mean_kld_unc", m / 50.0),
            ("median_kld", m / 2.0),
            ("min_kld", -m / 1000.0),
            ("max_kld", m * 40.0),
            ("kld_p0_1", m / 500.0),
            ("kld_p1", m / 100.0),
            ("kld_p5", m / 20.0),
            ("kld_p10", m / 10.0),
            ("kld_p90", m * 3.0),
            ("kld_p95", m * 4.0),
            ("kld_p99", m * 8.0),
            ("kld_p99_9", m * 20.0),
            ("same_top_p", 100.0 - m * 200.0),
            ("same_top_p_unc", 0.3),
            ("mean_ppl_q", 18.3 * (1.0 + m)),
            ("mean_ppl_q_unc", 0.2),
            ("mean_ppl_base", 18.29),
            ("mean_ppl_base_unc", 0.2),
            ("cor_ln_ppl", 99.9),
            ("mean_ln_ppl_ratio", m),
            ("mean_ln_ppl_ratio_unc", m),
            ("mean_ppl_ratio", 1.0 + m),
            ("mean_ppl_ratio_unc", m / 10.0),
            ("mean_ppl_diff", m * 18.0),
            ("mean_ppl_diff_unc", m),
            ("mean_dp", -m),
            ("mean_dp_unc", m / 10.0),
            ("median_dp", 0.0),
            ("min_dp", -m * 100.0),
            ("max_dp", m * 100.0),
            ("rms_dp", m * 60.0),
            ("rms_dp_unc", m),
            ("dp_p0_1", -m * 90.0),
            ("dp_p1", -m * 50.0),
            ("dp_p5", -m * 20.0),
            ("dp_p10", -m * 10.0),
            ("dp_p25", -m),
            ("dp_p75", m),
            ("dp_p90", m * 10.0),
            ("dp_p95", m * 20.0),
            ("dp_p99", m * 50.0),
            ("dp_p99_9", m * 90.0),
        ];
        let mut k: serde_json::Map<String, Value> = figures.iter().map(|(n, v)| (n.to_string(), json!(v))).collect();
        k.insert("n_chunks".into(), json!(14));
        k.insert("n_tokens".into(), json!(3570));
        Value::Object(k)
    }

    fn probes(s: f64) -> Value {
        json!({"suite": "basics", "mean_score": s, "score_spread": 0.05, "pass_scores": [s], "passed": 5, "failed": 2,
               "truncated": 1, "reference_mean_score": 0.75, "reference_score_spread": 0.04,
               "delta_vs_reference": s - 0.75})
    }

    fn greedy(k: u64) -> Value {
        json!({"n": 20, "identical": k, "agree": k as f64 / 20.0, "mean_prefix_fraction": 0.9, "complete": true,
               "disagreements": [{"index": 3, "first_difference": 17, "reference_margin": 0.012, "common_prefix": 17,
                                  "reference_tokens": 64, "model_tokens": 64, "reference_text": "the cat",
                                  "model_text": "the dog"}]})
    }

    fn file(n: &str, b: u64) -> Value {
        json!({"url": format!("s3://farm/r1/{n}"), "sha256": "0f".repeat(32), "bytes": b})
    }

    fn interval(mean: f64, se: f64) -> Value {
        json!({"n_tokens": 3584, "n_chunks": 14, "mean": mean, "se_tokens": se / 2.0, "se_chunks": se,
               "low": mean - 2.16 * se, "high": mean + 2.16 * se})
    }

    fn interval_of(ty: &str, bytes: u64, mean: f64, se: f64) -> Value {
        json!({"file_type": ty, "bytes": bytes, "kld": interval(mean, se)})
    }

    fn artifact(ty: &str, bytes: u64, bpw: f64, kld: Value, greedy: Value, probes: Value) -> Value {
        let name = format!("SmolLM2-{ty}");
        json!({"name": name, "file_type": ty, "container": "gguf", "bytes": bytes, "bits_per_weight": bpw,
               "files": [file(&format!("{name}.gguf"), bytes)], "verified": true,
               "type_mix": [{"type": "q8_0", "tensors": 210, "elements": 134515008u64, "bytes": bytes}],
               "imatrix": null, "peers": null, "kld": kld, "greedy": greedy, "probes": probes})
    }

    /// The sample as JSON: every member a report can have, two measured levels and one unmeasured
    /// (`docs/report.example.json`).
    pub fn json() -> Value {
        let mut q8 = artifact("Q8_0", 145000000, 8.5, kld(0.0045), greedy(19), probes(0.75));
        q8["choices"] = json!({"tasks_sha256": "ff".repeat(32), "n_tasks": 32, "n_correct": 13, "accuracy": 0.40625,
                               "accuracy_unc": 0.0882, "chance": 0.25, "changed": [4, 20], "now_wrong": [4],
                               "now_right": []});
        q8["imatrix"] = json!({"from": "file", "url": "s3://models/imatrix.gguf", "sha256": "ee".repeat(32)});
        q8["peers"] = json!({"llama-perplexity": {
            "version": "b6000", "command": "llama-perplexity -m SmolLM2-Q8_0.gguf --kl-divergence",
            "figures": {"Mean KLD": 0.0045, "Same top p": 99.1},
            "same_as_quantfarm": {"Mean KLD": true, "Same top p": true}}});
        let mut q4 = artifact("Q4_K_M", 105000000, 5.3, kld(0.0635), greedy(9), probes(0.5));
        q4["imatrix"] = json!({"from": "computed", "url": "s3://farm/r1/imatrix.gguf", "sha256": "ee".repeat(32),
                               "text": "texts/calibration.txt", "text_sha256": "cc".repeat(32),
                               "tokens_sha256": "dd".repeat(32), "chunks": 8, "ctx": 512, "batch": 512,
                               "method": "llama-imatrix's collection", "all_experts": false,
                               "experts": {"weights": 3, "partial": [{"weight": "blk.1.ffn_up_exps.weight",
                                           "experts": 8, "unrouted": [2, 5], "percent": 75.0}]}});
        let mut xl = artifact("Q4_K_XL", 112000000, 5.7, kld(0.0412), greedy(12), probes(0.625));
        xl["recipe"] = json!({"base": "Q4_K_M", "tensor_types": ["ffn_down=Q6_K"], "output_tensor_type": null,
                              "token_embedding_type": "Q8_0",
                              "llama_quantize_args": ["--tensor-type", "ffn_down=Q6_K", "--token-embedding-type", "Q8_0", "Q4_K_M"]});
        let reference_probes = json!({"suite": "basics", "mean_score": 0.75, "score_spread": 0.04,
                                      "pass_scores": [0.75], "passed": 6, "failed": 2, "truncated": 0});
        json!({
            "format": "quantfarm-report/1",
            "quantfarm_version": "0.1.0",
            "release": {"id": "r1", "name": "smollm2-<tuned>", "spec_file": "release.yaml", "spec_sha256": "aa".repeat(32),
                        "spec": {"name": "smollm2", "adapter": "s3://models/lora",
                                 "card": {"license": "apache-2.0", "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}}},
            "source": {"url": "s3://models/smollm2", "format": "hf", "architecture": "llama", "identity": "bb".repeat(32),
                       "bytes": 269060000, "tensors": 272},
            "links": {"merge": "merged", "conversion": "converted", "quantization": "quantized", "probes": "probed"},
            "adapter": {"url": "s3://models/lora", "format": "peft", "files": [file("adapter_model.safetensors", 1000)],
                        "changed_tensors": 60, "untied_embeddings": false},
            "merge_check": {"method": "greedy", "base": file("check/base.gguf", 540000000),
                            "lora": file("check/lora.gguf", 2000000), "merged": file("check/merged.gguf", 540000000),
                            "greedy": {"n": 20, "identical": 20, "agree": 1.0, "mean_prefix_fraction": 1.0,
                                       "complete": true, "disagreements": []}},
            "evaluation": {"text": "texts/gpl3.txt", "text_sha256": "cc".repeat(32), "tokens_sha256": "dd".repeat(32),
                           "ctx": 512, "batch": 2048, "n_chunks": 14, "chunks_per_task": 4,
                           "reference": "s3://farm/r1/SmolLM2-BF16.gguf",
                           "runtime": "llama.cpp", "prompts": "prompts.json", "n_prompts": 20, "max_tokens": 64,
                           "probes": "probes.yaml", "context": 512},
            "paired": {"method": "paired", "confidence": 0.95,
                       "values": file("kld-values.safetensors", 43000),
                       "means": [interval_of("Q4_K_M", 105000000, 0.0635, 0.004),
                                 interval_of("Q4_K_XL", 112000000, 0.0412, 0.003),
                                 interval_of("Q8_0", 145000000, 0.0045, 0.0004)],
                       "pairs": [{"smaller": "Q4_K_M", "larger": "Q4_K_XL", "diff": interval(0.0223, 0.002),
                                  "se_unpaired": 0.005, "distinguishable": true},
                                 {"smaller": "Q4_K_XL", "larger": "Q8_0", "diff": interval(0.0367, 0.003),
                                  "se_unpaired": 0.003, "distinguishable": true}]},
            "third_party": [{"url": "s3://models/elsewhere/SmolLM2-Q4_K_M.gguf",
                             "file": file("SmolLM2-Q4_K_M.gguf", 105500000), "type_mix": [
                                 {"type": "q4_K", "tensors": 180, "elements": 120000000u64, "bytes": 67500000u64}],
                             "bits_per_weight": 4.5, "kld": kld(0.0651), "nearest": "Q4_K_M",
                             "paired": interval(0.0016, 0.0004), "distinguishable": true}],
            "comparison": {
                "old": {"id": "r0", "name": "smollm2-<tuned>", "source_identity": "bb".repeat(32), "verdict": "released"},
                "new": {"id": "r1", "name": "smollm2-<tuned>", "source_identity": "bb".repeat(32), "verdict": "gate failed"},
                "pairing": "paired token by token", "paired": true, "same_reference": true, "confidence": 0.95,
                "rungs": [
                    {"file_type": "Q8_0", "presence": "both", "files_changed": false, "old_bytes": 145000000u64,
                     "new_bytes": 145000000u64, "types": [], "old_kld": 0.0045, "new_kld": 0.0045,
                     "delta": interval(0.0, 0.0), "greedy": {"old_identical": 19, "new_identical": 19, "n": 20,
                     "now_differ": [], "now_identical": []},
                     "probes": {"old_passed": 6, "old_failed": 2, "new_passed": 6, "new_failed": 2}, "changed": false},
                    {"file_type": "Q4_K_XL", "presence": "only_new", "files_changed": true, "old_bytes": null,
                     "new_bytes": 112000000u64, "types": [{"ggml_type": "q6_K", "old_tensors": 0, "new_tensors": 30}],
                     "old_kld": null, "new_kld": 0.0412, "delta": null, "no_delta": "only in the new release",
                     "greedy": null, "probes": null, "changed": true},
                ],
                "gates": [{"name": "kld", "level": "Q4_K_M", "old": true, "new": false}],
            },
            "sequential": {"method": "stratified seeded order, ratio estimate, t interval with a spread floor",
                           "confidence": 0.99, "min_chunks": 4, "spread": 0.3, "chunks_per_group": 1,
                           "order": [2, 9, 5, 12, 0, 7, 11, 4, 13, 1, 6, 10, 3, 8],
                           "rungs": [
                               {"file_type": "Q8_0", "chunks": 4, "of_chunks": 14, "stopped": "decided",
                                "mean": 0.0046, "low": 0.0031, "high": 0.0061, "thresholds": [0.01]},
                               {"file_type": "Q4_K_M", "chunks": 14, "of_chunks": 14, "stopped": "complete",
                                "mean": 0.0635, "low": 0.0635, "high": 0.0635, "thresholds": [0.05],
                                "note": "never decided early: gate \"tail\" (kld.p99 <= 1) reads kld.p99, which the stop rule does not bound"}]},
            "search": {"method": "each tensor group quantized alone, least summed KLD within the budget",
                       "sensitivity": {"url": "s3://farm/artifacts/55b8/sensitivity.json", "sha256": "ab".repeat(32),
                                       "reused": false, "text": "texts/calibration.txt",
                                       "tokens_sha256": "dd".repeat(32), "ctx": 512, "chunks": 8,
                                       "precision": 0.1, "layers": 3, "candidates": ["Q4_K", "Q6_K", "Q8_0"],
                                       "groups": 22, "probes": 66, "probe_seconds": 412.5,
                                       "probe_model_bytes": 17820000000u64},
                       "rungs": [{"name": "Q4_FIT", "target": "Q4_K_M's bits per weight",
                                  "budget_bytes": 104800000u64, "bytes": 104750000u64, "bits_per_weight": 5.2981,
                                  "predicted_kld": 0.0511,
                                  "picks": [{"group": "token_embd.weight", "ggml_type": "Q8_0"},
                                            {"group": "ffn_down.weight@0-9", "ggml_type": "Q6_K"}],
                                  "error": null},
                                 {"name": "TINY", "target": "2 bits per weight", "budget_bytes": null, "bytes": null,
                                  "bits_per_weight": null, "predicted_kld": null, "picks": [],
                                  "error": "TINY: the budget of 33750000 bytes is below the smallest recipe the candidates make (70100000 bytes) (target 2 bits per weight)"},
                                 {"name": "SMALLEST_OK", "target": "the smallest with kld.p99_9 <= 0.5",
                                  "budget_bytes": 91000000u64, "bytes": 90990000u64, "bits_per_weight": 4.6,
                                  "predicted_kld": 0.09, "picks": [{"group": "token_embd.weight", "ggml_type": "Q4_0"}],
                                  "error": null,
                                  "candidates": [{"bytes": 76000000u64, "bits_per_weight": 3.84, "predicted_kld": 0.3,
                                                  "measured": 0.81},
                                                 {"bytes": 90990000u64, "bits_per_weight": 4.6, "predicted_kld": 0.09,
                                                  "measured": 0.42},
                                                 {"bytes": 144900000u64, "bits_per_weight": 8.5, "predicted_kld": 0.004,
                                                  "measured": null}]}],
                       "frontier": [{"name": "Q4_K_M", "searched": false, "bytes": 104800000u64,
                                     "bits_per_weight": 5.3, "kld_mean": 0.0635, "kld_p99_9": 1.2},
                                    {"name": "Q4_K_XL", "searched": false, "bytes": 111900000u64,
                                     "bits_per_weight": 5.7, "kld_mean": 0.0412, "kld_p99_9": 0.9},
                                    {"name": "Q8_0", "searched": false, "bytes": 144900000u64,
                                     "bits_per_weight": 8.5, "kld_mean": 0.0045, "kld_p99_9": 0.05}]},
            "artifacts": [
                artifact("BF16", 270000000, 16.0, Value::Null, Value::Null, reference_probes),
                q8,
                q4,
                xl,
                artifact("Q6_K", 138000000, 6.6, json!({"error": "9 of the text's 14 chunks were measured"}),
                         Value::Null, Value::Null),
            ],
            "tasks": [{"id": "plan", "worker": "w1", "attempts": 1, "duration_ms": 9, "inputs": {"source": "s3://models/smollm2"},
                       "outputs": {"architecture": "llama"}}],
            "gates": [
                {"name": "measured", "level": "Q6_K", "check": "kld.mean and probe results measured", "source": "built-in",
                 "inputs": {"kld.mean": {"missing": "not measured: evaluation.skip lists it"}}, "passed": false,
                 "detail": "Q6_K: not measured: no KL-divergence figure"},
                {"name": "kld", "level": "Q4_K_M", "check": "kld.mean <= default.kld.mean", "source": "default",
                 "inputs": {"kld.mean": 0.0635, "default.kld.mean": 0.1}, "threshold": 0.1, "passed": true,
                 "detail": "Q4_K_M: kld.mean = 0.0635 <= default.kld.mean = 0.1"},
            ],
            "tools": {"quantfarm": "0.1.0", "peers": {"llama-perplexity": "b6000"},
                      "workers": [{"id": "w1", "name": "w", "version": "0.1.0", "os": "linux", "arch": "x86_64",
                                   "cores": 2, "runtimes": ["llama.cpp"]}, {"id": "w0"}]},
            "timings": {"created_ms": 1, "reported_ms": 2, "wall_ms": 1, "task_ms": 9,
                        "by_kind": {"plan": {"tasks": 1, "total_ms": 9, "max_ms": 9}}},
            "verdict": "gate_failed",
            "signature": {"algorithm": "ed25519", "canonicalization": "RFC8785",
                          "public_key": format!("quantfarm-ed25519-public:{}=", "A".repeat(43)),
                          "fingerprint": "SHA256:0123456789abcdef0123456789abcdef",
                          "value": format!("{}==", "B".repeat(86))},
        })
    }

    #[test]
    fn the_sample_is_the_documented_example_and_fits_the_types_both_ways() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/report.example.json");
        let ours = format!("{}\n", serde_json::to_string_pretty(&json()).expect("JSON"));
        if std::env::var_os("QUANTFARM_WRITE_EXAMPLE").is_some() {
            std::fs::write(&path, &ours).expect("docs/report.example.json");
        }
        let documented = std::fs::read_to_string(&path).expect("docs/report.example.json");
        assert!(
            documented == ours,
            "docs/report.example.json is not the views' sample report: write it again with \
             QUANTFARM_WRITE_EXAMPLE=1 cargo test -p quantfarm-coordinator the_sample_is"
        );
        let back = serde_json::to_value(report()).expect("serializes");
        let canonical = |v: &Value| crate::canonical::canonical_json(v).expect("canonical");
        assert_eq!(canonical(&back), canonical(&json()), "the types keep every member of the sample");
    }

    /// The sample as the views read it.
    pub fn report() -> Report {
        crate::parse(&json().to_string()).expect("the sample fits the report's types")
    }
}
