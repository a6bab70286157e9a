//! GGUF files written by the real tools: read → write is byte-identical (a file from the wild, ggml's own writer,
//! and a 3-way split by `llama-gguf-split`), and dequantization equals gguf-py's bit for bit.

use std::path::Path;
use std::process::Command;

use quantfarm_e2e::{fixtures_dir, llama_bin, run_py, smollm2_gguf};
use quantfarm_store::Location;
use quantfarm_tensors::write::copy_gguf;
use quantfarm_tensors::TensorSource;
use sha2::{Digest, Sha256};

fn sha256_file(p: &Path) -> String {
    let mut h = Sha256::new();
    let mut f = std::fs::File::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    std::io::copy(&mut f, &mut h).unwrap();
    quantfarm_store::hex(&h.finalize())
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Copies `src` (the first file of a model) into `out_dir` under `out_name` and returns the written paths.
fn round_trip(src: &Path, out_dir: &Path, out_name: &str, budget: u64) -> Vec<std::path::PathBuf> {
    rt().block_on(async {
        let s = TensorSource::open(&Location::local(src)).await.unwrap();
        let written = copy_gguf(&s, &Location::local(out_dir.join(out_name)), budget, false).await.unwrap();
        written.iter().map(|c| std::path::PathBuf::from(&c.location)).collect()
    })
}

#[test]
fn smollm2_round_trips_byte_for_byte() {
    let src = smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    // A small budget forces tensors to be copied in several reads.
    let out = round_trip(&src, dir.path(), "copy.gguf", 1 << 20);
    assert_eq!(out.len(), 1);
    assert_eq!(sha256_file(&out[0]), sha256_file(&src), "SmolLM2 Q4_1 changed in the round trip");
}

#[test]
fn ggml_tiny_gguf_round_trips_byte_for_byte() {
    let src = fixtures_dir().join("ggml-golden/tiny.gguf");
    let dir = tempfile::tempdir().unwrap();
    let out = round_trip(&src, dir.path(), "tiny.gguf", 64);
    assert_eq!(std::fs::read(&out[0]).unwrap(), std::fs::read(&src).unwrap());
}

#[test]
fn three_way_split_by_llama_gguf_split_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let split_dir = dir.path().join("split");
    std::fs::create_dir(&split_dir).unwrap();
    let tool = llama_bin().join("llama-gguf-split");
    // SmolLM2 has 272 tensors: 100 per file makes 3 files.
    let status = Command::new(&tool)
        .args(["--split", "--split-max-tensors", "100"])
        .arg(smollm2_gguf())
        .arg(split_dir.join("smollm2"))
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("{}: {e}", tool.display()));
    assert!(status.success(), "llama-gguf-split failed");
    let first = split_dir.join("smollm2-00001-of-00003.gguf");
    assert!(
        first.exists(),
        "llama-gguf-split did not write 3 files: {:?}",
        std::fs::read_dir(&split_dir).unwrap().collect::<Vec<_>>()
    );

    let src = rt().block_on(TensorSource::open(&Location::local(&first))).unwrap();
    assert_eq!(src.tensors().len(), 272, "the split model reads as one model");

    let out_dir = dir.path().join("out");
    let out = round_trip(&first, &out_dir, "again-00001-of-00003.gguf", 4 << 20);
    assert_eq!(out.len(), 3);
    for i in 1..=3 {
        let a = split_dir.join(format!("smollm2-0000{i}-of-00003.gguf"));
        let b = out_dir.join(format!("again-0000{i}-of-00003.gguf"));
        assert_eq!(sha256_file(&a), sha256_file(&b), "split file {i} differs");
    }
}

#[test]
fn smollm2_dequantizes_like_gguf_py_bit_for_bit() {
    let src_path = smollm2_gguf();
    let reference: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&run_py("gguf_dequant_hashes.py", &[src_path.as_os_str()])).unwrap();
    let ours = rt().block_on(async {
        let src = TensorSource::open(&Location::local(&src_path)).await.unwrap();
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        for e in src.tensors() {
            let mut values = vec![0f32; e.elements() as usize];
            src.read_f32_rows(&e.name, 0, &mut values, &mut scratch).await.unwrap();
            let mut h = Sha256::new();
            for v in &values {
                h.update(v.to_le_bytes());
            }
            out.push((e.name.clone(), quantfarm_store::hex(&h.finalize())));
        }
        out
    });
    assert_eq!(ours.len(), reference.len());
    let mismatched: Vec<_> = ours
        .iter()
        .filter(|(n, h)| reference.get(n).and_then(|v| v.as_str()) != Some(h.as_str()))
        .map(|(n, _)| n.clone())
        .collect();
    assert!(mismatched.is_empty(), "{} tensors dequantize differently from gguf-py: {mismatched:?}", mismatched.len());
}
