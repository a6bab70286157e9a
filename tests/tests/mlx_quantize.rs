//! `quantfarm_quant::mlx::quantize_affine` writes the same bytes as `mx.quantize` (affine, CPU): packed words,
//! scales and biases, at every bits × group size, for f32, bf16 and f16 sources, on rows chosen to hit the kernel's
//! edge cases (constant and all-zero groups, the `eps` floor, outliers, one-signed groups, rounding ties); and
//! `quantize_mlx_checkpoint` on SmolLM2 writes the tensors, config and index `mlx_lm.convert -q` wrote for the shared
//! manifests (4, 6 and 8 bits, groups of 64).

use quantfarm_e2e::run_py;
use quantfarm_quant::mlx::{quantize_affine, MLX_BITS, MLX_GROUP_SIZES};
use quantfarm_quant::{f32_to_bf16_bits, f32_to_f16_bits};
use quantfarm_tensors::dequant::{bf16_bits_to_f32, f16_bits_to_f32};
use quantfarm_tensors::Dtype;

const COLS: usize = 384;

/// SplitMix64: a fixed, dependency-free stream so the inputs never change.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// Roughly normal (sum of four uniforms), scaled.
    fn normal(&mut self, scale: f32) -> f32 {
        (self.uniform() + self.uniform() + self.uniform() + self.uniform()) * 0.5 * scale
    }
}

/// Rows of `COLS` values, each row exercising one path of the kernel.
fn matrix(seed: u64) -> Vec<f32> {
    let mut r = Rng(seed);
    let mut rows: Vec<Vec<f32>> = Vec::new();
    rows.push((0..COLS).map(|_| r.normal(0.05)).collect()); // typical weights
    rows.push(vec![0.3; COLS]); // constant
    rows.push(vec![0.0; COLS]); // all zero: scale is -eps, bias 0
    rows.push(
        (0..COLS)
            .map(|i| match i % 53 {
                0 => 40.0 * r.uniform().signum(),
                7 => -3.5,
                _ => r.normal(0.02),
            })
            .collect(),
    ); // outliers
    rows.push((0..COLS).map(|_| -r.uniform().abs() - 0.01).collect()); // all negative
    rows.push((0..COLS).map(|_| r.uniform().abs() * 7.0 + 1.0).collect()); // all positive, away from zero
    rows.push((0..COLS).map(|_| r.normal(1e-8)).collect()); // below the eps floor
    rows.push((0..COLS).map(|i| (i % 17) as f32 * 0.5 - 4.0).collect()); // exact half steps: rounding ties
    rows.push((0..COLS).map(|i| if i % 2 == 0 { 1.0 } else { -1.0 }).collect()); // |min| == |max|
    rows.push((0..COLS).map(|_| r.normal(300.0)).collect()); // large magnitudes
    rows.push((0..COLS).map(|i| if i % 64 < 32 { r.normal(1.0) } else { 0.0 }).collect()); // mixed groups
    rows.into_iter().flatten().collect()
}

fn to_dtype(w: &[f32], dtype: Dtype) -> Vec<f32> {
    match dtype {
        Dtype::BF16 => w.iter().map(|&x| bf16_bits_to_f32(f32_to_bf16_bits(x))).collect(),
        Dtype::F16 => w.iter().map(|&x| f16_bits_to_f32(f32_to_f16_bits(x))).collect(),
        _ => w.to_vec(),
    }
}

fn mx_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::BF16 => "bfloat16",
        Dtype::F16 => "float16",
        _ => "float32",
    }
}

/// Reports the first differing element of `what` (`esize`-byte elements), with the group it belongs to.
fn compare(name: &str, what: &str, ours: &[u8], theirs: &[u8], esize: usize) {
    assert_eq!(ours.len(), theirs.len(), "{name}: {what} length");
    if let Some(i) = ours.chunks_exact(esize).zip(theirs.chunks_exact(esize)).position(|(a, b)| a != b) {
        let n = ours.len() / esize;
        let diff = ours.chunks_exact(esize).zip(theirs.chunks_exact(esize)).filter(|(a, b)| a != b).count();
        panic!(
            "{name}: {what} element {i} of {n} differs ({diff} in all): ours {:02x?}, mlx {:02x?}",
            &ours[i * esize..(i + 1) * esize],
            &theirs[i * esize..(i + 1) * esize]
        );
    }
}

#[test]
fn affine_quantize_matches_mx_quantize_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let mut cases = Vec::new();
    let mut expected = Vec::new();
    for (k, dtype) in [Dtype::F32, Dtype::BF16, Dtype::F16].into_iter().enumerate() {
        let w = to_dtype(&matrix(0x5EED + k as u64), dtype);
        for bits in MLX_BITS {
            for g in MLX_GROUP_SIZES {
                let name = format!("{}-b{bits}-g{g}", mx_name(dtype));
                let bytes: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
                std::fs::write(dir.path().join(format!("{name}.in")), bytes).unwrap();
                cases.push(serde_json::json!({
                    "name": name, "rows": w.len() / COLS, "cols": COLS, "dtype": mx_name(dtype),
                    "bits": bits, "group_size": g,
                }));
                let q = quantize_affine(&w, COLS, bits, g, dtype).unwrap();
                expected.push((name, dtype, q));
            }
        }
    }
    std::fs::write(dir.path().join("cases.json"), serde_json::to_vec(&cases).unwrap()).unwrap();
    run_py("mlx_quantize_ref.py", &[dir.path().as_os_str()]);

    let read = |name: &str, ext: &str| std::fs::read(dir.path().join(format!("{name}.{ext}"))).unwrap();
    for (name, dtype, q) in &expected {
        compare(name, "packed words", &q.packed_bytes(), &read(name, "q"), 4);
        compare(name, "scales", &q.scales, &read(name, "s"), dtype.size());
        compare(name, "biases", &q.biases, &read(name, "b"), dtype.size());
    }
    assert_eq!(expected.len(), 54);
}

/// Converts the SmolLM2 HF checkpoint as `mlx_lm.convert -q --q-bits BITS --q-group-size 64` did for the shared
/// manifest, and compares every tensor (name, dtype, shape, sha256 of the bytes) and the config and index files.
fn checkpoint_matches_manifest(bits: u32) {
    use quantfarm_quant::mlx_file::{quantize_mlx_checkpoint, MlxFileError, MlxOptions};
    use quantfarm_store::Location;
    use quantfarm_tensors::TensorSource;
    use sha2::{Digest, Sha256};

    let manifest_path = quantfarm_e2e::fixtures_dir().join(format!("smollm2/manifests/smollm2-mlx-q{bits}.json"));
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    let hf = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(format!("mlx-q{bits}"));

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let src = TensorSource::open(&Location::local(&hf)).await.unwrap();
        // A small budget, so tensors are read and quantized in several row chunks.
        let opts = MlxOptions { budget: 3 << 20, ..MlxOptions::new(bits, 64) };
        let done = quantize_mlx_checkpoint(&src, &Location::local(&out), &opts).await.unwrap();
        assert_eq!(done.quantized, 211);
        if bits == 4 {
            // Refused: an existing output without `overwrite`.
            let again = quantize_mlx_checkpoint(&src, &Location::local(&out), &opts).await;
            assert!(matches!(again, Err(MlxFileError::Tensors(_))), "{:?}", again.err());
            // A quantized checkpoint is quantized again from its values as mx.dequantize gives them (below:
            // `verify` recomputes it so).
            let quantized = TensorSource::open(&Location::local(&out)).await.unwrap();
            let opts8 = MlxOptions { budget: 3 << 20, ..MlxOptions::new(8, 64) };
            let done = quantize_mlx_checkpoint(&quantized, &Location::local(dir.path().join("q8")), &opts8).await;
            assert_eq!(done.unwrap_or_else(|e| panic!("{e}")).quantized, 211);
        }

        let written = TensorSource::open(&Location::local(out.join("model.safetensors"))).await.unwrap();
        let tensors = manifest["tensors"].as_array().unwrap();
        assert_eq!(written.tensors().len(), tensors.len(), "tensor count");
        let mut buf = Vec::new();
        for t in tensors {
            let name = t["name"].as_str().unwrap();
            let e = written.entry(name).unwrap_or_else(|err| panic!("{err}"));
            assert_eq!(e.ty.to_string(), t["dtype"].as_str().unwrap().to_string(), "dtype of {name}");
            assert_eq!(serde_json::json!(e.shape), t["shape"], "shape of {name}");
            buf.resize(e.bytes as usize, 0);
            written.read_range(name, 0, &mut buf).await.unwrap();
            let sha = quantfarm_store::hex(&Sha256::digest(&buf));
            assert_eq!(sha, t["sha256"].as_str().unwrap(), "bytes of {name}");
        }
    });
    // `verify HF MLX` recomputes every module: identical, as is config.json and the carried tokenizer files.
    quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(&hf, &out, None));
    if bits == 4 {
        quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(&out, &dir.path().join("q8"), None));
    }
    for file in ["config.json", "model.safetensors.index.json", "tokenizer.json", "generation_config.json"] {
        let bytes = std::fs::read(out.join(file)).unwrap();
        let want = &manifest["other_files"][file];
        let sha = quantfarm_store::hex(&sha2::Sha256::digest(&bytes));
        assert_eq!(
            (bytes.len() as u64, sha.as_str()),
            (want["size"].as_u64().unwrap(), want["sha256"].as_str().unwrap()),
            "{file}:\n{}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(1500)])
        );
    }
}

#[test]
fn smollm2_q4_checkpoint_matches_mlx_lm() {
    checkpoint_matches_manifest(4);
}

#[test]
fn smollm2_q6_checkpoint_matches_mlx_lm() {
    checkpoint_matches_manifest(6);
}

#[test]
fn smollm2_q8_checkpoint_matches_mlx_lm() {
    checkpoint_matches_manifest(8);
}
