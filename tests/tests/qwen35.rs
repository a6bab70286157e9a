//! The two hybrid families as mappings (`mappings/qwen3_5.yaml`, `mappings/qwen3_5_moe.yaml`): Qwen3.5 and
//! Qwen3.5-MoE GGUFs with the real tensor inventory (gated-delta-net and attention layers, a multi-token-prediction
//! block, the MoE experts, router and gated shared expert) become the MLX checkpoints mlx-lm makes itself.
//!
//! Every file is made by the real tool: transformers builds a tiny random HF checkpoint (bf16, A_log f32), llama.cpp's
//! `convert_hf_to_gguf.py` converts it to GGUF (so the v-head reorder, `-exp(A_log)`, the norms' +1, the conv1d
//! squeeze and the expert stacking are llama.cpp's), and `mlx_lm.convert` makes the reference MLX checkpoint from the
//! same HF checkpoint. Ours, made from the GGUF, must hold the same tensors with the same bytes (A_log: within an
//! ulp, it goes through `log(-(-exp(a)))`), the same quantization (MoE: router and shared-expert gate at 8 bits), load
//! in `mlx_lm.load`, give mlx-lm's logits and generate; `verify` passes. GGUF → HF gives the dense checkpoint back
//! tensor for tensor; the MoE one, whose experts HF stores fused, is refused by name.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use quantfarm_e2e::{
    assert_verified_identical, convert_python, fixtures_dir, llama_bin, llama_src, run_py, run_py_with, smollm2_derived,
};
use quantfarm_quant::mlx_file::{gguf_to_mlx, MlxOptions};
use quantfarm_store::Location;
use quantfarm_tensors::convert::{plan_gguf_to_hf, plan_gguf_to_mlx, write_hf};
use quantfarm_tensors::{Dtype, TensorSource};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// The HF checkpoint of `kind` and its bf16 GGUF made by convert_hf_to_gguf.py (the dense one says its
/// pre-tokenizer is Qwen3.5's, so its rebuilt tokenizer is checked against llama.cpp's).
fn inputs(kind: &str, dir: &Path) -> (PathBuf, PathBuf) {
    let hf = dir.join(format!("hf-{kind}"));
    let tok = smollm2_derived().join("smollm2-hf");
    run_py_with(
        &convert_python(),
        "qwen35.py",
        &[OsStr::new("make"), OsStr::new(kind), hf.as_os_str(), tok.as_os_str()],
    );
    let gguf = dir.join(format!("{kind}.gguf"));
    let src = llama_src();
    run_py_with(
        &convert_python(),
        "qwen35.py",
        &[
            OsStr::new("gguf"),
            hf.as_os_str(),
            gguf.as_os_str(),
            OsStr::new("bf16"),
            src.as_os_str(),
            OsStr::new(if kind == "dense" { "qwen35" } else { "smollm" }),
        ],
    );
    (hf, gguf)
}

/// GGUF → MLX through the library, as `quantfarm convert --to mlx --bits B` does (0: unquantized bf16), with a small
/// budget so row gathers and expert tensors go in several chunks.
fn ours(gguf: &Path, bits: u32, out: &Path) {
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(gguf)).await.unwrap();
        let plan = plan_gguf_to_mlx(&src, Dtype::BF16).unwrap();
        let dst = Location::local(out);
        if bits == 0 {
            write_hf(&src, &plan, &dst, 4096, false).await.unwrap();
        } else {
            let opts = MlxOptions { budget: 4096, ..MlxOptions::new(bits, 64) };
            gguf_to_mlx(&src, &plan, &dst, &opts).await.unwrap();
        }
    });
}

fn check_family(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (hf, gguf) = inputs(kind, dir.path());
    for bits in [4u32, 0] {
        let mine = dir.path().join(format!("ours-{kind}-{bits}"));
        let gold = dir.path().join(format!("mlx-lm-{kind}-{bits}"));
        ours(&gguf, bits, &mine);
        run_py("qwen35.py", &[OsStr::new("golden"), hf.as_os_str(), gold.as_os_str(), OsStr::new(&bits.to_string())]);
        let report = run_py("qwen35.py", &[OsStr::new("compare"), mine.as_os_str(), gold.as_os_str()]);
        eprintln!("{kind} {bits}-bit: {report}");
        let r: serde_json::Value = serde_json::from_str(report.trim().lines().last().unwrap()).unwrap();
        assert_eq!(r["logit_diff"], 0.0, "{report}");
        assert_verified_identical(&quantfarm_e2e::verify(&gguf, &mine, None));
    }
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(format!("ours-{kind}-4/config.json"))).unwrap()).unwrap();
    let overrides = config["quantization"].as_object().unwrap().keys().filter(|k| k.contains("layers")).count();
    assert_eq!(overrides, if kind == "moe" { 8 } else { 0 }, "{}", config["quantization"]);
    assert_eq!(config["text_config"]["num_hidden_layers"], 4, "the NextN block is not a layer");

    let back = dir.path().join(format!("hf-back-{kind}"));
    let planned = rt().block_on(async {
        let src = TensorSource::open(&Location::local(&gguf)).await.unwrap();
        match plan_gguf_to_hf(&src, Dtype::BF16) {
            Ok(plan) => write_hf(&src, &plan, &Location::local(&back), 1 << 20, false).await.map(|_| ()),
            Err(e) => Err(e),
        }
    });
    if kind == "dense" {
        planned.unwrap();
        let report =
            run_py_with(&convert_python(), "qwen35.py", &[OsStr::new("compare_hf"), back.as_os_str(), hf.as_os_str()]);
        eprintln!("dense GGUF -> HF: {report}");
        assert_verified_identical(&quantfarm_e2e::verify(&gguf, &back, None));
        // The tokenizer.json rebuilt with Qwen3.5's pre-tokenizer encodes like llama.cpp's qwen35 tokenizer.
        let server = llama_bin().join("llama-server");
        let text = fixtures_dir().join("texts/gpl3.txt");
        let tok = back.join("tokenizer.json");
        let summary = run_py(
            "tokenize_compare.py",
            &[server.as_os_str(), gguf.as_os_str(), tok.as_os_str(), text.as_os_str(), OsStr::new("2000")],
        );
        assert!(summary.contains("\"identical\": true"), "{summary}");
        eprintln!("qwen35 tokenizer rebuilt from the GGUF: {summary}");
    } else {
        let e = planned.unwrap_err().to_string();
        assert!(e.contains("ffn_down_exps.weight") && e.contains("MLX only"), "{e}");
        assert!(!back.exists(), "nothing written");
    }
}

#[test]
fn qwen3_5_dense_gguf_becomes_mlx_lms_own_checkpoint() {
    check_family("dense");
}

#[test]
fn qwen3_5_moe_gguf_becomes_mlx_lms_own_checkpoint() {
    check_family("moe");
}
