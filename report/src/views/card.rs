//! The model card: a `README.md` ready for a model repository (Hugging Face's YAML front matter, then the method,
//! the dataset with its checksum, the run id, and the parity table per artifact), so what is published carries its
//! own proof and the way to check it.

use std::fmt::Write as _;

use serde_json::Value;

use super::markdown::cell;
use super::{fig, or_dash, or_null, rows, signer, size, verdict};
use crate::model::{Container, Report};
use crate::ModelCard;

/// A YAML scalar in double quotes (front matter values may hold ':' or '#').
fn yaml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

pub fn render(report: &Report) -> String {
    let rel = &report.release;
    // The spec is the release.yaml as resolved: the card reads its `card`, `base_name`, `adapter` and MLX group size.
    let spec = &rel.spec;
    let card: ModelCard = spec.get("card").and_then(|c| serde_json::from_value(c.clone()).ok()).unwrap_or_default();
    let name = rel.name.as_str();
    let base_model = card.base_model.as_deref().or_else(|| rel.spec_str("base_name"));
    let license = card.license.as_deref();
    let artifacts = rows(report);
    let has_gguf = artifacts.iter().any(|r| r.a.container == Container::Gguf);
    let has_mlx = artifacts.iter().any(|r| r.a.container == Container::Mlx);
    let vllm: Vec<&str> =
        artifacts.iter().filter(|r| r.a.container == Container::Vllm).map(|r| r.a.name.as_str()).collect();

    let mut md = String::from("---\n");
    if let Some(l) = license {
        let _ = writeln!(md, "license: {}", yaml_str(l));
    }
    if let Some(b) = base_model {
        let _ = writeln!(md, "base_model: {}", yaml_str(b));
        let _ = writeln!(md, "base_model_relation: quantized");
    }
    md.push_str("tags:\n");
    let vllm_tags = (!vllm.is_empty()).then_some(["vllm", "compressed-tensors"]).into_iter().flatten();
    let tags = ["quantized", "quantfarm"].into_iter().chain(has_gguf.then_some("gguf")).chain(has_mlx.then_some("mlx"));
    for t in tags.chain(vllm_tags) {
        let _ = writeln!(md, "  - {t}");
    }
    for t in &card.tags {
        let _ = writeln!(md, "  - {}", yaml_str(t));
    }
    md.push_str("---\n\n");

    let _ = writeln!(md, "# {}\n", cell(name));
    if let Some(d) = &card.description {
        let _ = writeln!(md, "{}\n", d.trim());
    }
    let _ = writeln!(
        md,
        "Quantized artifacts of {}, each measured against the GGUF BF16 reference and published with a signed parity \
         report. Verdict of the release: **{}**.\n",
        base_model.map_or_else(|| format!("`{}`", report.source.url), |b| format!("[{b}](https://huggingface.co/{b})")),
        verdict(report),
    );
    if license.is_none() {
        md.push_str("Licence: not stated in the release (`card.license`); see the base model's licence.\n\n");
    } else if let (Some(l), Some(b)) = (license, base_model) {
        let _ = writeln!(md, "Licence: {} (as the base model {b}).\n", cell(l));
    }

    md.push_str("## Parity\n\n| File | Size | Bits/weight | Mean KLD | Same top p | PPL ratio | Greedy identical | Probes passed |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in &artifacts {
        let k = r.a.kld_figures();
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {} | {} | {} | {} | {} |",
            cell(r.name),
            size(r.bytes),
            r.bpw,
            or_dash(r.kld.map(|(m, u)| format!("{m:.4} ± {u:.4}"))),
            or_dash(fig(k, |k| k.same_top_p).map(|v| format!("{v:.1} %"))),
            or_dash(fig(k, |k| k.mean_ppl_ratio).map(|v| format!("{v:.3}"))),
            or_dash(r.greedy.map(|(k, n)| format!("{k}/{n}"))),
            super::probe_cell(r),
        );
    }
    md.push_str("\nMean KLD: KL divergence from the GGUF BF16 per token (nats, lower is closer), by llama-perplexity's procedure. \
                 Greedy identical: prompts whose temperature-0 continuation is byte-identical to the reference's.\n\n");
    let failed: Vec<String> =
        report.gates.iter().filter(|g| !g.passed).map(|g| format!("- `{}`: {}", g.name, cell(&g.detail))).collect();
    if !failed.is_empty() {
        let _ = writeln!(md, "Gates that failed:\n\n{}\n", failed.join("\n"));
    }

    md.push_str("## Method\n\n");
    if let Some(adapter) = rel.spec_str("adapter") {
        let m = report.merge_check.as_ref().and_then(|m| m.greedy());
        let _ = writeln!(
            md,
            "- Adapter `{}` merged into the base exactly (f64, rounded once){}.",
            adapter.replace('`', "'"),
            match m.map(|m| (m.identical, m.n)) {
                Some((k, n)) => format!("; the merge gives {k}/{n} greedy continuations identical to the base with the adapter applied at run time"),
                _ => String::new(),
            }
        );
    }
    md.push_str("- Converted to GGUF BF16 by the architecture's mapping; every artifact recomputed from its input on another worker and compared byte for byte.\n");
    if has_gguf {
        md.push_str("- GGUF quants made with llama-quantize's algorithms and mixtures (the same bytes llama-quantize writes).\n");
        for r in artifacts.iter().filter_map(|r| Some((r.a.file_type.as_str(), r.a.recipe.as_ref()?))) {
            // A code span: no escapes, so no backtick or line break (a recipe's name is letters, digits, _ and -).
            let args = r.1.llama_quantize_args.join(" ").replace('`', "'").replace(['\n', '\r'], " ");
            let _ = writeln!(md, "- `{}` is a recipe, made as `llama-quantize {args}` makes it.", r.0);
        }
    }
    if has_mlx {
        let mlx: Vec<&str> = artifacts.iter().filter(|r| r.a.container == Container::Mlx).map(|r| r.name).collect();
        let mut how = format!(
            "affine, group size {}",
            spec.pointer("/outputs/mlx/group_size").and_then(Value::as_u64).unwrap_or(64)
        );
        if mlx.iter().any(|n| n.contains("MLX-mixed_")) {
            how.push_str("; `MLX-mixed_*` by mlx-lm's `--quant-predicate` recipe");
        }
        if mlx.iter().any(|n| ["MLX-mxfp4", "MLX-nvfp4", "MLX-mxfp8"].iter().any(|m| n.ends_with(m))) {
            how.push_str("; `MLX-mxfp4`, `MLX-nvfp4`, `MLX-mxfp8` by `--q-mode`, in their own group sizes");
        }
        let _ = writeln!(
            md,
            "- MLX checkpoints quantized as `mlx_lm.convert -q` writes them ({how}); each folder loads with \
             `mlx_lm.generate --model ./FOLDER`."
        );
    }
    if !vllm.is_empty() {
        let _ = writeln!(
            md,
            "- vLLM checkpoints in compressed-tensors' format, the bytes llm-compressor's `{}` writes (round to \
             nearest, no calibration data; W4A16 group size {}). vLLM reads the format from `config.json`, so no \
             `--quantization` flag is needed:",
            match spec.pointer("/outputs/vllm/like").and_then(Value::as_str) {
                Some("model-free") => "model_free_ptq",
                _ => "oneshot",
            },
            spec.pointer("/outputs/vllm/group_size").and_then(Value::as_u64).unwrap_or(64)
        );
        for name in &vllm {
            let _ = writeln!(md, "  `vllm serve ./{}`", name.replace('`', "'"));
        }
    }
    if let Some(e) = &report.evaluation {
        md.push_str("\n## Dataset\n\n");
        let _ = writeln!(
            md,
            "- KL divergence text: `{}`, sha256 `{}`, {} chunks of {} tokens (tokens sha256 `{}`).",
            e.text.replace('`', "'"),
            e.text_sha256.as_deref().unwrap_or("—"),
            or_null(e.n_chunks),
            e.ctx,
            e.tokens_sha256.as_deref().unwrap_or("—"),
        );
        if !e.prompts.is_empty() {
            let _ = writeln!(
                md,
                "- Greedy prompts: `{}` ({} prompts, {} tokens each).",
                e.prompts.replace('`', "'"),
                e.n_prompts,
                e.max_tokens
            );
        }
        if let Some(p) = Some(&e.probes).filter(|p| !p.is_empty()) {
            let _ = writeln!(md, "- Task probes: `{}`.", p.replace('`', "'"));
        }
    }
    if let Some((about, rows)) = super::coverage_rows(report) {
        let _ = writeln!(md, "\n## Importance matrix\n\n{about}");
        for [weight, share, unrouted] in rows {
            let _ = writeln!(md, "- `{weight}`: {share} experts with tokens; without: {unrouted}.");
        }
    }

    md.push_str("\n## Files\n\n| File | sha256 |\n|---|---|\n");
    for r in &artifacts {
        for f in &r.a.files {
            let file = r.a.published_path(f).unwrap_or_else(|| f.url.clone());
            let _ = writeln!(md, "| `{}` | `{}` |", file.replace('`', "'"), f.sha256);
        }
    }
    if artifacts.iter().any(|r| r.a.files.iter().any(|f| r.a.is_folder(f))) {
        md.push_str(
            "\nA folder's sha256 is its folder digest: the sha256 of its files' `sha256  name` lines (as `sha256sum` \
             prints them) sorted by name.\n",
        );
    }
    let _ = writeln!(
        md,
        "\n## Provenance\n\nRelease `{}`, made by quantfarm {}. The parity report (`report.json`, signed by `{}`; \
         also `report.intoto.json`, an in-toto attestation in a DSSE envelope) holds every figure above with its \
         uncertainty and every task's inputs: `quantfarm report verify report.json --pubkey FARM.pub`.",
        rel.id,
        report.quantfarm_version,
        signer(report),
    );
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_matter_table_and_provenance() {
        let md = render(&crate::views::sample::report());
        assert!(
            md.starts_with("---\nlicense: \"apache-2.0\"\nbase_model: \"HuggingFaceTB/SmolLM2-135M-Instruct\"\n"),
            "{md}"
        );
        assert!(md.contains("  - gguf\n") && !md.contains("  - mlx\n"));
        assert!(md.contains("| SmolLM2-Q4\\_K\\_M | 105.0 MB | 5.30 | 0.0635 ± 0.0013 |"), "{md}");
        assert!(md.contains("Verdict of the release: **gate failed**"));
        assert!(md.contains("- `measured`: Q6\\_K: not measured"), "{md}");
        assert!(md.contains(&format!("sha256 `{}`", "cc".repeat(32))), "the dataset's checksum");
        assert!(md.contains("Release `r1`"));
        assert!(md.contains(&format!("| `SmolLM2-Q8_0.gguf` | `{}` |", "0f".repeat(32))));
        assert!(
            md.contains("- `Q4_K_XL` is a recipe, made as `llama-quantize --tensor-type ffn_down=Q6_K --token-embedding-type Q8_0 Q4_K_M` makes it."),
            "{md}"
        );
    }
}
