//! HF safetensors → GGUF bf16 against llama.cpp's own converter: SmolLM2's converted file must equal the manifest of
//! `convert_hf_to_gguf.py --outtype bf16` (every tensor and key), split files must be what `llama-gguf-split` writes
//! and what llama.cpp loads, and failures must name their cause and leave nothing at the destination.

use std::path::{Path, PathBuf};
use std::process::Command;

use quantfarm_e2e::{fixtures_dir, llama_bin, smollm2_derived};
use quantfarm_store::Location;
use quantfarm_tensors::convert::{convert_hf_to_gguf, plan_hf_to_gguf, OutType, SplitRule};
use quantfarm_tensors::gguf::{Array, GgufHeader, Value};
use quantfarm_tensors::TensorSource;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn hex(b: &[u8]) -> String {
    quantfarm_store::hex(b)
}

fn sha256_file(p: &Path) -> String {
    let mut h = Sha256::new();
    let mut f = std::fs::File::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    std::io::copy(&mut f, &mut h).unwrap();
    hex(&h.finalize())
}

fn hf_dir() -> PathBuf {
    smollm2_derived().join("smollm2-hf")
}

fn manifest() -> Json {
    let p = fixtures_dir().join("smollm2/manifests/smollm2-hf-bf16.json");
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

fn convert(dst: &Path, prefix: &str, rule: Option<SplitRule>, budget: u64) -> Vec<PathBuf> {
    rt().block_on(async {
        let out = convert_hf_to_gguf(
            &Location::local(hf_dir()),
            &Location::local(dst),
            prefix,
            OutType::Bf16,
            rule,
            budget,
            false,
        )
        .await
        .unwrap();
        out.iter().map(|c| PathBuf::from(&c.location)).collect()
    })
}

/// The GGUF-encoded bytes of an array's elements (the manifest's `raw_sha256` covers these).
fn raw_elements(a: &Array) -> Vec<u8> {
    let mut out = Vec::new();
    match a {
        Array::String(v) => {
            for s in v {
                out.extend_from_slice(&(s.0.len() as u64).to_le_bytes());
                out.extend_from_slice(&s.0);
            }
        }
        Array::I32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::U32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Array::F32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        other => panic!("array type {:?} not expected in this model", other.elem_type()),
    }
    out
}

/// Compares metadata with the manifest's entries, in order: key, type, and value (F32 by bit pattern, arrays by
/// both of the manifest's hashes).
fn assert_metadata_matches(got: &[(String, Value)], want: &[Json]) {
    let got_keys: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
    let want_keys: Vec<&str> = want.iter().map(|e| e["key"].as_str().unwrap()).collect();
    assert_eq!(got_keys, want_keys, "metadata keys or their order differ");
    for ((key, v), w) in got.iter().zip(want) {
        assert_eq!(v.value_type().name(), w["type"].as_str().unwrap(), "{key}: type");
        match v {
            Value::Array(a) => {
                assert_eq!(a.elem_type().name(), w["elem_type"].as_str().unwrap(), "{key}: element type");
                assert_eq!(a.len() as u64, w["length"].as_u64().unwrap(), "{key}: length");
                let raw = hex(&Sha256::digest(raw_elements(a)));
                assert_eq!(raw, w["raw_sha256"].as_str().unwrap(), "{key}: raw bytes");
                let canon = serde_json::to_string(&a.to_json()).unwrap();
                assert_eq!(hex(&Sha256::digest(canon.as_bytes())), w["sha256"].as_str().unwrap(), "{key}: values");
            }
            Value::F32(x) => assert_eq!(hex(&x.to_le_bytes()), w["hex"].as_str().unwrap(), "{key}: f32 bits"),
            other => assert_eq!(other.to_json(), w["value"], "{key}: value"),
        }
    }
}

/// Reads every tensor of the model at `first` (one file or the first split) and compares name, type, shape and
/// sha256 with the manifest, in order.
fn assert_tensors_match(first: &Path, want: &[Json]) {
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(first)).await.unwrap();
        let model = src.gguf().expect("a GGUF model");
        let infos: Vec<_> = model.tensors().map(|t| t.info.clone()).collect();
        assert_eq!(infos.len(), want.len(), "tensor count");
        for (info, w) in infos.iter().zip(want) {
            let name = w["name"].as_str().unwrap();
            assert_eq!(info.name, name);
            assert_eq!(info.ty.name(), w["type"].as_str().unwrap(), "{name}: type");
            let shape: Vec<u64> = w["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
            assert_eq!(info.dims, shape, "{name}: shape");
            let mut buf = vec![0u8; info.nbytes() as usize];
            src.read_range(name, 0, &mut buf).await.unwrap();
            assert_eq!(hex(&Sha256::digest(&buf)), w["sha256"].as_str().unwrap(), "{name}: bytes");
        }
    })
}

fn header(p: &Path) -> GgufHeader {
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(p)).await.unwrap();
        src.gguf().unwrap().shards[0].1.clone()
    })
}

#[test]
fn smollm2_single_file_equals_convert_hf_to_gguf() {
    let m = manifest();
    let dir = tempfile::tempdir().unwrap();
    let out = convert(dir.path(), "smollm2", None, 64 << 20);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].file_name().unwrap(), "smollm2.gguf");
    let h = header(&out[0]);
    assert_metadata_matches(&h.metadata, m["metadata"].as_array().unwrap());
    assert_eq!(h.data_offset, m["header"]["data_offset"].as_u64().unwrap());
    assert_tensors_match(&out[0], m["tensors"].as_array().unwrap());
    // With every key and tensor equal, the file is the converter's byte for byte.
    assert_eq!(sha256_file(&out[0]), m["file"]["sha256"].as_str().unwrap(), "whole-file sha256");
}

#[test]
fn smollm2_split_files_are_gguf_splits_and_load_in_llama_cpp() {
    let m = manifest();
    let dir = tempfile::tempdir().unwrap();
    // A budget of a few rows forces chunked reads, and q/k heads gathered row by row.
    let out = convert(dir.path(), "smollm2", Some(SplitRule::MaxTensors(100)), 7000);
    let names: Vec<_> = out.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["smollm2-00001-of-00003.gguf", "smollm2-00002-of-00003.gguf", "smollm2-00003-of-00003.gguf"]);

    // Shard 0: all KVs then split.no, split.tensors.count, split.count; the others only the split keys.
    let split_keys = |no: u16| {
        vec![
            ("split.no".to_string(), Value::U16(no)),
            ("split.tensors.count".to_string(), Value::I32(272)),
            ("split.count".to_string(), Value::U16(3)),
        ]
    };
    let h0 = header(&out[0]);
    let n = h0.metadata.len();
    assert_metadata_matches(&h0.metadata[..n - 3], m["metadata"].as_array().unwrap());
    assert_eq!(h0.metadata[n - 3..], split_keys(0)[..]);
    assert_eq!(h0.tensors.len(), 100);
    // Reading the first file opens its siblings (our reader checks the split keys and the tensor count).
    assert_tensors_match(&out[0], m["tensors"].as_array().unwrap());

    // llama-gguf-split cuts our single file into the same bytes.
    let bin = llama_bin();
    let single = convert(&dir.path().join("single"), "smollm2", None, 64 << 20);
    let theirs = dir.path().join("theirs");
    std::fs::create_dir_all(&theirs).unwrap();
    let st = Command::new(bin.join("llama-gguf-split"))
        .args(["--split", "--split-max-tensors", "100"])
        .arg(&single[0])
        .arg(theirs.join("smollm2"))
        .output()
        .unwrap();
    assert!(st.status.success(), "llama-gguf-split --split: {}", String::from_utf8_lossy(&st.stderr));
    for (i, ours) in out.iter().enumerate() {
        let t = theirs.join(format!("smollm2-{:05}-of-00003.gguf", i + 1));
        assert_eq!(sha256_file(ours), sha256_file(&t), "split {} differs from llama-gguf-split's", i + 1);
    }

    // llama.cpp merges them back and generates the same text from the split files as from the single file.
    let merged = dir.path().join("merged.gguf");
    let st = Command::new(bin.join("llama-gguf-split")).arg("--merge").arg(&out[0]).arg(&merged).output().unwrap();
    assert!(st.status.success(), "llama-gguf-split --merge: {}", String::from_utf8_lossy(&st.stderr));
    assert_tensors_match(&merged, m["tensors"].as_array().unwrap());
    let generate = |model: &Path| quantfarm_e2e::llama_generate(model, "Hello", 4, 2, &["--no-warmup", "--simple-io"]);
    let from_split = generate(&out[0]);
    assert!(from_split.starts_with("Hello") && from_split.len() > "Hello".len(), "generated {from_split:?}");
    assert_eq!(from_split, generate(&single[0]));
}

/// A small checkpoint folder: SmolLM2's tokenizer files, its config edited by `edit`, and one safetensors file
/// with the given (name, shape) bf16 tensors.
fn tiny_checkpoint(dir: &Path, tensors: &[(&str, &[u64])], edit: impl FnOnce(&mut serde_json::Map<String, Json>)) {
    std::fs::create_dir_all(dir).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"] {
        std::fs::copy(hf_dir().join(f), dir.join(f)).unwrap();
    }
    let mut config: serde_json::Map<String, Json> =
        serde_json::from_slice(&std::fs::read(hf_dir().join("config.json")).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(dir.join("config.json"), serde_json::to_vec(&Json::Object(config)).unwrap()).unwrap();
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, shape) in tensors {
        let n = shape.iter().product::<u64>() * 2;
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}),
        );
        offset += n;
    }
    let mut h = serde_json::to_vec(&Json::Object(header)).unwrap();
    h.resize(h.len().div_ceil(8) * 8, b' ');
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&h);
    bytes.extend((0..offset).map(|i| (i % 251) as u8));
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
}

fn convert_err(src: &Path, dst: &Path, budget: u64) -> String {
    rt().block_on(async {
        convert_hf_to_gguf(&Location::local(src), &Location::local(dst), "out", OutType::Bf16, None, budget, false)
            .await
            .expect_err("conversion must fail")
            .to_string()
    })
}

fn assert_empty(dst: &Path) {
    let left: Vec<_> = std::fs::read_dir(dst).map(|d| d.map(|e| e.unwrap().file_name()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "files left at the destination: {left:?}");
}

#[test]
fn failures_name_their_cause_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ok: &[(&str, &[u64])] =
        &[("model.norm.weight", &[576]), ("model.layers.0.self_attn.q_proj.weight", &[576, 576])];

    // An MLX-style tensor no rule maps.
    let src = dir.path().join("unmapped");
    tiny_checkpoint(&src, &[ok[0], ok[1], ("lm_head.biases", &[4])], |_| {});
    let dst = dir.path().join("out1");
    let e = convert_err(&src, &dst, 1 << 20);
    assert_eq!(e, "cannot map tensor 'lm_head.biases' (mapping llama.yaml)");
    assert_empty(&dst);

    // A config.json key of the wrong type (a missing one takes LlamaConfig's default, as AutoConfig gives it).
    let src = dir.path().join("nokey");
    tiny_checkpoint(&src, ok, |c| {
        c.insert("num_hidden_layers".into(), serde_json::json!("thirty"));
    });
    let dst = dir.path().join("out2");
    let e = convert_err(&src, &dst, 1 << 20);
    assert!(e.contains("config.json") && e.contains("num_hidden_layers") && e.contains("does not fit"), "{e}");
    assert_empty(&dst);

    // A failure while writing (a row larger than the budget) leaves no partial file either.
    let src = dir.path().join("budget");
    tiny_checkpoint(&src, ok, |_| {});
    let dst = dir.path().join("out3");
    let e = convert_err(&src, &dst, 1000);
    assert!(e.contains("q_proj") && e.contains("budget"), "{e}");
    assert_empty(&dst);

    // Unsupported rope scaling is refused, not silently converted without its keys.
    let src = dir.path().join("rope");
    tiny_checkpoint(&src, ok, |c| {
        c.insert("rope_scaling".into(), serde_json::json!({"rope_type": "dynamic", "factor": 8.0}));
    });
    let e = convert_err(&src, &dir.path().join("out4"), 1 << 20);
    assert!(e.contains("$rope.rope_type") && e.contains("dynamic") && e.contains("llama3"), "{e}");
}

#[test]
fn plan_digest_is_stable_and_sensitive() {
    let dir = tempfile::tempdir().unwrap();
    let ok: &[(&str, &[u64])] =
        &[("model.norm.weight", &[576]), ("model.layers.0.self_attn.q_proj.weight", &[576, 576])];
    tiny_checkpoint(&dir.path().join("a"), ok, |_| {});
    tiny_checkpoint(&dir.path().join("b"), ok, |c| {
        c.insert("rms_norm_eps".into(), serde_json::json!(1e-6));
    });
    rt().block_on(async {
        let plan = |p: PathBuf| async move {
            let s = TensorSource::open(&Location::local(p)).await.unwrap();
            plan_hf_to_gguf(&s, OutType::Bf16).await.unwrap()
        };
        let a1 = plan(dir.path().join("a")).await;
        let a2 = plan(dir.path().join("a")).await;
        let b = plan(dir.path().join("b")).await;
        assert_eq!(a1.digest(), a2.digest());
        assert_ne!(a1.digest(), b.digest());
        let q = a1.tensors.iter().find(|t| t.name == "blk.0.attn_q.weight").unwrap();
        assert_eq!(q.permute_heads, Some(9));
        assert_eq!(q.ne, [576, 576]);
    });
}

/// An MLX checkpoint converts to GGUF with every affine triple dequantized exactly as MLX dequantizes it: SmolLM2
/// quantized to 4 bits (`quantize_mlx_checkpoint`, equal to `mlx_lm.convert -q`, see `mlx_quantize.rs`), converted
/// directly, gives the same file as the HF folder that `mx.dequantize` makes of it (tests/py/mlx_dequant_hf.py)
/// converted as an ordinary f32 checkpoint. `convert_hf_to_gguf.py` itself cannot read MLX folders.
#[test]
fn mlx_checkpoint_converts_with_mlx_dequantized_weights() {
    use quantfarm_quant::mlx_file::{quantize_mlx_checkpoint, MlxOptions};
    let dir = tempfile::tempdir().unwrap();
    // The same folder name on both sides: general.name comes from it.
    let mlx = dir.path().join("mlx/SmolLM2-135M-Instruct");
    let hf = dir.path().join("hf/SmolLM2-135M-Instruct");
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(hf_dir())).await.unwrap();
        let done = quantize_mlx_checkpoint(&src, &Location::local(&mlx), &MlxOptions::new(4, 64)).await.unwrap();
        assert_eq!(done.quantized, 211, "every Linear and the embedding are quantized");
    });
    let printed = quantfarm_e2e::run_py("mlx_dequant_hf.py", &[mlx.as_os_str(), hf.as_os_str()]);
    assert_eq!(printed.trim(), "dequantized 211");
    let (from_mlx, from_hf) = rt().block_on(async {
        let to = |src: &Path, out: &str| {
            let (src, dst) = (Location::local(src), Location::local(dir.path().join(out)));
            async move { convert_hf_to_gguf(&src, &dst, "model", OutType::Bf16, None, 16 << 20, false).await.unwrap() }
        };
        (to(&mlx, "out-mlx").await, to(&hf, "out-hf").await)
    });
    assert_eq!((from_mlx.len(), from_hf.len()), (1, 1));
    let (a, b) = (PathBuf::from(&from_mlx[0].location), PathBuf::from(&from_hf[0].location));
    let h = header(&a);
    assert_eq!(h.tensors.len(), 272);
    assert!(h.tensors.iter().any(|t| t.name == "token_embd.weight" && t.ty == quantfarm_tensors::GgmlType::BF16));
    assert_eq!(sha256_file(&a), sha256_file(&b), "MLX → GGUF differs from MLX-dequantized HF → GGUF");

    // The plan says what happens to each tensor: an affine source, dequantized into BF16.
    rt().block_on(async {
        let s = TensorSource::open(&Location::local(&mlx)).await.unwrap();
        let plan = plan_hf_to_gguf(&s, OutType::Bf16).await.unwrap();
        let q = plan.tensors.iter().find(|t| t.name == "blk.3.attn_q.weight").unwrap();
        assert_eq!(q.source, "model.layers.3.self_attn.q_proj.weight");
        assert!(matches!(q.source_type, quantfarm_tensors::TensorType::MlxAffine { bits: 4, group_size: 64, .. }));
        assert_eq!(q.permute_heads, Some(9));
    });
}

/// The checkpoint users actually have: `mlx_lm.convert -q` (4-bit) and then `mlx_lm fuse` of a LoRA adapter without
/// `--dequantize` (so every Linear is requantized, the state `convert_hf_to_gguf.py` fails on with "Can not map
/// tensor '…scales'"). quantfarm converts it, and llama.cpp loads the GGUF and generates.
#[test]
fn an_mlx_4bit_fused_checkpoint_converts_and_runs_in_llama_cpp() {
    use std::ffi::OsStr;
    let dir = tempfile::tempdir().unwrap();
    let mlx = dir.path().join("mlx-4bit");
    let hf = hf_dir();
    quantfarm_e2e::run_py(
        "mlx_checkpoint.py",
        &[OsStr::new("convert"), hf.as_os_str(), mlx.as_os_str(), OsStr::new("4"), OsStr::new("64")],
    );
    let adapter = dir.path().join("adapter");
    let unused = dir.path().join("unused.safetensors");
    quantfarm_e2e::lora_adapters("mlx-lora", &hf, &adapter, &unused, None);
    let fused = dir.path().join("SmolLM2-fused");
    let out = Command::new(quantfarm_e2e::peers_python())
        .args(["-m", "mlx_lm", "fuse", "--model"])
        .arg(&mlx)
        .arg("--adapter-path")
        .arg(&adapter)
        .arg("--save-path")
        .arg(&fused)
        .output()
        .expect("run mlx_lm fuse");
    assert!(out.status.success(), "mlx_lm fuse: {}", String::from_utf8_lossy(&out.stderr));
    let config: Json = serde_json::from_slice(&std::fs::read(fused.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization"]["bits"], 4, "the fused model is still quantized");

    let gguf = rt().block_on(async {
        let out = convert_hf_to_gguf(
            &Location::local(&fused),
            &Location::local(dir.path()),
            "fused",
            OutType::Bf16,
            None,
            16 << 20,
            false,
        )
        .await
        .unwrap();
        PathBuf::from(&out[0].location)
    });
    assert_eq!(header(&gguf).tensors.len(), 272);
    // `verify MLX GGUF`: every affine triple dequantized again gives the GGUF's bytes.
    quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(&fused, &gguf, None));
    let text = quantfarm_e2e::llama_generate(&gguf, "The capital of France is", 8, 2, &["--no-warmup", "--simple-io"]);
    let generated = text.trim_start().strip_prefix("The capital of France is").unwrap_or(&text);
    assert!(generated.chars().filter(|c| c.is_alphabetic()).count() >= 3, "llama.cpp generated {generated:?}");
}
