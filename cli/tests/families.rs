//! A whole release per model family, on the farm (`quantfarm run`, two local workers): a tiny random checkpoint of
//! each newly mapped family with its real vocabulary (`tests/py/make_synthetic_hf.py`), a PEFT LoRA merged into it,
//! the ladder Q8_0 / Q4_K_M / IQ4_XS quantized with an importance matrix the farm computes, and the evaluation
//! (KL divergence, greedy agreement and the merge check) run in llama.cpp. Every rung must be made, verified and
//! measured, and the merge must agree with the base plus the adapter applied at run time. The conversions
//! themselves are compared with convert_hf_to_gguf.py byte for byte in `tests/tests/convert_architectures.rs`, and
//! the ladder's bytes with llama-quantize's in this file's last test.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use quantfarm_e2e::{convert_python, fixtures_dir, llama_bin, llama_src, run_py_with};
use serde_json::Value;

const LADDER: [&str; 3] = ["Q8_0", "Q4_K_M", "IQ4_XS"];

fn checkpoint(arch: &str, dir: &Path) -> PathBuf {
    let out = dir.join(arch);
    let src = llama_src();
    run_py_with(&convert_python(), "make_synthetic_hf.py", &[OsStr::new(arch), out.as_os_str(), src.as_os_str()]);
    out
}

/// convert_hf_to_gguf.py's BF16 GGUF of the checkpoint `hf`, at `out`.
fn oracle_bf16(hf: &Path, out: &Path) {
    let o = Command::new(convert_python())
        .arg(llama_src().join("convert_hf_to_gguf.py"))
        .arg(hf)
        .args(["--outtype", "bf16", "--outfile"])
        .arg(out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}: {}", hf.display(), String::from_utf8_lossy(&o.stderr));
}

/// The release of `arch`'s checkpoint with a PEFT LoRA merged into it, run; returns the summary line.
fn release(arch: &str) -> Value {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint(arch, dir.path());
    let adapter = quantfarm_e2e::lora_adapter("peft-attn", &hf, dir.path());
    let sum = release_of(arch, &hf, Some(&adapter), dir.path());
    assert_eq!(sum["merge_check"]["greedy"]["identical"], 2, "{arch}: {:#}", sum["merge_check"]);
    sum
}

/// The release named `name` of `source` (an HF, MLX or GGUF model), with `adapter` merged first when given, run
/// in `dir`; asserts that every rung was made, verified and measured and every gate passed. The default per-level
/// KLD limits are for trained models: a random one's quantization error is another matter, so the `kld` gate is
/// replaced by a loose one that still needs every level measured; and a random model rambles to every probe's
/// token cap, so its answers have no score and the `probes` gate is replaced by one that needs the suite run on
/// every level.
fn release_of(name: &str, source: &Path, adapter: Option<&Path>, dir: &Path) -> Value {
    let arch = name;
    std::fs::create_dir_all(dir).unwrap();
    let (adapter, merge_gate) = match adapter {
        Some(a) => (
            format!("adapter: {}\nbase_name: HuggingFaceTB/SmolLM2-135M-Instruct\n", a.display()),
            "  - {name: merge, check: 'merge.greedy.agree >= 1'}\n",
        ),
        None => (String::new(), ""),
    };
    let prompts = quantfarm_e2e::prompts(2, dir);
    let text = fixtures_dir().join("texts/gpl3.txt");
    // User turns only: some families' templates (Gemma's) refuse a system message.
    let probes = dir.join("probes.yaml");
    std::fs::write(
        &probes,
        "name: family-basics\ndefaults: {max_tokens: 8, thinking: false}\nprobes:\n\
         \x20 - {name: capital, prompt: What is the capital of France?, expect: {contains: Paris}}\n\
         \x20 - {name: sum, prompt: What is 2 + 2?, expect: {regex: '\\b4\\b'}}\n",
    )
    .unwrap();
    let release = dir.join("release.yaml");
    std::fs::write(
        &release,
        format!(
            "name: {arch}\nsource: {}\n{adapter}outputs:\n  gguf:\n    quants: [{}]\n\
             \x20   imatrix: {{text: {}, chunks: 2, ctx: 128}}\n\
             evaluation:\n  text: {}\n  ctx: 128\n  chunks: 2\n  prompts: {}\n  max_tokens: 8\n  probes: {}\n\
             gates:\n{merge_gate}\
             \x20 - {{name: kld, levels: all, check: 'kld.mean <= 100'}}\n\
             \x20 - {{name: probes, levels: all, check: 'probe.truncated >= 0'}}\n",
            source.display(),
            LADDER.join(", "),
            text.display(),
            text.display(),
            prompts.display(),
            probes.display(),
        ),
    )
    .unwrap();
    let out = quantfarm_e2e::farm_run_output(Path::new(env!("CARGO_BIN_EXE_quantfarm")), &release, 2, dir);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let sum: Value = serde_json::from_str(stdout.lines().last().unwrap_or_else(|| panic!("{arch}: {stderr}")))
        .unwrap_or_else(|e| panic!("{arch}: {e}: {stdout}\n{stderr}"));
    let failed: Vec<&Value> = sum["gates"].as_array().into_iter().flatten().filter(|g| g["passed"] != true).collect();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{arch}: state {}, error {}, failed gates {failed:#?}",
        sum["state"],
        sum["error"]
    );
    for ty in LADDER {
        let a = sum["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["file_type"] == ty)
            .unwrap_or_else(|| panic!("{arch}: no {ty} in {sum:#}"));
        assert_eq!(a["kld"]["n_chunks"], 2, "{arch} {ty}: {a:#}");
        assert!(a["kld"]["mean_kld"].as_f64().is_some_and(|k| k.is_finite() && k >= 0.0), "{arch} {ty}: {a:#}");
        assert_eq!(a["greedy"]["n"], 2, "{arch} {ty}: {a:#}");
        assert_eq!(a["verified"], true, "{arch} {ty}: {a:#}");
        assert!(a["probes"].is_object(), "{arch} {ty}: {a:#}");
    }
    for g in sum["gates"].as_array().unwrap() {
        assert_eq!(g["passed"], true, "{arch}: {g:#}");
    }
    eprintln!("{arch}: released, every gate passed: {}", sum["gates"]);
    sum
}

/// Gemma 2 (soft-capping, norms as 1 + weight).
#[test]
fn gemma2_release() {
    release("gemma2");
}

/// Llama 3.x (rope_scaling llama3: the GGUF carries rope_freqs.weight).
#[test]
fn llama3_release() {
    release("llama3");
}

/// Qwen3-MoE (experts stacked; the LoRA on attention).
#[test]
fn qwen3_moe_release() {
    release("qwen3_moe");
}

/// Gemma 3 4B+ (the text tower of Gemma3ForConditionalGeneration, linear rope).
#[test]
fn gemma3_multimodal_release() {
    release("gemma3_mm");
}

/// Phi-3.5 (fused qkv and gate_up, longrope factors; the LoRA on the fused qkv_proj).
#[test]
fn phi3_release() {
    release("phi3");
}

/// SmolLM3 (Llama's tensors as arch smollm3, no BOS).
#[test]
fn smollm3_release() {
    release("smollm3");
}

/// Granite 3.x (the multipliers as scales; a StarCoder-style vocabulary).
#[test]
fn granite_release() {
    release("granite");
}

/// OLMo 2 (post-norm blocks, full-width q/k norms; cl100k_base).
#[test]
fn olmo2_release() {
    release("olmo2");
}

/// Any source: a release from the GGUF convert_hf_to_gguf.py made (its reference is that file, byte for byte), from
/// a quantized GGUF (said loudly: the reference is its exact decoding), and from an MLX checkpoint (dequantized
/// exactly, as `convert` does).
#[test]
fn releases_from_a_gguf_and_an_mlx_source() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint("llama3", dir.path());
    let bf16 = dir.path().join("llama3-bf16.gguf");
    oracle_bf16(&hf, &bf16);
    let sum = release_of("from-gguf", &bf16, None, &dir.path().join("gguf"));
    let reference = sum["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == "BF16").unwrap().clone();
    let file = PathBuf::from(reference["files"][0]["url"].as_str().unwrap());
    assert!(std::fs::read(&file).unwrap() == std::fs::read(&bf16).unwrap(), "the reference is the source GGUF");

    let q4 = dir.path().join("llama3-q4_k_m.gguf");
    let o =
        Command::new(llama_bin().join("llama-quantize")).arg(&bf16).arg(&q4).args(["Q4_K_M", "2"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    release_of("from-q4", &q4, None, &dir.path().join("q4"));

    // A byte-level BPE family: an MLX checkpoint made from a SentencePiece GGUF carries the rebuilt tokenizer.json
    // only, which convert_hf_to_gguf's SentencePiece families cannot read either.
    let g = checkpoint("qwen2", dir.path());
    let gguf = dir.path().join("qwen2.gguf");
    let mlx = dir.path().join("qwen2-mlx8");
    for (args, what) in [
        (vec![g.as_os_str(), gguf.as_os_str()], "HF -> GGUF"),
        (
            vec![
                gguf.as_os_str(),
                mlx.as_os_str(),
                OsStr::new("--to"),
                OsStr::new("mlx"),
                OsStr::new("--bits"),
                OsStr::new("8"),
            ],
            "GGUF -> MLX",
        ),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_quantfarm")).arg("convert").args(args).output().unwrap();
        assert!(o.status.success(), "{what}: {}", String::from_utf8_lossy(&o.stderr));
    }
    release_of("from-mlx", &mlx, None, &dir.path().join("mlx"));
}

/// The ladder of each family's BF16 GGUF (made by convert_hf_to_gguf.py) is byte-identical to llama-quantize's,
/// run here on the same file: llama-quantize's rules for each architecture (the generated rope_freqs.weight kept
/// F32, the 3-D expert tensors, the tied embedding).
#[test]
fn family_ladders_equal_llama_quantize() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    for arch in ["llama3", "qwen3_moe", "gemma2", "gemma3_mm", "phi3", "granite", "olmo2"] {
        let hf = checkpoint(arch, dir.path());
        let bf16 = dir.path().join(format!("{arch}-bf16.gguf"));
        oracle_bf16(&hf, &bf16);
        for ty in LADDER {
            let theirs = dir.path().join(format!("{arch}-{ty}.ref.gguf"));
            let o = Command::new(llama_bin().join("llama-quantize"))
                .arg(&bf16)
                .arg(&theirs)
                .args([ty, "2"])
                .output()
                .unwrap();
            assert!(o.status.success(), "llama-quantize {arch} {ty}: {}", String::from_utf8_lossy(&o.stderr));
            let ours = dir.path().join(format!("{arch}-{ty}.gguf"));
            let o = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
                .arg("quantize")
                .arg(&bf16)
                .arg(&ours)
                .arg(ty)
                .output()
                .unwrap();
            assert!(o.status.success(), "quantfarm quantize {arch} {ty}: {}", String::from_utf8_lossy(&o.stderr));
            assert!(std::fs::read(&ours).unwrap() == std::fs::read(&theirs).unwrap(), "{arch} {ty}: files differ");
            eprintln!("{arch} {ty}: identical to llama-quantize");
        }
    }
}
