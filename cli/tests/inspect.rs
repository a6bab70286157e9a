//! `quantfarm inspect` against the oracle: on the real SmolLM2 GGUF it reports exactly what gguf-py's GGUFReader
//! reads (tensor count, names, types, shapes, every metadata key and value), and it reads S3 like a path.

use std::process::Command;

use quantfarm_e2e::{run_py, smollm2_gguf};
use serde_json::Value;

fn inspect(args: &[&str], envs: &[(&str, String)]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
        .arg("inspect")
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run quantfarm");
    assert!(out.status.success(), "quantfarm inspect {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("inspect --json prints JSON")
}

#[test]
fn inspect_matches_gguf_py_on_smollm2() {
    let path = smollm2_gguf();
    let p = path.to_str().unwrap();
    let ours = inspect(&[p, "--json", "--tensors", "--metadata"], &[]);
    let theirs: Value = serde_json::from_str(&run_py("gguf_dump.py", &[path.as_os_str()])).unwrap();

    let our_tensors = ours["tensors"].as_array().unwrap();
    let their_tensors = theirs["tensors"].as_array().unwrap();
    assert_eq!(ours["tensor_count"], their_tensors.len());
    assert_eq!(our_tensors.len(), their_tensors.len());
    for (a, b) in our_tensors.iter().zip(their_tensors) {
        assert_eq!(a["name"], b["name"]);
        assert_eq!(a["type"], b["type"], "type of {}", a["name"]);
        assert_eq!(a["ne"], b["ne"], "shape of {}", a["name"]);
        assert_eq!(a["bytes"], b["bytes"], "bytes of {}", a["name"]);
    }
    let our_meta = ours["metadata"].as_object().unwrap();
    let their_meta = theirs["metadata"].as_object().unwrap();
    let ours_keys: Vec<_> = our_meta.keys().collect();
    let their_keys: Vec<_> = their_meta.keys().collect();
    assert_eq!(ours_keys, their_keys, "metadata keys (in file order)");
    for (k, v) in their_meta {
        assert_eq!(&our_meta[k], v, "metadata value of {k}");
    }
    assert_eq!(ours["architecture"], "llama");
}

#[test]
fn inspect_reads_from_s3_as_from_a_path() {
    let server = quantfarm_e2e::s3::S3Server::start();
    server.upload(&smollm2_gguf(), "models", "smollm2.gguf");

    let local = inspect(&[smollm2_gguf().to_str().unwrap(), "--json", "--tensors", "--read", "--sha256"], &[]);
    let remote = inspect(
        &["s3://models/smollm2.gguf", "--json", "--tensors", "--read", "--sha256", "--budget", "4MiB"],
        &server.env(),
    );
    assert_eq!(local["tensors"], remote["tensors"]);
    assert_eq!(local["read"]["sha256"], remote["read"]["sha256"], "tensor bytes read over S3 differ");
    assert!(remote["read"]["largest_read"].as_u64().unwrap() <= 4 << 20);
}

#[test]
fn inspect_names_the_file_when_it_is_malformed() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\x0f").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_quantfarm")).args(["inspect"]).arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.gguf") && err.contains("n_tensors"), "{err}");
}
