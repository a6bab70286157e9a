//! safetensors checkpoints: the HF SmolLM2 checkpoint read and re-written as three shards with an index, checked
//! against mlx's own safetensors loader, and the sharded folder read over S3 like a local one.

use quantfarm_e2e::s3::S3Server;
use quantfarm_e2e::{run_py, smollm2_derived};
use quantfarm_store::Location;
use quantfarm_tensors::write::copy_safetensors;
use quantfarm_tensors::TensorSource;
use serde_json::Value;
use sha2::{Digest, Sha256};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn hashes(src: &TensorSource) -> Vec<(String, Vec<u64>, String)> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    for e in src.tensors() {
        let mut h = Sha256::new();
        for r in src.chunks(e, 3 << 20).unwrap() {
            buf.resize((r.end - r.start) as usize, 0);
            src.read_range(&e.name, r.start, &mut buf).await.unwrap();
            h.update(&buf);
        }
        out.push((e.name.clone(), e.shape.clone(), quantfarm_store::hex(&h.finalize())));
    }
    out.sort();
    out
}

#[test]
fn hf_checkpoint_rewritten_as_shards_reads_the_same_in_mlx_and_over_s3() {
    let hf = smollm2_derived().join("smollm2-hf");
    let server = S3Server::start();
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("smollm2-sharded");
    let rt = rt();
    rt.block_on(async {
        let src = TensorSource::open(&Location::local(&hf)).await.unwrap();
        let written = copy_safetensors(&src, &Location::local(&out_dir), 100_000_000, 8 << 20, false).await.unwrap();
        assert_eq!(written.len(), 4, "3 shards and an index: {written:?}");
    });
    server.upload(&out_dir, "models", "smollm2-sharded");
    rt.block_on(async {
        let src = TensorSource::open(&Location::local(&hf)).await.unwrap();

        let original = hashes(&src).await;
        let local = TensorSource::open(&Location::local(&out_dir)).await.unwrap();
        assert_eq!(local.files().len(), 3);
        assert_eq!(hashes(&local).await, original);

        let remote = TensorSource::open(&server.location("models", "smollm2-sharded")).await.unwrap();
        assert_eq!(remote.files().len(), 3);
        assert_eq!(hashes(&remote).await, original, "the sharded folder reads differently over S3");

        let mlx: Value = serde_json::from_str(&run_py("st_hashes.py", &[out_dir.as_os_str()])).unwrap();
        let tensors = mlx["tensors"].as_object().unwrap();
        assert_eq!(tensors.len(), original.len());
        for (name, shape, sha) in &original {
            assert_eq!(tensors[name]["sha256"].as_str(), Some(sha.as_str()), "bytes of {name} as mlx reads them");
            assert_eq!(tensors[name]["shape"], serde_json::json!(shape), "shape of {name}");
            assert_eq!(mlx["weight_map"][name], tensors[name]["file"], "index entry of {name}");
        }
    });
}
