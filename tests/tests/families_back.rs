//! The way back, per family: the GGUF `convert_hf_to_gguf.py` makes of a tiny random checkpoint
//! (`tests/py/make_synthetic_hf.py`) goes back to HF with every tensor the checkpoint's own bit for bit (verified by
//! `quantfarm verify`), and the real converter, run again on that HF folder, writes the same GGUF: every tensor and
//! every metadata key (the config and the tokenizer rebuilt from the GGUF's keys are what the converter needs). The
//! same GGUF goes to MLX with the very tensors the HF checkpoint gives (`tests/tests/mlx_families.rs` compares
//! those with mlx-lm's).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use quantfarm_e2e::{convert_hf_to_gguf_py, run_py, run_py_with, tensor_bytes};
use quantfarm_quant::mlx_file::{gguf_to_mlx, quantize_mlx_checkpoint, MlxOptions};
use quantfarm_store::Location;
use quantfarm_tensors::convert::{convert_gguf_to_hf, plan_gguf_to_mlx};
use quantfarm_tensors::gguf::GgufHeader;
use quantfarm_tensors::{Dtype, TensorSource};
use serde_json::Value;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn checkpoint(arch: &str, dir: &Path) -> PathBuf {
    quantfarm_e2e::synthetic_hf(arch, &dir.join(arch).join("model"))
}

fn header(p: &Path) -> GgufHeader {
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(p)).await.unwrap();
        src.gguf().unwrap().shards[0].1.clone()
    })
}

/// How far convert_hf_to_gguf.py, run on the HF folder written back, agrees with its first GGUF.
#[derive(Clone, Copy)]
enum Again {
    /// The same file, byte for byte.
    Identical,
    /// The same tensors and every key with the same value, except `missing` (what the tokenizer files rebuilt
    /// from the GGUF do not carry yet); keys may come in another order (the special token ids: the rebuilt
    /// tokenizer_config.json names a token the original left to config.json).
    Keys { missing: &'static [&'static str] },
}

fn back(arch: &str, again: Again) {
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint(arch, dir.path());
    back_from(arch, &hf, dir.path(), again);
}

/// [`back`] of `arch`'s checkpoint with its config.json's `rope_scaling` replaced by `scaling` (the same weights:
/// what a user's long-context config of the family holds), in `name`'s folder.
fn back_scaled(arch: &str, name: &str, scaling: Value, again: Again) {
    let dir = tempfile::tempdir().unwrap();
    let base = checkpoint(arch, dir.path());
    let hf = dir.path().join(name).join("model");
    std::fs::create_dir_all(&hf).unwrap();
    for e in std::fs::read_dir(&base).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), hf.join(e.file_name())).unwrap();
    }
    let mut config: Value = serde_json::from_slice(&std::fs::read(hf.join("config.json")).unwrap()).unwrap();
    config["rope_scaling"] = scaling;
    std::fs::write(hf.join("config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    back_from(name, &hf, dir.path(), again);
}

fn back_from(arch: &str, hf: &Path, dir: &Path, again: Again) {
    let (hf, dir) = (hf.to_path_buf(), dir);
    let gguf = dir.join(format!("{arch}.gguf"));
    convert_hf_to_gguf_py(&hf, "bf16", &gguf);

    // GGUF → HF: the checkpoint's tensors, bit for bit; `verify` recomputes them from the GGUF.
    let back = dir.join("back").join("model");
    rt().block_on(convert_gguf_to_hf(&Location::local(&gguf), &Location::local(&back), Dtype::BF16, 1 << 20, false))
        .unwrap_or_else(|e| panic!("{arch}: GGUF → HF: {e}"));
    quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(&gguf, &back, None));
    let (ours, orig) = (tensor_bytes(&back), tensor_bytes(&hf));
    assert_eq!(ours.keys().collect::<Vec<_>>(), orig.keys().collect::<Vec<_>>(), "{arch}: tensor names");
    for (name, b) in &orig {
        assert!(&ours[name] == b, "{arch}: {name} differs from the checkpoint's");
    }

    // The real converter on the HF folder we wrote: the same GGUF, key for key and tensor for tensor.
    let twice = dir.join(format!("{arch}-again.gguf"));
    convert_hf_to_gguf_py(&back, "bf16", &twice);
    let (a, b) = (header(&twice), header(&gguf));
    let missing: &[&str] = match again {
        Again::Keys { missing } => missing,
        Again::Identical => &[],
    };
    let map = |h: &GgufHeader| h.metadata.iter().cloned().collect::<BTreeMap<_, _>>();
    let (ma, mb) = (map(&a), map(&b));
    for (k, vb) in &mb {
        match ma.get(k) {
            None => assert!(missing.contains(&k.as_str()), "{arch}: {k} is lost going round"),
            Some(va) => {
                assert!(va == vb, "{arch}: {k}: again {:.300} vs first {:.300}", format!("{va:?}"), format!("{vb:?}"))
            }
        }
    }
    for k in ma.keys() {
        assert!(mb.contains_key(k), "{arch}: {k} appears going round");
    }
    for k in missing {
        assert!(!ma.contains_key(*k), "{arch}: {k} now goes round: drop it from the test's list");
    }
    assert!(tensor_bytes(&twice) == tensor_bytes(&gguf), "{arch}: tensors differ going round");
    if matches!(again, Again::Identical) {
        let keys = |h: &GgufHeader| h.metadata.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&a), keys(&b), "{arch}: key order");
        assert!(std::fs::read(&twice).unwrap() == std::fs::read(&gguf).unwrap(), "{arch}: the files differ");
    }

    // GGUF → MLX: the tensors HF → MLX makes of the checkpoint itself.
    let (from_gguf, from_hf) = (dir.join("mlx-gguf"), dir.join("mlx-hf"));
    rt().block_on(async {
        let opts = MlxOptions::new(4, 64);
        let src = TensorSource::open(&Location::local(&gguf)).await.unwrap();
        let plan = plan_gguf_to_mlx(&src, Dtype::BF16).await.unwrap();
        gguf_to_mlx(&src, &plan, &Location::local(&from_gguf), &opts).await.unwrap();
        let src = TensorSource::open(&Location::local(&hf)).await.unwrap();
        quantize_mlx_checkpoint(&src, &Location::local(&from_hf), &opts).await.unwrap();
    });
    let stored = |d: &Path| -> serde_json::Map<String, Value> {
        serde_json::from_str(&run_py("mlx_checkpoint.py", &[OsStr::new("stored"), d.as_os_str()])).unwrap()
    };
    let (x, y) = (stored(&from_gguf), stored(&from_hf));
    let names = |m: &serde_json::Map<String, Value>| m.keys().cloned().collect::<std::collections::BTreeSet<_>>();
    assert_eq!(names(&x), names(&y), "{arch}: MLX tensor names (from the GGUF, from the HF checkpoint)");
    for (name, want) in &y {
        assert_eq!(&x[name], want, "{arch}: MLX {name} (from the GGUF, from the HF checkpoint)");
    }
    eprintln!("{arch}: GGUF → HF → GGUF identical ({} tensors); GGUF → MLX = HF → MLX", orig.len());
}

#[test]
fn qwen2_goes_back() {
    back("qwen2", Again::Keys { missing: &[] });
}

#[test]
fn qwen3_goes_back() {
    back("qwen3", Again::Keys { missing: &[] });
}

/// Mistral (LLaMA's SentencePiece vocabulary): tokenizer.model is written back from the GGUF's pieces, scores and
/// types, which the converter reads before tokenizer.json.
#[test]
fn mistral_goes_back() {
    back("mistral", Again::Keys { missing: &[] });
}

/// Gemma 2: norms back as weight − 1, soft-capping and the query scale from the GGUF's keys.
#[test]
fn gemma2_goes_back() {
    back("gemma2", Again::Keys { missing: &[] });
}

#[test]
fn gemma3_goes_back() {
    back("gemma3", Again::Keys { missing: &[] });
}

#[test]
fn olmo2_goes_back() {
    back("olmo2", Again::Identical);
}

#[test]
fn granite_goes_back() {
    back("granite", Again::Keys { missing: &[] });
}

#[test]
fn smollm3_goes_back() {
    back("smollm3", Again::Keys { missing: &[] });
}

/// Llama 3.x: the generated rope_freqs.weight goes back as the config's rope_scaling (llama3, the factor read off
/// the table, Meta's band edges: kept only when they give the table back bit for bit), so the converter run again
/// writes the same rope_freqs.weight, and mlx-lm's Llama reads the same rope scaling from the MLX config.
#[test]
fn llama3_goes_back() {
    back("llama3", Again::Keys { missing: &[] });
}

/// Mistral Nemo: the tekken vocabulary rebuilt from the GGUF's keys (pre-tokenizer tekken, the BOS template; its
/// 1,000 control tokens kept at their ids inside the vocabulary).
#[test]
fn mistral_nemo_goes_back() {
    back("mistral_nemo", Again::Keys { missing: &[] });
}

/// Phi-3.5 (LLaMA's SentencePiece vocabulary with Phi-3's added tokens): the fused qkv_proj and gate_up_proj as
/// they are, and the longrope factor tensors back as rope_scaling (each factor the shortest decimal whose f32 is the
/// tensor's), so the converter run again writes the same factors and attention factor.
#[test]
fn phi3_goes_back() {
    back("phi3", Again::Keys { missing: &[] });
}

/// Phi-4 (cl100k as a GPT2Tokenizer, no rope scaling, no sliding window: the GGUF's 0 goes back as null).
#[test]
fn phi4_goes_back() {
    back("phi4", Again::Keys { missing: &[] });
}

/// Qwen2.5 with yarn scaling (its long-context config): the GGUF's rope.scaling keys back as rope_scaling, so the
/// converter run again writes the same keys.
#[test]
fn qwen2_yarn_goes_back() {
    back("qwen2_yarn", Again::Keys { missing: &[] });
}

/// Qwen3 with the yarn scaling its model card recommends for long contexts (factor 4 over 32,768 positions).
#[test]
fn qwen3_yarn_goes_back() {
    let scaling = serde_json::json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768});
    back_scaled("qwen3", "qwen3_yarn", scaling, Again::Keys { missing: &[] });
}

/// A Llama-architecture model with linear scaling (Mistral's SentencePiece checkpoint, its config scaled by 2).
#[test]
fn llama_linear_goes_back() {
    let scaling = serde_json::json!({"rope_type": "linear", "factor": 2.0});
    back_scaled("mistral", "mistral_linear", scaling, Again::Keys { missing: &[] });
}

/// Qwen3-MoE: each block's stacked ffn_{gate,up,down}_exps back as the per-expert weights (expert by expert, a run
/// of the stacked tensor's rows each), the MoE fields from the GGUF's keys.
#[test]
fn qwen3_moe_goes_back() {
    back("qwen3_moe", Again::Keys { missing: &[] });
}

/// gpt-oss as a fine-tune saves it (bf16 experts in transformers' GptOssExperts layout): the stacked experts joined
/// again, transposed, gate and up dealt out in turn (`fused` in mappings/gpt_oss.yaml), the biases interleaved,
/// yarn's keys back as rope_scaling.
#[test]
fn gpt_oss_bf16_goes_back() {
    back("gpt_oss_bf16", Again::Keys { missing: &[] });
}

/// gpt-oss's own checkpoint: the GGUF the converter makes of it (its MXFP4 expert blocks repacked as GGUF MXFP4)
/// goes back to the bf16 checkpoint transformers itself makes of the MXFP4 one (`Mxfp4Config(dequantize=True)`),
/// tensor for tensor and bit for bit (MXFP4 values are exact in bf16), but for the sign of zero: E2M1's code 8 is
/// −0, which transformers keeps and ggml's table (`kvalues_mxfp4`, an int8 0) makes +0, as our dequantization does
/// to stay ggml's. A small budget reads the experts in bands of whole MXFP4 blocks.
#[test]
fn gpt_oss_mxfp4_goes_back_as_transformers_dequantizes_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mxfp4 = checkpoint("gpt_oss", d);
    let gguf = d.join("gpt_oss.gguf");
    convert_hf_to_gguf_py(&mxfp4, "bf16", &gguf);
    let back = d.join("back").join("model");
    rt().block_on(convert_gguf_to_hf(&Location::local(&gguf), &Location::local(&back), Dtype::BF16, 4096, false))
        .unwrap_or_else(|e| panic!("gpt_oss: GGUF → HF: {e}"));
    let theirs = d.join("transformers");
    let printed = run_py_with(
        &quantfarm_e2e::convert_python(),
        "transformers_mxfp4_dequant.py",
        &[mxfp4.as_os_str(), theirs.as_os_str()],
    );
    assert_eq!(printed.trim(), "dequantized 8", "2 blocks × gate_up, down and their biases");
    let (ours, want) = (tensor_bytes(&back), tensor_bytes(&theirs));
    assert_eq!(ours.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "gpt_oss: tensor names");
    let mut signed_zeros = 0;
    for (name, b) in &want {
        let a = &ours[name];
        assert_eq!(a.len(), b.len(), "gpt_oss: {name}: bytes");
        // bf16 values (every tensor of both is bf16): the same bits, or both a zero.
        for (x, y) in a.chunks_exact(2).zip(b.chunks_exact(2)) {
            let (x, y) = (u16::from_le_bytes([x[0], x[1]]), u16::from_le_bytes([y[0], y[1]]));
            let zeros = x & 0x7fff == 0 && y & 0x7fff == 0;
            assert!(x == y || zeros, "gpt_oss: {name}: {x:#06x}, transformers' {y:#06x}");
            signed_zeros += usize::from(x != y);
        }
    }
    quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(&gguf, &back, None));
    eprintln!(
        "gpt_oss MXFP4: GGUF → HF = transformers' dequantized checkpoint ({} tensors; {signed_zeros} −0 as +0)",
        want.len()
    );
}

/// Ministral 3 (text only): yarn's keys back as rope_parameters with the `mscale_all_dim` and Llama 4 attention
/// temperature the converter writes, so the converter run again writes the same keys.
#[test]
fn ministral3_goes_back() {
    back("ministral3", Again::Keys { missing: &[] });
}
