//! `report.md`: the report for terminals and pull-request comments — verdict, ladder, gates, merge check,
//! identity chain — in GitHub-flavoured Markdown tables.

use std::fmt::Write as _;

use super::{fig, identity_chain, or_dash, or_null, rows, signer, size, verdict};
use crate::model::{MergeCheck, Report};

/// Escapes what would break a table cell or start Markdown markup.
pub(crate) fn cell(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '|' | '\\' | '*' | '_' | '`' | '<' | '>' | '[' | ']' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

pub fn render(report: &Report) -> String {
    let mut md = String::new();
    let rel = &report.release;
    let name = rel.name.as_str();
    let _ = writeln!(md, "# Parity report: {} — {}\n", cell(name), verdict(report).to_uppercase());
    let _ = writeln!(
        md,
        "Release `{}` from `{}` (sha256 `{}`), quantfarm {}. Signed by `{}`: check it with \
         `quantfarm report verify report.json --pubkey FARM.pub`.\n",
        rel.id,
        rel.spec_file,
        &rel.spec_sha256.chars().take(16).collect::<String>(),
        report.quantfarm_version,
        signer(report),
    );

    let _ = writeln!(md, "## Ladder\n");
    let _ = writeln!(
        md,
        "| Artifact | Size | Bits/weight | Mean KLD | 99% KLD | Same top p | PPL(Q)/PPL(base) | Greedy identical | Probes passed | Reproduced |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|");
    for r in rows(report) {
        let k = r.a.kld_figures();
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {} | {} | {} | {} | {} | {} | {} |",
            cell(r.name),
            size(r.bytes),
            r.bpw,
            or_dash(r.kld.map(|(m, u)| format!("{m:.6} ± {u:.6}"))),
            or_dash(fig(k, |k| k.kld_p99).map(|v| format!("{v:.4}"))),
            or_dash(
                fig(k, |k| k.same_top_p)
                    .map(|v| format!("{v:.2} ± {:.2} %", fig(k, |k| k.same_top_p_unc).unwrap_or(0.0)))
            ),
            or_dash(fig(k, |k| k.mean_ppl_ratio).map(|v| format!("{v:.4}"))),
            or_dash(r.greedy.map(|(k, n)| format!("{k}/{n}"))),
            super::probe_cell(&r),
            if r.a.verified { "yes" } else { "**no**" },
        );
    }
    if let Some((m, s)) = super::reference_probe(report) {
        let _ = writeln!(md, "\nReference (GGUF BF16) probes: {:.1} ± {:.1} % passed.", 100.0 * m, 100.0 * s);
    }
    if let Some(e) = &report.evaluation {
        let _ = writeln!(
            md,
            "\nKL divergence against the GGUF BF16 on `{}` (sha256 `{}`), {} chunks of {} tokens, by \
             llama-perplexity's procedure.",
            cell(&e.text),
            e.text_sha256.as_deref().unwrap_or("—").chars().take(16).collect::<String>(),
            or_null(e.n_chunks),
            e.ctx,
        );
        if e.n_prompts > 0 {
            let _ = writeln!(
                md,
                "\nGreedy agreement on {} prompts at temperature 0, up to {} tokens each.",
                e.n_prompts, e.max_tokens,
            );
        }
    }

    let third = super::third_party_rows(report);
    if !third.is_empty() {
        let _ = writeln!(
            md,
            "\n## Third-party files\n\nGGUF files of the same base made elsewhere, scored against the same base logits.\n"
        );
        let _ = writeln!(md, "| {} |", super::THIRD_PARTY_HEADER.join(" | "));
        let _ = writeln!(md, "|---|---:|---:|---:|---|---:|");
        for r in third {
            let _ = writeln!(md, "| {} |", r.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | "));
        }
    }
    let choices = super::choice_rows(report);
    if !choices.is_empty() {
        let about = "As `llama-perplexity --multiple-choice` scores it; tasks numbered from 1.";
        table(&mut md, "Multiple choice", about, &super::CHOICE_HEADER, "|---|---:|---|---|---|", &choices);
    }
    if let Some((about, rows)) = super::paired_rows(report) {
        table(&mut md, "Paired comparisons", &about, &super::PAIRED_HEADER, "|---|---:|---:|---:|---|", &rows);
    }

    if let Some((about, rows)) = super::sequential_rows(report) {
        table(&mut md, "Sequential measurement", &about, &super::SEQUENTIAL_HEADER, "|---|---:|---|---|---|", &rows);
    }
    if let Some((about, rows)) = super::search_rows(report) {
        table(&mut md, "Searched rungs", &about, &super::SEARCH_HEADER, "|---|---|---:|---:|---:|---:|", &rows);
        let frontier = super::frontier_rows(report);
        let about = "Every GGUF rung measured, smallest first: size against KL divergence.";
        table(&mut md, "Frontier", about, &super::FRONTIER_HEADER, "|---|---:|---:|---:|", &frontier);
    }
    match super::coverage_rows(report) {
        Some((about, rows)) if rows.is_empty() => {
            let _ = writeln!(md, "\n## Importance matrix: experts reached\n\n{about}");
        }
        Some((about, rows)) => table(
            &mut md,
            "Importance matrix: experts reached",
            &about,
            &super::COVERAGE_HEADER,
            "|---|---:|---|",
            &rows,
        ),
        None => {}
    }

    match &report.comparison {
        Some(crate::model::Comparison::Diff(d)) => {
            let _ = writeln!(md, "\n## Since {} ({})\n\n{}", cell(&d.old.name), d.old.id, d.markdown_body("###"));
        }
        Some(crate::model::Comparison::Unavailable { with, error }) => {
            let _ = writeln!(md, "\n## Since {}\n\nNo comparison: {}.", cell(with), cell(error));
        }
        None => {}
    }

    let _ = writeln!(md, "\n## Gates\n");
    let _ = writeln!(md, "| | Gate | Level | Check | Inputs | Threshold | Detail |");
    let _ = writeln!(md, "|:---:|---|---|---|---|---:|---|");
    for g in &report.gates {
        let ok = g.passed;
        let inputs: Vec<String> = super::gate_inputs(g)
            .into_iter()
            .map(|(k, v)| match v {
                super::Input::Missing(why) => format!("{k}: missing ({why})"),
                super::Input::Value(v) => format!("{k} = {v}"),
            })
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | `{}` | {} | {} | {} |",
            if ok { "✅" } else { "❌" },
            cell(&g.name),
            cell(g.level.as_deref().unwrap_or("—")),
            g.check.replace('`', "'").replace('|', "\\|"),
            cell(&inputs.join("; ")),
            or_dash(g.threshold.map(crate::gates::expr::fmt_num)),
            cell(&g.detail),
        );
    }

    match &report.merge_check {
        Some(MergeCheck::Measured(m)) => {
            let _ = writeln!(
            md,
            "\n## Merge check (link 1)\n\nThe merge (rounded to f32) against the base with the adapter applied at run time: \
             {}/{} prompts byte-identical, mean common prefix {:.3}.",
            m.greedy.identical,
            m.greedy.n,
            m.greedy.mean_prefix_fraction
        );
        }
        Some(MergeCheck::Unmeasured { error }) => {
            let _ = writeln!(md, "\n## Merge check (link 1)\n\n{}", cell(error));
        }
        None => {}
    }

    cross_runtime(&mut md, report);
    transformers(&mut md, report);

    let mut diverged = String::new();
    for r in rows(report) {
        for d in r.a.greedy.iter().flat_map(|g| &g.disagreements) {
            let _ = writeln!(
                diverged,
                "| {} | {} | {} | {} |",
                cell(r.name),
                d.index,
                d.first_difference,
                or_dash(Some(d.reference_margin).filter(|m| m.is_finite()).map(|v| format!("{v:.4}")))
            );
        }
    }
    if !diverged.is_empty() {
        let _ = writeln!(
            md,
            "\n## Greedy divergences\n\nWhere each differing continuation first differs, and the reference's top-2 \
             logit margin there (a small margin is a near-tie, not a break).\n\n| Artifact | Prompt | First differing token | Reference margin |\n|---|---:|---:|---:|\n{diverged}"
        );
    }

    let _ = writeln!(md, "\n## Identity chain\n\n| Step | Object | sha256 | Size |\n|---|---|---|---:|");
    for (step, files) in identity_chain(report) {
        for (url, sha, bytes) in files {
            let _ = writeln!(
                md,
                "| {} | `{}` | `{}` | {} |",
                cell(&step),
                url.replace('`', "'"),
                if sha.is_empty() { "—".to_string() } else { sha },
                if bytes == 0 { "—".to_string() } else { size(bytes) }
            );
        }
    }
    md
}

/// The bf16 checkpoint and each vLLM rung in transformers (as saved and weight-only).
fn transformers(md: &mut String, report: &Report) {
    let Some(f) = &report.transformers else { return };
    let _ = writeln!(md, "\n## transformers: the vLLM rungs as vLLM computes them\n");
    let runtimes: Vec<String> = f
        .runtimes
        .iter()
        .map(|r| {
            format!(
                "torch {} / transformers {} / compressed-tensors {} on {}",
                r.torch,
                r.transformers,
                if r.compressed_tensors.is_empty() { "—" } else { &r.compressed_tensors },
                r.device
            )
        })
        .collect();
    let _ = writeln!(
        md,
        "The GGUF BF16's source checkpoint (`{}`) and each vLLM rung run in {}; fed the token ids llama.cpp was fed. \
         *as-saved* quantizes FP8_DYNAMIC's inputs per token (vLLM's W8A8 path, emulated); *weight-only* runs the \
         decompressed weights with bf16 inputs; with a PEFT adapter, the base with the adapter applied at run time, \
         unmerged, is compared with the merge (the merge check in transformers).\n",
        f.model.replace('`', "'"),
        if runtimes.is_empty() { "transformers".to_string() } else { cell(&runtimes.join(", ")) }
    );
    let _ = writeln!(md, "| Model in transformers | Activations | Compared with | Greedy identical | Mean prefix | Mean KLD vs llama.cpp BF16 | Same top p | Probes passed | Loaded |");
    let _ = writeln!(md, "|---|---|---|---:|---:|---:|---:|---:|---|");
    for (s, with) in f.subjects() {
        let k = match &s.kld {
            Some(crate::model::Kld::Measured(k)) => Some(k),
            _ => None,
        };
        let loaded = match (&s.load_error, &s.scheme) {
            (Some(e), _) => format!("**failed**: {}", cell(e)),
            (None, Some(scheme)) => format!("decompressed ({})", cell(scheme)),
            (None, None) => "bf16".to_string(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            cell(&s.label()),
            cell(&s.activations),
            with,
            or_dash(s.greedy.as_ref().map(|g| format!("{}/{}", g.identical, g.n))),
            or_dash(s.greedy.as_ref().map(|g| format!("{:.3}", g.mean_prefix_fraction))),
            or_dash(k.map(|k| format!("{:.6} ± {:.6}", k.mean_kld, k.mean_kld_unc))),
            or_dash(k.map(|k| format!("{:.2} %", k.same_top_p))),
            super::probes_cell(s.probes.as_ref()),
            loaded,
        );
    }
}

/// Link 2 across runtimes: the bf16 weights and each MLX rung in mlx-lm, with each divergence of the bf16 run.
fn cross_runtime(md: &mut String, report: &Report) {
    let Some(c) = &report.cross_runtime else { return };
    let _ = writeln!(md, "\n## Cross-runtime check (link 2): llama.cpp and mlx-lm\n");
    let Some(f) = c.figures() else {
        if let crate::model::CrossRuntime::Unmeasured { error } = c {
            let _ = writeln!(md, "{}", cell(error));
        }
        return;
    };
    let runtimes: Vec<String> = f
        .runtimes
        .iter()
        .map(|r| format!("mlx {} / mlx-lm {} on {} ({})", r.mlx, r.mlx_lm, r.device, r.device_name))
        .collect();
    let _ = writeln!(
        md,
        "The GGUF BF16's weights (`{}`) and each MLX rung run in {}; fed the token ids llama.cpp was fed.\n",
        f.model.replace('`', "'"),
        if runtimes.is_empty() { "mlx-lm".to_string() } else { cell(&runtimes.join(", ")) }
    );
    let _ = writeln!(md, "| Model in mlx-lm | Compared with | Greedy identical | Mean prefix | Mean KLD vs llama.cpp BF16 | Same top p | Probes on mlx_lm.server | Loaded |");
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|---:|---|");
    for (s, with) in std::iter::once((&f.bf16, "llama.cpp GGUF BF16")).chain(f.rungs.iter().map(|r| (r, "mlx-lm BF16")))
    {
        let k = match &s.kld {
            Some(crate::model::Kld::Measured(k)) => Some(k),
            _ => None,
        };
        let loaded = match (&s.load_error, s.upcast) {
            (Some(e), _) => format!("**failed**: {}", cell(e)),
            (None, Some(true)) => "upcast to f32 (CPU build)".to_string(),
            (None, Some(false)) => "as stored".to_string(),
            (None, None) => "—".to_string(),
        };
        // The HF layout mlx-lm cannot load was given to it as quantfarm's unquantized MLX conversion.
        let loaded = match &s.converted {
            Some(_) if s.load_error.is_none() => format!("{loaded}; as quantfarm's MLX conversion"),
            _ => loaded,
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            cell(&s.file_type),
            with,
            or_dash(s.greedy.as_ref().map(|g| format!("{}/{}", g.identical, g.n))),
            or_dash(s.greedy.as_ref().map(|g| format!("{:.3}", g.mean_prefix_fraction))),
            or_dash(k.map(|k| format!("{:.6} ± {:.6}", k.mean_kld, k.mean_kld_unc))),
            or_dash(k.map(|k| format!("{:.2} %", k.same_top_p))),
            super::mlx_lm_probes(s),
            loaded,
        );
    }
    let diverged: Vec<String> = f
        .bf16
        .greedy
        .iter()
        .flat_map(|g| &g.disagreements)
        .map(|d| {
            format!(
                "| {} | {} | {} | {} |",
                d.index,
                d.first_difference,
                or_dash(Some(d.reference_margin).filter(|m| m.is_finite()).map(|v| format!("{v:.4}"))),
                cell(&format!("{} ⟶ {}", d.reference_text, d.model_text)),
            )
        })
        .collect();
    if !diverged.is_empty() {
        let _ = writeln!(
            md,
            "\nWhere mlx-lm's bf16 continuation first differs from llama.cpp's, with llama.cpp's top-2 margin there:\n\n\
             | Prompt | First differing token | llama.cpp margin | llama.cpp ⟶ mlx-lm |\n|---:|---:|---:|---|\n{}",
            diverged.join("\n")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_level_gate_and_file() {
        let md = render(&crate::views::sample::report());
        assert!(md.starts_with("# Parity report: smollm2-\\<tuned\\> — GATE FAILED"), "{md}");
        assert!(md.contains("| SmolLM2-Q4\\_K\\_M | 105.0 MB | 5.30 | 0.063500 ± 0.001270 |"), "{md}");
        assert!(md.contains("| SmolLM2-Q6\\_K | 138.0 MB | 6.60 | — |"), "{md}");
        assert!(md.contains("| ❌ | measured | Q6\\_K |"), "{md}");
        assert!(md.contains("| ✅ | kld | Q4\\_K\\_M | `kld.mean <= default.kld.mean` | default.kld.mean = 0.1; kld.mean = 0.0635 | 0.1 |"), "{md}");
        assert!(md.contains("20/20 prompts byte-identical"), "{md}");
        assert!(md.contains("Reference (GGUF BF16) probes: 75.0 ± 4.0 % passed."), "{md}");
        assert!(md.contains("| SmolLM2-Q8\\_0 | 3 | 17 | 0.0120 |"), "{md}");
        assert_eq!(
            md.matches(&"0f".repeat(32)).count(),
            6,
            "the adapter file's and every artifact file's sha256: {md}"
        );
    }

    #[test]
    fn cells_cannot_break_the_table() {
        assert_eq!(cell("a|b\nc"), "a\\|b c");
    }
}

/// A section of its own: the heading, the sentence under it, and a table of `rows` under `header` (`align`: the
/// markdown alignment row).
fn table<const N: usize>(
    md: &mut String,
    heading: &str,
    about: &str,
    header: &[&str; N],
    align: &str,
    rows: &[[String; N]],
) {
    let _ = writeln!(md, "\n## {heading}\n\n{about}\n");
    let _ = writeln!(md, "| {} |", header.join(" | "));
    let _ = writeln!(md, "{align}");
    for r in rows {
        let _ = writeln!(md, "| {} |", r.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | "));
    }
}
