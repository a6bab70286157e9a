//! `quantfarm imatrix` on the real SmolLM2-135M against the real `llama-imatrix` (run here, and the fixture made
//! with it elsewhere): the same entries and counts, values equal to llama-imatrix's f32 running sums' rounding (and
//! its very bytes with `--f32-running-sums`), and a Q4_K_M made with it as good on another text as one made with
//! llama-imatrix's file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use quantfarm_e2e::{fixtures_dir, llama_bin, repo_root, smollm2_derived};
use quantfarm_quant::imatrix::sums::ImatrixSums;
use quantfarm_store::Location;

fn quantfarm(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_quantfarm")).args(args).output().expect("run quantfarm");
    ok(out, &format!("quantfarm {}", args.first().unwrap_or(&"")))
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

fn load(p: &Path) -> ImatrixSums {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(ImatrixSums::load(&Location::local(p))).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Largest and median relative difference of every value, and how many exceed `tol`.
fn rel_diff(a: &ImatrixSums, b: &ImatrixSums, tol: f64) -> (f64, f64, usize, usize) {
    let mut rel = Vec::new();
    for (name, x) in &a.entries {
        let y = &b.entries[name];
        assert_eq!(x.counts, y.counts, "{name}: token counts");
        rel.extend(x.values.iter().zip(&y.values).map(|(p, q)| (p - q).abs() / q.abs().max(f64::MIN_POSITIVE)));
    }
    rel.sort_by(f64::total_cmp);
    let over = rel.iter().filter(|&&r| r > tol).count();
    (rel[rel.len() - 1], rel[rel.len() / 2], over, rel.len())
}

fn mean_kld(base: &Path, model: &Path, text: &Path) -> f64 {
    let out =
        quantfarm(&["kld", "--base", s(base), "--model", s(model), "--text", s(text), "--threads", "2", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("kld --json");
    v["mean_kld"].as_f64().expect("mean_kld")
}

#[test]
fn imatrix_matches_llama_imatrix_and_makes_an_equally_good_q4_k_m() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().expect("tempdir");
    let bf16 = smollm2_derived().join("smollm2-bf16.gguf");
    // Beside the text, so each file records the name `gpl3.txt`, as the fixture does.
    let text = dir.path().join("gpl3.txt");
    std::fs::copy(fixtures_dir().join("texts/gpl3.txt"), &text).expect("copy text");
    let run_here = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
            .args(args)
            .current_dir(dir.path())
            .output()
            .expect("run quantfarm");
        ok(out, "quantfarm imatrix")
    };
    let m = s(&bf16);
    print!("{}", run_here(&["imatrix", "--model", m, "--text", "gpl3.txt", "--threads", "2", "-o", "ours.gguf"]));
    let f32_args = ["imatrix", "--model", m, "--text", "gpl3.txt", "--threads", "2", "--f32-running-sums", "-o"];
    print!("{}", run_here(&[&f32_args[..], &["ours-f32.gguf"]].concat()));
    let live = Command::new(llama_bin().join("llama-imatrix"))
        .args(["-m", m, "-f", "gpl3.txt", "-c", "512", "-t", "2", "-o", "llama.gguf"])
        .current_dir(dir.path())
        .output()
        .expect("run llama-imatrix");
    ok(live, "llama-imatrix");
    let p = |n: &str| dir.path().join(n);

    // llama-imatrix's own arithmetic gives its very bytes: the same tokens, chunks, tensors and activations.
    let ours_f32 = std::fs::read(p("ours-f32.gguf")).expect("read");
    assert!(ours_f32 == std::fs::read(p("llama.gguf")).expect("read"), "--f32-running-sums differs from llama-imatrix");

    // The default (f64 sums per decode group, added in order): same entries and counts; the values differ only by
    // llama-imatrix's f32 running-sum rounding.
    let ours = load(&p("ours.gguf"));
    let llama = load(&p("llama.gguf"));
    let fixture = load(&fixtures_dir().join("smollm2/imatrix-gpl3.gguf"));
    for other in [&llama, &fixture] {
        assert_eq!(ours.entries.keys().collect::<Vec<_>>(), other.entries.keys().collect::<Vec<_>>());
        assert_eq!(
            (ours.chunk_count, ours.chunk_size, &ours.datasets),
            (other.chunk_count, other.chunk_size, &other.datasets)
        );
    }
    let (max, median, over, n) = rel_diff(&ours, &llama, 1e-5);
    println!("vs llama-imatrix here: max rel {max:.3e}, median {median:.3e}, {over} of {n} values above 1e-5");
    assert!(max < 2e-4 && median < 5e-6 && over * 100 < n, "vs llama-imatrix: {max} {median} {over}/{n}");
    // The fixture was made on another machine, whose kernels give other activations: llama-imatrix here differs
    // from it as much as we do.
    let (fmax, fmedian, _, _) = rel_diff(&ours, &fixture, 1e-5);
    let (lmax, lmedian, _, _) = rel_diff(&llama, &fixture, 1e-5);
    println!("vs the fixture: ours max {fmax:.3e} median {fmedian:.3e}; llama-imatrix here max {lmax:.3e} median {lmedian:.3e}");
    assert!(
        fmedian < 2.0 * lmedian + 1e-6 && fmax < 0.1,
        "vs the fixture: {fmax} {fmedian} (llama here {lmax} {lmedian})"
    );

    // Q4_K_M on a text neither imatrix saw: ours within ±3% of llama-imatrix's, and both well below none.
    let eval_text: PathBuf = repo_root().join("examples/texts/python-reference.txt");
    let base = p("python.base");
    quantfarm(&["kld", "--reference", m, "--text", s(&eval_text), "--save-base", s(&base), "--threads", "2"]);
    let mut kld = Vec::new();
    for im in [None, Some("llama.gguf"), Some("ours.gguf")] {
        let out = p(&format!("q4_k_m-{}", im.unwrap_or("none")));
        let mut args = vec!["quantize", m, s(&out), "Q4_K_M"];
        let im_path = im.map(p);
        if let Some(f) = &im_path {
            args.extend(["--imatrix", s(f)]);
        }
        quantfarm(&args);
        kld.push(mean_kld(&base, &out, &eval_text));
    }
    println!(
        "Q4_K_M mean KLD on python-reference.txt: no imatrix {:.6}, llama-imatrix's {:.6}, ours {:.6}",
        kld[0], kld[1], kld[2]
    );
    assert!((kld[2] / kld[1] - 1.0).abs() <= 0.03, "ours {} vs llama-imatrix's {}", kld[2], kld[1]);
    assert!(kld[2] < 0.75 * kld[0], "the imatrix must help: {} vs {}", kld[2], kld[0]);
}

#[test]
fn imatrix_refuses_a_text_too_short_and_leaves_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let short = dir.path().join("short.txt");
    std::fs::write(&short, "A few words.").expect("write");
    let out_file = dir.path().join("out.gguf");
    let bf16 = smollm2_derived().join("smollm2-bf16.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
        .args(["imatrix", "--model", s(&bf16), "--text", s(&short), "-o", s(&out_file)])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("tokens") && err.contains("1024"), "{err}");
    assert!(std::fs::read_dir(dir.path()).expect("ls").count() == 1, "nothing but the text is left");
}

/// MoE experts are counted separately, through the routing ids (`MUL_MAT_ID`): on a tiny Qwen3.5-MoE (made by
/// transformers, converted by llama.cpp's `convert_hf_to_gguf.py`; 4 experts, 2 per token, gated-delta-net layers),
/// `--f32-running-sums` gives llama-imatrix's bytes, and the default the same entries and per-expert counts.
#[test]
fn moe_experts_are_counted_per_expert_as_llama_imatrix_counts_them() {
    let _cpu = quantfarm_e2e::cpu_bound();
    use quantfarm_e2e::{convert_python, llama_src, run_py_with};
    use std::ffi::OsStr;
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = dir.path().join("hf-moe");
    let tok = smollm2_derived().join("smollm2-hf");
    run_py_with(
        &convert_python(),
        "qwen35.py",
        &[OsStr::new("make"), OsStr::new("moe"), hf.as_os_str(), tok.as_os_str()],
    );
    let gguf = dir.path().join("moe.gguf");
    let src = llama_src();
    let args = [
        OsStr::new("gguf"),
        hf.as_os_str(),
        gguf.as_os_str(),
        OsStr::new("bf16"),
        src.as_os_str(),
        OsStr::new("smollm"),
    ];
    run_py_with(&convert_python(), "qwen35.py", &args);
    std::fs::copy(fixtures_dir().join("texts/gpl3.txt"), dir.path().join("gpl3.txt")).expect("copy text");
    let m = s(&gguf);
    let common = ["--model", m, "--text", "gpl3.txt", "--ctx", "128", "--chunks", "8", "--threads", "2"];
    for (out, extra) in [("ours.gguf", None), ("ours-f32.gguf", Some("--f32-running-sums"))] {
        let mut args = vec!["imatrix"];
        args.extend(common);
        args.extend(extra);
        args.extend(["-o", out]);
        let o =
            Command::new(env!("CARGO_BIN_EXE_quantfarm")).args(&args).current_dir(dir.path()).output().expect("run");
        ok(o, "quantfarm imatrix");
    }
    let live = Command::new(llama_bin().join("llama-imatrix"))
        .args(["-m", m, "-f", "gpl3.txt", "-c", "128", "--chunks", "8", "-t", "2", "-o", "llama.gguf"])
        .current_dir(dir.path())
        .output()
        .expect("run llama-imatrix");
    ok(live, "llama-imatrix");
    let p = |n: &str| dir.path().join(n);
    assert!(std::fs::read(p("ours-f32.gguf")).expect("read") == std::fs::read(p("llama.gguf")).expect("read"));
    let (ours, llama) = (load(&p("ours.gguf")), load(&p("llama.gguf")));
    let experts: Vec<&String> = ours.entries.keys().filter(|k| k.contains("_exps")).collect();
    assert!(!experts.is_empty(), "no expert entries in {:?}", ours.entries.keys().collect::<Vec<_>>());
    for name in experts {
        let c = &ours.entries[name].counts;
        // 8 chunks of 128 tokens, 2 experts per token, over 4 experts.
        assert_eq!((c.len(), c.iter().sum::<u64>()), (4, 8 * 128 * 2), "{name}: {c:?}");
    }
    let (max, median, _, n) = rel_diff(&ours, &llama, 1e-5);
    println!("MoE vs llama-imatrix: max rel {max:.3e}, median {median:.3e} over {n} values");
    assert!(max < 2e-4, "{max}");

    // MXFP4_MOE on the same model: the 3-D expert tensors MXFP4, the rest Q8_0; with and without the imatrix (which
    // MXFP4 ignores, but its keys are written), byte for byte llama-quantize's file.
    for imatrix in [None, Some("llama.gguf")] {
        let tag = if imatrix.is_some() { "imat" } else { "plain" };
        let (theirs, mine) = (format!("theirs-mxfp4-{tag}.gguf"), format!("ours-mxfp4-{tag}.gguf"));
        let mut q = Command::new(llama_bin().join("llama-quantize"));
        q.env("LD_LIBRARY_PATH", llama_bin()).current_dir(dir.path());
        if let Some(im) = imatrix {
            q.args(["--imatrix", im]);
        }
        ok(q.args([m, theirs.as_str(), "MXFP4_MOE", "2"]).output().expect("run llama-quantize"), "llama-quantize");
        let mut args = vec!["quantize", m, mine.as_str(), "MXFP4_MOE", "--threads", "2"];
        if let Some(im) = imatrix {
            args.extend(["--imatrix", im]);
        }
        let o =
            Command::new(env!("CARGO_BIN_EXE_quantfarm")).args(&args).current_dir(dir.path()).output().expect("run");
        ok(o, "quantfarm quantize MXFP4_MOE");
        let (a, b) = (std::fs::read(p(&mine)).expect("ours"), std::fs::read(p(&theirs)).expect("theirs"));
        assert!(a == b, "MXFP4_MOE ({tag}): {} bytes against llama-quantize's {}", a.len(), b.len());
    }

    // Expert coverage (issue 40): a calibration text of one word repeated gives every token nearly the same hidden
    // state, so the routers pick the same few experts and the others get no token. The weights left with experts
    // without data, and their share, are what llama-imatrix warns about on the same text ("has partial data").
    std::fs::write(p("repeated.txt"), "the ".repeat(400)).expect("write");
    let cov_args = ["--text", "repeated.txt", "--ctx", "64", "--chunks", "2", "--threads", "2"];
    let o = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
        .args(["imatrix", "--model", m])
        .args(cov_args)
        .args(["-o", "repeated.gguf"])
        .current_dir(dir.path())
        .output()
        .expect("run");
    let said = ok(o, "quantfarm imatrix (repeated text)");
    let mut ours: Vec<(String, String)> = said
        .lines()
        .filter_map(|l| l.split_once(": partial data ("))
        .map(|(name, rest)| (name.to_string(), rest.split('%').next().unwrap_or_default().to_string()))
        .collect();
    let live = Command::new(llama_bin().join("llama-imatrix"))
        .args(["-m", m, "-f", "repeated.txt", "-c", "64", "--chunks", "2", "-t", "2", "-o", "llama-repeated.gguf"])
        .current_dir(dir.path())
        .output()
        .expect("run llama-imatrix");
    let all = format!("{}{}", String::from_utf8_lossy(&live.stdout), String::from_utf8_lossy(&live.stderr));
    assert!(live.status.success(), "llama-imatrix: {all}");
    let mut theirs: Vec<(String, String)> = all
        .lines()
        .filter_map(|l| l.split_once("entry '")?.1.split_once("' has partial data ("))
        .map(|(name, rest)| (name.trim().to_string(), rest.split('%').next().unwrap_or_default().to_string()))
        .collect();
    assert!(!theirs.is_empty(), "the repeated text leaves experts without tokens: {all}");
    // (llama-imatrix warns in its hash map's order.)
    ours.sort();
    theirs.sort();
    assert_eq!(ours, theirs, "experts without tokens, per weight: ours against llama-imatrix's warnings\n{said}");
    println!("partial data, as llama-imatrix warns: {ours:?}");

    // The farm computes the same importance matrix in a release (from the HF checkpoint) and states the coverage in
    // the report, beside each quant: the same weights and shares, and which experts.
    // The Q4_K_M artifact of a release of the checkpoint computing its importance matrix on repeated.txt.
    let farm_release = |all_experts: bool| -> serde_json::Value {
        let release = p("release.yaml");
        std::fs::write(
            &release,
            format!(
                "name: moe-coverage\nsource: {}\noutputs:\n  gguf:\n    quants: [Q4_K_M]\n    imatrix: {{text: \
                 repeated.txt, ctx: 64, chunks: 2, all_experts: {all_experts}}}\n",
                hf.display()
            ),
        )
        .expect("write release.yaml");
        let out = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
            .arg("run")
            .arg(&release)
            .args(["--workers", "2", "--json", "--store"])
            .arg(p("store"))
            .env("QUANTFARM_KEY_FILE", p("key"))
            .current_dir(dir.path())
            .output()
            .expect("run the release");
        // No evaluation: made and verified, not measured, so not released (exit 1).
        assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
        let sum: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the run's JSON summary");
        let q4 = sum["artifacts"].as_array().and_then(|a| a.iter().find(|a| a["file_type"] == "Q4_K_M"));
        q4.expect("Q4_K_M").clone()
    };
    let q4 = farm_release(false);
    let experts = &q4["imatrix"]["experts"];
    let weights = load(&p("repeated.gguf")).entries.values().filter(|st| st.counts.len() > 1).count();
    assert_eq!(experts["weights"].as_u64(), Some(weights as u64), "{experts}");
    let cov = quantfarm_quant::imatrix::sums::ImatrixSums::expert_coverage(&load(&p("repeated.gguf")));
    let mut farm: Vec<(String, String, Vec<u64>)> = experts["partial"]
        .as_array()
        .expect("partial")
        .iter()
        .map(|e| {
            let unrouted = e["unrouted"].as_array().expect("unrouted").iter().filter_map(|u| u.as_u64()).collect();
            (
                e["weight"].as_str().unwrap_or_default().to_string(),
                format!("{:.2}", e["percent"].as_f64().unwrap_or(0.0)),
                unrouted,
            )
        })
        .collect();
    farm.sort();
    let named: Vec<(String, String)> = farm.iter().map(|(w, pc, _)| (w.clone(), pc.clone())).collect();
    assert_eq!(named, theirs, "the report's partial weights against llama-imatrix's warnings");
    for (w, _, unrouted) in &farm {
        let c = cov.iter().find(|c| &c.weight == w).expect("the weight in quantfarm imatrix's file");
        let want: Vec<u64> = c.unrouted.iter().map(|&u| u64::from(u)).collect();
        assert_eq!(unrouted, &want, "{w}: the experts without tokens");
    }

    // `--all-experts`: every expert credited on every token. The oracle is llama-imatrix itself with the router
    // told to pick all 4 experts (`--override-kv qwen35moe.expert_used_count=int:4`): in the first layer, whose input
    // no routing has touched yet, it then computes every expert's activations itself. A text of "the" repeated
    // without spaces leaves experts of blk.0 unrouted under the model's own routing (checked), which ours must then
    // compute from the graph and the weights.
    std::fs::write(p("the.txt"), "the".repeat(600)).expect("write");
    let the = ["--text", "the.txt", "--ctx", "64", "--chunks", "2", "--threads", "2"];
    for (out, extra) in [("the.gguf", None), ("all.gguf", Some("--all-experts"))] {
        let o = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
            .args(["imatrix", "--model", m])
            .args(the)
            .args(extra)
            .args(["-o", out])
            .current_dir(dir.path())
            .output()
            .expect("run");
        let said = ok(o, "quantfarm imatrix (the.txt)");
        if extra.is_some() {
            assert!(said.contains("every expert of the 12 mixture-of-experts weights had tokens"), "{said}");
        }
    }
    let routed = load(&p("the.gguf"));
    let first_layer_partial =
        routed.expert_coverage().into_iter().filter(|c| c.weight.starts_with("blk.0.")).any(|c| !c.unrouted.is_empty());
    assert!(
        first_layer_partial,
        "the.txt no longer leaves an expert of blk.0 unrouted: the check below would test nothing"
    );
    let live = Command::new(llama_bin().join("llama-imatrix"))
        .args(["-m", m, "-f", "the.txt", "-c", "64", "--chunks", "2", "-t", "2", "-o", "forced.gguf"])
        .args(["--override-kv", "qwen35moe.expert_used_count=int:4"])
        .current_dir(dir.path())
        .output()
        .expect("run llama-imatrix");
    ok(live, "llama-imatrix --override-kv qwen35moe.expert_used_count=int:4");
    let (all, forced) = (load(&p("all.gguf")), load(&p("forced.gguf")));
    for (name, st) in all.entries.iter().filter(|(k, _)| k.contains("_exps")) {
        assert_eq!(st.counts, vec![128; 4], "{name}: every expert on all 2 × 64 tokens");
    }
    let mut compared = 0;
    for (name, st) in all.entries.iter().filter(|(k, _)| k.starts_with("blk.0.") && k.contains("_exps")) {
        let theirs = &forced.entries[name];
        assert_eq!(st.counts, theirs.counts, "{name}");
        let worst = st
            .values
            .iter()
            .zip(&theirs.values)
            .map(|(a, b)| (a - b).abs() / b.abs().max(1e-30))
            .fold(0.0f64, f64::max);
        // llama-imatrix sums in f32, ours in f64; the activations are ggml's (bf16-rounded inputs).
        assert!(worst < 1e-4, "{name}: relative difference {worst:.3e} against llama.cpp's own all-expert pass");
        compared += 1;
    }
    assert_eq!(compared, 3, "blk.0's gate, up and down experts");
    println!("--all-experts: blk.0's experts equal llama-imatrix's with every expert routed");

    // The farm with `all_experts: true`: the same file as `quantfarm imatrix --all-experts`, every expert covered.
    let o = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
        .args(["imatrix", "--model", m, "--all-experts"])
        .args(cov_args)
        .args(["-o", "repeated-all.gguf"])
        .current_dir(dir.path())
        .output()
        .expect("run");
    ok(o, "quantfarm imatrix --all-experts (repeated text)");
    let q4 = farm_release(true);
    let im = &q4["imatrix"];
    assert_eq!(im["all_experts"], true, "{im}");
    assert_eq!(
        (im["experts"]["weights"].as_u64(), im["experts"]["partial"].as_array().map(Vec::len)),
        (Some(12), Some(0)),
        "{im}"
    );
    let farm_file = std::fs::read(im["url"].as_str().expect("the imatrix's url")).expect("read the farm's imatrix");
    assert!(
        farm_file == std::fs::read(p("repeated-all.gguf")).expect("read"),
        "the farm's all-experts imatrix differs from quantfarm imatrix's"
    );
}
