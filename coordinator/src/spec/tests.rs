use super::*;

const GOOD: &str = "name: smollm2\nsource: ./m\noutputs:\n  gguf:\n    split: {max_tensors: 100}\n    quants: [Q8_0]\n";

#[test]
fn an_imatrix_is_a_file_or_computed_from_a_text() {
    let with = |im: &str| ReleaseSpec::parse(&format!("{GOOD}    imatrix: {im}\n"), "release.yaml");
    assert_eq!(with("{file: im.gguf}").unwrap().imatrix(), Some(&ImatrixSource::File("im.gguf".into())));
    let t = with("{text: c.txt, chunks: 10}").unwrap();
    assert_eq!(
        t.imatrix(),
        Some(&ImatrixSource::Text {
            text: "c.txt".into(),
            chunks: Some(10),
            ctx: 512,
            batch: 2048,
            all_experts: false
        })
    );
    // Written back as read (the report's spec).
    let yaml = serde_norway::to_string(&t).unwrap();
    assert_eq!(ReleaseSpec::parse(&yaml, "again.yaml").unwrap().imatrix(), t.imatrix());
    for (bad, says) in [
        ("im.gguf", "imatrix"),
        ("{}", "expected {file: PATH}"),
        ("{file: a, text: b}", "not both"),
        ("{file: a, chunks: 3}", "go with `text`"),
        ("{text: b, ctx: 512, batch: 1000}", "imatrix.batch"),
        ("{text: b, chunks: 0}", "imatrix.chunks"),
        ("{text: b, chunk: 3}", "chunk"),
    ] {
        let err = with(bad).unwrap_err().to_string();
        assert!(err.contains("release.yaml") && err.contains(says), "{bad}: {err}");
    }
}

#[test]
fn parses_without_gates_of_its_own() {
    let s = ReleaseSpec::parse(GOOD, "release.yaml").unwrap();
    assert_eq!(s.quants(), &[Rung::File(quantfarm_ggml::FileType::Q8_0)]);
    assert!(s.gates.is_empty(), "the defaults are added when the gates are evaluated");
    assert_eq!(s.prefix(), "smollm2");
    assert_eq!(s.levels().iter().map(EvalTarget::to_string).collect::<Vec<_>>(), ["Q8_0"]);
}

#[test]
fn unknown_key_names_line_and_key() {
    let text = GOOD.replace("    quants", "    quant_levels: [Q4_0]\n    quants");
    let e = ReleaseSpec::parse(&text, "release.yaml").unwrap_err().to_string();
    assert!(e.contains("release.yaml") && e.contains("quant_levels") && e.contains("line 6"), "{e}");
}

#[test]
fn bad_quant_type_is_named() {
    let e = ReleaseSpec::parse(&GOOD.replace("Q8_0", "Q9_X"), "r.yaml").unwrap_err().to_string();
    assert!(e.contains("Q9_X") && e.contains("line 6"), "{e}");
}

#[test]
fn semantic_errors() {
    let both = GOOD.replace("{max_tensors: 100}", "{max_tensors: 100, max_size: 2G}");
    assert!(ReleaseSpec::parse(&both, "r").unwrap_err().to_string().contains("exactly one"));
    let bad_name = GOOD.replace("smollm2", "../x");
    assert!(ReleaseSpec::parse(&bad_name, "r").unwrap_err().to_string().contains("name"));
    let gate = format!("{GOOD}gates:\n  - {{name: g, check: 'q4_0.kld.mean <= 0.1'}}\n");
    assert!(ReleaseSpec::parse(&gate, "r").unwrap_err().to_string().contains("unknown figure \"q4_0.kld.mean\""));
    let unmeasured = format!("{GOOD}gates:\n  - {{name: g, check: 'q8_0.kld.mean <= 0.1'}}\n");
    assert!(ReleaseSpec::parse(&unmeasured, "r").unwrap_err().to_string().contains("needs evaluation.text"));
    let old = format!("{GOOD}gates:\n  - {{name: g, rule: kld_mean, level: Q8_0, max: 0.1}}\n");
    assert!(ReleaseSpec::parse(&old, "r").unwrap_err().to_string().contains("unknown field `rule`"));
    // A level llama-quantize makes only with an importance matrix, without one: named, with both forms.
    let e = ReleaseSpec::parse(&GOOD.replace("[Q8_0]", "[Q8_0, IQ3_XXS]"), "r").unwrap_err().to_string();
    assert!(e.contains("IQ3_XXS") && e.contains("imatrix: {file: PATH}") && e.contains("imatrix: {text: PATH}"), "{e}");
    let with = GOOD.replace("[Q8_0]", "[Q8_0, IQ3_XXS]\n    imatrix: {file: im.gguf}");
    assert!(ReleaseSpec::parse(&with, "r").is_ok());
}

#[test]
fn recipes_are_rungs_named_apart_and_refused_without_the_imatrix_they_need() {
    let recipe = "{name: Q4_K_XL, base: Q4_K_M, tensor_types: {ffn_down: q6_k}}";
    let s = ReleaseSpec::parse(&GOOD.replace("[Q8_0]", &format!("[Q8_0, {recipe}]")), "r").unwrap();
    assert_eq!(s.levels().iter().map(EvalTarget::to_string).collect::<Vec<_>>(), ["Q8_0", "Q4_K_XL"]);
    let xl = s.rung(Level::parse("Q4_K_XL").unwrap()).unwrap();
    assert_eq!(xl.base(), quantfarm_ggml::FileType::Q4_K_M);
    // Written back and read again (the journal keeps the spec so), the same rungs.
    let again = ReleaseSpec::parse(&serde_norway::to_string(&s).unwrap(), "again").unwrap();
    assert_eq!(again.quants(), s.quants());
    for (quants, says) in [
        (format!("[{recipe}, {recipe}]"), "Q4_K_XL is listed twice"),
        (format!("[{recipe}, {}]", recipe.replace("Q4_K_XL", "q4-k-xl")), "have the same name in gates"),
        ("[{name: R, base: Q4_K_M, tensor_types: {ffn_down: iq1_s}}]".into(), "R (a recipe) names IQ1_S"),
        ("[{name: R, base: IQ2_M}]".into(), "R (a recipe) names IQ2_M"),
    ] {
        let e = ReleaseSpec::parse(&GOOD.replace("[Q8_0]", &quants), "r").unwrap_err().to_string();
        assert!(e.contains(says), "{quants}: {e}");
        if says.contains("names") {
            assert!(e.contains("imatrix: {file: PATH}") && e.contains("imatrix: {text: PATH}"), "{e}");
        }
    }
}

#[test]
fn adapter_and_mlx_outputs() {
    let text = "name: r\nsource: ./m\nadapter: ./a\nbase_name: org/m\noutputs:\n  mlx: {bits: [4, 8]}\n";
    let s = ReleaseSpec::parse(text, "r").unwrap();
    let rungs = [MlxRung::Bits(4), MlxRung::Bits(8)];
    assert_eq!((s.adapter.as_deref(), s.mlx_rungs(), s.converts()), (Some("./a"), rungs.to_vec(), true));
    assert_eq!(s.outputs.mlx.as_ref().unwrap().group_size, 64);
    for (bad, says) in [
        (text.replace("[4, 8]", "[7]"), "outputs.mlx.bits: 7"),
        (text.replace("[4, 8]", "[4, 4]"), "outputs.mlx.bits: 4"),
        (text.replace("{bits: [4, 8]}", "{bits: [4], group_size: 48}"), "outputs.mlx.group_size: 48"),
        (text.replace("{bits: [4, 8]}", "{}"), "outputs.mlx: names no bit width"),
        (text.replace("{bits: [4, 8]}", "{recipes: [mixed_3_6, mixed_3_6]}"), "mixed_3_6 is named twice"),
        (text.replace("{bits: [4, 8]}", "{recipes: [mixed_4_8]}"), "mixed_4_8"),
        (text.replace("adapter: ./a\n", ""), "base_name: names the base"),
    ] {
        let e = ReleaseSpec::parse(&bad, "r").unwrap_err().to_string();
        assert!(e.contains(says), "{e}");
    }
}

#[test]
fn merge_gate_and_skipped_levels() {
    let text = "name: r\nsource: ./m\nadapter: ./a\noutputs:\n  gguf: {quants: [Q8_0]}\n  mlx: {bits: [4]}\n\
                evaluation: {prompts: p.json, skip: [MLX-4bit]}\n\
                gates:\n  - {name: merge-exact, check: 'merge.greedy.agree >= 1'}\n";
    let s = ReleaseSpec::parse(text, "r").unwrap();
    assert_eq!(s.gates[0].check, "merge.greedy.agree >= 1");
    assert_eq!(s.levels().iter().map(EvalTarget::to_string).collect::<Vec<_>>(), ["Q8_0", "MLX-4bit"]);
    let q8 = EvalTarget::parse("Q8_0").unwrap();
    assert!(s.measures(q8) && !s.measures(EvalTarget::Mlx(MlxRung::Bits(4))));
    for (bad, says) in [
        (text.replace(">= 1", ">= "), "right-hand side"),
        (text.replace("check:", "rule:"), "unknown field `rule`"),
        (text.replace("adapter: ./a\n", ""), "needs an adapter"),
        (text.replace("prompts: p.json", "probes: p.yaml"), "needs an adapter and evaluation.prompts"),
        (text.replace("skip: [MLX-4bit]", "skip: [Q6_K]"), "evaluation.skip: \"Q6_K\""),
    ] {
        let e = ReleaseSpec::parse(&bad, "r").unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn the_merge_check_in_transformers_needs_an_adapter_and_the_runtime() {
    let text = "name: r\nsource: ./m\nadapter: ./a\noutputs:\n  gguf: {quants: [Q8_0]}\n\
                evaluation: {text: t.txt, prompts: p.json, transformers: true}\n\
                gates:\n  - {name: merge, check: 'merge.transformers.greedy.agree >= 1'}\n";
    let s = ReleaseSpec::parse(text, "r").unwrap();
    // An adapter is enough for transformers to run (its base is an HF checkpoint), without a vLLM output.
    assert!(s.runs_transformers());
    for (bad, says) in [
        (text.replace("adapter: ./a\n", ""), "merge.transformers.greedy.agree is the merge check in transformers"),
        (text.replace(", transformers: true", ""), "evaluation.transformers: true"),
        (text.replace("prompts: p.json, ", ""), "merge.transformers.greedy.agree needs evaluation.prompts"),
    ] {
        let e = ReleaseSpec::parse(&bad, "r").unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
    let plain = text
        .replace("adapter: ./a\n", "")
        .replace("  - {name: merge, check: 'merge.transformers.greedy.agree >= 1'}\n", "");
    assert!(
        !ReleaseSpec::parse(&plain.replace("gates:\n", ""), "r").unwrap().runs_transformers(),
        "no vLLM output, no adapter"
    );
}

#[test]
fn evaluation_section() {
    let text = format!("{GOOD}evaluation: {{text: t.txt, chunks: 8}}\ngates:\n  - {{name: g, levels: [Q8_0], check: 'kld.mean <= 0.01'}}\n");
    let s = ReleaseSpec::parse(&text, "r").unwrap();
    let e = s.evaluation.as_ref().unwrap();
    assert_eq!((e.text.as_deref(), e.ctx, e.batch, e.chunks), (Some("t.txt"), 512, 2048, Some(8)));
    assert_eq!((e.prompts.as_deref(), e.max_tokens, e.prompt_shares, e.context), (None, 64, 2, 4096));
    for (bad, says) in [
        (text.replace("chunks: 8", "batch: 700"), "evaluation.batch: 700"),
        (text.replace("chunks: 8", "ctx: 4"), "evaluation.ctx: 4"),
        (text.replace("chunks: 8", "chunks: 0"), "evaluation.chunks"),
        (text.replace("chunks: 8", "chunk: 8"), "chunk"),
        (text.replace("chunks: 8", "prompt_shares: 0"), "evaluation.prompt_shares: 0"),
        (text.replace("chunks: 8", "peers: [llama-bench]"), "llama-bench"),
        (text.replace("text: t.txt, chunks: 8", "ctx: 512"), "names nothing to measure"),
    ] {
        let e = ReleaseSpec::parse(&bad, "r").unwrap_err().to_string();
        assert!(e.contains(says), "{e}");
    }
}

#[test]
fn decimal_sizes() {
    assert_eq!(parse_decimal_size("500M").unwrap(), 500_000_000);
    assert_eq!(parse_decimal_size("2GB").unwrap(), 2_000_000_000);
    assert!(parse_decimal_size("x").is_err());
}

#[test]
fn a_comparison_names_an_earlier_release_and_a_confidence_is_a_fraction() {
    let with = |e: &str| ReleaseSpec::parse(&format!("{GOOD}evaluation:\n  text: t.txt\n{e}"), "r");
    let s = with("  compare_with: releases/smollm2-1a2b3c4d\n  confidence: 0.99\n").unwrap();
    let e = s.evaluation.as_ref().unwrap();
    assert_eq!((e.compare_with.as_deref(), e.confidence), (Some("releases/smollm2-1a2b3c4d"), 0.99));
    assert_eq!(with("").unwrap().evaluation.unwrap().confidence, 0.95);
    for bad in ["releases/../x", "s3://b/report.json", "releases/"] {
        let err = with(&format!("  compare_with: {bad:?}\n")).unwrap_err().to_string();
        assert!(err.contains("evaluation.compare_with") && err.contains("releases/<id>"), "{bad}: {err}");
    }
    for bad in ["1", "0.3", "1.5"] {
        let err = with(&format!("  confidence: {bad}\n")).unwrap_err().to_string();
        assert!(err.contains("evaluation.confidence"), "{bad}: {err}");
    }
}

#[test]
fn peers_are_tools_or_third_party_gguf_files() {
    let with = |p: &str| ReleaseSpec::parse(&format!("{GOOD}evaluation:\n  text: t.txt\n  peers: {p}\n"), "r");
    let s = with("[llama-perplexity, elsewhere/Q4_K_M.gguf]").unwrap();
    let e = s.evaluation.as_ref().unwrap();
    assert_eq!(e.peer_tools().collect::<Vec<_>>(), [Peer::LlamaPerplexity]);
    assert_eq!(e.third_party().collect::<Vec<_>>(), ["elsewhere/Q4_K_M.gguf"]);
    let err = with("[llama-perplexitty]").unwrap_err().to_string();
    assert!(err.contains("evaluation.peers[0]") && err.contains("ending in .gguf"), "{err}");
}

#[test]
fn a_searched_rung_names_its_budget_and_the_search_its_text() {
    let head = "name: s\nsource: ./m\noutputs:\n  gguf:\n";
    let with = |rest: &str| ReleaseSpec::parse(&format!("{head}{rest}"), "release.yaml");
    let s = with("    quants: [Q4_K_M, {name: Q4_FIT, target_bpw: Q4_K_M}, {name: B45, target_bpw: 4.5}]\n    imatrix: {text: c.txt}\n")
        .unwrap();
    let searched: Vec<(String, Target)> =
        s.quants().iter().filter_map(Rung::search).map(|r| (r.name.to_string(), r.target)).collect();
    assert_eq!(
        searched,
        [
            ("Q4_FIT".to_string(), Target::SizeOf(Level::File(quantfarm_ggml::FileType::Q4_K_M))),
            ("B45".to_string(), Target::Bpw(4.5))
        ]
    );
    assert!(s.searches());
    assert_eq!(s.search_settings(), SearchSettings::default());
    assert_eq!(s.rung(Level::parse("Q4_FIT").unwrap()).unwrap().base(), quantfarm_ggml::FileType::Q8_0);
    // Written back as read.
    let again = ReleaseSpec::parse(&serde_norway::to_string(&s).unwrap(), "again.yaml").unwrap();
    assert_eq!(again.quants(), s.quants());
    let k =
        with("    quants: [{name: OK, kld: {metric: kld.p99_9, max: 0.5}}]\n    search: {text: t.txt, points: 4}\n")
            .unwrap();
    let r = k.quants()[0].search().unwrap();
    assert_eq!(r.target, Target::Kld { metric: KldMetric::P99_9, max: 0.5 });
    assert_eq!(r.default_kld_mean(&k), Ok(0.5));
    assert_eq!(k.search_settings().points, 4);
    let again = ReleaseSpec::parse(&serde_norway::to_string(&k).unwrap(), "again.yaml").unwrap();
    assert_eq!(again.quants(), k.quants());
    let t = with("    quants: [{name: F, target_bpw: 5}]\n    search: {text: t.txt, candidates: [q4_0, Q8_0], layers: 2, chunks: 4}\n")
        .unwrap();
    let st = t.search_settings();
    assert_eq!((st.candidates.len(), st.layers, st.chunks, st.text.as_deref()), (2, 2, 4, Some("t.txt")));
    for (bad, says) in [
        ("    quants: [{name: F, target_bpw: 4.5}]\n", "give outputs.gguf.search.text"),
        ("    quants: [{name: F, target_bpw: Q4_K_M}]\n    search: {text: t}\n", "not a rung of outputs.gguf.quants"),
        ("    quants: [{name: F, target_bpw: 0.5}]\n    search: {text: t}\n", "expected 1 to 32 bits"),
        ("    quants: [{name: F, target_bpw: [1]}]\n    search: {text: t}\n", "a number or a rung's name"),
        ("    quants: [{name: F, target_bpw: 4, base: Q4_K_M}]\n    search: {text: t}\n", "not both"),
        (
            "    quants: [{name: F, target_bpw: 4, tensor_types: {a: q8_0}}]\n    search: {text: t}\n",
            "chosen by the search",
        ),
        ("    quants: [{name: F}]\n", "expected a recipe"),
        (
            "    quants: [{name: F, kld: {metric: kld.p50, max: 1}}]\n    search: {text: t}\n",
            "expected one of kld.mean",
        ),
        ("    quants: [{name: F, kld: {metric: kld.mean, max: -1}}]\n    search: {text: t}\n", "positive number"),
        ("    quants: [{name: F, kld: {metric: kld.mean}}]\n    search: {text: t}\n", "kld: expected"),
        (
            "    quants: [{name: F, kld: {metric: kld.mean, max: 1}, target_bpw: 4}]\n    search: {text: t}\n",
            "not both",
        ),
        ("    quants: [{name: F, target_bpw: 4}]\n    search: {text: t, points: 1}\n", "search.points"),
        ("    quants: [Q8_0]\n    search: {text: t}\n", "no rung of outputs.gguf.quants is searched"),
        (
            "    quants: [{name: F, target_bpw: 4}]\n    search: {text: t, candidates: [IQ2_XXS]}\n",
            "only with an importance matrix",
        ),
        ("    quants: [{name: F, target_bpw: 4}]\n    search: {text: t, candidates: [Q9]}\n", "unknown tensor type"),
        ("    quants: [{name: F, target_bpw: 4}]\n    search: {text: t, precision: 0}\n", "search.precision"),
        ("    quants: [{name: F, target_bpw: 4}]\n    search: {text: t, layer: 2}\n", "unknown field"),
        (
            "    quants: [{name: A, target_bpw: 4}, {name: F, target_bpw: A}]\n    search: {text: t}\n",
            "is a searched rung",
        ),
    ] {
        let err = with(bad).unwrap_err().to_string();
        assert!(err.contains(says), "{bad}: {err}");
    }
}
