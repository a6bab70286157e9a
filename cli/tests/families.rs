//! A whole release per model family, on the farm (`quantfarm run`, two local workers): a tiny random checkpoint of
//! each newly mapped family with its real vocabulary (`tests/py/make_synthetic_hf.py`), a PEFT LoRA merged into it,
//! the ladder Q8_0 / Q4_K_M / IQ4_XS quantized with an importance matrix the farm computes, an MLX 8-bit rung, and
//! the evaluation (KL divergence, greedy agreement and the merge check) run in llama.cpp, and in mlx-lm for the
//! source's bf16 weights and the MLX rung (link 2). Every rung must be made, verified and measured, and the merge
//! must agree with the base plus the adapter applied at run time. The conversions themselves are compared with
//! convert_hf_to_gguf.py byte for byte in `tests/tests/convert_architectures.rs` and with mlx_lm.convert in
//! `tests/tests/mlx_families.rs`, and the ladder's bytes with llama-quantize's in this file's last test.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use quantfarm_e2e::{convert_hf_to_gguf_py, fixtures_dir, llama_bin};
use serde_json::Value;

const LADDER: [&str; 3] = ["Q8_0", "Q4_K_M", "IQ4_XS"];

/// The ladder a release of `name` asks for: gpt-oss's MXFP4 checkpoint has one rung that keeps its experts as they
/// are (MXFP4_MOE, the rest Q8_0); another type would requantize them, which both llama-quantize and quantfarm
/// refuse.
fn ladder(name: &str) -> &'static [&'static str] {
    if name == "gpt_oss" {
        &["MXFP4_MOE"]
    } else {
        &LADDER
    }
}

/// A release's MLX rung (8 bits).
#[derive(Clone, Copy, PartialEq, Eq)]
enum MlxRung {
    None,
    /// Made, verified and measured in llama.cpp through its exact conversion.
    LlamaCpp,
    /// Also measured in mlx-lm, with the source's bf16 weights (link 2).
    MlxLm,
}

fn checkpoint(arch: &str, dir: &Path) -> PathBuf {
    quantfarm_e2e::synthetic_hf(arch, &dir.join(arch))
}

/// The release of `arch`'s checkpoint with a PEFT LoRA merged into it, run; returns the summary line.
fn release(arch: &str) -> Value {
    release_expecting(arch, &[])
}

/// [`release`] whose MLX rung is measured in llama.cpp only, and in mlx-lm too (link 2) only with QUANTFARM_LONG
/// (`scripts/test --long`): the mlx-lm link costs about 11 s of helper and server starts per release, which the
/// default run spends on the families whose mlx-lm side is most likely to differ (Llama 3's rope scaling, Gemma 3's
/// wrapper, Phi-3's rope, Qwen3.5's sanitize, gpt-oss's conversion). These
/// families' MLX conversions are still checked against mlx_lm.convert's in the default run
/// (`tests/tests/mlx_families.rs`); their cross-runtime agreement only in the long one.
fn release_llama_cpp_rung(arch: &str) -> Value {
    let rung = if std::env::var_os("QUANTFARM_LONG").is_some() { MlxRung::MlxLm } else { MlxRung::LlamaCpp };
    release_with(arch, rung, &[])
}

/// [`release`], whose gates named in `expect_failed` must fail (and no other).
fn release_expecting(arch: &str, expect_failed: &[&str]) -> Value {
    release_with(arch, MlxRung::MlxLm, expect_failed)
}

fn release_with(arch: &str, rung: MlxRung, expect_failed: &[&str]) -> Value {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint(arch, dir.path());
    let adapter = quantfarm_e2e::lora_adapter("peft-attn", &hf, dir.path());
    let sum = release_of(arch, &hf, Some(&adapter), dir.path(), rung, expect_failed);
    assert_eq!(sum["merge_check"]["greedy"]["identical"], 2, "{arch}: {:#}", sum["merge_check"]);
    sum
}

/// The release named `name` of `source` (an HF, MLX or GGUF model), with `adapter` merged first when given, run
/// in `dir`; asserts that every rung was made, verified and measured and every gate passed. The default per-level
/// KLD limits are for trained models: a random one's quantization error is another matter, so the `kld` gate is
/// replaced by a loose one that still needs every level measured; and a random model rambles to every probe's
/// token cap, so its answers have no score and the `probes` gate is replaced by one that needs the suite run on
/// every level; and a random model's near-uniform outputs make greedy continuations part at near-ties between
/// runtimes, so the cross-runtime greedy gate only needs the figure (`cli/tests/mlx_lm.rs` says the same), while
/// the cross-runtime KLD gate keeps its default. Gates named in `expect_failed` must fail, and no other.
///
/// `rung` says whether there is an MLX rung and where it is measured.
fn release_of(
    name: &str,
    source: &Path,
    adapter: Option<&Path>,
    dir: &Path,
    rung: MlxRung,
    expect_failed: &[&str],
) -> Value {
    let (mlx_output, mlx_lm) = match rung {
        MlxRung::None => ("", false),
        MlxRung::LlamaCpp => ("  mlx: {bits: [8]}\n", false),
        MlxRung::MlxLm => ("  mlx: {bits: [8]}\n", true),
    };
    let greedy_gate =
        if mlx_lm { "  - {name: cross-runtime-greedy, check: 'cross_runtime.greedy.agree >= 0'}\n" } else { "" };
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
             \x20   imatrix: {{text: {}, chunks: 2, ctx: 128}}\n{mlx_output}\
             evaluation:\n  text: {}\n  ctx: 128\n  chunks: 2\n  prompts: {}\n  max_tokens: 8\n  probes: {}\n\
             \x20 mlx_lm: {mlx_lm}\n\
             gates:\n{merge_gate}\
             \x20 - {{name: kld, levels: all, check: 'kld.mean <= 100'}}\n\
             \x20 - {{name: probes, levels: all, check: 'probe.truncated >= 0'}}\n{greedy_gate}",
            source.display(),
            ladder(name).join(", "),
            text.display(),
            text.display(),
            prompts.display(),
            probes.display(),
        ),
    )
    .unwrap();
    // The workers run mlx-lm (the peers' Python): the MLX rung and the source's bf16 weights are measured in it.
    let python = quantfarm_e2e::peers_python();
    let env = [("QUANTFARM_PYTHON", python.as_os_str())];
    let out = quantfarm_e2e::farm_run_output_env(Path::new(env!("CARGO_BIN_EXE_quantfarm")), &release, 2, dir, &env);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let sum: Value = serde_json::from_str(stdout.lines().last().unwrap_or_else(|| panic!("{arch}: {stderr}")))
        .unwrap_or_else(|e| panic!("{arch}: {e}: {stdout}\n{stderr}"));
    let failed: Vec<&Value> = sum["gates"].as_array().into_iter().flatten().filter(|g| g["passed"] != true).collect();
    if expect_failed.is_empty() {
        assert_eq!(
            out.status.code(),
            Some(0),
            "{arch}: state {}, error {}, failed gates {failed:#?}",
            sum["state"],
            sum["error"]
        );
    } else {
        let names: Vec<&str> = failed.iter().filter_map(|g| g["name"].as_str()).collect();
        assert_eq!((sum["state"].as_str(), names.as_slice()), (Some("gate_failed"), expect_failed), "{arch}: {sum:#}");
        eprintln!("{arch}: failed as expected: {failed:#?}");
    }
    for &ty in ladder(name) {
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
        let expected = expect_failed.contains(&g["name"].as_str().unwrap_or(""));
        assert_eq!(g["passed"], !expected, "{arch}: {g:#}");
    }
    eprintln!("{arch}: released, gates: {}", sum["gates"]);
    // The MLX rung: made, verified and measured through its exact conversion in llama.cpp, and in mlx-lm with the
    // source's bf16 weights (link 2: near zero across runtimes).
    if rung == MlxRung::None {
        return sum;
    }
    let mlx = sum["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == "MLX-8bit");
    let mlx = mlx.unwrap_or_else(|| panic!("{arch}: no MLX-8bit in {sum:#}"));
    assert_eq!((mlx["verified"].as_bool(), mlx["kld"]["n_chunks"].as_u64()), (Some(true), Some(2)), "{arch}: {mlx:#}");
    if !mlx_lm {
        return sum;
    }
    let url = sum["report_url"].as_str().unwrap_or_else(|| panic!("{arch}: no report_url in {sum:#}"));
    let report: Value = serde_json::from_str(&std::fs::read_to_string(url).unwrap()).unwrap();
    let c = &report["cross_runtime"];
    // The bf16 weights are measured unless the release expects them not to be (gemma3_mm).
    let bf16_measured = !expect_failed.contains(&"cross-runtime-greedy");
    assert_eq!(c["rungs"][0]["kld"]["n_chunks"].as_u64(), Some(2), "{arch} MLX-8bit: {c:#}");
    if !bf16_measured {
        // The rung's greedy agreement is with mlx-lm's bf16 continuations: none, so not measured (not 0 of 0).
        assert!(c["rungs"][0]["greedy"].is_null(), "{arch}: {c:#}");
    }
    if bf16_measured {
        // The rung's greedy agreement is with the bf16 weights' continuations in mlx-lm.
        for (what, s) in [("bf16", &c["bf16"]), ("MLX-8bit", &c["rungs"][0])] {
            let got = (s["kld"]["n_chunks"].as_u64(), s["greedy"]["n"].as_u64());
            assert_eq!(got, (Some(2), Some(2)), "{arch} {what}: {c:#}");
        }
    }
    eprintln!(
        "{arch}: mlx-lm bf16 vs llama.cpp BF16: mean KLD {}, greedy agree {}; MLX-8bit in mlx-lm: mean KLD {}",
        c["bf16"]["kld"]["mean_kld"], c["bf16"]["greedy"]["agree"], c["rungs"][0]["kld"]["mean_kld"]
    );
    sum
}

/// Gemma 2 (soft-capping, norms as 1 + weight). Its conversions are checked byte for byte in the default run
/// (convert_architectures.rs, mlx_families.rs) and Gemma 3's release runs the family's norms and template, so the
/// release itself only with QUANTFARM_LONG (`scripts/test --long`), keeping the default run under its 30 minutes.
#[test]
fn gemma2_release() {
    if quantfarm_e2e::skip_unless_long("gemma2_release", "gemma3_multimodal_release runs the family's release path") {
        return;
    }
    release_llama_cpp_rung("gemma2");
}

/// Llama 3.x (rope_scaling llama3: the GGUF carries rope_freqs.weight).
#[test]
fn llama3_release() {
    release("llama3");
}

/// Qwen3-MoE (experts stacked; the LoRA on attention). Its conversions (GGUF and MLX, the stacked experts) are
/// checked byte for byte in the default run and an MoE's release path is qwen3_5_moe_release's, so only with
/// QUANTFARM_LONG, as `gemma2_release`.
#[test]
fn qwen3_moe_release() {
    if quantfarm_e2e::skip_unless_long("qwen3_moe_release", "qwen3_5_moe_release runs an MoE's release path") {
        return;
    }
    release_llama_cpp_rung("qwen3_moe");
}

/// Gemma 3 4B+ (the text tower of Gemma3ForConditionalGeneration, linear rope). mlx-lm 0.32.2 cannot load the
/// checkpoint as transformers 5 saves it (`model.language_model.…`: its gemma3 sanitize reads `language_model`),
/// so the source's bf16 weights are not measured in mlx-lm and both cross-runtime gates fail, saying so; the MLX
/// rung, written in the layout mlx-lm loads, is measured in it.
#[test]
fn gemma3_multimodal_release() {
    let sum = release_expecting("gemma3_mm", &["cross-runtime-kld", "cross-runtime-greedy"]);
    let gate = sum["gates"].as_array().unwrap().iter().find(|g| g["name"] == "cross-runtime-kld").unwrap();
    assert!(gate["detail"].as_str().unwrap().contains("KeyError: 'language_model'"), "{gate:#}");
}

/// Phi-3.5 (fused qkv and gate_up, longrope factors; the LoRA on the fused qkv_proj). Link 2 catches a real
/// difference between the runtimes: mlx-lm 0.32.2's `SuScaledRoPE` (mlx_lm/models/rope_utils.py) rotates by the
/// long factors at every length, where llama.cpp (and transformers) use the short ones below
/// `original_max_position_embeddings`, so the bf16 weights' KLD across runtimes fails its default gate.
#[test]
fn phi3_release() {
    release_expecting("phi3", &["cross-runtime-kld"]);
}

/// SmolLM3 (Llama's tensors as arch smollm3, no BOS). Llama's release path under another name (its conversions are
/// checked byte for byte in the default run), so only with QUANTFARM_LONG (`scripts/test --long`), keeping the
/// default run under its 30 minutes.
#[test]
fn smollm3_release() {
    if quantfarm_e2e::skip_unless_long("smollm3_release", "llama.yaml's release path, run by llama3_release") {
        return;
    }
    release("smollm3");
}

/// Granite 3.x (the multipliers as scales; a StarCoder-style vocabulary). As `smollm3_release`: only with
/// QUANTFARM_LONG.
#[test]
fn granite_release() {
    if quantfarm_e2e::skip_unless_long("granite_release", "llama.yaml's release path, run by llama3_release") {
        return;
    }
    release("granite");
}

/// OLMo 2 (post-norm blocks, full-width q/k norms; cl100k_base). Its conversions are checked byte for byte in the
/// default run, so its release only with QUANTFARM_LONG, as `gemma2_release`.
#[test]
fn olmo2_release() {
    if quantfarm_e2e::skip_unless_long("olmo2_release", "its conversions are checked byte for byte; llama3_release") {
        return;
    }
    release_llama_cpp_rung("olmo2");
}

/// Phi-4 (Phi-3's fused layout, no rope scaling; cl100k as a GPT2Tokenizer; the LoRA on the fused qkv_proj). The
/// layout's release is phi3_release's and cl100k's olmo2_release's, so only with QUANTFARM_LONG, as
/// `smollm3_release`.
#[test]
fn phi4_release() {
    if quantfarm_e2e::skip_unless_long("phi4_release", "phi3_release and olmo2_release run its parts") {
        return;
    }
    release("phi4");
}

/// Mistral Nemo (Mistral's layout; the tekken vocabulary). llama.yaml's release path with ministral3_release's
/// vocabulary, so only with QUANTFARM_LONG, as `smollm3_release`.
#[test]
fn mistral_nemo_release() {
    if quantfarm_e2e::skip_unless_long("mistral_nemo_release", "llama3_release and ministral3_release run its parts") {
        return;
    }
    release("mistral_nemo");
}

/// Ministral 3 as Mistral3ForConditionalGeneration saves it (the text tower released, the Pixtral tower left out;
/// yarn with Llama 4's attention temperature; the tekken vocabulary). Its conversions are checked byte for byte in
/// the default run (convert_architectures.rs, mlx_families.rs) and a wrapper's text tower is released by
/// gemma3_multimodal_release, so the release itself only with QUANTFARM_LONG, as `gemma2_release`.
#[test]
fn ministral3_release() {
    if quantfarm_e2e::skip_unless_long("ministral3_release", "gemma3_multimodal_release releases a wrapped tower") {
        return;
    }
    release_llama_cpp_rung("ministral3_mm");
}

/// gpt-oss fine-tuned and saved dequantized, as fine-tunes usually are (bf16 experts, transposed on conversion;
/// attention sinks, a biased router, yarn rope, o200k_harmony; the LoRA on attention). The MLX rung is written in
/// mlx-lm's gpt_oss layout; mlx-lm cannot load the merged checkpoint's own layout, so its bf16 weights are given to
/// it as quantfarm's unquantized MLX conversion, which the report says, and which must agree with llama.cpp's GGUF
/// BF16 (link 2) as closely as any family's bf16 weights do.
#[test]
fn gpt_oss_release() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint("gpt_oss_bf16", dir.path());
    let adapter = quantfarm_e2e::lora_adapter("peft-attn", &hf, dir.path());
    let sum = release_of("gpt_oss_bf16", &hf, Some(&adapter), dir.path(), MlxRung::MlxLm, &[]);
    assert_eq!(sum["merge_check"]["greedy"]["identical"], 2, "gpt_oss: {:#}", sum["merge_check"]);
    let url = sum["report_url"].as_str().unwrap();
    let report: Value = serde_json::from_str(&std::fs::read_to_string(url).unwrap()).unwrap();
    let bf16 = &report["cross_runtime"]["bf16"];
    let converted = bf16["converted"].as_str().unwrap_or_else(|| panic!("not converted: {bf16:#}"));
    assert!(converted.contains("mlp.experts."), "{converted}");
    assert!(bf16["rungs"].is_null() && bf16["load_error"].is_null(), "{bf16:#}");
    // Two runtimes on the same bf16 weights (mlx's CPU build upcasts): far below any quantization's divergence.
    let kld = bf16["kld"]["mean_kld"].as_f64().unwrap();
    assert!(kld < 1e-3, "mlx-lm bf16 vs llama.cpp BF16: mean KLD {kld}");
    assert_eq!(bf16["greedy"]["identical"], 2, "{bf16:#}");
    // The conversion is made once per worker that runs the model's mlx-lm tasks (kept in its cache, its digest
    // beside it), not once per task: its greedy, KLD and probe tasks share it.
    let tasks: Vec<&Value> = report["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["id"].as_str().unwrap().starts_with("mlx-lm/") && !t["id"].as_str().unwrap().contains("MLX"))
        .collect();
    let workers: std::collections::BTreeSet<&str> = tasks.iter().map(|t| t["worker"].as_str().unwrap()).collect();
    let made: Vec<PathBuf> = std::fs::read_dir(dir.path().join("data/cache"))
        .unwrap()
        .flat_map(|cache| std::fs::read_dir(cache.unwrap().path()).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "made"))
        .collect();
    eprintln!(
        "gpt-oss: {} mlx-lm tasks on the bf16 model, on {workers:?}; {} conversions made",
        tasks.len(),
        made.len()
    );
    assert!(tasks.len() >= 3 && !made.is_empty() && made.len() <= workers.len(), "{made:?} for {tasks:#?}");
}

/// transformers' own tiny Qwen3.5 of `kind` (`tests/py/qwen35.py make dense|moe`: a multi-token-prediction block,
/// SmolLM2's tokenizer) in `dir/qwen3_5-KIND`; `nested`: as Qwen3_5[Moe]ForConditionalGeneration stores it (the
/// released models' layout, which mlx-lm loads), in `dir/qwen3_5-KIND-nested`.
fn qwen3_5_checkpoint(kind: &str, dir: &Path, nested: bool) -> PathBuf {
    let hf = dir.join(format!("qwen3_5-{kind}"));
    let tok = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    let py = quantfarm_e2e::convert_python();
    quantfarm_e2e::run_py_with(
        &py,
        "qwen35.py",
        &[OsStr::new("make"), OsStr::new(kind), hf.as_os_str(), tok.as_os_str()],
    );
    if !nested {
        return hf;
    }
    let out = dir.join(format!("qwen3_5-{kind}-nested"));
    quantfarm_e2e::run_py_with(&py, "qwen35.py", &[OsStr::new("nest"), hf.as_os_str(), out.as_os_str()]);
    out
}

/// A Qwen3.5 release (hybrid gated-delta-net and attention layers, the v-head reorder, `ssm_a = -exp(A_log)`, a
/// multi-token-prediction block written as a trailing NextN block): transformers' own tiny checkpoint of `kind` in
/// the released models' layout, the LoRA on its full-attention layer; the MLX rung made as mlx_lm.convert makes it
/// (mlx-lm's sanitize: norms + 1 in bf16; the MoE's fused experts split), measured in llama.cpp through its exact
/// conversion (the v-head reorder of quantized rows, the sanitize undone) and in mlx-lm beside the source's bf16
/// weights.
fn qwen3_5_release_of(kind: &str) {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let hf = qwen3_5_checkpoint(kind, dir.path(), true);
    let adapter = quantfarm_e2e::lora_adapter("peft-attn", &hf, dir.path());
    let name = if kind == "moe" { "qwen3_5_moe" } else { "qwen3_5" };
    let sum = release_of(name, &hf, Some(&adapter), dir.path(), MlxRung::MlxLm, &[]);
    assert_eq!(sum["merge_check"]["greedy"]["identical"], 2, "{:#}", sum["merge_check"]);
    // An 8-bit rung is as close to the reference as Q8_0 is: rows in the wrong order, or norms offset twice, would
    // be far from it.
    let kld = |ty: &str| {
        let a = sum["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == ty).unwrap();
        a["kld"]["mean_kld"].as_f64().unwrap()
    };
    let (mlx, q8) = (kld("MLX-8bit"), kld("Q8_0"));
    assert!(mlx < 10.0 * q8.max(1e-4), "{kind}: MLX-8bit mean KLD {mlx}, Q8_0 {q8}");
}

/// Qwen3.5-MoE (experts fused as transformers 5 saves them, split going to MLX; a shared expert): the family's
/// release path, which the dense model's shares but for its plain MLP.
#[test]
fn qwen3_5_moe_release() {
    qwen3_5_release_of("moe");
}

/// The dense Qwen3.5 (the family of the parity method's own 27B run): only with QUANTFARM_LONG, as the MoE release
/// covers its layers.
#[test]
fn qwen3_5_release() {
    if quantfarm_e2e::skip_unless_long("qwen3_5_release", "qwen3_5_moe_release runs its layers") {
        return;
    }
    qwen3_5_release_of("dense");
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
    convert_hf_to_gguf_py(&hf, "bf16", &bf16);
    // With an MLX rung made as `convert --to mlx` makes it (rope_freqs.weight back as the config's rope_scaling),
    // verified and measured in llama.cpp (mlx-lm cannot load the GGUF reference for link 2).
    let sum = release_of("from-gguf", &bf16, None, &dir.path().join("gguf"), MlxRung::LlamaCpp, &[]);
    let reference = sum["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == "BF16").unwrap().clone();
    let file = PathBuf::from(reference["files"][0]["url"].as_str().unwrap());
    assert!(std::fs::read(&file).unwrap() == std::fs::read(&bf16).unwrap(), "the reference is the source GGUF");

    // A quantized GGUF source only with QUANTFARM_LONG (`scripts/test --long`): the release path is the BF16 GGUF's,
    // and its reference is its exact decoding, checked against gguf-py in the default run
    // (tests/tests/dequant_oracle.rs).
    if !quantfarm_e2e::skip_unless_long("release from a Q4_K_M GGUF", "the same release path as from the BF16 GGUF") {
        let q4 = dir.path().join("llama3-q4_k_m.gguf");
        let o = Command::new(llama_bin().join("llama-quantize"))
            .arg(&bf16)
            .arg(&q4)
            .args(["Q4_K_M", "2"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        release_of("from-q4", &q4, None, &dir.path().join("q4"), MlxRung::None, &[]);
    }

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
    // An MLX rung of a quantized MLX source: quantized again from its values as mx.dequantize gives them (the
    // reference's), and measured in mlx-lm beside the source itself.
    release_of("from-mlx", &mlx, None, &dir.path().join("mlx"), MlxRung::MlxLm, &[]);
}

/// The ladder of each family's BF16 GGUF is byte-identical to llama-quantize's, run here on the same file:
/// llama-quantize's rules for each architecture (the generated rope_freqs.weight kept F32, the 3-D expert tensors,
/// the tied embedding, Qwen3.5's recurrent-layer tensors and NextN block). One family per GGUF architecture: the
/// rules are the architecture's (Phi-4's are phi3's, Mistral Nemo's llama's). The BF16 file is `quantfarm convert`'s,
/// which `tests/tests/convert_architectures.rs` (and `qwen35.rs`) check byte for byte against convert_hf_to_gguf.py's
/// on the same checkpoints: both quantizers are given one file, whoever wrote it.
#[test]
fn family_ladders_equal_llama_quantize() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let families = [
        "llama3",
        "qwen3_moe",
        "gemma2",
        "gemma3_mm",
        "phi3",
        "ministral3_mm",
        "granite",
        "olmo2",
        "qwen3_5",
        "gpt_oss_bf16",
        "gpt_oss",
    ];
    for arch in families {
        let bf16 = dir.path().join(format!("{arch}-bf16.gguf"));
        // transformers' own tiny Qwen3.5 with its NextN block (tests/py/qwen35.py), SmolLM2's tokenizer.
        let hf = if arch == "qwen3_5" {
            qwen3_5_checkpoint("dense", dir.path(), false)
        } else {
            checkpoint(arch, dir.path())
        };
        let o = Command::new(env!("CARGO_BIN_EXE_quantfarm")).arg("convert").arg(&hf).arg(&bf16).output().unwrap();
        assert!(o.status.success(), "quantfarm convert {arch}: {}", String::from_utf8_lossy(&o.stderr));
        for &ty in ladder(arch) {
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

/// gpt-oss as OpenAI ships it (MXFP4 experts, no adapter: a LoRA merges into a dequantized checkpoint, and a
/// quantized base is refused): its GGUF keeps the experts MXFP4 (MOSTLY_MXFP4_MOE), and the rung that keeps them
/// is made, verified, measured and released. An MLX rung is refused by name (quantfarm does not write mlx's mxfp4
/// weights yet), and with it the mlx-lm link.
#[test]
fn gpt_oss_mxfp4_release() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint("gpt_oss", dir.path());
    release_of("gpt_oss", &hf, None, dir.path(), MlxRung::None, &[]);
}
