//! MLX folders built by hand: per-module overrides decide how a module's codes unpack, and a broken affine triple
//! (missing biases, scales of the wrong shape, a quantized module the config does not describe) is an error naming
//! the tensor or key.

use quantfarm_store::Location;
use quantfarm_tensors::safetensors::{encode_header, StTensorDesc};
use quantfarm_tensors::{Dtype, TensorSource, TensorType};

fn t(name: &str, dtype: Dtype, shape: &[u64]) -> StTensorDesc {
    StTensorDesc { name: name.into(), dtype, shape: shape.to_vec() }
}

/// Writes an MLX folder with `config` and zero-filled tensors.
fn folder(config: serde_json::Value, tensors: &[StTensorDesc]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let mut bytes = encode_header(tensors, &[("format".into(), "mlx".into())]);
    bytes.resize(bytes.len() + tensors.iter().map(StTensorDesc::nbytes).sum::<u64>() as usize, 0);
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    dir
}

fn open(dir: &tempfile::TempDir) -> quantfarm_tensors::Result<TensorSource> {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(TensorSource::open(&Location::local(dir.path())))
}

#[test]
fn overrides_decide_the_unpacked_shape() {
    let q = serde_json::json!({"quantization": {"group_size": 64, "bits": 4, "a": {"group_size": 32, "bits": 8}}});
    let dir = folder(
        q,
        &[
            t("a.weight", Dtype::U32, &[3, 32]), // 8-bit: 128 columns, 4 groups of 32
            t("a.scales", Dtype::BF16, &[3, 4]),
            t("a.biases", Dtype::BF16, &[3, 4]),
            t("b.weight", Dtype::U32, &[2, 16]), // 4-bit: 128 columns, 2 groups of 64
            t("b.scales", Dtype::F16, &[2, 2]),
            t("b.biases", Dtype::F16, &[2, 2]),
            t("norm.weight", Dtype::BF16, &[128]),
        ],
    );
    let src = open(&dir).unwrap();
    let by_name = |n: &str| src.tensors().iter().find(|e| e.name == n).unwrap().clone();
    assert_eq!(src.tensors().len(), 3);
    assert_eq!(by_name("a.weight").shape, [3, 128]);
    assert!(matches!(
        by_name("a.weight").ty,
        TensorType::MlxAffine { bits: 8, group_size: 32, scale_dtype: Dtype::BF16 }
    ));
    assert_eq!(by_name("b.weight").shape, [2, 128]);
    assert_eq!(by_name("norm.weight").ty, TensorType::Dtype(Dtype::BF16));
}

#[test]
fn broken_triples_are_named() {
    let q = serde_json::json!({"quantization": {"group_size": 64, "bits": 4}});
    let cases: Vec<(Vec<StTensorDesc>, &str)> = vec![
        (vec![t("m.weight", Dtype::U32, &[2, 16]), t("m.scales", Dtype::BF16, &[2, 2])], "m.biases"),
        (
            vec![
                t("m.weight", Dtype::U32, &[2, 16]),
                t("m.scales", Dtype::BF16, &[2, 3]),
                t("m.biases", Dtype::BF16, &[2, 3]),
            ],
            "m.scales",
        ),
        (
            vec![
                t("m.weight", Dtype::F32, &[2, 16]),
                t("m.scales", Dtype::BF16, &[2, 2]),
                t("m.biases", Dtype::BF16, &[2, 2]),
            ],
            "m.weight",
        ),
        (vec![t("m.weight", Dtype::U32, &[2, 16]), t("x.scales", Dtype::BF16, &[2, 2])], "x.scales"),
    ];
    for (tensors, field) in cases {
        let dir = folder(q.clone(), &tensors);
        let err = open(&dir).err().unwrap_or_else(|| panic!("{field}: opened")).to_string();
        assert!(err.contains(field) && err.contains("model.safetensors"), "{field}: {err}");
    }
    // Quantized weights but a config that does not say how.
    let dir = folder(
        serde_json::json!({"quantization": {"m": false}}),
        &[
            t("m.weight", Dtype::U32, &[2, 16]),
            t("m.scales", Dtype::BF16, &[2, 2]),
            t("m.biases", Dtype::BF16, &[2, 2]),
        ],
    );
    let err = open(&dir).err().unwrap().to_string();
    assert!(err.contains("config.json") && err.contains("\"m\""), "{err}");
}
