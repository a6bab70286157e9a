//! The object-store side against a real S3 server (s3s-fs on loopback, SigV4 checked): ranged reads within a
//! budget give the same bytes as local reads, outputs are invisible until committed, aborted or dropped uploads
//! leave nothing, existing objects are not replaced, and unsafe keys are refused.

use quantfarm_e2e::s3::S3Server;
use quantfarm_e2e::smollm2_gguf;
use quantfarm_store::{Error, Location, StagedSink};
use quantfarm_tensors::write::copy_gguf;
use quantfarm_tensors::TensorSource;
use sha2::{Digest, Sha256};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect()
}

/// Every tensor's bytes, read in chunks of at most `budget`, hashed.
async fn tensor_hashes(src: &TensorSource, budget: u64) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    for e in src.tensors() {
        let mut h = Sha256::new();
        for r in src.chunks(e, budget).unwrap() {
            assert!(r.end - r.start <= budget);
            buf.resize((r.end - r.start) as usize, 0);
            src.read_range(&e.name, r.start, &mut buf).await.unwrap();
            h.update(&buf);
        }
        out.push((e.name.clone(), quantfarm_store::hex(&h.finalize())));
    }
    out
}

#[test]
fn gguf_over_s3_reads_the_same_bytes_as_locally_within_the_budget() {
    let server = S3Server::start();
    server.upload(&smollm2_gguf(), "models", "sub/smollm2.gguf");
    rt().block_on(async {
        let local = TensorSource::open(&Location::local(smollm2_gguf())).await.unwrap();
        let remote = TensorSource::open(&server.location("models", "sub/smollm2.gguf")).await.unwrap();
        assert_eq!(local.tensors(), remote.tensors());
        assert_eq!(tensor_hashes(&local, 1 << 20).await, tensor_hashes(&remote, 256 << 10).await);
    });
}

/// An output smaller than a multipart part is held in memory and put whole at commit: before it nothing of it is on
/// the server (no upload, no marker), after it the object; one dropped uncommitted leaves nothing to sweep.
#[test]
fn a_small_output_is_put_whole_at_commit_with_no_staging() {
    let server = S3Server::start();
    let data = pattern(3 << 20);
    rt().block_on(async {
        let loc = server.location("out", "s/small.gguf");
        let mut sink = StagedSink::create(&loc, false).await.unwrap();
        sink.write(&data).await.unwrap();
        let before = server.files();
        assert!(before.iter().all(|f| !f.contains("small") && !f.starts_with(".upload")), "{before:?}");
        let committed = sink.commit().await.unwrap();
        assert_eq!(committed.sha256, quantfarm_store::hex(&Sha256::digest(&data)));
        assert_eq!(std::fs::read(server.root.join("out/s/small.gguf")).unwrap(), data);
        {
            let mut dropped = StagedSink::create(&server.location("out", "s/dropped.gguf"), false).await.unwrap();
            dropped.write(&data).await.unwrap();
        }
        let left: Vec<String> =
            server.files().into_iter().filter(|f| f.contains("dropped") || f.starts_with(".upload")).collect();
        assert!(left.is_empty(), "{left:?}");
    });
}

#[test]
fn a_staged_upload_is_invisible_until_commit_and_leaves_nothing_when_aborted() {
    let server = S3Server::start();
    let data = pattern(20 << 20); // three 8 MiB parts
    rt().block_on(async {
        let loc = server.location("out", "a/model.gguf");
        let mut sink = StagedSink::create(&loc, false).await.unwrap();
        sink.write(&data[..12 << 20]).await.unwrap();
        sink.write(&data[12 << 20..]).await.unwrap();
        assert!(
            !server.files().iter().any(|f| f.ends_with("model.gguf")),
            "visible before commit: {:?}",
            server.files()
        );
        assert!(server.location("out", "a").list().await.unwrap().is_empty());
        let committed = sink.commit().await.unwrap();
        assert_eq!(committed.bytes, data.len() as u64);
        assert_eq!(committed.sha256, quantfarm_store::hex(&Sha256::digest(&data)));
        assert_eq!(std::fs::read(server.root.join("out/a/model.gguf")).unwrap(), data);

        // Not replaced without overwrite.
        match StagedSink::create(&loc, false).await {
            Err(Error::Exists { .. }) => {}
            other => panic!("expected Exists, got {:?}", other.map(|_| ())),
        }

        // Aborted and dropped uploads leave nothing behind.
        let mut aborted = StagedSink::create(&server.location("out", "b/aborted.gguf"), false).await.unwrap();
        aborted.write(&data).await.unwrap();
        aborted.abort().await.unwrap();
        {
            let mut dropped = StagedSink::create(&server.location("out", "b/dropped.gguf"), false).await.unwrap();
            dropped.write(&data).await.unwrap();
        }
        // The dropped sink aborts on the runtime in the background: give it up to 10 s.
        // s3s-fs keeps uploaded parts as `.upload_id-UUID.part-N` and upload metadata under the key's name.
        let partial = || {
            let files = server.files().into_iter();
            files
                .filter(|f| f.contains("aborted") || f.contains("dropped") || f.contains(".upload_id-"))
                .collect::<Vec<_>>()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut left = partial();
        while !left.is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            left = partial();
        }
        assert!(left.is_empty(), "partial uploads left behind: {left:?}");
    });
}

#[test]
fn a_gguf_copied_to_s3_is_byte_identical() {
    let server = S3Server::start();
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(smollm2_gguf())).await.unwrap();
        let out = copy_gguf(&src, &server.location("out", "copy/smollm2.gguf"), 4 << 20, false).await.unwrap();
        let original = std::fs::read(smollm2_gguf()).unwrap();
        assert_eq!(out[0].sha256, quantfarm_store::hex(&Sha256::digest(&original)));
        assert_eq!(std::fs::read(server.root.join("out/copy/smollm2.gguf")).unwrap(), original);
    });
}

#[test]
fn unsafe_object_keys_are_refused() {
    for key in ["../escape.gguf", "a/../../b", "/abs/key", "a//b", "a/\u{7}bell", "./x"] {
        let url = format!("s3://bucket/{key}");
        match Location::parse(&url) {
            Err(Error::InvalidLocation { msg, .. }) => assert!(msg.contains("object key"), "{url}: {msg}"),
            Err(e) => panic!("{url}: unexpected error {e}"),
            Ok(_) => panic!("{url}: accepted"),
        }
    }
}
