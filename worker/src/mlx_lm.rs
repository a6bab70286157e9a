//! mlx-lm as a runtime: a client for the helper program `worker/mlx/quantfarm_mlx.py` (its protocol is documented
//! at its top; the requests it shares with the other runtimes' helpers are `crate::helper`'s), which runs models in
//! mlx-lm, the runtime MLX users load their checkpoints in. It needs a Python with `mlx` and `mlx-lm`
//! (`scripts/install-mlx-runtime`); a worker advertises `mlx_lm` only when the helper answers the version handshake
//! ([`MlxLm::start`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::Deserialize;
use serde_json::json;
use tokio::process::{Child, Command};

use crate::helper::{self, Helper, Script};
pub use crate::helper::{free_port, Continuation, Error, LogitRows, PROTOCOL};

/// The helper program, as shipped in the repository.
pub const HELPER: &str = include_str!("../mlx/quantfarm_mlx.py");

/// The mlx-lm helper.
pub const SCRIPT: Script =
    Script { runtime: "mlx-lm", text: HELPER, stem: "quantfarm_mlx", env: &[("MLX_DISABLE_COMPILE", "1")] };

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

/// A running mlx-lm helper.
pub struct MlxLm {
    helper: Helper,
    pub versions: Versions,
}

impl MlxLm {
    /// Writes the helper into `dir`, starts it with `python` and shakes hands.
    pub async fn start(python: &Path, dir: &Path) -> Result<MlxLm, Error> {
        let helper = Helper::start(SCRIPT, python, dir).await?;
        let versions = helper.parse("hello", helper.hello.clone())?;
        Ok(MlxLm { helper, versions })
    }

    /// `mlx_lm.load` of a checkpoint folder; with `upcast_quantized`, a quantized (or mixture-of-experts) model's
    /// floating parameters are made f32 (what the CPU build needs for f32 activations, and for its GatherMM).
    pub async fn load(&mut self, model: &Path, upcast_quantized: bool) -> Result<Loaded, Error> {
        let v = self.helper.call("load", json!({ "model": model, "upcast_quantized": upcast_quantized })).await?;
        self.helper.parse("load", v)
    }

    /// One forward pass over `tokens`; the logits of positions `first..` written to `out`.
    pub async fn logits(&mut self, tokens: &[u32], first: usize, out: &Path) -> Result<LogitRows, Error> {
        self.helper.logits(tokens, first, out).await
    }

    /// A greedy continuation of `tokens` (temperature 0, as `mlx_lm.generate`), at most `max_tokens`, ending
    /// with the first of `stop` (`None`: the tokenizer's end-of-sequence ids, where `mlx_lm.generate` ends).
    pub async fn greedy(
        &mut self,
        tokens: &[u32],
        max_tokens: u32,
        stop: Option<&[u32]>,
    ) -> Result<Continuation, Error> {
        self.helper.greedy(tokens, max_tokens, stop).await
    }

    /// The loaded model's tokenizer's text of each sequence.
    pub async fn decode(&mut self, sequences: &[&[u32]]) -> Result<Vec<String>, Error> {
        self.helper.decode(sequences).await
    }

    /// The helper client itself, for the loops the runtimes share (`crate::exec`'s `helper_runs`).
    pub fn helper(&mut self) -> &mut Helper {
        &mut self.helper
    }

    /// Stops the helper.
    pub async fn stop(self) {
        self.helper.stop().await
    }

    /// The helper's process id (the tests kill it to see a task fail as a dead helper).
    pub fn pid(&self) -> Option<u32> {
        self.helper.pid()
    }
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
        let runtime = SCRIPT.runtime;
        let start = |msg: String| Error::Start { runtime, python: python.display().to_string(), msg };
        let mut cmd = Command::from(helper::command(SCRIPT, python, dir)?);
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
                return Err(Error::Died {
                    runtime,
                    msg: format!("mlx_lm.server exited ({status}): {}", server.log_tail()),
                });
            }
            if health(port).await {
                return Ok(server);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::Died {
                    runtime,
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

/// The handshake alone, blocking: writes the helper into `dir`, runs it with `python` on one `hello` line and
/// reads the answer. What a worker checks before it advertises `mlx_lm`.
pub fn handshake(python: &Path, dir: &Path) -> Result<Versions, Error> {
    helper::parse(SCRIPT.runtime, "hello", helper::handshake(SCRIPT, python, dir)?)
}
