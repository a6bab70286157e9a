//! The synthesized tiny Llama: the same bytes every time (pinned, so a change is noticed and the tiny Llama's version (quantfarm_proto::SYNTHETIC_MODELS)
//! bumped), converted by our converter into a GGUF that llama.cpp loads and generates from.

use std::path::{Path, PathBuf};

use quantfarm_e2e::llama_generate;
use quantfarm_store::Location;
use quantfarm_tensors::convert::{convert_hf_to_gguf, OutType};
use quantfarm_tensors::synthetic::{tiny_llama_exists, write_tiny_llama, TINY_LLAMA_FILES};
use quantfarm_tensors::TensorSource;
use serde_json::Value as Json;

/// sha256 of model.safetensors. If this changes, the model's bytes changed: bump the tiny Llama's version (quantfarm_proto::SYNTHETIC_MODELS).
/// The tiny Llama's versioned name (`quantfarm_proto::SYNTHETIC_MODELS`).
fn tiny_llama() -> &'static str {
    quantfarm_proto::synthetic_model("tiny-llama").expect("tiny-llama is in SYNTHETIC_MODELS")
}

const MODEL_SHA256: &str = "5d90fa10af4f4dcd60d770f0198d58fc566a960e12756265ebd8e36f6e6320ed";

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn write(dir: &Path) -> Vec<quantfarm_store::Committed> {
    rt().block_on(write_tiny_llama(&Location::local(dir))).unwrap()
}

fn exists(dir: &Path) -> bool {
    rt().block_on(tiny_llama_exists(&Location::local(dir))).unwrap()
}

#[test]
fn tiny_llama_is_deterministic_and_pinned() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a").join(tiny_llama()), tmp.path().join("b").join(tiny_llama()));
    assert!(!exists(&a));
    let written = write(&a);
    assert!(exists(&a));
    write(&b);
    assert_eq!(written.len(), TINY_LLAMA_FILES.len());
    for f in TINY_LLAMA_FILES {
        let (x, y) = (std::fs::read(a.join(f)).unwrap(), std::fs::read(b.join(f)).unwrap());
        assert!(x == y, "{f} differs between two writes");
    }
    let model = written.iter().find(|c| c.location.ends_with("/model.safetensors")).unwrap();
    assert!(model.bytes < 1 << 20, "{} bytes", model.bytes);
    assert_eq!(
        model.sha256,
        MODEL_SHA256,
        "model.safetensors changed: bump the tiny Llama's version ({}) in SYNTHETIC_MODELS",
        tiny_llama()
    );
    // Idempotent: a re-run finds the same files and changes nothing.
    assert_eq!(write(&a), written);
}

#[test]
fn tiny_llama_converts_and_llama_cpp_generates() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tmp.path().join(tiny_llama());
    write(&hf);
    let out = rt()
        .block_on(convert_hf_to_gguf(
            &Location::local(&hf),
            &Location::local(tmp.path()),
            "tiny",
            OutType::Bf16,
            None,
            1 << 20,
            false,
        ))
        .unwrap();
    assert_eq!(out.len(), 1);
    let gguf = PathBuf::from(&out[0].location);

    let meta = rt().block_on(TensorSource::open(&Location::local(&gguf))).unwrap().metadata();
    assert_eq!(meta.get("general.architecture"), Some(&Json::from("llama")));
    assert_eq!(meta.get("tokenizer.ggml.pre"), Some(&Json::from("smollm")));
    assert_eq!(meta.get("llama.block_count"), Some(&Json::from(2)));

    // One thread: with two, llama-completion generated different text from run to run on this 64-wide model.
    let text = llama_generate(&gguf, "hello", 4, 1, &["-c", "128"]);
    assert!(text.starts_with("hello") && text.len() > "hello".len(), "generated {text:?}");
}
