//! A real S3-compatible server on loopback for tests: `s3s-fs` (SigV4-checking, buckets as folders), installed by
//! `scripts/install-s3s-fs`. Started per test on a free port over a temporary folder; killed on drop.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quantfarm_store::s3::S3Config;
use quantfarm_store::Location;

pub const ACCESS_KEY: &str = "quantfarm-test-access";
pub const SECRET_KEY: &str = "quantfarm-test-secret-0123456789";

pub struct S3Server {
    /// Behind a lock so that a test can crash and restart the server while others hold it.
    child: std::sync::Mutex<Child>,
    pub port: u16,
    /// The folder the server serves: `root/BUCKET/KEY` is object KEY of BUCKET.
    pub root: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

/// The s3s-fs binary: `$QUANTFARM_S3S_FS`, or the one `scripts/install-s3s-fs` installs (run here if missing).
pub fn s3s_fs_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("QUANTFARM_S3S_FS") {
        return PathBuf::from(p);
    }
    let p = crate::cache_dir().join("s3s-fs-0.14.1/bin/s3s-fs");
    if p.exists() {
        return p;
    }
    let script = crate::repo_root().join("scripts/install-s3s-fs");
    std::fs::create_dir_all(crate::cache_dir()).expect("cache folder");
    let out = Command::new("flock")
        .arg(crate::cache_dir().join(".install-s3s-fs.lock"))
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(out.status.success(), "{} failed:\n{}", script.display(), String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

impl S3Server {
    /// Starts a server over a new temporary folder.
    pub fn start() -> S3Server {
        let tmp = tempfile::tempdir().expect("temp dir");
        let root = tmp.path().to_path_buf();
        let mut s = S3Server::start_at(&root);
        s._tmp = Some(tmp);
        s
    }

    /// Starts a server over `root` (which must exist).
    pub fn start_at(root: &Path) -> S3Server {
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
        let child = std::sync::Mutex::new(S3Server::spawn(root, port));
        S3Server { child, port, root: root.to_path_buf(), _tmp: None }
    }

    /// Kills the server (SIGKILL: no chance to finish anything), waits `down`, and starts it again on the same port
    /// over the same folder, as a crashed and restarted S3 service comes back.
    pub fn crash_and_restart(&self, down: Duration) {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let _ = child.kill();
        let _ = child.wait();
        std::thread::sleep(down);
        *child = S3Server::spawn(&self.root, self.port);
    }

    fn spawn(root: &Path, port: u16) -> Child {
        let child = Command::new(s3s_fs_bin())
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--access-key",
                ACCESS_KEY,
                "--secret-key",
                SECRET_KEY,
            ])
            .arg(root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start s3s-fs");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "s3s-fs did not listen on port {port} within 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        child
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn config(&self, bucket: &str) -> S3Config {
        S3Config {
            bucket: bucket.to_string(),
            endpoint: Some(self.endpoint()),
            region: Some("us-east-1".into()),
            access_key_id: Some(ACCESS_KEY.into()),
            secret_access_key: Some(SECRET_KEY.into()),
        }
    }

    /// A location `s3://bucket/key` on this server (key may be a folder prefix).
    pub fn location(&self, bucket: &str, key: &str) -> Location {
        std::fs::create_dir_all(self.root.join(bucket)).expect("bucket folder");
        let store = self.config(bucket).build().expect("S3 store");
        let key = quantfarm_store::location::checked_key(key, "test").expect("valid key");
        Location::in_store(Arc::new(store), key, "s3", bucket)
    }

    /// Uploads a local file or the files of a local folder to `bucket/key` through the S3 API (a multipart upload
    /// by the staged sink), so the server records each object's ETag. (s3s-fs recomputes the MD5 of a file that was
    /// merely copied into its folder on every GET, which would make ranged reads of it quadratic.)
    pub fn upload(&self, local: &Path, bucket: &str, key: &str) {
        let files: Vec<(PathBuf, String)> = if local.is_dir() {
            let mut v: Vec<_> = std::fs::read_dir(local)
                .expect("read folder")
                .flatten()
                .filter(|e| e.path().is_file())
                .map(|e| (e.path(), format!("{key}/{}", e.file_name().to_string_lossy())))
                .collect();
            v.sort();
            v
        } else {
            vec![(local.to_path_buf(), key.to_string())]
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            for (path, key) in files {
                let mut sink =
                    quantfarm_store::StagedSink::create(&self.location(bucket, &key), true).await.expect("upload");
                let mut f = std::fs::File::open(&path).expect("open file to upload");
                let mut buf = vec![0u8; 8 << 20];
                loop {
                    let n = std::io::Read::read(&mut f, &mut buf).expect("read file to upload");
                    if n == 0 {
                        break;
                    }
                    sink.write(&buf[..n]).await.expect("upload");
                }
                sink.commit().await.expect("commit upload");
            }
        });
    }

    /// Environment variables that point a child process (e.g. the CLI) at this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// Every file under the served folder, relative to it (what the bucket shows, plus any staging files).
    pub fn files(&self) -> Vec<String> {
        fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
            if let Ok(rd) = std::fs::read_dir(dir) {
                for e in rd.flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        walk(&p, base, out);
                    } else if let Ok(rel) = p.strip_prefix(base) {
                        out.push(rel.to_string_lossy().into_owned());
                    }
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.root, &self.root, &mut out);
        out.sort();
        out
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}
