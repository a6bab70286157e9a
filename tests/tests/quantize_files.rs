//! llama-quantize's decisions and bytes on the real SmolLM2: for every ladder rung in the shared manifests the
//! mixture rules pick the same type for every tensor, in the same order; for the rungs whose types quantfarm can
//! produce today (Q8_0, Q4_0, Q6_K, Q5_K_M, Q4_K_M) the whole output file equals llama-quantize's, byte for byte.
//! With an importance matrix (`--imatrix`, GGUF or legacy .dat) likewise, including the `quantize.imatrix.*` keys.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use quantfarm_e2e::{fixtures_dir, llama_bin, smollm2_derived};
use quantfarm_quant::file::{model_facts, quantize_gguf, Options};
use quantfarm_quant::imatrix::Imatrix;
use quantfarm_quant::{mixture, FileType, GgmlType};
use quantfarm_store::Location;
use quantfarm_tensors::TensorSource;
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
        ("smollm2-imat-q4_k_m.json", FileType::Q4_K_M),
        ("smollm2-imat-q3_k_m.json", FileType::Q3_K_M),
    ] {
        let has_imatrix = file.contains("-imat-");
        let m = manifest(file);
        let theirs: Vec<(String, String)> = m["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["name"].as_str().unwrap().to_string(), t["type"].as_str().unwrap().to_string()))
            .collect();
        let ours: Vec<(String, String)> = mixture::choose_types(ftype, &facts, &infos, has_imatrix)
            .unwrap_or_else(|e| panic!("{ftype}: {e}"))
            .into_iter()
            .map(|c| (c.name, c.ty.name().to_string()))
            .collect();
        assert_eq!(ours, theirs, "{ftype}: tensor order and types differ from llama-quantize's ({file})");
    }
}

#[test]
fn every_rung_equals_llama_quantizes_byte_for_byte_or_is_refused_naming_the_missing_type() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(bf16())).await.unwrap();
        for (file, ftype) in [
            ("smollm2-q8_0.json", FileType::Q8_0),
            ("smollm2-q4_0.json", FileType::Q4_0),
            ("smollm2-q6_k.json", FileType::Q6_K),
            ("smollm2-q5_k_m.json", FileType::Q5_K_M),
            ("smollm2-q4_k_m.json", FileType::Q4_K_M),
            ("smollm2-q3_k_m.json", FileType::Q3_K_M),
            ("smollm2-q2_k.json", FileType::Q2_K),
        ] {
            let m = manifest(file);
            let out = dir.path().join(format!("{ftype}.gguf"));
            // A small budget: tensors are quantized in many row chunks.
            let opts = Options { budget: 1 << 20, ..Options::new(ftype) };
            let result = quantize_gguf(&src, &Location::local(&out), &opts).await;
            check_rung(result, &out, &m, &ftype.to_string()).await;
        }
    });
}

/// The types of a manifest's tensors that quantfarm cannot produce yet.
fn missing_types(m: &Value) -> Vec<String> {
    let mut v: Vec<String> = m["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["type"].as_str().unwrap().to_string())
        .filter(|t| GgmlType::ALL.iter().any(|g| g.name() == t && !quantfarm_quant::supported(*g)))
        .collect();
    v.sort();
    v.dedup();
    v
}

/// A rung whose types quantfarm can all produce must equal the manifest; otherwise it must be refused naming a
/// missing type and a tensor, leaving no file. Either way the test asserts something, and it tightens by itself
/// when a quantizer lands.
async fn check_rung(
    result: Result<quantfarm_quant::file::Quantized, quantfarm_quant::file::FileError>,
    out: &Path,
    m: &Value,
    label: &str,
) {
    let missing = missing_types(m);
    if missing.is_empty() {
        let q = result.unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_matches_manifest(out, &q.committed.sha256, m, label).await;
    } else {
        let err = result.err().unwrap_or_else(|| panic!("{label}: needs {missing:?}, not implemented")).to_string();
        assert!(missing.iter().any(|t| err.contains(t.as_str())) && err.contains("tensor"), "{label}: {err}");
        assert!(!out.exists(), "{label}: a refused quantization left a file");
    }
}

/// The file at `out` (whose sha256 is `sha`) equals the manifest's: metadata keys, types and scalar values in
/// order, tensor names, types and shapes, then the whole file; on a difference, the first tensor that differs.
async fn assert_matches_manifest(out: &Path, sha: &str, m: &Value, label: &str) {
    let ours = TensorSource::open(&Location::local(out)).await.unwrap();
    let header = ours.gguf().unwrap().header();
    let theirs = m["metadata"].as_array().unwrap();
    let keys = |v: &mut dyn Iterator<Item = String>| v.collect::<Vec<_>>();
    assert_eq!(
        keys(&mut header.metadata.iter().map(|(k, _)| k.clone())),
        keys(&mut theirs.iter().map(|e| e["key"].as_str().unwrap().to_string())),
        "{label}: metadata keys"
    );
    for ((k, v), e) in header.metadata.iter().zip(theirs) {
        assert_eq!(v.value_type().name(), e["type"].as_str().unwrap(), "{label}: type of {k}");
        if let Some(want) = e.get("value") {
            assert_eq!(&v.to_json(), want, "{label}: value of {k}");
        }
    }
    let tensors = m["tensors"].as_array().unwrap();
    let ours_list: Vec<(String, String, Vec<u64>)> =
        header.tensors.iter().map(|t| (t.name.clone(), t.ty.name().to_string(), t.dims.clone())).collect();
    let theirs_list: Vec<(String, String, Vec<u64>)> = tensors
        .iter()
        .map(|t| {
            let shape = t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
            (t["name"].as_str().unwrap().to_string(), t["type"].as_str().unwrap().to_string(), shape)
        })
        .collect();
    assert_eq!(ours_list, theirs_list, "{label}: tensor names, types and shapes");
    if sha != m["file"]["sha256"].as_str().unwrap() {
        // Name the first tensor that differs, for the failure message.
        let mut buf = Vec::new();
        for t in tensors {
            let name = t["name"].as_str().unwrap();
            let e = ours.entry(name).unwrap();
            buf.resize(e.bytes as usize, 0);
            ours.read_range(name, 0, &mut buf).await.unwrap();
            let sha = quantfarm_store::hex(&<sha2::Sha256 as sha2::Digest>::digest(&buf));
            assert_eq!(sha, t["sha256"].as_str().unwrap(), "{label}: tensor {name}");
        }
        panic!("{label}: tensors equal but the file differs (metadata or layout)");
    }
    assert_eq!(std::fs::metadata(out).unwrap().len(), m["file"]["size"].as_u64().unwrap(), "{label}: size");
}

fn imatrix_gguf() -> PathBuf {
    fixtures_dir().join("smollm2/imatrix-gpl3.gguf")
}

/// The fixture imatrix, recorded under the name llama-quantize was given (it ran beside the file).
async fn fixture_imatrix() -> Arc<Imatrix> {
    let mut im = Imatrix::load(&Location::local(imatrix_gguf())).await.unwrap();
    im.file = "imatrix-gpl3.gguf".into();
    Arc::new(im)
}

#[test]
fn the_fixture_imatrix_loads_as_llama_quantize_reads_it() {
    let im = rt().block_on(fixture_imatrix());
    let m = manifest("imatrix-gpl3.json");
    assert_eq!(im.entries.len() * 2, m["tensors"].as_array().unwrap().len());
    assert_eq!(im.entries.len(), 210);
    assert_eq!((im.datasets.as_slice(), im.chunk_count, im.chunk_size), (&["gpl3.txt".to_string()][..], 14, 512));
    assert!(!im.legacy);
    let w = im.get("blk.0.ffn_down.weight").expect("an entry per blk weight");
    assert_eq!(w.len(), 1536);
    assert!(w.iter().all(|v| v.is_finite() && *v >= 0.0));
    assert!(im.get("token_embd.weight").is_none() && im.get("output.weight").is_none());
}

#[test]
fn imatrix_q4_k_m_equals_llama_quantizes_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(bf16())).await.unwrap();
        let m = manifest("smollm2-imat-q4_k_m.json");
        let out = dir.path().join("imat-q4_k_m.gguf");
        let opts = Options {
            budget: 1 << 20,
            imatrix: Some(fixture_imatrix().await),
            threads: Some(2),
            ..Options::new(FileType::Q4_K_M)
        };
        let q = quantize_gguf(&src, &Location::local(&out), &opts).await.unwrap();
        assert_matches_manifest(&out, &q.committed.sha256, &m, "imatrix Q4_K_M").await;
    });
}

#[test]
fn imatrix_q3_k_m_equals_llama_quantizes_or_is_refused_naming_q3_k() {
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(bf16())).await.unwrap();
        let m = manifest("smollm2-imat-q3_k_m.json");
        let out = dir.path().join("imat-q3_k_m.gguf");
        let opts = Options { imatrix: Some(fixture_imatrix().await), ..Options::new(FileType::Q3_K_M) };
        let result = quantize_gguf(&src, &Location::local(&out), &opts).await;
        // Before Q3_K landed this had to be refused naming Q3_K (`check_rung` asserts whichever applies).
        check_rung(result, &out, &m, "imatrix Q3_K_M").await;
    });
}

/// `llama-imatrix --in-file X.gguf --output-format dat`: the same imatrix in the legacy format.
fn legacy_imatrix(dir: &Path) -> PathBuf {
    let dat = dir.join("imatrix-gpl3.dat");
    let bin = llama_bin();
    let out = std::process::Command::new(bin.join("llama-imatrix"))
        .env("LD_LIBRARY_PATH", &bin)
        .arg("-m")
        .arg(bf16())
        .arg("--in-file")
        .arg(imatrix_gguf())
        .arg("-o")
        .arg(&dat)
        .args(["--output-format", "dat"])
        .output()
        .unwrap();
    assert!(out.status.success() && dat.exists(), "llama-imatrix failed:\n{}", String::from_utf8_lossy(&out.stderr));
    dat
}

#[test]
fn legacy_dat_imatrix_gives_llama_quantizes_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let dat = legacy_imatrix(dir.path());
    // The .dat stores (sum/count)·ncall, so its values may differ from the GGUF's in the last bit: compare with
    // llama-quantize given the same .dat, not with the GGUF imatrix's output.
    let reference = dir.path().join("reference.gguf");
    let bin = llama_bin();
    let out = std::process::Command::new(bin.join("llama-quantize"))
        .env("LD_LIBRARY_PATH", &bin)
        .arg("--imatrix")
        .arg(&dat)
        .arg(bf16())
        .arg(&reference)
        .args(["Q4_K_M", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "llama-quantize failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let want = quantfarm_store::hex(&<sha2::Sha256 as sha2::Digest>::digest(std::fs::read(&reference).unwrap()));
    rt().block_on(async {
        let mut im = Imatrix::load(&Location::local(&dat)).await.unwrap();
        assert!(im.legacy);
        assert_eq!(
            (im.entries.len(), im.datasets.as_slice(), im.chunk_count),
            (210, &["gpl3.txt".to_string()][..], 14)
        );
        // Legacy values are close to the GGUF's (same mean of x², through a multiply and divide by ncall).
        let gguf = fixture_imatrix().await;
        for (name, w) in &im.entries {
            let g = gguf.get(name).unwrap();
            assert!(w.iter().zip(g).all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs().max(1e-6)), "{name}");
        }
        im.file = dat.to_string_lossy().into_owned();
        let src = TensorSource::open(&Location::local(bf16())).await.unwrap();
        let ours = dir.path().join("ours.gguf");
        let opts = Options { imatrix: Some(Arc::new(im)), ..Options::new(FileType::Q4_K_M) };
        let q = quantize_gguf(&src, &Location::local(&ours), &opts).await.unwrap();
        assert_eq!(q.committed.sha256, want, "quantfarm with the .dat differs from llama-quantize with the .dat");
    });
}

/// A legacy imatrix with one entry per (name, values).
fn write_dat(path: &Path, entries: &[(&str, Vec<f32>)]) {
    let mut b = (entries.len() as i32).to_le_bytes().to_vec();
    for (name, vals) in entries {
        b.extend((name.len() as i32).to_le_bytes());
        b.extend(name.as_bytes());
        b.extend(1i32.to_le_bytes());
        b.extend((vals.len() as i32).to_le_bytes());
        vals.iter().for_each(|v| b.extend(v.to_le_bytes()));
    }
    std::fs::write(path, b).unwrap();
}

#[test]
fn an_imatrix_for_another_model_is_refused_naming_tensor_and_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let dat = dir.path().join("other.dat");
    write_dat(&dat, &[("blk.0.attn_k.weight", vec![1.0; 896])]);
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(bf16())).await.unwrap();
        let im = Imatrix::load(&Location::local(&dat)).await.unwrap();
        let out = dir.path().join("out.gguf");
        let opts = Options { imatrix: Some(Arc::new(im)), ..Options::new(FileType::Q4_K_M) };
        let err = quantize_gguf(&src, &Location::local(&out), &opts).await.err().expect("sizes differ").to_string();
        assert!(err.contains("blk.0.attn_k.weight") && err.contains("896") && err.contains("576"), "{err}");
        assert!(!out.exists(), "a refused quantization left a file");
    });
}

#[test]
fn a_truncated_imatrix_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(imatrix_gguf()).unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let dat = legacy_imatrix(dir.path());
    let dat_bytes = std::fs::read(&dat).unwrap();
    let cut_dat = dir.path().join("cut.dat");
    std::fs::write(&cut_dat, &dat_bytes[..dat_bytes.len() / 2]).unwrap();
    rt().block_on(async {
        for path in [&cut, &cut_dat] {
            let err = Imatrix::load(&Location::local(path)).await.expect_err("truncated").to_string();
            assert!(err.contains(&*path.to_string_lossy()), "{err}");
        }
        let err = Imatrix::load(&Location::local(&cut_dat)).await.err().unwrap().to_string();
        assert!(err.contains("truncated") && err.contains("entry"), "{err}");
    });
}

#[test]
fn an_imatrix_in_s3_loads_like_the_local_file() {
    let server = quantfarm_e2e::s3::S3Server::start();
    server.upload(&imatrix_gguf(), "imat", "smollm2/imatrix-gpl3.gguf");
    rt().block_on(async {
        let remote = Imatrix::load(&server.location("imat", "smollm2/imatrix-gpl3.gguf")).await.unwrap();
        let mut local = Imatrix::load(&Location::local(imatrix_gguf())).await.unwrap();
        local.file = remote.file.clone();
        assert_eq!(remote, local);
    });
}
