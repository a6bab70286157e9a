//! llama-quantize's decisions and bytes on the real SmolLM2: for every ladder rung in the shared manifests the
//! mixture rules pick the same type for every tensor, in the same order; for the rungs whose types quantfarm can
//! produce today (Q8_0, Q4_0, Q6_K, Q5_K_M, Q4_K_M) the whole output file equals llama-quantize's, byte for byte.

use quantfarm_e2e::{fixtures_dir, smollm2_derived};
use quantfarm_quant::file::{model_facts, quantize_gguf, Options};
use quantfarm_quant::{mixture, FileType};
use quantfarm_tensors::{Location, TensorSource};
use serde_json::Value;

fn manifest(name: &str) -> Value {
    let p = fixtures_dir().join("smollm2/manifests").join(name);
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn bf16() -> std::path::PathBuf {
    smollm2_derived().join("smollm2-bf16.gguf")
}

#[test]
fn mixture_rules_choose_llama_quantizes_types_for_every_rung() {
    let src = rt().block_on(TensorSource::open(&Location::local(bf16()))).unwrap();
    let facts = model_facts(&src).unwrap();
    let infos: Vec<_> =
        src.gguf().unwrap().tensors().map(|t| (t.info.name.clone(), t.info.dims.clone(), t.info.ty)).collect();
    for (file, ftype) in [
        ("smollm2-q8_0.json", FileType::Q8_0),
        ("smollm2-q6_k.json", FileType::Q6_K),
        ("smollm2-q5_k_m.json", FileType::Q5_K_M),
        ("smollm2-q4_k_m.json", FileType::Q4_K_M),
        ("smollm2-q3_k_m.json", FileType::Q3_K_M),
        ("smollm2-q2_k.json", FileType::Q2_K),
        ("smollm2-q4_0.json", FileType::Q4_0),
    ] {
        let m = manifest(file);
        let theirs: Vec<(String, String)> = m["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["name"].as_str().unwrap().to_string(), t["type"].as_str().unwrap().to_string()))
            .collect();
        let ours: Vec<(String, String)> = mixture::choose_types(ftype, &facts, &infos)
            .into_iter()
            .map(|c| (c.name, c.ty.name().to_string()))
            .collect();
        assert_eq!(ours, theirs, "{ftype}: tensor order and types differ from llama-quantize's ({file})");
    }
}

#[test]
fn q8_0_q4_0_q6_k_q5_k_m_q4_k_m_files_equal_llama_quantizes_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(bf16())).await.unwrap();
        for (file, ftype) in [
            ("smollm2-q8_0.json", FileType::Q8_0),
            ("smollm2-q4_0.json", FileType::Q4_0),
            ("smollm2-q6_k.json", FileType::Q6_K),
            ("smollm2-q5_k_m.json", FileType::Q5_K_M),
            ("smollm2-q4_k_m.json", FileType::Q4_K_M),
        ] {
            let m = manifest(file);
            let out = dir.path().join(format!("{ftype}.gguf"));
            // A small budget: tensors are quantized in many row chunks.
            let opts = Options { ftype, allow_requantize: false, budget: 1 << 20, overwrite: false };
            let q = quantize_gguf(&src, &Location::local(&out), &opts).await.unwrap();
            assert_eq!(q.committed.bytes, m["file"]["size"].as_u64().unwrap(), "{ftype}: size");
            if q.committed.sha256 != m["file"]["sha256"].as_str().unwrap() {
                // Name the first tensor that differs, for the failure message.
                let ours = TensorSource::open(&Location::local(&out)).await.unwrap();
                let mut buf = Vec::new();
                for t in m["tensors"].as_array().unwrap() {
                    let name = t["name"].as_str().unwrap();
                    let e = ours.entry(name).unwrap();
                    buf.resize(e.bytes as usize, 0);
                    ours.read_range(name, 0, &mut buf).await.unwrap();
                    let sha = quantfarm_tensors::sink::hex(&<sha2::Sha256 as sha2::Digest>::digest(&buf));
                    assert_eq!(sha, t["sha256"].as_str().unwrap(), "{ftype}: tensor {name}");
                }
                panic!("{ftype}: tensors equal but the file differs (metadata or layout)");
            }
        }
    });
}

#[test]
fn k_quant_rungs_are_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(bf16())).await.unwrap();
        // Q2_K gives most tensors Q2_K or Q3_K, which quantfarm cannot produce yet (Q4_K..Q6_K it can).
        let opts = Options { ftype: FileType::Q2_K, allow_requantize: false, budget: 1 << 20, overwrite: false };
        let out = dir.path().join("q2_k.gguf");
        let err =
            quantize_gguf(&src, &Location::local(&out), &opts).await.err().expect("Q2_K needs Q2_K/Q3_K").to_string();
        assert!(err.contains("Q2_K") && err.contains("tensor"), "{err}");
        assert!(!out.exists(), "a refused quantization left a file");
    });
}
