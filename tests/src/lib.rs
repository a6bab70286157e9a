//! Support for the end-to-end tests: where the peer tools and shared fixtures are, and a real S3 server.
//!
//! Oracles are never optional. A test that needs one and cannot find it fails with a message saying how to get it
//! (`scripts/test` installs them all), because a skipped oracle is not a pass.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether a slow test must be skipped: it runs only with `QUANTFARM_LONG` set (`scripts/test --long`); otherwise
/// it says so, loudly, with `why` (what it does and how long it takes).
pub fn skip_unless_long(test: &str, why: &str) -> bool {
    if std::env::var_os("QUANTFARM_LONG").is_some() {
        return false;
    }
    eprintln!("SKIP {test}: {why}; set QUANTFARM_LONG=1 (scripts/test --long) to run it");
    true
}

/// A plain HTTP/1.1 GET of `path` on `addr` (the coordinator's metrics and health endpoints): the whole response,
/// status line and headers included.
pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).expect("timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").expect("request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("response");
    out
}

/// The repository root (the workspace folder).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// `../shared` beside the checkout, or `$QUANTFARM_SHARED`.
pub fn shared_dir() -> PathBuf {
    let dir = std::env::var_os("QUANTFARM_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("..").join("shared"));
    assert!(dir.join("DESIGN.md").exists(), "shared folder not found at {} (set QUANTFARM_SHARED)", dir.display());
    dir
}

/// Held by a test that keeps every core busy (llama.cpp, torch or mlx with as many threads as there are cores), so
/// that such tests of one test binary run one after another while the light ones still run beside them. Side by side
/// on 2 cores they take longer than in turn, because llama.cpp's threads spin while they wait for each other:
/// cli/tests/eval.rs took 501 s with its tests in parallel and 303 s one at a time (AMD EPYC, 2 cores).
pub fn cpu_bound() -> std::sync::MutexGuard<'static, ()> {
    static CPU: std::sync::Mutex<()> = std::sync::Mutex::new(());
    CPU.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn fixtures_dir() -> PathBuf {
    shared_dir().join("fixtures")
}

/// `$QUANTFARM_CACHE`, default `~/.cache/quantfarm`, as the shared tools use it.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("QUANTFARM_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache").join("quantfarm")
    })
}

/// Runs one of `../shared/tools/*` (idempotent installers) and returns the path it prints. Runs are serialized with
/// `flock` on a file in the cache (tests run in parallel, and two builds of llama.cpp in one folder would collide);
/// `scripts/install-peers` takes the same locks.
fn shared_tool(name: &str) -> PathBuf {
    installer(&shared_dir().join("tools").join(name))
}

/// Runs an idempotent installer script under its `flock` and returns the path it prints last.
fn installer(script: &Path) -> PathBuf {
    let name = script.file_name().and_then(|n| n.to_str()).expect("installer name");
    std::fs::create_dir_all(cache_dir()).expect("cache folder");
    let out = Command::new("flock")
        .arg(cache_dir().join(format!(".{name}.lock")))
        .arg(script)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed (run scripts/test, which installs the peer tools):\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8_lossy(&out.stdout).trim().lines().last().unwrap_or("").to_string();
    PathBuf::from(path)
}

/// The Python of the peer venv (mlx, mlx-lm, gguf-py, numpy, safetensors).
pub fn peers_python() -> PathBuf {
    let p = cache_dir().join("venv-peers").join("bin").join("python");
    if p.exists() && cache_dir().join("venv-peers").join(".complete").exists() {
        return p;
    }
    shared_tool("install-mlx")
}

/// The Python in which llama.cpp's own `convert_hf_to_gguf.py` runs (torch, transformers, sentencepiece, the
/// source tree's gguf-py; `scripts/install-convert-oracle`).
/// The installer always runs: it is quick when the venv is up to date, and it brings an older one up to its pins.
pub fn convert_python() -> PathBuf {
    installer(&repo_root().join("scripts").join("install-convert-oracle"))
}

/// The Python of llm-compressor 0.14.0.1's venv (`scripts/install-llm-compressor`): compressed-tensors 0.19.0,
/// transformers 5.17.0, and the converter venv's torch 2.11.0.
pub fn llm_compressor_python() -> PathBuf {
    installer(&repo_root().join("scripts").join("install-llm-compressor"))
}

/// compressed-tensors 0.20.1 and loguru, unpacked for the converter's venv (`scripts/install-compressed-tensors`):
/// the folder to put on `PYTHONPATH` when running `tests/py/ct_oracle.py` with [`convert_python`].
pub fn compressed_tensors_site() -> PathBuf {
    installer(&repo_root().join("scripts").join("install-compressed-tensors"))
}

/// The cache folder holding the independent checkers of reports and deploy files (`scripts/install-check-tools`):
/// `node-check/` (playwright-core, driving Debian's /usr/bin/chromium) and `venv-check/` (securesystemslib,
/// jsonschema, kubernetes-validate, check-jsonschema); Debian's docker-compose and systemd-analyze beside them.
pub fn check_tools() -> PathBuf {
    let c = cache_dir();
    let installed = ["node-check/.complete", "venv-check/.complete"].iter().all(|f| c.join(f).exists())
        && ["/usr/bin/chromium", "/usr/bin/docker-compose"].iter().all(|f| Path::new(f).exists());
    if installed {
        return c;
    }
    installer(&repo_root().join("scripts").join("install-check-tools"))
}

/// llama.cpp's source tree (`convert_hf_to_gguf.py`, `models/ggml-vocab-*.gguf`, `models/templates/`).
pub fn llama_src() -> PathBuf {
    llama_bin().join("../..").canonicalize().expect("llama.cpp source tree")
}

/// The real SmolLM2-135M-Instruct Q4_1 GGUF.
pub fn smollm2_gguf() -> PathBuf {
    let p = cache_dir().join("models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        return p;
    }
    shared_tool("get-smollm2")
}

/// The folder with `smollm2-bf16.gguf` and `smollm2-hf/`.
pub fn smollm2_derived() -> PathBuf {
    let dir = cache_dir().join("models/smollm2");
    if dir.join("smollm2-bf16.gguf").exists() && dir.join("smollm2-hf/.complete").exists() {
        return dir;
    }
    shared_tool("make-smollm2-fixtures")
}

/// llama.cpp's built tools folder (llama-gguf-split, llama-quantize, …).
pub fn llama_bin() -> PathBuf {
    let dir = cache_dir().join("llama.cpp-0.3.36");
    if dir.join(".built").exists() {
        return dir.join("build").join("bin");
    }
    shared_tool("install-llama-cpp")
}

/// Greedy text from `llama-completion -m MODEL -p PROMPT -n N --temp 0 -no-cnv -t THREADS EXTRA…` (stdin closed):
/// its stdout, which starts with the echoed prompt. Panics when the tool fails.
///
/// llama-completion (0.3.36) prints through llama.cpp's asynchronous logger, and under CPU contention its output
/// can be cut short: the process exits with status 0 before the logger thread has written everything (seen: no
/// output at all, or only the echoed prompt; strace shows no write to stdout before `exit_group(0)`). It happens on
/// any GGUF (16 of 40 runs of one fixed tiny model with two busy cores; 0 of 30 on an idle machine). Output that
/// stops within the prompt is therefore retried, loudly, up to 10 times; anything else is returned at once.
pub fn llama_generate(model: &Path, prompt: &str, n: u32, threads: u32, extra: &[&str]) -> String {
    const ATTEMPTS: usize = 10;
    for attempt in 1..=ATTEMPTS {
        let o = Command::new(llama_bin().join("llama-completion"))
            .arg("-m")
            .arg(model)
            .args(["-p", prompt, "-n", &n.to_string(), "--temp", "0", "-no-cnv", "-t", &threads.to_string()])
            .args(extra)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run llama-completion: {e}"));
        let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "llama-completion on {} failed:\n{stderr}", model.display());
        if prompt.starts_with(&*stdout) && attempt < ATTEMPTS {
            eprintln!(
                "RETRY llama-completion exited 0 with its output cut to {stdout:?} (attempt {attempt} of {ATTEMPTS})"
            );
            continue;
        }
        return stdout.into_owned();
    }
    unreachable!("the last attempt returns")
}

/// Runs a Python script from `tests/py/` with the peer venv; panics with its stderr on failure.
pub fn run_py(script: &str, args: &[&std::ffi::OsStr]) -> String {
    run_py_with(&peers_python(), script, args)
}

/// A tiny random checkpoint of family `arch` (`tests/py/make_synthetic_hf.py`: seeded bf16 weights, the real
/// config's fields and the real tokenizer) written to folder `out`, which is returned.
///
/// The script is deterministic (seeded) but slow (transformers builds and saves each real tokenizer: 6–11 s), and
/// the family tests make the same checkpoints dozens of times, so each is made once per set of inputs into
/// `$QUANTFARM_CACHE/synthetic-hf/` (keyed by the sha256 of the script, the family, `QF_SYNTHETIC_DIMS`, the
/// llama.cpp source its vocabularies come from and the converter venv's installed packages) and copied from there.
pub fn synthetic_hf(arch: &str, out: &Path) -> PathBuf {
    let cached = synthetic_hf_cached(arch);
    copy_tree(&cached, out);
    out.to_path_buf()
}

fn synthetic_hf_cached(arch: &str) -> PathBuf {
    use sha2::Digest as _;
    let python = convert_python();
    let src = llama_src();
    let script = repo_root().join("tests/py/make_synthetic_hf.py");
    let mut h = sha2::Sha256::new();
    h.update(std::fs::read(&script).expect("make_synthetic_hf.py"));
    for part in [arch.as_bytes(), src.as_os_str().as_encoded_bytes(), python.as_os_str().as_encoded_bytes()] {
        key_part(&mut h, part);
    }
    key_part(&mut h, std::env::var("QF_SYNTHETIC_DIMS").unwrap_or_default().as_bytes());
    // The packages the script imports (transformers, tokenizers, gguf, sentencepiece, quicktok-v1, …).
    h.update(installed_packages(&python).as_bytes());
    let dir = cache_dir().join("synthetic-hf").join(format!("{arch}-{}", key_name(h)));
    cached_entry(dir, |made| {
        run_py_with(&python, "make_synthetic_hf.py", &[OsStr::new(arch), made.as_os_str(), src.as_os_str()]);
    })
}

/// The packages installed in the venv of `python`, by the names of their metadata folders (name and version), sorted
/// and one per line: part of a cache key, so that a new version of any makes the cached output again.
fn installed_packages(python: &Path) -> String {
    let venv = python.parent().and_then(Path::parent).expect("the venv of a python in bin/");
    let mut packages: Vec<String> =
        walk_names(&venv.join("lib"), 3).into_iter().filter(|n| n.ends_with(".dist-info")).collect();
    packages.sort();
    packages.join("\n")
}

/// The names of the entries under `dir`, `depth` levels deep.
fn walk_names(dir: &Path, depth: u32) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        out.push(e.file_name().to_string_lossy().into_owned());
        if depth > 1 && e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk_names(&e.path(), depth - 1));
        }
    }
    out
}

/// Adds `bytes` to a cache key, length-prefixed.
fn key_part(h: &mut sha2::Sha256, bytes: &[u8]) {
    use sha2::Digest as _;
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// The regular files of `dir`, sorted by path.
fn folder_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Adds every file of `files` to a cache key (its name, then its bytes, one file in memory at a time).
fn key_files(h: &mut sha2::Sha256, files: &[PathBuf]) {
    for f in files {
        key_part(h, f.file_name().unwrap_or_default().as_encoded_bytes());
        key_part(h, &std::fs::read(f).unwrap_or_else(|e| panic!("read {}: {e}", f.display())));
    }
}

/// The cache key's name: the first 12 bytes of the hash, in hex.
fn key_name(h: sha2::Sha256) -> String {
    use sha2::Digest as _;
    h.finalize().iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// The cache entry `dir`, made once: `make` fills the folder it is given (not yet created) in a staging folder
/// beside `dir`, which is then marked complete and renamed into place, so a killed run or a concurrent one leaves
/// no half entry.
fn cached_entry(dir: PathBuf, make: impl FnOnce(&Path)) -> PathBuf {
    if dir.join(".complete").exists() {
        return dir;
    }
    let parent = dir.parent().expect("cache folder");
    std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("create {}: {e}", parent.display()));
    let staging = tempfile::tempdir_in(parent).expect("a staging folder");
    let made = staging.path().join("entry");
    make(&made);
    std::fs::write(made.join(".complete"), b"").expect("mark the entry complete");
    if std::fs::rename(&made, &dir).is_err() && !dir.join(".complete").exists() {
        panic!("cannot move {} to {}", made.display(), dir.display());
    }
    dir
}

/// Copies the folder `from` to `to` (created), every file but the cache's `.complete` marker.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("create {}: {e}", to.display()));
    for e in std::fs::read_dir(from).unwrap_or_else(|e| panic!("read {}: {e}", from.display())).flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            copy_tree(&src, &dst);
        } else if e.file_name() != ".complete" {
            std::fs::copy(&src, &dst)
                .unwrap_or_else(|err| panic!("copy {} to {}: {err}", src.display(), dst.display()));
        }
    }
}

/// convert_hf_to_gguf.py (the llama.cpp source the peer tools are built from) on the HF checkpoint `hf`, writing
/// `--outtype outtype` to the file `out`; panics with its stderr on failure.
///
/// The converter is deterministic and the suite runs it on the same small checkpoints many times (each run starts
/// Python and imports torch: seconds), so the output for a checkpoint of at most 256 MiB is made once per set of
/// inputs into `$QUANTFARM_CACHE/convert-hf-to-gguf/` — keyed by the sha256 of the script, the llama.cpp source
/// tree's path (its pinned version), the out type, the folder's name (`general.name` comes from it), every file of
/// the folder and the converter venv's installed packages — and copied from there; larger checkpoints are converted
/// each time.
pub fn convert_hf_to_gguf_py(hf: &Path, outtype: &str, out: &Path) {
    use sha2::Digest as _;
    let script = llama_src().join("convert_hf_to_gguf.py");
    let python = convert_python();
    let run = |to: &Path| {
        let o = Command::new(&python)
            .arg(&script)
            .arg(hf)
            .args(["--outtype", outtype, "--outfile"])
            .arg(to)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            o.status.success(),
            "convert_hf_to_gguf.py on {}:\n{}",
            hf.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let files = folder_files(hf);
    let total: u64 = files.iter().map(|f| f.metadata().map_or(0, |m| m.len())).sum();
    if total > 256 << 20 {
        return run(out);
    }
    let mut h = sha2::Sha256::new();
    key_part(&mut h, &std::fs::read(&script).expect("convert_hf_to_gguf.py"));
    key_part(&mut h, script.as_os_str().as_encoded_bytes());
    key_part(&mut h, outtype.as_bytes());
    key_part(&mut h, hf.file_name().unwrap_or_default().as_encoded_bytes());
    key_files(&mut h, &files);
    h.update(installed_packages(&python).as_bytes());
    let dir = cache_dir().join("convert-hf-to-gguf").join(format!("{outtype}-{}", key_name(h)));
    let dir = cached_entry(dir, |made| {
        std::fs::create_dir_all(made).expect("create the staging entry");
        run(&made.join("out.gguf"));
    });
    std::fs::copy(dir.join("out.gguf"), out)
        .unwrap_or_else(|e| panic!("copy the cached conversion of {} to {}: {e}", hf.display(), out.display()));
}

/// Runs a Python script from `tests/py/` with the given interpreter; panics with its stderr on failure.
pub fn run_py_with(python: &Path, script: &str, args: &[&std::ffi::OsStr]) -> String {
    let path = repo_root().join("tests").join("py").join(script);
    let out = Command::new(python)
        .arg(&path)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    assert!(out.status.success(), "{} failed:\n{}", path.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("script prints UTF-8")
}

/// A synthetic LoRA adapter for the HF checkpoint `hf`, written by `tests/py/lora_adapters.py KIND` into
/// `dir/KIND-adapter` (its expected merge beside it, unused by the callers of this helper); returns the adapter.
pub fn lora_adapter(kind: &str, hf: &Path, dir: &Path) -> PathBuf {
    let adapter = dir.join(format!("{kind}-adapter"));
    let expected = dir.join(format!("{kind}-expected.safetensors"));
    lora_adapters(kind, hf, &adapter, &expected, None);
    adapter
}

/// `tests/py/lora_adapters.py FORMAT BASE ADAPTER EXPECTED [FLAW]`: the adapter folder and, unflawed, its float64
/// reference merge. The script is deterministic (seeded numpy) but slow on a real base (a float64 product per adapted
/// matrix: seconds on SmolLM2), and the suite asks for the same adapters of the same bases many times, so each is made
/// once per set of inputs into `$QUANTFARM_CACHE/lora-adapters/` (keyed by the sha256 of the script, the format, the
/// flaw, every byte of the base folder and the Python's installed packages) and copied from there.
pub fn lora_adapters(format: &str, base: &Path, adapter: &Path, expected: &Path, flaw: Option<&str>) {
    use sha2::Digest as _;
    let python = peers_python();
    let mut h = sha2::Sha256::new();
    h.update(std::fs::read(repo_root().join("tests/py/lora_adapters.py")).expect("lora_adapters.py"));
    key_part(&mut h, format.as_bytes());
    key_part(&mut h, flaw.unwrap_or("").as_bytes());
    key_part(&mut h, python.as_os_str().as_encoded_bytes());
    key_files(&mut h, &folder_files(base));
    h.update(installed_packages(&python).as_bytes());
    let name = format!("{format}-{}-{}", flaw.unwrap_or("ok"), key_name(h));
    let dir = cached_entry(cache_dir().join("lora-adapters").join(name), |made| {
        std::fs::create_dir_all(made).expect("create the staging entry");
        let (a, e) = (made.join("adapter"), made.join("expected.safetensors"));
        let mut args = vec![OsStr::new(format), base.as_os_str(), a.as_os_str(), e.as_os_str()];
        if let Some(f) = flaw {
            args.push(OsStr::new(f));
        }
        run_py_with(&python, "lora_adapters.py", &args);
    });
    copy_tree(&dir.join("adapter"), adapter);
    let cached = dir.join("expected.safetensors");
    if cached.exists() {
        std::fs::copy(&cached, expected)
            .unwrap_or_else(|err| panic!("copy {} to {}: {err}", cached.display(), expected.display()));
    }
}

/// The first `n` prompts of `examples/prompts-20.json`, written as a prompt file into `dir`. Greedy agreement is
/// compared prompt by prompt (the farm's shares against one process, a merge against its adapter at run time), so
/// a test that checks such a comparison needs a few prompts, not the whole set: each one costs a decode per model.
pub fn prompts(n: usize, dir: &Path) -> PathBuf {
    let all: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(repo_root().join("examples/prompts-20.json")).expect("prompts-20.json"))
            .expect("prompts-20.json is a JSON array");
    assert!(n <= all.len(), "prompts-20.json has {} prompts, not {n}", all.len());
    let path = dir.join(format!("prompts-{n}.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(&all[..n]).expect("JSON")).expect("write the prompt file");
    path
}

/// `quantfarm run RELEASE --workers N --json` (the binary `bin`) with its store and signing key in `dir` and the
/// peer tools in reach: the process's output, whose last stdout line is the release's summary.
pub fn farm_run_output(bin: &Path, release: &Path, workers: u32, dir: &Path) -> std::process::Output {
    farm_run_output_env(bin, release, workers, dir, &[])
}

/// [`farm_run_output`] with more environment variables (`QUANTFARM_PYTHON`, so the workers run mlx-lm).
pub fn farm_run_output_env(
    bin: &Path,
    release: &Path,
    workers: u32,
    dir: &Path,
    env: &[(&str, &std::ffi::OsStr)],
) -> std::process::Output {
    Command::new(bin)
        .envs(env.iter().copied())
        .arg("run")
        .arg(release)
        .args(["--workers", &workers.to_string(), "--json", "--store"])
        .arg(dir.join("data"))
        .env("QUANTFARM_KEY_FILE", dir.join("k"))
        .env("QUANTFARM_LLAMA_BIN", llama_bin())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()))
}

pub mod s3;

/// Name → stored bytes of every tensor of a model (a GGUF file or split, a safetensors file or folder, an MLX
/// folder), read through quantfarm's own reader.
pub fn tensor_bytes(p: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    use quantfarm_store::Location;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    rt.block_on(async {
        let src = quantfarm_tensors::TensorSource::open(&Location::local(p))
            .await
            .unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
        let mut out = std::collections::BTreeMap::new();
        for e in src.tensors() {
            let mut b = vec![0u8; e.bytes as usize];
            src.read_range(&e.name, 0, &mut b).await.unwrap_or_else(|err| panic!("{}: {}: {err}", p.display(), e.name));
            out.insert(e.name.clone(), b);
        }
        out
    })
}

/// Asserts that GGUF file `ours` has `theirs`' metadata (keys in order, values) and tensor infos, naming the first
/// difference, and returns each tensor's bytes: (name, ours, theirs), in file order. The callers compare those as
/// their format demands.
pub fn assert_same_gguf_layout(ours: &Path, theirs: &Path) -> Vec<(String, Vec<u8>, Vec<u8>)> {
    use quantfarm_store::Location;
    use quantfarm_tensors::gguf::GgufHeader;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    rt.block_on(async {
        let open = |p: &Path| {
            let p = p.to_path_buf();
            async move {
                let src = quantfarm_tensors::TensorSource::open(&Location::local(&p))
                    .await
                    .unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
                let header = src.gguf().expect("a GGUF").shards[0].1.clone();
                (header, src)
            }
        };
        let ((ha, sa), (hb, sb)) = (open(ours).await, open(theirs).await);
        let keys = |h: &GgufHeader| h.metadata.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&ha), keys(&hb), "metadata keys (ours, convert_hf_to_gguf.py's)");
        for ((k, va), (_, vb)) in ha.metadata.iter().zip(&hb.metadata) {
            assert!(va == vb, "{k}: ours {:.300} vs {:.300}", format!("{va:?}"), format!("{vb:?}"));
        }
        let infos =
            |h: &GgufHeader| h.tensors.iter().map(|t| (t.name.clone(), t.ty, t.dims.clone())).collect::<Vec<_>>();
        assert_eq!(infos(&ha), infos(&hb), "tensor infos");
        let mut out = Vec::with_capacity(ha.tensors.len());
        for t in &ha.tensors {
            let mut x = vec![0u8; t.nbytes() as usize];
            let mut y = x.clone();
            sa.read_range(&t.name, 0, &mut x).await.unwrap_or_else(|e| panic!("{}: {e}", t.name));
            sb.read_range(&t.name, 0, &mut y).await.unwrap_or_else(|e| panic!("{}: {e}", t.name));
            out.push((t.name.clone(), x, y));
        }
        out
    })
}

/// `quantfarm verify SRC OUT [--adapter A --base-name NAME]` through the library: every tensor recomputed and
/// compared.
pub fn verify(src: &Path, out: &Path, adapter: Option<(&Path, &str)>) -> quantfarm_tensors::verify::Verification {
    use quantfarm_quant::verify::{verify, VerifyOptions};
    use quantfarm_store::Location;
    let opts = VerifyOptions {
        budget: 8 << 20,
        adapter: adapter.map(|(a, _)| Location::local(a)),
        base_name: adapter.map(|(_, n)| n.to_string()),
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    rt.block_on(verify(&Location::local(src), &Location::local(out), &opts))
        .unwrap_or_else(|e| panic!("verify {} against {}: {e}", out.display(), src.display()))
}

/// Asserts that a verification passed with every tensor identical to its recomputation.
pub fn assert_verified_identical(v: &quantfarm_tensors::verify::Verification) {
    let (identical, within, differing) = v.counts();
    let bad: Vec<String> = v
        .tensors
        .iter()
        .filter(|t| t.verdict != quantfarm_tensors::verify::Verdict::Identical)
        .map(|t| format!("{}: {}", t.name, t.verdict))
        .take(5)
        .collect();
    assert!(
        v.passed() && within == 0 && differing == 0 && identical > 0,
        "{}: {identical} identical, {within} within a step, {differing} differ; problems {:?}; {bad:?}",
        v.direction,
        v.problems
    );
    eprintln!("verify {}: {identical} tensors identical; checked {:?}", v.direction, v.checked);
}

/// `llama-perplexity ARGS`' output (stdout, then stderr), run until it holds what `complete` looks for, at most five
/// times: it prints through an asynchronous log thread, and on a loaded machine a successful run often ends before
/// its last lines are out (2026-12-07: three runs in a row without their last task line and final figures). A failed
/// run panics with its output; after five incomplete ones the last is returned, for the caller to check what it
/// holds.
pub fn llama_perplexity_output(args: &[&std::ffi::OsStr], complete: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    for _ in 0..5 {
        let out = std::process::Command::new(llama_bin().join("llama-perplexity")).args(args).output().unwrap();
        last = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "llama-perplexity failed ({}):\n{last}", out.status);
        if complete(&last) {
            return last;
        }
    }
    eprintln!("llama-perplexity's output stayed incomplete in five runs: the caller checks what it printed");
    last
}
