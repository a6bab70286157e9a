//! `report.html`: one self-contained page — inline CSS and SVG, no script, no font or image fetched — that shows
//! the verdict and the gate table first, then the ladder (size against mean KLD with its uncertainty), KLD
//! percentiles per level, same-top-p, greedy agreement per link with where continuations diverge, probe pass rates
//! against the reference's noise band, and the identity chain.

use std::fmt::Write as _;

pub(crate) use super::svg::esc;
use super::svg::Chart;
use super::{identity_chain, or_dash, reference_probe, rows, signer, size, verdict};
use crate::model::{GreedySummary, KldFigures, Report, Verdict};

pub(crate) const CSS: &str = r#"
:root { color-scheme: light; --ok: #1a7f37; --bad: #cf222e; --ink: #1f2328; --muted: #59636e; --line: #d1d9e0; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink); margin: 0 auto;
       max-width: 1100px; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid var(--line); }
.meta { color: var(--muted); margin: 0 0 12px; } code { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; }
.badge { display: inline-block; padding: 2px 10px; border-radius: 12px; color: #fff; font-weight: 600; }
.badge.released { background: var(--ok); } .badge.failed { background: var(--bad); }
table { border-collapse: collapse; width: 100%; margin: 6px 0; } th, td { border: 1px solid var(--line); padding: 4px 8px;
        text-align: left; vertical-align: top; } th { background: #f6f8fa; } td.num { text-align: right;
        font-variant-numeric: tabular-nums; } tr.fail td { background: #ffebe9; } .pass { color: var(--ok); font-weight: 600; }
.fail-mark { color: var(--bad); font-weight: 600; } .sha { font-size: 11px; word-break: break-all; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(480px, 1fr)); gap: 16px; }
figure { margin: 0; } figcaption { color: var(--muted); font-size: 12px; }
svg.chart { width: 100%; height: auto; background: #fff; }
svg .plot { fill: #fbfcfd; stroke: var(--line); } svg .grid { stroke: #eaeef2; } svg .tick { font-size: 11px; fill: var(--muted); }
svg .axis { font-size: 12px; fill: var(--ink); } svg .label { font-size: 11px; fill: var(--ink); }
svg .err { stroke: #0969da; stroke-width: 1.5; } svg .pt circle { fill: #0969da; } svg .pt.mlx circle { fill: #8250df; } svg .pt.searched circle { fill: #1a7f37; }
svg .bar { fill: #0969da; } svg .bar.ref { fill: #8c959f; } svg .bar.merge { fill: #1a7f37; } svg .band { fill: #fbbc0544; stroke: #bf8700; }
svg .ladder polyline { fill: none; stroke: #0969da55; stroke-width: 1.2; } svg .series polyline { fill: none; stroke-width: 1.8; } svg .series circle { r: 2.5; }
svg .s0 polyline { stroke: #0969da; } svg .s0 circle, svg .s0 rect { fill: #0969da; }
svg .s1 polyline { stroke: #cf222e; } svg .s1 circle, svg .s1 rect { fill: #cf222e; }
svg .s2 polyline { stroke: #1a7f37; } svg .s2 circle, svg .s2 rect { fill: #1a7f37; }
svg .s3 polyline { stroke: #8250df; } svg .s3 circle, svg .s3 rect { fill: #8250df; }
svg .s4 polyline { stroke: #bf8700; } svg .s4 circle, svg .s4 rect { fill: #bf8700; }
svg .s5 polyline { stroke: #57606a; } svg .s5 circle, svg .s5 rect { fill: #57606a; }
.empty { color: var(--muted); font-style: italic; }
details { margin: 4px 0; } summary { cursor: pointer; font-weight: 600; }
"#;

/// The KLD percentiles drawn per level, and their labels.
/// Reads one figure.
type Figure = fn(&KldFigures) -> f64;

const PERCENTILES: [(Figure, &str); 9] = [
    (|k| k.kld_p1, "1%"),
    (|k| k.kld_p5, "5%"),
    (|k| k.kld_p10, "10%"),
    (|k| k.median_kld, "50%"),
    (|k| k.kld_p90, "90%"),
    (|k| k.kld_p95, "95%"),
    (|k| k.kld_p99, "99%"),
    (|k| k.kld_p99_9, "99.9%"),
    (|k| k.max_kld, "max"),
];

pub fn render(report: &Report) -> String {
    let rel = &report.release;
    let name = rel.name.as_str();
    let released = report.verdict == Verdict::Released;
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Parity report: {}</title><style>{CSS}</style></head><body>",
        esc(name)
    );
    let _ = write!(
        h,
        "<h1>Parity report: {} <span class=\"badge {}\">{}</span></h1><p class=\"meta\">Release <code>{}</code> from \
         <code>{}</code> · quantfarm {} · signed by <code>{}</code> (check with <code>quantfarm report verify report.json \
         --pubkey FARM.pub</code>)</p>",
        esc(name),
        if released { "released" } else { "failed" },
        esc(&verdict(report).to_uppercase()),
        esc(&rel.id),
        esc(&rel.spec_file),
        esc(&report.quantfarm_version),
        esc(signer(report)),
    );
    gates(&mut h, report);
    h.push_str("<h2>Ladder</h2><div class=\"charts\">");
    ladder_chart(&mut h, report);
    percentile_chart(&mut h, report);
    same_top_chart(&mut h, report);
    greedy_chart(&mut h, report);
    probe_chart(&mut h, report);
    h.push_str("</div>");
    ladder_table(&mut h, report);
    third_party(&mut h, report);
    choices(&mut h, report);
    paired(&mut h, report);
    if let Some((about, rows)) = super::sequential_rows(report) {
        section(&mut h, "Sequential measurement", &about, super::SEQUENTIAL_HEADER, rows);
    }
    if let Some((about, rows)) = super::search_rows(report) {
        section(&mut h, "Searched rungs", &about, super::SEARCH_HEADER, rows);
        let about = "Every GGUF rung measured, smallest first: size against KL divergence (the ladder chart above).";
        section(&mut h, "Frontier", about, super::FRONTIER_HEADER, super::frontier_rows(report));
    }
    match super::coverage_rows(report) {
        Some((about, rows)) if rows.is_empty() => {
            let _ = write!(h, "<h2>Importance matrix: experts reached</h2><p>{}</p>", esc(&about));
        }
        Some((about, rows)) => {
            section(&mut h, "Importance matrix: experts reached", &about, super::COVERAGE_HEADER, rows)
        }
        None => {}
    }
    match &report.comparison {
        Some(crate::model::Comparison::Diff(d)) => {
            let _ = write!(h, "<h2>Since {} ({})</h2>{}", esc(&d.old.name), esc(&d.old.id), d.html_body("h3"));
        }
        Some(crate::model::Comparison::Unavailable { with, error }) => {
            let _ = write!(h, "<h2>Since {}</h2><p>No comparison: {}.</p>", esc(with), esc(error));
        }
        None => {}
    }
    cross_runtime(&mut h, report);
    transformers(&mut h, report);
    divergences(&mut h, report);
    chain(&mut h, report);
    h.push_str("</body></html>\n");
    h
}

/// A section: its heading, a sentence (escaped here), and a table of `header` and `rows`; nothing without rows.
fn section<const N: usize>(h: &mut String, heading: &str, about: &str, header: [&str; N], rows: Vec<[String; N]>) {
    if rows.is_empty() {
        return;
    }
    let _ = write!(h, "<h2>{}</h2><p>{}</p><table><tr>", esc(heading), esc(about));
    for c in header {
        let _ = write!(h, "<th>{}</th>", esc(c));
    }
    h.push_str("</tr>");
    for r in rows {
        h.push_str("<tr>");
        for c in r {
            let _ = write!(h, "<td>{}</td>", esc(&c));
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
}

fn third_party(h: &mut String, report: &Report) {
    let about = "GGUF files of the same base made elsewhere, scored against the same base logits.";
    section(h, "Third-party files", about, super::THIRD_PARTY_HEADER, super::third_party_rows(report));
}

fn choices(h: &mut String, report: &Report) {
    let about = "As llama-perplexity --multiple-choice scores it; tasks numbered from 1.";
    section(h, "Multiple choice", about, super::CHOICE_HEADER, super::choice_rows(report));
}

fn paired(h: &mut String, report: &Report) {
    let Some((about, rows)) = super::paired_rows(report) else { return };
    section(h, "Paired comparisons", &about, super::PAIRED_HEADER, rows);
}

fn gates(h: &mut String, report: &Report) {
    h.push_str("<h2>Gates</h2><table><tr><th></th><th>Gate</th><th>Level</th><th>Check</th><th>Inputs</th><th>Threshold</th><th>Detail</th></tr>");
    for g in &report.gates {
        let ok = g.passed;
        let inputs: Vec<String> = super::gate_inputs(g)
            .into_iter()
            .map(|(k, v)| match v {
                super::Input::Missing(why) => {
                    format!("<code>{}</code>: <span class=\"fail-mark\">missing</span> ({})", esc(k), esc(&why))
                }
                super::Input::Value(v) => format!("<code>{}</code> = {}", esc(k), esc(&v)),
            })
            .collect();
        let _ = write!(
            h,
            "<tr class=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            if ok { "ok" } else { "fail" },
            if ok { "<span class=\"pass\">pass</span>" } else { "<span class=\"fail-mark\">FAIL</span>" },
            esc(&g.name),
            esc(g.level.as_deref().unwrap_or("—")),
            esc(&g.check),
            inputs.join("<br>"),
            esc(&or_dash(g.threshold.map(crate::gates::expr::fmt_num))),
            esc(&g.detail),
        );
    }
    h.push_str("</table>");
}

fn figure(h: &mut String, svg: String, caption: &str) {
    let _ = write!(h, "<figure>{svg}<figcaption>{}</figcaption></figure>", esc(caption));
}

fn empty(h: &mut String, what: &str) {
    let _ = write!(h, "<figure><p class=\"empty\">{}</p></figure>", esc(what));
}

fn ladder_chart(h: &mut String, report: &Report) {
    let measured: Vec<_> = rows(report).into_iter().filter(|r| r.kld.is_some()).collect();
    if measured.is_empty() {
        return empty(h, "No level has a KL-divergence figure: nothing to plot.");
    }
    let xs: Vec<f64> = measured.iter().map(|r| r.bytes as f64 / 1e6).collect();
    let ys: Vec<f64> = measured.iter().flat_map(|r| r.kld.map(|(m, u)| [m, m + u])).flatten().collect();
    let mut c =
        Chart::new("size against mean KL divergence", &xs, false, "size (MB)", &ys, true, "mean KLD (nats/token)");
    // The GGUF ladder joined in order of size (a recipe among its file types where its bytes put it), under the points.
    let mut gguf: Vec<(f64, f64)> = measured
        .iter()
        .filter(|r| r.a.container == crate::model::Container::Gguf)
        .filter_map(|r| r.kld.map(|(m, _)| (r.bytes as f64 / 1e6, m)))
        .filter(|&(_, m)| m > 0.0)
        .collect();
    gguf.sort_by(|a, b| a.0.total_cmp(&b.0));
    if gguf.len() > 1 {
        c.line(&gguf, "the GGUF ladder, in order of size", "ladder");
    }
    for r in &measured {
        let (m, u) = r.kld.unwrap_or_default();
        let searched =
            report.search.as_ref().is_some_and(|s| s.frontier.iter().any(|p| p.searched && p.name == r.file_type));
        let class = match () {
            _ if r.file_type.starts_with("MLX-") => "pt mlx",
            _ if searched => "pt searched",
            _ => "pt",
        };
        let title = format!("{}: {} · {:.2} bits/weight · mean KLD {m:.6} ± {u:.6}", r.name, size(r.bytes), r.bpw);
        c.point(r.bytes as f64 / 1e6, m, u, r.file_type, &title, class);
    }
    figure(h, c.finish(), "The ladder: each level's size against its mean KL divergence from the GGUF BF16 (log scale), with the ± uncertainty llama-perplexity prints; searched rungs in green.");
}

fn percentile_chart(h: &mut String, report: &Report) {
    let measured: Vec<_> = rows(report).into_iter().filter(|r| r.kld.is_some()).collect();
    if measured.is_empty() {
        return empty(h, "No KL-divergence percentiles: no level was measured.");
    }
    let figures = |r: &super::Row<'_>| -> Vec<f64> {
        let k = r.a.kld_figures();
        PERCENTILES.iter().filter_map(|(f, _)| super::fig(k, *f)).collect()
    };
    let ys: Vec<f64> = measured.iter().flat_map(figures).collect();
    let mut c =
        Chart::categories("KL divergence percentiles per level", PERCENTILES.len(), &ys, true, "KLD (nats/token)");
    for (i, (_, label)) in PERCENTILES.iter().enumerate() {
        c.category(i, label);
    }
    for (s, r) in measured.iter().enumerate() {
        let k = r.a.kld_figures();
        let pts: Vec<(f64, f64)> = PERCENTILES
            .iter()
            .enumerate()
            .filter_map(|(i, (f, _))| k.map(f).filter(|v| *v > 0.0).map(|v| (i as f64, v)))
            .collect();
        let class = format!("series s{}", s % 6);
        c.line(&pts, r.name, &class);
        c.legend(s, r.file_type, &format!("s{}", s % 6));
    }
    figure(h, c.finish(), "Per-token KL divergence percentiles (log scale): the tail shows what the mean hides.");
}

fn same_top_chart(h: &mut String, report: &Report) {
    let same_top = |r: &super::Row<'_>| r.a.kld_figures().map(|k| (k.same_top_p, k.same_top_p_unc));
    let measured: Vec<_> =
        rows(report).into_iter().filter(|r| same_top(r).is_some_and(|(v, _)| v.is_finite())).collect();
    if measured.is_empty() {
        return empty(h, "No same-top-p figures: no level was measured.");
    }
    let ys: Vec<f64> = measured.iter().filter_map(|r| same_top(r).map(|(v, _)| v)).chain([100.0]).collect();
    let mut c = Chart::categories("same top token, percent", measured.len(), &ys, false, "same top p (%)");
    for (i, r) in measured.iter().enumerate() {
        let (v, u) = same_top(r).unwrap_or_default();
        let u = if u.is_finite() { u } else { 0.0 };
        c.bar(i, 0.0, 0.6, v, &format!("{}: {v:.3} ± {u:.3} %", r.name), "bar");
        c.category(i, r.file_type);
    }
    figure(h, c.finish(), "How often each level's most likely next token is the reference's.");
}

fn greedy_chart(h: &mut String, report: &Report) {
    let mut bars: Vec<(String, f64, String, &str)> = Vec::new();
    if let Some(g) = report.merge_check.as_ref().and_then(|m| m.greedy()) {
        let (k, n) = (g.identical, g.n);
        bars.push(("merge".into(), ratio(k, n), format!("merge check (link 1): {k}/{n} identical"), "bar merge"));
    }
    for r in rows(report) {
        if let Some((k, n)) = r.greedy {
            bars.push((
                r.file_type.to_string(),
                ratio(k, n),
                format!("{}: {k}/{n} identical to the reference", r.name),
                "bar",
            ));
        }
    }
    if bars.is_empty() {
        return empty(h, "No greedy agreement: the release has no evaluation.prompts.");
    }
    let mut c = Chart::categories("greedy agreement", bars.len(), &[0.0, 100.0], false, "prompts identical (%)");
    for (i, (label, v, title, class)) in bars.iter().enumerate() {
        c.bar(i, 0.0, 0.6, 100.0 * v, title, class);
        c.category(i, label);
    }
    figure(h, c.finish(), "Greedy continuations byte-identical to the reference: the merge against the base + adapter at run time (link 1), each level against the GGUF BF16 (divergence positions below).");
}

fn ratio(k: u64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        k as f64 / n as f64
    }
}

fn probe_chart(h: &mut String, report: &Report) {
    // The reference (GGUF BF16) is drawn first; a level whose every answer was truncated has no bar, and says so.
    let measured: Vec<_> =
        rows(report).into_iter().filter(|r| r.truncated.is_some() && r.file_type != "BF16").collect();
    if measured.is_empty() {
        return empty(h, "No probe results: the release has no evaluation.probes.");
    }
    let reference = reference_probe(report);
    let n = measured.len() + 1;
    let mut c = Chart::categories("probe pass rates", n, &[0.0, 100.0], false, "probes passed (%)");
    match reference {
        Some((m, s)) => {
            c.bar(0, 0.0, 0.6, 100.0 * m, &format!("reference: {:.1} ± {:.1} %", 100.0 * m, 100.0 * s), "bar ref")
        }
        None => c.note(0, 50.0, "no score"),
    }
    c.category(0, "BF16");
    for (i, r) in measured.iter().enumerate() {
        let i = i + 1;
        if let (Some((rm, rs)), Some((_, s))) = (reference, r.probe) {
            let noise = rs.max(s);
            c.band(
                i,
                100.0 * (rm - noise),
                100.0 * (rm + noise),
                &format!("reference ± noise: {:.1} ± {:.1} %", 100.0 * rm, 100.0 * noise),
            );
        }
        match r.probe {
            Some((m, s)) => {
                c.bar(i, 0.0, 0.6, 100.0 * m, &format!("{}: {:.1} ± {:.1} %", r.name, 100.0 * m, 100.0 * s), "bar")
            }
            None => c.note(i, 50.0, "no score"),
        }
        c.category(i, r.file_type);
    }
    figure(h, c.finish(), "Probe pass rates (truncated answers are never scored: a level whose every answer hit the token cap has no score); the shaded band is the reference's rate ± the noise band.");
}

fn ladder_table(h: &mut String, report: &Report) {
    h.push_str("<h2>Artifacts</h2><table><tr><th>Artifact</th><th>Size</th><th>Bits/weight</th><th>Mean KLD</th><th>Median KLD</th><th>99% KLD</th><th>Same top p</th><th>RMS Δp</th><th>PPL(Q)</th><th>Greedy</th><th>Probes</th><th>Reproduced</th></tr>");
    for r in rows(report) {
        let k = r.a.kld_figures();
        // A figure, or a dash when it was not measured (or is not finite: written as null).
        let fig = |f: Figure| super::fig(k, f);
        let num = |f: Figure, d: usize| or_dash(fig(f).map(|v| format!("{v:.d$}")));
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{:.2}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            esc(r.name),
            esc(&size(r.bytes)),
            r.bpw,
            esc(&or_dash(r.kld.map(|(m, u)| format!("{m:.6} ± {u:.6}")))),
            num(|k| k.median_kld, 6),
            num(|k| k.kld_p99, 4),
            esc(&or_dash(fig(|k| k.same_top_p).map(|v| format!("{v:.3} %")))),
            esc(&or_dash(fig(|k| k.rms_dp).map(|v| format!("{v:.3} %")))),
            num(|k| k.mean_ppl_q, 4),
            esc(&or_dash(r.greedy.map(|(k, n)| format!("{k}/{n}")))),
            esc(&super::probe_cell(&r)),
            if r.a.verified { "<span class=\"pass\">yes</span>" } else { "<span class=\"fail-mark\">no</span>" },
        );
    }
    h.push_str("</table>");
}

/// Link 2 across runtimes: the bf16 weights and each MLX rung in mlx-lm, beside llama.cpp's figures.
fn cross_runtime(h: &mut String, report: &Report) {
    use crate::model::{CrossRuntime, Kld};
    let Some(c) = &report.cross_runtime else { return };
    h.push_str("<h2>Cross-runtime check (link 2): llama.cpp and mlx-lm</h2>");
    let f = match c {
        CrossRuntime::Unmeasured { error } => {
            let _ = write!(h, "<p class=\"empty\">{}</p>", esc(error));
            return;
        }
        CrossRuntime::Measured(f) => f,
    };
    let runtimes: Vec<String> = f
        .runtimes
        .iter()
        .map(|r| format!("mlx {} / mlx-lm {} on {} ({})", r.mlx, r.mlx_lm, r.device, r.device_name))
        .collect();
    let _ = write!(
        h,
        "<p class=\"meta\">The GGUF BF16's weights (<code>{}</code>) and each MLX rung in {}, fed the token ids llama.cpp \
         was fed; KL divergence against llama.cpp's logits of the GGUF BF16 on the same chunks.</p>",
        esc(&f.model),
        esc(&if runtimes.is_empty() { "mlx-lm".to_string() } else { runtimes.join(", ") }),
    );
    h.push_str("<table><tr><th>Model in mlx-lm</th><th>Greedy compared with</th><th>Greedy identical</th><th>Mean prefix</th><th>Mean KLD vs llama.cpp BF16</th><th>99% KLD</th><th>Same top p</th><th>Mean KLD in llama.cpp</th><th>Probes on mlx_lm.server</th><th>Loaded</th></tr>");
    let in_llama = |ty: &str| {
        rows(report).into_iter().find(|r| r.name.ends_with(&format!("-{ty}"))).and_then(|r| r.kld.map(|(m, _)| m))
    };
    for (s, with) in std::iter::once((&f.bf16, "llama.cpp GGUF BF16")).chain(f.rungs.iter().map(|r| (r, "mlx-lm BF16")))
    {
        let k = match &s.kld {
            Some(Kld::Measured(k)) => Some(k),
            _ => None,
        };
        let failed = s.load_error.is_some();
        let loaded = match (&s.load_error, s.upcast) {
            (Some(e), _) => format!("failed: {e}"),
            (None, Some(true)) => "upcast to f32 (CPU build)".to_string(),
            (None, Some(false)) => "as stored".to_string(),
            (None, None) => "—".to_string(),
        };
        // The HF layout mlx-lm cannot load was given to it as quantfarm's unquantized MLX conversion.
        let loaded = match &s.converted {
            Some(_) if s.load_error.is_none() => format!("{loaded}; as quantfarm's MLX conversion"),
            _ => loaded,
        };
        let _ = write!(
            h,
            "<tr{}><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            if failed { " class=\"fail\"" } else { "" },
            esc(&s.file_type),
            with,
            esc(&or_dash(s.greedy.as_ref().map(|g| format!("{}/{}", g.identical, g.n)))),
            esc(&or_dash(s.greedy.as_ref().map(|g| format!("{:.3}", g.mean_prefix_fraction)))),
            esc(&or_dash(k.map(|k| format!("{:.6} ± {:.6}", k.mean_kld, k.mean_kld_unc)))),
            esc(&or_dash(k.map(|k| k.kld_p99).filter(|v| v.is_finite()).map(|v| format!("{v:.4}")))),
            esc(&or_dash(k.map(|k| format!("{:.3} %", k.same_top_p)))),
            esc(&or_dash(if s.file_type.starts_with("vLLM-") { in_llama(&s.file_type) } else { None }.map(|v| format!("{v:.6}")))),
            esc(&super::mlx_lm_probes(s)),
            esc(&loaded),
        );
    }
    h.push_str("</table>");
}

/// The bf16 checkpoint and each vLLM rung in transformers (as saved and weight-only), beside llama.cpp's figures.
fn transformers(h: &mut String, report: &Report) {
    use crate::model::Kld;
    let Some(f) = &report.transformers else { return };
    h.push_str("<h2>transformers: the vLLM rungs as vLLM computes them</h2>");
    let runtimes: Vec<String> = f
        .runtimes
        .iter()
        .map(|r| {
            format!(
                "torch {} / transformers {} / compressed-tensors {} on {}",
                r.torch, r.transformers, r.compressed_tensors, r.device
            )
        })
        .collect();
    let _ = write!(
        h,
        "<p class=\"meta\">The GGUF BF16's source checkpoint (<code>{}</code>) and each vLLM rung in {}, fed the token ids \
         llama.cpp was fed; <em>as-saved</em> quantizes FP8_DYNAMIC's inputs per token (vLLM's W8A8 path, emulated), \
         <em>weight-only</em> runs the decompressed weights with bf16 inputs; with a PEFT adapter, the base \
         with the adapter applied at run time, unmerged, is compared with the merge (the merge check in \
         transformers).</p>",
        esc(&f.model),
        esc(&if runtimes.is_empty() { "transformers".to_string() } else { runtimes.join(", ") }),
    );
    h.push_str("<table><tr><th>Model in transformers</th><th>Activations</th><th>Greedy compared with</th><th>Greedy identical</th><th>Mean KLD vs llama.cpp BF16</th><th>99% KLD</th><th>Same top p</th><th>Mean KLD in llama.cpp</th><th>Probes passed</th><th>Loaded</th></tr>");
    let in_llama = |ty: &str| {
        rows(report).into_iter().find(|r| r.name.ends_with(&format!("-{ty}"))).and_then(|r| r.kld.map(|(m, _)| m))
    };
    for (s, with) in f.subjects() {
        let k = match &s.kld {
            Some(Kld::Measured(k)) => Some(k),
            _ => None,
        };
        let loaded = match (&s.load_error, &s.scheme) {
            (Some(e), _) => format!("failed: {e}"),
            (None, Some(scheme)) => format!("decompressed ({scheme})"),
            (None, None) => "bf16".to_string(),
        };
        let _ = write!(
            h,
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            if s.load_error.is_some() { " class=\"fail\"" } else { "" },
            esc(&s.label()),
            esc(&s.activations),
            with,
            esc(&or_dash(s.greedy.as_ref().map(|g| format!("{}/{}", g.identical, g.n)))),
            esc(&or_dash(k.map(|k| format!("{:.6} ± {:.6}", k.mean_kld, k.mean_kld_unc)))),
            esc(&or_dash(k.map(|k| k.kld_p99).filter(|v| v.is_finite()).map(|v| format!("{v:.4}")))),
            esc(&or_dash(k.map(|k| format!("{:.3} %", k.same_top_p)))),
            esc(&or_dash(if s.file_type.starts_with("vLLM-") { in_llama(&s.file_type) } else { None }.map(|v| format!("{v:.6}")))),
            esc(&super::probes_cell(s.probes.as_ref())),
            esc(&loaded),
        );
    }
    h.push_str("</table>");
}

/// Up to `n` characters of `s`, with an ellipsis when cut.
fn excerpt(s: &str, n: usize) -> String {
    let mut out: String = s.chars().take(n).collect();
    if s.chars().count() > n {
        out.push('…');
    }
    out
}

fn divergences(h: &mut String, report: &Report) {
    let mut subjects: Vec<(String, &GreedySummary)> = Vec::new();
    if let Some(g) = report.merge_check.as_ref().and_then(|m| m.greedy()) {
        subjects.push(("merge check".to_string(), g));
    }
    for r in rows(report) {
        if let Some(g) = &r.a.greedy {
            subjects.push((r.name.to_string(), g));
        }
    }
    if let Some(f) = report.cross_runtime.as_ref().and_then(|c| c.figures()) {
        if let Some(g) = &f.bf16.greedy {
            subjects.push(("BF16 in mlx-lm against llama.cpp (link 2)".to_string(), g));
        }
        for r in &f.rungs {
            if let Some(g) = &r.greedy {
                subjects.push((format!("{} in mlx-lm against mlx-lm's BF16", r.file_type), g));
            }
        }
    }
    h.push_str("<h2>Greedy divergences</h2>");
    let mut any = false;
    for (who, g) in subjects {
        let list = &g.disagreements;
        if list.is_empty() {
            continue;
        }
        if !any {
            h.push_str(
                "<p class=\"meta\">Where each differing continuation first differs, and the reference's top-2 logit margin \
                 there: a small margin is a late near-tie, a large one an early break.</p>",
            );
            any = true;
        }
        let _ = write!(
            h,
            "<details><summary>{}: {} of {} prompts differ</summary><table><tr><th>Prompt</th><th>First differing token</th><th>Reference margin</th><th>Reference</th><th>Model</th></tr>",
            esc(&who),
            list.len(),
            g.n
        );
        for d in list {
            let _ = write!(
                h,
                "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td></tr>",
                d.index,
                d.first_difference,
                esc(&or_dash(Some(d.reference_margin).filter(|m| m.is_finite()).map(|v| format!("{v:.4}")))),
                esc(&excerpt(&d.reference_text, 120)),
                esc(&excerpt(&d.model_text, 120)),
            );
        }
        h.push_str("</table></details>");
    }
    if !any {
        h.push_str("<p class=\"empty\">No continuation differs from its reference (or none was measured).</p>");
    }
}

fn chain(h: &mut String, report: &Report) {
    h.push_str("<h2>Identity chain</h2><table><tr><th>Step</th><th>Object</th><th>sha256</th><th>Size</th></tr>");
    for (step, files) in identity_chain(report) {
        for (url, sha, bytes) in files {
            let _ = write!(
                h,
                "<tr><td>{}</td><td><code>{}</code></td><td class=\"sha\"><code>{}</code></td><td class=\"num\">{}</td></tr>",
                esc(&step),
                esc(&url),
                esc(if sha.is_empty() { "—" } else { &sha }),
                esc(&if bytes == 0 { "—".to_string() } else { size(bytes) }),
            );
        }
    }
    h.push_str("</table>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_contained_and_escaped() {
        let html = render(&crate::views::sample::report());
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("smollm2-&lt;tuned&gt;"), "the release name is escaped");
        assert!(!html.contains("<script"), "no script");
        for fetch in ["src=", "href=", "url(", "@import"] {
            assert!(!html.contains(fetch), "nothing is fetched: found {fetch}");
        }
        assert_eq!(html.matches("<svg").count(), 5, "ladder, percentiles, same-top-p, greedy, probes");
        assert!(html.contains("SmolLM2-Q4_K_M: 105.0 MB · 5.30 bits/weight · mean KLD 0.063500 ± 0.001270"));
        // The measured GGUF rungs joined by size: Q4_K_M (105 MB), the Q4_K_XL recipe (112 MB), Q8_0 (145 MB).
        let line = &html[html.find("<g class=\"ladder\">").expect("the ladder line")..];
        let points = &line[line.find("points=\"").unwrap() + 8..];
        let xs: Vec<f64> = points[..points.find('"').unwrap()]
            .split(' ')
            .map(|p| p.split(',').next().unwrap().parse().unwrap())
            .collect();
        assert!(xs.len() == 3 && xs.windows(2).all(|w| w[0] < w[1]), "{xs:?}");
        assert!(html.contains(
            "<tr class=\"fail\"><td><span class=\"fail-mark\">FAIL</span></td><td>measured</td><td>Q6_K</td>"
        ));
    }

    #[test]
    fn an_unmeasured_release_says_so_instead_of_plotting() {
        let mut r = crate::views::sample::report();
        for a in &mut r.artifacts {
            a.kld = None;
            a.probes = None;
            a.greedy = None;
        }
        r.merge_check = None;
        let html = render(&r);
        assert_eq!(html.matches("<svg").count(), 0);
        assert!(html.contains("No level has a KL-divergence figure"));
    }
}
