//! MLX checkpoints made by `mlx_lm.convert`: each quantized module reads as one logical tensor of the unpacked
//! shape, and its dequantized values equal `mx.dequantize`'s (scales and biases upcast to f32) bit for bit.

use quantfarm_e2e::{run_py, smollm2_derived};
use quantfarm_store::Location;
use quantfarm_tensors::{TensorSource, TensorType};
use sha2::{Digest, Sha256};

fn check(bits: u8, group: u32) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(format!("mlx-q{bits}"));
    let hf = smollm2_derived().join("smollm2-hf");
    run_py(
        "mlx_checkpoint.py",
        &["convert".as_ref(), hf.as_os_str(), out.as_os_str(), bits.to_string().as_ref(), group.to_string().as_ref()],
    );
    let reference: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&run_py("mlx_checkpoint.py", &["hashes".as_ref(), out.as_os_str()])).unwrap();

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let src = TensorSource::open(&Location::local(&out)).await.unwrap();
        assert_eq!(src.format(), quantfarm_tensors::Format::Mlx);
        assert_eq!(src.tensors().len(), reference.len(), "logical tensors");
        let mut quantized = 0;
        let mut scratch = Vec::new();
        for e in src.tensors() {
            let r = &reference[&e.name];
            assert_eq!(serde_json::json!(e.shape), r["shape"], "shape of {}", e.name);
            if let TensorType::MlxAffine { bits: b, group_size: g, .. } = e.ty {
                assert_eq!((b, g), (bits, group), "{}", e.name);
                quantized += 1;
            }
            // Read in several row chunks to exercise row offsets.
            let rows = e.rows();
            let row_len = e.row_len() as usize;
            let step = rows.div_ceil(3).max(1);
            let mut h = Sha256::new();
            let mut first = 0;
            while first < rows {
                let n = step.min(rows - first);
                let mut vals = vec![0f32; n as usize * row_len];
                src.read_f32_rows(&e.name, first, &mut vals, &mut scratch).await.unwrap();
                for v in &vals {
                    h.update(v.to_le_bytes());
                }
                first += n;
            }
            assert_eq!(quantfarm_store::hex(&h.finalize()), r["sha256"].as_str().unwrap(), "values of {}", e.name);
        }
        assert!(quantized >= 200, "only {quantized} quantized modules found");
    });
}

#[test]
fn mlx_lm_4bit_checkpoint_reads_like_mlx() {
    check(4, 64);
}

#[test]
fn mlx_lm_3bit_group32_checkpoint_reads_like_mlx() {
    check(3, 32);
}

/// MLX → HF (`convert MLX DIR --to hf`): every tensor is the bytes `mlx_lm.convert --dequantize --dtype D` writes
/// for a checkpoint whose scales are D (bf16 and f16: mlx rounds `scale·q` and then `+ bias` to the dtype),
/// config.json loses its quantization blocks, and `verify` recomputes every tensor.
fn dequantized_like_mlx_lm(bits: u8, group: u32, dtype: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mlx = dir.path().join("mlx");
    let hf = smollm2_derived().join("smollm2-hf");
    let (b, g) = (bits.to_string(), group.to_string());
    run_py(
        "mlx_checkpoint.py",
        &["convert".as_ref(), hf.as_os_str(), mlx.as_os_str(), b.as_ref(), g.as_ref(), dtype.as_ref()],
    );
    let theirs = dir.path().join("mlx-dequantized");
    // In the checkpoint's own dtype: without --dtype, mlx_lm casts the scales to config.json's torch_dtype first.
    run_py("mlx_checkpoint.py", &["dequantize".as_ref(), mlx.as_os_str(), theirs.as_os_str(), dtype.as_ref()]);
    let ours = dir.path().join("hf");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let src = TensorSource::open(&Location::local(&mlx)).await.unwrap();
        let plan = quantfarm_tensors::convert::plan_mlx_to_hf(&src).unwrap();
        quantfarm_tensors::convert::write_hf(&src, &plan, &Location::local(&ours), 1 << 20, false).await.unwrap();
    });
    let stored = |d: &std::path::Path| -> serde_json::Value {
        serde_json::from_str(&run_py("mlx_checkpoint.py", &["stored".as_ref(), d.as_os_str()])).unwrap()
    };
    let (want, got) = (stored(&theirs), stored(&ours));
    let want = want.as_object().unwrap();
    assert_eq!(want.len(), got.as_object().unwrap().len(), "tensor count");
    for (name, w) in want {
        assert_eq!(&got[name], w, "{name}: ours, mlx_lm.convert --dequantize's");
    }
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(ours.join("config.json")).unwrap()).unwrap();
    assert!(config.get("quantization").is_none() && config.get("quantization_config").is_none(), "{config}");
    assert_eq!(config["model_type"], "llama");
    assert_eq!(std::fs::read(ours.join("tokenizer.json")).unwrap(), std::fs::read(mlx.join("tokenizer.json")).unwrap());
    quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(&mlx, &ours, None));
    eprintln!("MLX {bits}-bit g{group} {dtype} -> HF: {} tensors identical to mlx_lm.convert --dequantize", want.len());

    // The same checkpoint wrapped as a multimodal one (`language_model.` before every name) converts to the same
    // tensors: the prefix is stripped.
    let wrapped = dir.path().join("wrapped");
    run_py("mlx_checkpoint.py", &["prefix".as_ref(), mlx.as_os_str(), wrapped.as_os_str(), "language_model.".as_ref()]);
    let unwrapped = dir.path().join("unwrapped");
    rt.block_on(async {
        let src = TensorSource::open(&Location::local(&wrapped)).await.unwrap();
        assert!(src.tensors().iter().all(|e| e.name.starts_with("language_model.")));
        let plan = quantfarm_tensors::convert::plan_mlx_to_hf(&src).unwrap();
        quantfarm_tensors::convert::write_hf(&src, &plan, &Location::local(&unwrapped), 1 << 20, false).await.unwrap();
    });
    assert_eq!(stored(&unwrapped), stored(&ours), "the wrapped checkpoint converts to other tensors");
}

#[test]
fn mlx_3bit_bf16_checkpoint_dequantizes_like_mlx_lm() {
    dequantized_like_mlx_lm(3, 32, "bfloat16");
}

#[test]
fn mlx_4bit_f16_checkpoint_dequantizes_like_mlx_lm() {
    dequantized_like_mlx_lm(4, 64, "float16");
}
