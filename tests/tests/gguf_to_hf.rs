//! GGUF → HF and GGUF → MLX: the way back through the mappings.
//! - SmolLM2's bf16 GGUF comes back as its HF checkpoint value for value (the q/k permutation undone), and going
//!   forward again gives the GGUF's tensors byte for byte;
//! - the tokenizer rebuilt from the GGUF's keys encodes a 2,000-line text to the same ids as the GGUF's own
//!   tokenizer in llama.cpp (`llama-server` /tokenize), for SmolLM2 (digits split, GPT-2 regex) and Qwen3 (Qwen's
//!   regex, NFC);
//!
//! (GGUF → MLX through the CLI is in cli/tests/convert.rs.)

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use quantfarm_e2e::{convert_python, fixtures_dir, llama_bin, llama_src, run_py, run_py_with, smollm2_derived};
use quantfarm_store::Location;
use quantfarm_tensors::convert::{convert_gguf_to_hf, convert_hf_to_gguf, OutType};
use quantfarm_tensors::{Dtype, TensorSource, TensorType};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Every tensor's values as f32 (exact for BF16, F16 and F32 storage), and its stored type.
fn values(p: &Path) -> HashMap<String, (TensorType, Vec<f32>)> {
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(p)).await.unwrap();
        let mut out = HashMap::new();
        for e in src.tensors() {
            let mut v = vec![0f32; e.elements() as usize];
            src.read_f32_rows(&e.name, 0, &mut v, &mut Vec::new()).await.unwrap();
            out.insert(e.name.clone(), (e.ty, v));
        }
        out
    })
}

fn to_hf(gguf: &Path, dir: &Path) {
    rt().block_on(convert_gguf_to_hf(&Location::local(gguf), &Location::local(dir), Dtype::BF16, 8 << 20, false))
        .unwrap_or_else(|e| panic!("{}: {e}", gguf.display()));
}

fn tokenize_compare(gguf: &Path, tokenizer: &Path) -> String {
    let server = llama_bin().join("llama-server");
    let text = fixtures_dir().join("texts/gpl3.txt");
    run_py(
        "tokenize_compare.py",
        &[server.as_os_str(), gguf.as_os_str(), tokenizer.as_os_str(), text.as_os_str(), OsStr::new("2000")],
    )
}

#[test]
fn smollm2_bf16_gguf_comes_back_as_its_hf_checkpoint() {
    let derived = smollm2_derived();
    let (gguf, hf) = (derived.join("smollm2-bf16.gguf"), derived.join("smollm2-hf"));
    let dir = tempfile::tempdir().unwrap();
    let back = dir.path().join("hf");
    to_hf(&gguf, &back);
    quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(&gguf, &back, None));
    let (ours, orig) = (values(&back), values(&hf));
    assert_eq!(ours.len(), orig.len());
    for (name, (ty, v)) in &orig {
        let (oty, ov) = ours.get(name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(*oty, TensorType::Dtype(Dtype::BF16), "{name}");
        // The fixture keeps norms F32 (their values are bf16 values); everything else is BF16 there too.
        assert!(*ty == TensorType::Dtype(Dtype::BF16) || *ty == TensorType::Dtype(Dtype::F32), "{name}: {ty}");
        let differ = v.iter().zip(ov).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "{name}: {differ} values differ from the HF checkpoint");
    }
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(back.join("config.json")).unwrap()).unwrap();
    let want: serde_json::Value = serde_json::from_slice(&std::fs::read(hf.join("config.json")).unwrap()).unwrap();
    for k in [
        "architectures",
        "model_type",
        "num_hidden_layers",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "rope_theta",
        "rms_norm_eps",
        "vocab_size",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "hidden_act",
    ] {
        assert_eq!(config[k], want[k], "config.json {k}");
    }

    // Forward again: the same tensors as the GGUF we started from.
    let again = dir.path().join("again");
    let out = rt()
        .block_on(convert_hf_to_gguf(
            &Location::local(&back),
            &Location::local(&again),
            "m",
            OutType::Bf16,
            None,
            8 << 20,
            false,
        ))
        .unwrap();
    let (a, b) = (values(Path::new(&out[0].location)), values(&gguf));
    for (name, (ty, v)) in &b {
        let (aty, av) = &a[name];
        assert_eq!(
            (aty, av.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
            (ty, v.iter().map(|x| x.to_bits()).collect()),
            "{name}"
        );
    }

    let summary = tokenize_compare(&gguf, &back.join("tokenizer.json"));
    assert!(summary.contains("\"identical\": true"), "{summary}");
    eprintln!("SmolLM2 tokenizer rebuilt from the GGUF: {summary}");
}

/// Qwen3's byte-level BPE rebuilt from a GGUF (made by our HF → GGUF from a checkpoint with Qwen2's real
/// vocabulary) tokenizes like llama.cpp.
#[test]
fn qwen3_tokenizer_rebuilt_from_the_gguf_tokenizes_like_llama_cpp() {
    rebuilt_tokenizer_tokenizes_like_llama_cpp("qwen3");
}

/// SentencePiece: a Mistral checkpoint with LLaMA's real 32,000-piece vocabulary (llama.cpp's
/// `ggml-vocab-llama-spm.gguf`, as tokenizer.model) → GGUF → HF: the tokenizer.json rebuilt from the GGUF's pieces and
/// scores (byte fallback, merges by score) encodes the text as llama.cpp's SPM tokenizer does.
#[test]
fn sentencepiece_tokenizer_rebuilt_from_the_gguf_tokenizes_like_llama_cpp() {
    rebuilt_tokenizer_tokenizes_like_llama_cpp("mistral");
}

fn rebuilt_tokenizer_tokenizes_like_llama_cpp(arch: &str) {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join(arch);
    let src = llama_src();
    run_py_with(&convert_python(), "make_synthetic_hf.py", &[OsStr::new(arch), hf.as_os_str(), src.as_os_str()]);
    let ggufs = rt()
        .block_on(convert_hf_to_gguf(
            &Location::local(&hf),
            &Location::local(dir.path()),
            arch,
            OutType::Bf16,
            None,
            8 << 20,
            false,
        ))
        .unwrap();
    let gguf = PathBuf::from(&ggufs[0].location);
    let back = dir.path().join("back");
    to_hf(&gguf, &back);
    let summary = tokenize_compare(&gguf, &back.join("tokenizer.json"));
    assert!(summary.contains("\"identical\": true"), "{summary}");
    eprintln!("{arch} tokenizer rebuilt from the GGUF: {summary}");
}
