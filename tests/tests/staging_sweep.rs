//! A writer killed mid-write (SIGKILL: no drop, no abort) leaves its staging — locally the temp file
//! `.NAME.partial-XXXXXX` beside the output, on a real S3 server (s3s-fs on loopback) an incomplete multipart upload
//! and the marker object that names it — and `quantfarm_store::staging::sweep` removes it: every such file, and the
//! upload's parts in the server's own folder, while a writer that started after the death keeps its staging and
//! commits. Folder listings never show staging names.
//!
//! The writer is this test binary run again as a child process (`writer_child`, which does nothing unless
//! `STAGING_WRITER` names an output), so it can be killed for real.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use quantfarm_e2e::s3::{S3Server, ACCESS_KEY, SECRET_KEY};
use quantfarm_store::staging::{sweep, Swept};
use quantfarm_store::{Location, StagedSink};

const WRITER: &str = "STAGING_WRITER";
/// More than two 8 MiB parts: the killed upload has parts on the server.
const STAGED_BYTES: usize = 20 << 20;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// The child: stages `STAGED_BYTES` to `$STAGING_WRITER`, says so, and waits to be killed.
#[test]
fn writer_child() {
    let Ok(url) = std::env::var(WRITER) else { return };
    rt().block_on(async {
        let mut sink = StagedSink::create(&Location::parse(&url).unwrap(), false).await.unwrap();
        sink.write(&vec![7u8; STAGED_BYTES]).await.unwrap();
        println!("STAGED");
        tokio::time::sleep(Duration::from_secs(120)).await;
        drop(sink);
    });
}

/// Runs a writer of `url` in a child process until it has staged its bytes and `landed` says they are in the store,
/// then SIGKILLs it; returns the time of death.
fn staged_then_killed(url: &str, s3: Option<&S3Server>, landed: impl Fn() -> bool) -> SystemTime {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["writer_child", "--exact", "--nocapture", "--test-threads", "1"])
        .env(WRITER, url)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(s) = s3 {
        cmd.env("AWS_ENDPOINT_URL", s.endpoint())
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_REGION", "us-east-1");
    }
    let mut child = cmd.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.any(|l| l.is_ok_and(|l| l.trim_end().ends_with("STAGED"))), "the writer did not stage its output");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !landed() {
        assert!(std::time::Instant::now() < deadline, "the staged bytes did not reach the store within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let died = SystemTime::now();
    // File times and the server's clock must place a writer that starts now after the death.
    std::thread::sleep(Duration::from_millis(1100));
    died
}

fn staging_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| quantfarm_store::staging::is_staging(n))
        .collect();
    names.sort();
    names
}

#[test]
fn a_killed_local_writers_staging_file_is_swept_and_a_live_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("model.gguf");
    let staged_len =
        || staging_files(dir.path()).first().and_then(|n| std::fs::metadata(dir.path().join(n)).ok()).map(|m| m.len());
    let died = staged_then_killed(out.to_str().unwrap(), None, || staged_len() == Some(STAGED_BYTES as u64));
    let left = staging_files(dir.path());
    assert_eq!(left.len(), 1, "the killed writer left its staging file: {left:?}");
    assert!(left[0].starts_with(".model.gguf.partial-"), "{left:?}");
    rt().block_on(async {
        let target = Location::local(&out);
        assert!(Location::local(dir.path()).list().await.unwrap().is_empty(), "a listing shows staging");
        // A writer of the same output that started after the death.
        let mut live = StagedSink::create(&target, false).await.unwrap();
        live.write(b"live").await.unwrap();
        assert_eq!(sweep(&target, died).await.unwrap(), Swept { files: 1, uploads: 0 });
        let kept = staging_files(dir.path());
        assert_eq!(kept.len(), 1, "only the live writer's staging is left: {kept:?}");
        assert_ne!(kept, left);
        live.commit().await.unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"live");
        assert!(staging_files(dir.path()).is_empty());
        // Nothing left to sweep.
        assert_eq!(sweep(&target, SystemTime::now()).await.unwrap(), Swept::default());
    });
}

#[test]
fn a_killed_local_writers_staging_inside_a_folder_output_is_swept() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("mlx-4bit");
    std::fs::create_dir_all(&folder).unwrap();
    let died = staged_then_killed(folder.join("model.safetensors").to_str().unwrap(), None, || {
        staging_files(&folder).len() == 1
    });
    assert_eq!(staging_files(&folder).len(), 1);
    rt().block_on(async {
        assert_eq!(sweep(&Location::local(&folder), died).await.unwrap(), Swept { files: 1, uploads: 0 });
    });
    assert!(staging_files(&folder).is_empty());
}

/// s3s-fs's own record of incomplete uploads in its folder: `.upload-UUID.json` and the parts
/// `.upload_id-UUID.part-N` (independent of quantfarm's marker objects).
fn uploads_on_server(s3: &S3Server) -> Vec<String> {
    s3.files().into_iter().filter(|f| f.starts_with(".upload-") || f.starts_with(".upload_id-")).collect()
}

/// What the live writer writes: more than one 8 MiB part.
fn live_bytes() -> Vec<u8> {
    (0..9usize << 20).map(|i| (i % 251) as u8).collect()
}

#[test]
fn a_killed_s3_writers_upload_is_aborted_and_a_live_ones_kept() {
    let s3 = S3Server::start();
    std::fs::create_dir_all(s3.root.join("out")).unwrap();
    // Two 8 MiB parts sent (the rest is in the writer's buffer when it dies).
    let parts = || uploads_on_server(&s3).iter().filter(|f| f.contains(".part-")).count();
    let died = staged_then_killed("s3://out/a/model.gguf", Some(&s3), || parts() == 2);
    let markers = staging_files(&s3.root.join("out/a"));
    assert_eq!(markers.len(), 1, "one marker names the killed writer's upload: {:?}", s3.files());
    rt().block_on(async {
        let target = s3.location("out", "a/model.gguf");
        assert!(s3.location("out", "a").list().await.unwrap().is_empty(), "a listing shows staging");
        // A live writer past its first part (a smaller output is put whole at commit, with no staging).
        let mut live = StagedSink::create(&target, false).await.unwrap();
        live.write(&live_bytes()).await.unwrap();
        assert_eq!(sweep(&target, died).await.unwrap(), Swept { files: 0, uploads: 1 });
        let kept = staging_files(&s3.root.join("out/a"));
        assert_eq!(kept.len(), 1, "the live writer's marker is kept: {kept:?}");
        assert_ne!(kept, markers);
        live.commit().await.unwrap();
    });
    assert!(std::fs::read(s3.root.join("out/a/model.gguf")).unwrap() == live_bytes(), "not the live writer's bytes");
    assert!(staging_files(&s3.root.join("out/a")).is_empty(), "{:?}", s3.files());
    assert!(uploads_on_server(&s3).is_empty(), "incomplete uploads left on the server: {:?}", uploads_on_server(&s3));
}
