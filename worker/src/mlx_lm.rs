//! mlx-lm as a runtime: a client for the helper program `worker/mlx/quantfarm_mlx.py` (its protocol is documented
//! at its top), which runs models in mlx-lm, the runtime MLX users load their checkpoints in.
//!
//! The helper's text is compiled into the worker ([`HELPER`]) and written next to the worker's scratch when
//! started, so a worker binary needs nothing from the repository, only a Python with `mlx` and `mlx-lm`
//! (`scripts/install-mlx-runtime`). One helper process holds one model; requests are answered in order, one JSON
//! line each way. A worker advertises `mlx_lm` only when the helper answers the version handshake
//! ([`MlxLm::start`]).
//!
//! Failures keep their meaning: the helper says whether the request or the model was at fault
//! ([`Error::Input`], e.g. a checkpoint mlx-lm cannot load, with mlx-lm's own message) or something else failed
//! ([`Error::Runtime`]); a helper that dies or cannot be started is [`Error::Died`] / [`Error::Start`].

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The helper program, as shipped in the repository.
pub const HELPER: &str = include_str!("../mlx/quantfarm_mlx.py");

/// The protocol version this client speaks (the helper's `PROTOCOL`).
pub const PROTOCOL: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot start the mlx-lm helper with {python}: {msg}")]
    Start { python: String, msg: String },
    #[error("the mlx-lm helper stopped answering ({msg})")]
    Died { msg: String },
    #[error("mlx-lm: {msg}")]
    Input { msg: String },
    #[error("mlx-lm helper: {msg}")]
    Runtime { msg: String },
    #[error("the mlx-lm helper answered {op} with something this worker cannot read: {msg}")]
    Protocol { op: &'static str, msg: String },
}

/// What the handshake tells: the versions and the device, recorded in the report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Versions {
    pub mlx: String,
    pub mlx_lm: String,
    /// `cpu` or `gpu`.
    pub device: String,
    pub device_name: String,
}

/// A loaded model: whether it is quantized and whether its floating parameters were upcast to f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct Loaded {
    pub quantized: bool,
    pub upcast: bool,
    pub vocab: Option<u32>,
}

/// Rows of logits written to a file (little-endian f32, `rows × vocab`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct LogitRows {
    pub rows: u32,
    pub vocab: u32,
}

/// A greedy continuation: the generated ids (ending with the stop id when one ended it, as llama.cpp's end with their
/// end-of-generation id) and each step's top-1 minus top-2
/// log-probability.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Continuation {
    pub tokens: Vec<u32>,
    pub margins: Vec<f32>,
}

/// A running helper process.
pub struct MlxLm {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    pub versions: Versions,
}

impl MlxLm {
    /// Writes the helper into `dir`, starts it with `python` and shakes hands.
    pub async fn start(python: &Path, dir: &Path) -> Result<MlxLm, Error> {
        let start = |msg: String| Error::Start { python: python.display().to_string(), msg };
        let mut cmd = Command::from(command(python, dir)?);
        let mut child = cmd.stderr(Stdio::null()).kill_on_drop(true).spawn().map_err(|e| start(e.to_string()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(start("no pipes to the helper".into()));
        };
        let mut helper = MlxLm { child, stdin, stdout: BufReader::new(stdout).lines(), versions: Versions::default() };
        let hello = match helper.call("hello", json!({ "protocol": PROTOCOL })).await {
            Ok(v) => v,
            // A Python without mlx-lm dies at import: say so as a start failure.
            Err(Error::Died { msg }) => return Err(start(format!("it exited before the handshake ({msg})"))),
            Err(e) => return Err(e),
        };
        helper.versions = parse("hello", hello)?;
        Ok(helper)
    }

    /// `mlx_lm.load` of a checkpoint folder; with `upcast_quantized`, a quantized (or mixture-of-experts) model's
    /// floating parameters are made f32 (what the CPU build needs for f32 activations, and for its GatherMM).
    pub async fn load(&mut self, model: &Path, upcast_quantized: bool) -> Result<Loaded, Error> {
        let v = self.call("load", json!({ "model": model, "upcast_quantized": upcast_quantized })).await?;
        parse("load", v)
    }

    /// One forward pass over `tokens`; the logits of positions `first..` written to `out`.
    pub async fn logits(&mut self, tokens: &[u32], first: usize, out: &Path) -> Result<LogitRows, Error> {
        let v = self.call("logits", json!({ "tokens": tokens, "first": first, "out": out })).await?;
        parse("logits", v)
    }

    /// A greedy continuation of `tokens` (temperature 0, as `mlx_lm.generate`), at most `max_tokens`, ending
    /// with the first of `stop` (`None`: the tokenizer's end-of-sequence ids, where `mlx_lm.generate` ends).
    pub async fn greedy(
        &mut self,
        tokens: &[u32],
        max_tokens: u32,
        stop: Option<&[u32]>,
    ) -> Result<Continuation, Error> {
        let v = self.call("greedy", json!({ "tokens": tokens, "max_tokens": max_tokens, "stop": stop })).await?;
        parse("greedy", v)
    }

    /// The loaded model's tokenizer's text of each sequence.
    pub async fn decode(&mut self, sequences: &[&[u32]]) -> Result<Vec<String>, Error> {
        #[derive(Deserialize)]
        struct Texts {
            texts: Vec<String>,
        }
        let v = self.call("decode", json!({ "sequences": sequences })).await?;
        let t: Texts = parse("decode", v)?;
        if t.texts.len() != sequences.len() {
            return Err(Error::Protocol {
                op: "decode",
                msg: format!("{} texts for {} sequences", t.texts.len(), sequences.len()),
            });
        }
        Ok(t.texts)
    }

    /// Stops the helper.
    pub async fn stop(mut self) {
        drop(self.stdin);
        if tokio::time::timeout(std::time::Duration::from_secs(5), self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
    }

    /// The helper's process id (the tests kill it to see a task fail as a dead helper).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    async fn call(&mut self, op: &'static str, mut request: Value) -> Result<Value, Error> {
        request["op"] = json!(op);
        let mut line = request.to_string();
        line.push('\n');
        let died = |e: std::io::Error| Error::Died { msg: e.to_string() };
        self.stdin.write_all(line.as_bytes()).await.map_err(died)?;
        self.stdin.flush().await.map_err(died)?;
        let Some(answer) = self.stdout.next_line().await.map_err(died)? else {
            let status = self.child.wait().await.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
            return Err(Error::Died { msg: format!("{op}: {status}") });
        };
        read_answer(op, &answer)
    }
}

/// The helper run by `python`, with pipes to its input and output (written into `dir` first).
fn command(python: &Path, dir: &Path) -> Result<std::process::Command, Error> {
    let script = helper_file(dir).map_err(|e| Error::Start {
        python: python.display().to_string(),
        msg: format!("writing the helper into {}: {e}", dir.display()),
    })?;
    let mut cmd = std::process::Command::new(python);
    cmd.arg(&script).stdin(Stdio::piped()).stdout(Stdio::piped()).env("MLX_DISABLE_COMPILE", "1");
    Ok(cmd)
}

/// One answer line: its fields when `ok`, else the failure by the meaning the helper gives it.
fn read_answer(op: &'static str, line: &str) -> Result<Value, Error> {
    let answer: Value = serde_json::from_str(line).map_err(|e| Error::Protocol { op, msg: format!("{e}: {line}") })?;
    if answer["ok"] == json!(true) {
        return Ok(answer);
    }
    let msg = answer["error"].as_str().unwrap_or("(no message)").to_string();
    Err(match answer["kind"].as_str() {
        Some("input") => Error::Input { msg },
        _ => Error::Runtime { msg },
    })
}

/// `mlx_lm.server` serving one model on loopback (started by the helper's `serve` mode, so a quantized model can be
/// upcast as the other tasks' are), killed when dropped. Its log goes to a file, whose last lines say why it stopped.
pub struct Server {
    child: Child,
    pub url: String,
    log: PathBuf,
}

impl Server {
    /// Starts the server on `port` of 127.0.0.1 and waits until `GET /health` answers 200 (the model itself is loaded
    /// by the first request), at most `timeout`.
    pub async fn start(
        python: &Path,
        dir: &Path,
        model: &Path,
        port: u16,
        upcast: bool,
        timeout: std::time::Duration,
    ) -> Result<Server, Error> {
        let start = |msg: String| Error::Start { python: python.display().to_string(), msg };
        let mut cmd = Command::from(command(python, dir)?);
        cmd.arg("serve").arg("--model").arg(model).args(["--host", "127.0.0.1", "--port", &port.to_string()]);
        if upcast {
            cmd.arg("--upcast");
        }
        let log = dir.join(format!("mlx_lm-server-{port}.log"));
        let file = std::fs::File::create(&log).map_err(|e| start(format!("{}: {e}", log.display())))?;
        let err = file.try_clone().map_err(|e| start(e.to_string()))?;
        cmd.stdin(Stdio::null()).stdout(Stdio::from(file)).stderr(Stdio::from(err)).kill_on_drop(true);
        let child = cmd.spawn().map_err(|e| start(e.to_string()))?;
        let mut server = Server { child, url: format!("http://127.0.0.1:{port}"), log };
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(Error::Died { msg: format!("mlx_lm.server exited ({status}): {}", server.log_tail()) });
            }
            if health(port).await {
                return Ok(server);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::Died {
                    msg: format!("mlx_lm.server did not answer /health within {timeout:?}: {}", server.log_tail()),
                });
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(5).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    /// Stops the server.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Whether `GET /health` on 127.0.0.1:`port` answers 200.
async fn health(port: u16) -> bool {
    use tokio::io::AsyncReadExt;
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else { return false };
    let req = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if s.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut head = [0u8; 32];
    let n = s.read(&mut head).await.unwrap_or(0);
    let line = String::from_utf8_lossy(&head[..n]);
    line.starts_with("HTTP/1.") && line.split_whitespace().nth(1) == Some("200")
}

/// A loopback port free now (for a server started next).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

/// The handshake alone, blocking: writes the helper into `dir`, runs it with `python` on one `hello` line and
/// reads the answer (the helper exits at the end of its input). What a worker checks before it advertises
/// `mlx_lm`.
pub fn handshake(python: &Path, dir: &Path) -> Result<Versions, Error> {
    use std::io::Write;
    let start = |msg: String| Error::Start { python: python.display().to_string(), msg };
    let mut child = command(python, dir)?.stderr(Stdio::piped()).spawn().map_err(|e| start(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let hello = json!({ "op": "hello", "protocol": PROTOCOL }).to_string() + "\n";
        stdin.write_all(hello.as_bytes()).map_err(|e| start(e.to_string()))?;
    }
    let out = child.wait_with_output().map_err(|e| start(e.to_string()))?;
    let answer = String::from_utf8_lossy(&out.stdout);
    let Some(line) = answer.lines().next() else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().last().unwrap_or("no output").to_string();
        return Err(start(format!("{}: {last}", out.status)));
    };
    parse("hello", read_answer("hello", line)?)
}

fn parse<T: serde::de::DeserializeOwned>(op: &'static str, v: Value) -> Result<T, Error> {
    serde_json::from_value(v).map_err(|e| Error::Protocol { op, msg: e.to_string() })
}

/// Writes the helper into `dir` (once per content: the name carries a digest of the text) and returns its path.
fn helper_file(dir: &Path) -> std::io::Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    HELPER.hash(&mut h);
    let path = dir.join(format!("quantfarm_mlx-{:016x}.py", h.finish()));
    if std::fs::read_to_string(&path).is_ok_and(|s| s == HELPER) {
        return Ok(path);
    }
    std::fs::create_dir_all(dir)?;
    // A temporary file of its own: workers of one process (`quantfarm run`) write the helper at the same moment.
    let mut tmp = tempfile::Builder::new().prefix(".quantfarm_mlx-").suffix(".partial").tempfile_in(dir)?;
    std::io::Write::write_all(&mut tmp, HELPER.as_bytes())?;
    tmp.persist(&path).map_err(|e| e.error)?;
    Ok(path)
}
