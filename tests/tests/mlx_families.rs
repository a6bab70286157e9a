//! HF → MLX for every mapped family against `mlx_lm.convert -q` (mlx-lm 0.32.2) run here on the same checkpoint:
//! tiny random checkpoints (`tests/py/make_synthetic_hf.py`) of Llama 3, Qwen3-MoE, Gemma 2, Gemma 3 (text and
//! multimodal), Ministral 3 (multimodal), Phi-3, SmolLM3, Granite and OLMo 2 must give the very same tensors (name,
//! dtype, shape and bytes) and config.json as mlx-lm writes, and gpt-oss fine-tunes mlx-lm's own layout of the same
//! weights; `quantfarm verify` then recomputes every module of ours. What each family's
//! model does on loading (experts stacked, towers popped, a quantization predicate) comes from its mapping's `mlx`
//! section, so these are the tests of that data.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use quantfarm_e2e::run_py;
use quantfarm_quant::mlx_file::{quantize_mlx_checkpoint, MlxOptions};
use quantfarm_quant::mlx_fp::FpMode;
use quantfarm_quant::mlx_recipe::MixedRecipe;
use quantfarm_store::Location;
use quantfarm_tensors::TensorSource;
use serde_json::Value;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn checkpoint(arch: &str, dir: &Path) -> PathBuf {
    quantfarm_e2e::synthetic_hf(arch, &dir.join(arch))
}

/// `mlx_checkpoint.py stored`: every stored tensor's dtype, shape and sha256.
fn stored(dir: &Path) -> serde_json::Map<String, Value> {
    serde_json::from_str(&run_py("mlx_checkpoint.py", &[OsStr::new("stored"), dir.as_os_str()])).unwrap()
}

/// Ours from `hf`, mlx-lm's from `oracle_input` (the same checkpoint, or the layout mlx-lm loads of it).
fn check_with(arch: &str, hf: &Path, oracle_input: &Path, dir: &Path, quantized: usize) {
    check_rung(arch, hf, oracle_input, dir, quantized, Rung::Four);
}

/// The rungs `mlx_lm.convert -q` is compared at.
#[derive(Clone, Copy)]
enum Rung {
    /// 4 bits, groups of 64.
    Four,
    /// `--quant-predicate`.
    Mixed(MixedRecipe),
    /// `--q-mode`.
    Fp(FpMode),
}

/// [`check_with`] at another rung.
fn check_rung(arch: &str, hf: &Path, oracle_input: &Path, dir: &Path, quantized: usize, rung: Rung) {
    let what = match rung {
        Rung::Four => "4".to_string(),
        Rung::Mixed(r) => r.to_string(),
        Rung::Fp(m) => m.name().to_string(),
    };
    let theirs = dir.join(format!("{arch}-{what}-mlx-lm"));
    run_py(
        "mlx_checkpoint.py",
        &[OsStr::new("convert"), oracle_input.as_os_str(), theirs.as_os_str(), OsStr::new(&what), OsStr::new("64")],
    );
    let ours = dir.join(format!("{arch}-{what}-ours"));
    let done = rt().block_on(async {
        let src = TensorSource::open(&Location::local(hf)).await.unwrap();
        // A small budget, so tensors (and a stacked tensor's experts) are read in several pieces.
        let base = match rung {
            Rung::Four => MlxOptions::new(4, 64),
            Rung::Mixed(r) => MlxOptions::mixed(r, 64),
            Rung::Fp(m) => MlxOptions::fp(m),
        };
        let opts = MlxOptions { budget: 64 << 10, ..base };
        quantize_mlx_checkpoint(&src, &Location::local(&ours), &opts).await.unwrap_or_else(|e| panic!("{arch}: {e}"))
    });
    let (a, b) = (stored(&ours), stored(&theirs));
    let names = |m: &serde_json::Map<String, Value>| m.keys().cloned().collect::<std::collections::BTreeSet<_>>();
    assert_eq!(names(&a), names(&b), "{arch}: tensor names (ours, mlx-lm's)");
    for (name, want) in &b {
        assert_eq!(&a[name], want, "{arch}: {name} (ours, mlx-lm's)");
    }
    assert_eq!(done.quantized, quantized, "{arch}: modules quantized");
    for file in ["config.json", "model.safetensors.index.json"] {
        let (x, y) = (std::fs::read(ours.join(file)).unwrap(), std::fs::read(theirs.join(file)).unwrap());
        assert!(
            x == y,
            "{arch}: {file} differs:\nours {}\nmlx-lm {}",
            String::from_utf8_lossy(&x),
            String::from_utf8_lossy(&y)
        );
    }
    quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(hf, &ours, None));
    eprintln!("{arch} {what}: {} tensors identical to mlx_lm.convert -q, {quantized} modules quantized", a.len());
}

/// mlx-lm's mixed recipes (`--quant-predicate`): the high bits on v_proj (and a fused qkv_proj, whose name contains
/// it) and down_proj of the first and last eighth of the blocks and every third between, and on lm_head; every
/// quantized module listed in config.json in mlx-lm's module order; the model's own predicate replaced (Qwen3-MoE's
/// 8-bit router gets the recipe's bits); a multimodal wrapper's prefix. Tensors, config.json and the index byte for
/// byte, then `quantfarm verify`, which recognizes the recipe from config.json.
fn check_recipe(arch: &str, recipe: MixedRecipe, quantized: usize) {
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint(arch, dir.path());
    check_rung(arch, &hf, &hf, dir.path(), quantized, Rung::Mixed(recipe));
}

/// Also: a config.json whose recipe entry contradicts its module's tensors (a 6-bit module said to be at 4 bits)
/// fails `quantfarm verify`, naming the tensor.
#[test]
fn llama3_mixed_4_6_equals_mlx_lm() {
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint("llama3", dir.path());
    check_rung("llama3", &hf, &hf, dir.path(), 15, Rung::Mixed(MixedRecipe::Mixed4_6));
    let ours = dir.path().join("llama3-mixed_4_6-ours");
    let path = ours.join("config.json");
    let text = std::fs::read_to_string(&path).unwrap();
    // Block 1 of 2 is in the last eighth: its v_proj has 6 bits.
    let entry = "\"model.layers.1.self_attn.v_proj\": {\n            \"group_size\": 64,\n            \"bits\": 6,";
    assert!(text.contains(entry), "{text}");
    std::fs::write(&path, text.replace(entry, &entry.replace("\"bits\": 6", "\"bits\": 4"))).unwrap();
    let opts = quantfarm_quant::verify::VerifyOptions { budget: 8 << 20, adapter: None, base_name: None };
    let got = rt().block_on(quantfarm_quant::verify::verify(&Location::local(&hf), &Location::local(&ours), &opts));
    // The reader finds the entry at odds with the stored tensors before anything is recomputed.
    let e = got.expect_err("a config.json at odds with its tensors verified").to_string();
    assert!(e.contains("model.layers.1.self_attn.v_proj.scales") && e.contains("for 4 bits"), "{e}");
}

#[test]
fn phi3_mixed_3_6_equals_mlx_lm() {
    check_recipe("phi3", MixedRecipe::Mixed3_6, 2 * 4 + 2);
}

#[test]
fn qwen3_moe_mixed_2_6_equals_mlx_lm() {
    check_recipe("qwen3_moe", MixedRecipe::Mixed2_6, 2 * 7 + 2);
}

#[test]
fn ministral3_multimodal_mixed_3_4_equals_mlx_lm() {
    check_recipe("ministral3_mm", MixedRecipe::Mixed3_4, 16);
}

/// `--q-mode mxfp4|nvfp4|mxfp8`: uint32 codes and uint8 scales, no biases; config.json's global entry names the
/// mode while the model's own predicate still gives affine entries without one (Qwen3-MoE's 8-bit router), and the
/// 32-wide expert rows that groups of 64 leave in bf16 are quantized in the modes' groups of 16 or 32. Then the
/// checkpoint converts to GGUF as `mx.dequantize` gives its values (how a release measures the rung in llama.cpp).
fn check_fp(arch: &str, mode: FpMode, quantized: usize) {
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint(arch, dir.path());
    check_rung(arch, &hf, &hf, dir.path(), quantized, Rung::Fp(mode));
    let ours = dir.path().join(format!("{arch}-{}-ours", mode.name()));
    let deq = dir.path().join(format!("deq/{arch}-{}-ours", mode.name()));
    assert_eq!(mlx_to_gguf_as_dequantized(&ours, &deq, dir.path()), format!("dequantized {quantized}"));
}

#[test]
fn llama3_mxfp4_equals_mlx_lm() {
    check_fp("llama3", FpMode::Mxfp4, 15);
}

#[test]
fn qwen3_moe_nvfp4_equals_mlx_lm() {
    check_fp("qwen3_moe", FpMode::Nvfp4, 2 * 8 + 2);
}

#[test]
fn gemma3_mxfp8_equals_mlx_lm() {
    check_fp("gemma3", FpMode::Mxfp8, 15);
}

fn check(arch: &str, quantized: usize) {
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint(arch, dir.path());
    check_with(arch, &hf, &hf, dir.path(), quantized);
}

/// 2 blocks × 7 Linears, the embedding, and the untied head where there is one.
#[test]
fn llama3_mlx_equals_mlx_lm() {
    check("llama3", 15);
}

/// Experts stacked into `switch_mlp` (3-D, quantized along the last axis), the router kept at 8 bits; the stacked
/// down projections' 32-wide rows do not divide into groups of 64, so they stay bf16, as in mlx-lm.
#[test]
fn qwen3_moe_mlx_equals_mlx_lm() {
    check("qwen3_moe", 2 * 7 + 2);
}

#[test]
fn gemma2_mlx_equals_mlx_lm() {
    check("gemma2", 15);
}

#[test]
fn gemma3_mlx_equals_mlx_lm() {
    check("gemma3", 15);
}

/// Gemma3ForConditionalGeneration as transformers 5 saves it (`model.language_model.…`): mlx-lm 0.32.2 loads only
/// the layout Google's repositories ship (`language_model.model.…`, `vision_tower.…`), so its output for that
/// copy is the reference; ours, from the transformers 5 layout, must be the same (the towers left out).
#[test]
fn gemma3_multimodal_mlx_equals_mlx_lm() {
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint("gemma3_mm", dir.path());
    let legacy = dir.path().join("gemma3_mm-legacy");
    run_py(
        "mlx_checkpoint.py",
        &[
            OsStr::new("rename"),
            hf.as_os_str(),
            legacy.as_os_str(),
            OsStr::new("model.language_model.=language_model.model."),
            OsStr::new("model.vision_tower.=vision_tower."),
            OsStr::new("model.multi_modal_projector.=multi_modal_projector."),
        ],
    );
    check_with("gemma3_mm", &hf, &legacy, dir.path(), 15);
    // The legacy layout itself converts the same.
    check_with("gemma3_mm-legacy", &legacy, &legacy, dir.path(), 15);
}

/// Fused qkv_proj and gate_up_proj kept fused, as mlx-lm's phi3 model has them.
/// mlx-lm's mistral3 wrapper: the text model under `language_model.`, the Pixtral tower popped.
#[test]
fn ministral3_multimodal_mlx_equals_mlx_lm() {
    check("ministral3_mm", 16);
}

#[test]
fn phi3_mlx_equals_mlx_lm() {
    check("phi3", 2 * 4 + 2);
}

#[test]
fn smollm3_mlx_equals_mlx_lm() {
    check("smollm3", 15);
}

/// o_proj, down_proj (and an untied lm_head) at 8 bits, as granite's quant_predicate says.
#[test]
fn granite_mlx_equals_mlx_lm() {
    check("granite", 15);
}

#[test]
fn olmo2_mlx_equals_mlx_lm() {
    check("olmo2", 16);
}

/// transformers 5's fused experts: mlx-lm 0.32.2 fails on them (its sanitize stacks per-expert weights), and
/// quantfarm refuses them by name, saying what to do instead.
#[test]
fn fused_experts_are_refused_going_to_mlx() {
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint("qwen3_moe_fused", dir.path());
    let err = rt().block_on(async {
        let src = TensorSource::open(&Location::local(&hf)).await.unwrap();
        let out = Location::local(dir.path().join("out"));
        quantize_mlx_checkpoint(&src, &out, &MlxOptions::new(4, 64)).await.err().expect("refused").to_string()
    });
    assert!(
        err.contains("model.layers.0.mlp.experts.down_proj") && err.contains("quantfarm convert --to mlx"),
        "{err}"
    );
    assert!(!dir.path().join("out").exists(), "nothing written");
}

/// The stacked, 3-D quantized experts read back exactly as MLX dequantizes them: our Qwen3-MoE MLX checkpoint
/// converted to GGUF is the same file as the HF folder `mx.dequantize` makes of it (tests/py/mlx_dequant_hf.py)
/// converted as an ordinary checkpoint (the release measures an MLX rung through this conversion).
#[test]
fn qwen3_moe_mlx_converts_to_gguf_as_mlx_dequantizes_it() {
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint("qwen3_moe", dir.path());
    // The same folder name on both sides: general.name comes from it.
    let (mlx, deq) = (dir.path().join("mlx/Qwen3-MoE"), dir.path().join("deq/Qwen3-MoE"));
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(&hf)).await.unwrap();
        quantize_mlx_checkpoint(&src, &Location::local(&mlx), &MlxOptions::new(4, 64)).await.unwrap();
    });
    assert_eq!(mlx_to_gguf_as_dequantized(&mlx, &deq, dir.path()), "dequantized 16");
}

/// Asserts that MLX checkpoint `mlx` converted to GGUF is the same file as the HF folder `deq` that
/// `mx.dequantize` makes of it (tests/py/mlx_dequant_hf.py; the same folder name, which general.name comes from)
/// converted as an ordinary checkpoint, in `dir`; returns what the script printed.
fn mlx_to_gguf_as_dequantized(mlx: &Path, deq: &Path, dir: &Path) -> String {
    use quantfarm_tensors::convert::{convert_hf_to_gguf, OutType};
    let printed = run_py("mlx_dequant_hf.py", &[mlx.as_os_str(), deq.as_os_str()]);
    let to_gguf = |src: &Path, out: &str| {
        let dst = Location::local(dir.join(out));
        let done = rt().block_on(convert_hf_to_gguf(
            &Location::local(src),
            &dst,
            "model",
            OutType::Bf16,
            None,
            1 << 20,
            false,
        ));
        std::fs::read(&done.unwrap_or_else(|e| panic!("{}: {e}", src.display()))[0].location).unwrap()
    };
    let (a, b) = (to_gguf(mlx, "from-mlx"), to_gguf(deq, "from-deq"));
    assert!(a == b, "MLX → GGUF differs from MLX-dequantized HF → GGUF ({} and {} bytes)", a.len(), b.len());
    printed.trim().to_string()
}

/// gpt-oss fine-tunes are saved with bf16 experts in transformers' GptOssExperts layout, which mlx-lm 0.32.2 cannot
/// load; quantfarm writes them as mlx-lm's model holds them (`mlx.split` in mappings/gpt_oss.yaml). The oracle is
/// two independent tools from one MXFP4 checkpoint: transformers dequantizes it into the fine-tune layout (ours is
/// made from that), and mlx-lm loads it natively (its sanitize splits gate/up), `mlx_lm.convert --dequantize`
/// writes mlx-lm's own bf16 layout, and `mlx_lm.convert -q` quantizes that. Unquantized and 4-bit, every tensor is
/// the same bytes; the 4-bit checkpoint then converts to GGUF as its `mx.dequantize` does (the release measures an
/// MLX rung through that conversion).
#[test]
fn gpt_oss_bf16_mlx_equals_mlx_lms_own_layout() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mxfp4 = checkpoint("gpt_oss", d);
    let hf = d.join("gpt-oss-bf16");
    let printed = quantfarm_e2e::run_py_with(
        &quantfarm_e2e::convert_python(),
        "transformers_mxfp4_dequant.py",
        &[mxfp4.as_os_str(), hf.as_os_str()],
    );
    assert_eq!(printed.trim(), "dequantized 8", "2 blocks × gate_up, down and their biases");
    let (mlx_bf16, theirs) = (d.join("mlx-lm-bf16"), d.join("mlx-lm-q4"));
    run_py(
        "mlx_checkpoint.py",
        &[OsStr::new("dequantize"), mxfp4.as_os_str(), mlx_bf16.as_os_str(), OsStr::new("bfloat16")],
    );
    run_py(
        "mlx_checkpoint.py",
        &[OsStr::new("convert"), mlx_bf16.as_os_str(), theirs.as_os_str(), OsStr::new("4"), OsStr::new("64")],
    );
    let ours = |out: &Path, opts: MlxOptions| {
        rt().block_on(async {
            let src = TensorSource::open(&Location::local(&hf)).await.unwrap();
            // A small budget: the transposed experts are gathered in several bands.
            let opts = MlxOptions { budget: 16 << 10, ..opts };
            quantize_mlx_checkpoint(&src, &Location::local(out), &opts).await.unwrap_or_else(|e| panic!("{e}"))
        })
    };
    let (ours_bf16, ours_q4) = (d.join("ours-bf16"), d.join("ours-q4"));
    ours(&ours_bf16, MlxOptions::unquantized());
    let done = ours(&ours_q4, MlxOptions::new(4, 64));
    for (a, b, what) in [(&ours_bf16, &mlx_bf16, "unquantized"), (&ours_q4, &theirs, "4-bit")] {
        let (a, b) = (stored(a), stored(b));
        let names = |m: &serde_json::Map<String, Value>| m.keys().cloned().collect::<std::collections::BTreeSet<_>>();
        assert_eq!(names(&a), names(&b), "{what}: tensor names (ours, mlx-lm's)");
        for (name, want) in &b {
            assert_eq!(&a[name], want, "{what}: {name} (ours, mlx-lm's)");
        }
        eprintln!("gpt-oss {what}: {} tensors identical to mlx-lm's", a.len());
    }
    // Experts and attention of 2 blocks (3 + 4), the embedding and the head; the routers at 8 bits.
    assert_eq!(done.quantized, 16, "modules quantized");
    let config =
        |p: &Path| -> Value { serde_json::from_slice(&std::fs::read(p.join("config.json")).unwrap()).unwrap() };
    assert_eq!(config(&ours_q4)["quantization"], config(&theirs)["quantization"], "config.json quantization");
    assert!(config(&ours_bf16).get("quantization").is_none(), "unquantized: no quantization in config.json");
    for out in [&ours_bf16, &ours_q4] {
        quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(&hf, out, None));
    }
    // MLX → GGUF reads mlx-lm's layout: the same file as the HF folder mx.dequantize makes of the checkpoint.
    let deq = d.join("deq/gpt-oss");
    let mlx = d.join("mlx/gpt-oss");
    std::fs::create_dir_all(d.join("mlx")).unwrap();
    std::fs::rename(&ours_q4, &mlx).unwrap();
    assert!(mlx_to_gguf_as_dequantized(&mlx, &deq, d).starts_with("dequantized"));
}

/// gpt-oss's MXFP4 checkpoint to MLX is refused by name, before anything is written: mlx-lm keeps the expert
/// blocks as mlx's mxfp4 weights, which quantfarm does not write yet (a dequantized checkpoint converts: above).
#[test]
fn gpt_oss_mxfp4_to_mlx_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mxfp4 = checkpoint("gpt_oss", dir.path());
    let out = dir.path().join("mlx");
    let done = rt().block_on(async {
        let src = TensorSource::open(&Location::local(&mxfp4)).await.unwrap();
        quantize_mlx_checkpoint(&src, &Location::local(&out), &MlxOptions::new(4, 64)).await
    });
    let Err(e) = done else { panic!("gpt-oss's MXFP4 checkpoint converted to MLX") };
    let e = e.to_string();
    assert!(e.contains("_blocks") && e.contains("MXFP4") && e.contains("dequantize it to bf16"), "{e}");
    assert!(!out.exists(), "nothing written: {e}");
}
