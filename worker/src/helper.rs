//! A runtime helper: a Python program the worker starts and talks to over stdin/stdout, one JSON object per line
//! each way, one answer per request, in order (the protocol documented atop each helper: `worker/mlx/quantfarm_mlx.py`
//! for mlx-lm, `worker/transformers/quantfarm_transformers.py` for transformers). The requests both speak (`hello`,
//! `logits`, `greedy`, `decode`) are here; each runtime's module adds its `load` and its versions.
//!
//! A helper's text is compiled into the worker ([`Script::text`]) and written next to the worker's scratch when
//! started, so a worker binary needs nothing from the repository, only a Python with the runtime's packages. One
//! helper process holds one model. Failures keep their meaning: the helper says whether the request or the model was
//! at fault ([`Error::Input`], with the runtime's own message) or something else failed ([`Error::Runtime`]); a
//! helper that dies or cannot be started is [`Error::Died`] / [`Error::Start`].

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The protocol version the clients speak (each helper's `PROTOCOL`).
pub const PROTOCOL: u32 = 1;

/// One helper program.
#[derive(Clone, Copy, Debug)]
pub struct Script {
    /// The runtime's name in messages (`mlx-lm`, `transformers`).
    pub runtime: &'static str,
    /// The program's text.
    pub text: &'static str,
    /// Its file name's stem (a digest of the text is appended).
    pub stem: &'static str,
    /// Environment variables it is started with.
    pub env: &'static [(&'static str, &'static str)],
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot start the {runtime} helper with {python}: {msg}")]
    Start { runtime: &'static str, python: String, msg: String },
    #[error("the {runtime} helper stopped answering ({msg})")]
    Died { runtime: &'static str, msg: String },
    #[error("{runtime}: {msg}")]
    Input { runtime: &'static str, msg: String },
    #[error("{runtime} helper: {msg}")]
    Runtime { runtime: &'static str, msg: String },
    #[error("the {runtime} helper answered {op} with something this worker cannot read: {msg}")]
    Protocol { runtime: &'static str, op: &'static str, msg: String },
}

/// Rows of logits written to a file (little-endian f32, `rows × vocab`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct LogitRows {
    pub rows: u32,
    pub vocab: u32,
}

/// A greedy continuation: the generated ids (ending with the stop id when one ended it, as llama.cpp's end with their
/// end-of-generation id) and each step's top-1 minus top-2 log-probability.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Continuation {
    pub tokens: Vec<u32>,
    pub margins: Vec<f32>,
}

/// A running helper process.
pub struct Helper {
    script: Script,
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    /// The handshake's answer (versions and device, each runtime's own fields).
    pub hello: Value,
}

impl Helper {
    /// Writes the helper into `dir`, starts it with `python` and shakes hands.
    pub async fn start(script: Script, python: &Path, dir: &Path) -> Result<Helper, Error> {
        let runtime = script.runtime;
        let start = |msg: String| Error::Start { runtime, python: python.display().to_string(), msg };
        let mut cmd = Command::from(command(script, python, dir)?);
        let mut child = cmd.stderr(Stdio::null()).kill_on_drop(true).spawn().map_err(|e| start(e.to_string()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(start("no pipes to the helper".into()));
        };
        let mut helper = Helper { script, child, stdin, stdout: BufReader::new(stdout).lines(), hello: Value::Null };
        helper.hello = match helper.call("hello", json!({ "protocol": PROTOCOL })).await {
            Ok(v) => v,
            // A Python without the runtime's packages dies at import: say so as a start failure.
            Err(Error::Died { msg, .. }) => return Err(start(format!("it exited before the handshake ({msg})"))),
            Err(e) => return Err(e),
        };
        Ok(helper)
    }

    /// The runtime's name in messages.
    pub fn runtime(&self) -> &'static str {
        self.script.runtime
    }

    /// One forward pass over `tokens`; the logits of positions `first..` written to `out`.
    pub async fn logits(&mut self, tokens: &[u32], first: usize, out: &Path) -> Result<LogitRows, Error> {
        let v = self.call("logits", json!({ "tokens": tokens, "first": first, "out": out })).await?;
        self.parse("logits", v)
    }

    /// A greedy continuation of `tokens` (temperature 0), at most `max_tokens`, ending with the first of `stop`
    /// (`None`: the model's end-of-sequence ids, where the runtime's own generation ends).
    pub async fn greedy(
        &mut self,
        tokens: &[u32],
        max_tokens: u32,
        stop: Option<&[u32]>,
    ) -> Result<Continuation, Error> {
        let v = self.call("greedy", json!({ "tokens": tokens, "max_tokens": max_tokens, "stop": stop })).await?;
        self.parse("greedy", v)
    }

    /// The loaded model's tokenizer's text of each sequence.
    pub async fn decode(&mut self, sequences: &[&[u32]]) -> Result<Vec<String>, Error> {
        #[derive(Deserialize)]
        struct Texts {
            texts: Vec<String>,
        }
        let v = self.call("decode", json!({ "sequences": sequences })).await?;
        let t: Texts = self.parse("decode", v)?;
        if t.texts.len() != sequences.len() {
            return Err(Error::Protocol {
                runtime: self.script.runtime,
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

    /// Sends request `op` with its fields and reads its answer's fields.
    pub async fn call(&mut self, op: &'static str, mut request: Value) -> Result<Value, Error> {
        let runtime = self.script.runtime;
        request["op"] = json!(op);
        let mut line = request.to_string();
        line.push('\n');
        let died = |e: std::io::Error| Error::Died { runtime, msg: e.to_string() };
        self.stdin.write_all(line.as_bytes()).await.map_err(died)?;
        self.stdin.flush().await.map_err(died)?;
        let Some(answer) = self.stdout.next_line().await.map_err(died)? else {
            let status = self.child.wait().await.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
            return Err(Error::Died { runtime, msg: format!("{op}: {status}") });
        };
        read_answer(runtime, op, &answer)
    }

    /// An answer's fields as `T`.
    pub fn parse<T: serde::de::DeserializeOwned>(&self, op: &'static str, v: Value) -> Result<T, Error> {
        parse(self.script.runtime, op, v)
    }
}

/// The helper run by `python`, with pipes to its input and output (written into `dir` first).
pub(crate) fn command(script: Script, python: &Path, dir: &Path) -> Result<std::process::Command, Error> {
    let path = helper_file(script, dir).map_err(|e| Error::Start {
        runtime: script.runtime,
        python: python.display().to_string(),
        msg: format!("writing the helper into {}: {e}", dir.display()),
    })?;
    let mut cmd = std::process::Command::new(python);
    cmd.arg(&path).stdin(Stdio::piped()).stdout(Stdio::piped()).envs(script.env.iter().copied());
    Ok(cmd)
}

/// One answer line: its fields when `ok`, else the failure by the meaning the helper gives it.
fn read_answer(runtime: &'static str, op: &'static str, line: &str) -> Result<Value, Error> {
    let answer: Value =
        serde_json::from_str(line).map_err(|e| Error::Protocol { runtime, op, msg: format!("{e}: {line}") })?;
    if answer["ok"] == json!(true) {
        return Ok(answer);
    }
    let msg = answer["error"].as_str().unwrap_or("(no message)").to_string();
    Err(match answer["kind"].as_str() {
        Some("input") => Error::Input { runtime, msg },
        _ => Error::Runtime { runtime, msg },
    })
}

pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    runtime: &'static str,
    op: &'static str,
    v: Value,
) -> Result<T, Error> {
    serde_json::from_value(v).map_err(|e| Error::Protocol { runtime, op, msg: e.to_string() })
}

/// The handshake alone, blocking: writes the helper into `dir`, runs it with `python` on one `hello` line and
/// reads the answer (the helper exits at the end of its input). What a worker checks before it advertises the
/// runtime.
pub fn handshake(script: Script, python: &Path, dir: &Path) -> Result<Value, Error> {
    use std::io::Write;
    let runtime = script.runtime;
    let start = |msg: String| Error::Start { runtime, python: python.display().to_string(), msg };
    let mut child = command(script, python, dir)?.stderr(Stdio::piped()).spawn().map_err(|e| start(e.to_string()))?;
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
    read_answer(runtime, "hello", line)
}

/// Writes the helper into `dir` (once per content: the name carries a digest of the text) and returns its path.
fn helper_file(script: Script, dir: &Path) -> std::io::Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    script.text.hash(&mut h);
    let path = dir.join(format!("{}-{:016x}.py", script.stem, h.finish()));
    if std::fs::read_to_string(&path).is_ok_and(|s| s == script.text) {
        return Ok(path);
    }
    std::fs::create_dir_all(dir)?;
    // A temporary file of its own: workers of one process (`quantfarm run`) write the helper at the same moment.
    let mut tmp = tempfile::Builder::new().prefix(&format!(".{}-", script.stem)).suffix(".partial").tempfile_in(dir)?;
    std::io::Write::write_all(&mut tmp, script.text.as_bytes())?;
    tmp.persist(&path).map_err(|e| e.error)?;
    Ok(path)
}

/// A loopback port free now (for a server started next).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}
