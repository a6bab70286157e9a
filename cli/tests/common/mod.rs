//! What the farm's end-to-end tests share: a farm of real processes (one `quantfarm coordinator`, `quantfarm
//! worker`s) over a real S3 server, and the checks on what they leave in the bucket.
#![allow(dead_code)] // each test target uses its own part

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quantfarm_e2e::s3::S3Server;
use quantfarm_store::Location;
use quantfarm_tensors::TensorSource;
use serde_json::Value;
use sha2::{Digest, Sha256};

pub const TOKEN: &str = "farm-test-token-5f2c";

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_quantfarm")
}

/// Kills the process on drop, so a failing test leaves nothing running.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct Farm<'a> {
    pub s3: &'a S3Server,
    pub dir: PathBuf,
    pub port: u16,
    pub store_bucket: String,
    pub key: PathBuf,
}

impl<'a> Farm<'a> {
    /// A farm in `dir` whose store is bucket `store_bucket` of `s3` (created here), on a free port.
    pub fn new(s3: &'a S3Server, dir: &Path, store_bucket: &str, key: &Path) -> Farm<'a> {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::create_dir_all(s3.root.join(store_bucket)).unwrap();
        Farm {
            s3,
            dir: dir.to_path_buf(),
            port: free_port(),
            store_bucket: store_bucket.to_string(),
            key: key.to_path_buf(),
        }
    }

    /// Everything the coordinators of this farm logged so far (each start writes its own file).
    pub fn coordinator_logs(&self) -> String {
        let mut logs: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("coordinator-")))
            .collect();
        logs.sort();
        logs.iter().map(|p| std::fs::read_to_string(p).unwrap_or_default()).collect()
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn coordinator(&self) -> Proc {
        self.coordinator_with(&[])
    }

    /// The coordinator with `extra` options after the farm's own (a later value of an option wins).
    pub fn coordinator_with(&self, extra: &[&str]) -> Proc {
        let log = std::fs::File::create(self.dir.join(format!("coordinator-{}.log", now_ms()))).unwrap();
        let child = Command::new(bin())
            .args(["coordinator", "--listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--store", &format!("s3://{}/store", self.store_bucket)])
            .arg("--journal")
            .arg(self.dir.join("journal.sqlite"))
            .arg("--key")
            .arg(&self.key)
            .args(["--token", TOKEN, "--lease-ms", "2000", "--backoff-ms", "200"])
            .args(extra)
            .envs(self.s3.env())
            .env("QUANTFARM_LOG", "info")
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "the coordinator did not listen within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Proc(child)
    }

    pub fn worker(&self, name: &str, token: &str) -> (Proc, PathBuf) {
        self.worker_with(name, token, &self.dir.join("scratch"), &[])
    }

    /// A worker with `extra` options after the farm's own.
    pub fn worker_args(&self, name: &str, extra: &[&OsStr]) -> (Proc, PathBuf) {
        self.spawn_worker(name, TOKEN, &self.dir.join("scratch"), &[], extra)
    }

    /// A worker with scratch folder `scratch`, started through `wrap` (a program and its arguments, given the
    /// worker's command line after them; empty: none). Its log is `DIR/NAME.log`.
    pub fn worker_with(&self, name: &str, token: &str, scratch: &Path, wrap: &[&OsStr]) -> (Proc, PathBuf) {
        self.spawn_worker(name, token, scratch, wrap, &[])
    }

    fn spawn_worker(
        &self,
        name: &str,
        token: &str,
        scratch: &Path,
        wrap: &[&OsStr],
        extra: &[&OsStr],
    ) -> (Proc, PathBuf) {
        let log_path = self.dir.join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        let mut cmd = match wrap.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin());
                c
            }
            None => Command::new(bin()),
        };
        let child = cmd
            .args(["worker", "--coordinator", &self.url(), "--token", token, "--name", name, "--memory", "256MiB"])
            .arg("--scratch")
            .arg(scratch)
            .args(extra)
            .envs(self.s3.env())
            .env("QUANTFARM_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        (Proc(child), log_path)
    }

    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(bin())
            .args(args)
            .args(["--coordinator", &self.url(), "--token", TOKEN])
            .envs(self.s3.env())
            .output()
            .unwrap()
    }
}

/// A new signing key `DIR/signing.key` (and its `.pub`), made by `quantfarm keygen`.
pub fn keygen(dir: &Path) -> PathBuf {
    let key = dir.join("signing.key");
    let out = Command::new(bin()).arg("keygen").arg(&key).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    key
}

pub fn now_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Every object of a bucket with its size, as an S3 client lists them.
pub fn list_bucket(rt: &tokio::runtime::Runtime, s3: &S3Server, bucket: &str) -> BTreeMap<String, u64> {
    use futures::StreamExt;
    use object_store::ObjectStore;
    let store = s3.config(bucket).build().unwrap();
    rt.block_on(async {
        let mut out = BTreeMap::new();
        let mut stream = store.list(None);
        while let Some(m) = stream.next().await {
            if let Ok(m) = m {
                out.insert(m.location.to_string(), m.size);
            }
        }
        out
    })
}

/// Per tensor: (type, sha256 of its bytes), for a GGUF (first split file opens all).
pub fn tensor_hashes(rt: &tokio::runtime::Runtime, loc: &Location) -> BTreeMap<String, (String, String)> {
    rt.block_on(async {
        let src = TensorSource::open(loc).await.unwrap();
        let mut out = BTreeMap::new();
        for e in src.tensors().to_vec() {
            let mut buf = vec![0u8; e.bytes as usize];
            src.read_range(&e.name, 0, &mut buf).await.unwrap();
            out.insert(e.name.clone(), (e.ty.to_string(), hex(&Sha256::digest(&buf))));
        }
        out
    })
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn manifest(name: &str) -> BTreeMap<String, (String, String)> {
    let path = quantfarm_e2e::fixtures_dir().join("smollm2/manifests").join(name);
    let m: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    m["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                (t["type"].as_str().unwrap().to_string(), t["sha256"].as_str().unwrap().to_string()),
            )
        })
        .collect()
}

/// `quantfarm run RELEASE --store DIR/data --json` with a signing key in DIR.
pub fn run_json(release: &Path, dir: &Path) -> Output {
    Command::new(bin())
        .arg("run")
        .arg(release)
        .arg("--store")
        .arg(dir.join("data"))
        .arg("--json")
        .env("QUANTFARM_KEY_FILE", dir.join("k"))
        .output()
        .unwrap()
}

/// The last JSON line of `submit --watch --json` / `watch --json`: the summary.
pub fn summary(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line =
        stdout.lines().last().unwrap_or_else(|| panic!("no output; stderr:\n{}", String::from_utf8_lossy(&out.stderr)));
    serde_json::from_str(line).unwrap()
}

/// (file name, sha256) of every artifact file in a summary.
pub fn artifact_files(summary: &Value) -> BTreeSet<(String, String)> {
    summary["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|a| a["files"].as_array().unwrap().iter())
        .map(|f| {
            let url = f["url"].as_str().unwrap();
            (url.rsplit('/').next().unwrap().to_string(), f["sha256"].as_str().unwrap().to_string())
        })
        .collect()
}

pub fn read_object(rt: &tokio::runtime::Runtime, url: &str, s3: &S3Server) -> Vec<u8> {
    let (bucket, key) = url.strip_prefix("s3://").unwrap().split_once('/').unwrap();
    let loc = s3.location(bucket, key);
    rt.block_on(async {
        let b = quantfarm_store::Blob::open(&loc).await.unwrap();
        b.read_vec(0, b.len()).await.unwrap()
    })
}

/// Watches a bucket's listing while a run goes on: every (key, size) ever listed.
pub struct BucketWatch {
    seen: Arc<Mutex<BTreeMap<String, BTreeSet<u64>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BucketWatch {
    pub fn start(s3: &S3Server, bucket: &str) -> BucketWatch {
        let seen: Arc<Mutex<BTreeMap<String, BTreeSet<u64>>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        let config = s3.config(bucket);
        let thread = std::thread::spawn(move || {
            use futures::StreamExt;
            use object_store::ObjectStore;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let store = config.build().unwrap();
            while !stop2.load(Ordering::SeqCst) {
                rt.block_on(async {
                    let mut stream = store.list(None);
                    while let Some(m) = stream.next().await {
                        if let Ok(m) = m {
                            seen2.lock().unwrap().entry(m.location.to_string()).or_default().insert(m.size);
                        }
                    }
                });
                std::thread::sleep(Duration::from_millis(40));
            }
        });
        BucketWatch { seen, stop, thread: Some(thread) }
    }

    /// Stops watching; asserts every object ever listed is in `fin` with its final size (nothing partial, nothing
    /// that later vanished), except staging markers (`.NAME.partial-*`, `quantfarm_store::staging`), which name
    /// uploads in progress and must be gone at the end.
    pub fn check(mut self, fin: &BTreeMap<String, u64>) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap();
        let seen = self.seen.lock().unwrap();
        for (key, sizes) in seen.iter() {
            if quantfarm_store::staging::is_staging(key.rsplit('/').next().unwrap_or(key)) {
                assert!(!fin.contains_key(key), "staging marker {key} is still there at the end");
                continue;
            }
            let size = fin.get(key).unwrap_or_else(|| panic!("{key} was listed during the run but is gone at the end"));
            assert_eq!(sizes, &BTreeSet::from([*size]), "{key} was listed with sizes {sizes:?}, final size {size}");
        }
        seen.len()
    }
}

pub fn wait_log(path: &Path, pattern: &regex::Regex, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(m) = pattern.find(&text) {
            return Some(m.as_str().to_string());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}
