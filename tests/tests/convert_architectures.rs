//! HF → GGUF for every mapped architecture against llama.cpp's own `convert_hf_to_gguf.py`, run here on the same
//! input: tiny random checkpoints of qwen2, qwen3, mistral and gemma3 with real vocabularies and chat templates
//! (`tests/py/make_synthetic_hf.py`: Qwen2's byte-level BPE, LLaMA's SentencePiece model) must convert to the very
//! same file, byte for byte, for each out-type. The converter runs in `venv-convert`
//! (`scripts/install-convert-oracle`: torch, transformers, sentencepiece and the source tree's gguf-py).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use quantfarm_e2e::{convert_python, llama_src, run_py_with};
use quantfarm_store::Location;
use quantfarm_tensors::convert::{convert_hf_to_gguf, OutType};
use quantfarm_tensors::gguf::GgufHeader;
use quantfarm_tensors::TensorSource;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A synthetic checkpoint of `arch` in `dir/arch`.
fn checkpoint(arch: &str, dir: &Path) -> PathBuf {
    let out = dir.join(arch);
    let src = llama_src();
    run_py_with(&convert_python(), "make_synthetic_hf.py", &[OsStr::new(arch), out.as_os_str(), src.as_os_str()]);
    out
}

fn oracle(hf: &Path, outtype: &str, out: &Path) {
    let script = llama_src().join("convert_hf_to_gguf.py");
    let o = Command::new(convert_python())
        .arg(&script)
        .arg(hf)
        .args(["--outtype", outtype, "--outfile"])
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(o.status.success(), "convert_hf_to_gguf.py failed:\n{}", String::from_utf8_lossy(&o.stderr));
}

fn ours(hf: &Path, out: OutType, dir: &Path) -> PathBuf {
    rt().block_on(async {
        let done =
            convert_hf_to_gguf(&Location::local(hf), &Location::local(dir), "ours", out, None, 1 << 20, false).await;
        PathBuf::from(&done.unwrap_or_else(|e| panic!("{}: {e}", hf.display()))[0].location)
    })
}

fn header(p: &Path) -> (GgufHeader, TensorSource) {
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(p)).await.unwrap();
        (src.gguf().unwrap().shards[0].1.clone(), src)
    })
}

/// Panics naming the first key or tensor that differs, or the first differing byte.
fn assert_same_file(ours: &Path, theirs: &Path) {
    let (a, b) = (std::fs::read(ours).unwrap(), std::fs::read(theirs).unwrap());
    if a == b {
        return;
    }
    let ((ha, sa), (hb, sb)) = (header(ours), header(theirs));
    let keys = |h: &GgufHeader| h.metadata.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(keys(&ha), keys(&hb), "metadata keys (ours, convert_hf_to_gguf.py's)");
    for ((k, va), (_, vb)) in ha.metadata.iter().zip(&hb.metadata) {
        assert!(va == vb, "{k}: ours {:.300} vs {:.300}", format!("{va:?}"), format!("{vb:?}"));
    }
    let infos = |h: &GgufHeader| h.tensors.iter().map(|t| (t.name.clone(), t.ty, t.dims.clone())).collect::<Vec<_>>();
    assert_eq!(infos(&ha), infos(&hb), "tensor infos");
    rt().block_on(async {
        for t in &ha.tensors {
            let mut x = vec![0u8; t.nbytes() as usize];
            let mut y = x.clone();
            sa.read_range(&t.name, 0, &mut x).await.unwrap();
            sb.read_range(&t.name, 0, &mut y).await.unwrap();
            let at = x.iter().zip(&y).position(|(p, q)| p != q);
            assert!(at.is_none(), "{}: first differing byte at {at:?}", t.name);
        }
    });
    let at = a.iter().zip(&b).position(|(p, q)| p != q).unwrap_or(a.len().min(b.len()));
    panic!("files differ at byte {at} (lengths {} and {})", a.len(), b.len());
}

fn check(arch: &str, outtypes: &[(&str, OutType)]) {
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint(arch, dir.path());
    for (name, out) in outtypes {
        let theirs = dir.path().join(format!("{arch}-{name}.oracle.gguf"));
        oracle(&hf, name, &theirs);
        let mine = ours(&hf, *out, &dir.path().join(format!("ours-{name}")));
        assert_same_file(&mine, &theirs);
        // `verify` recomputes the real script's output from the checkpoint.
        quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(&hf, &theirs, None));
        eprintln!(
            "{arch} {name}: identical to convert_hf_to_gguf.py ({} bytes)",
            std::fs::metadata(&mine).unwrap().len()
        );
    }
}

/// Qwen2: byte-level BPE (pre-tokenizer "qwen2"), q/k/v biases, no permutation; all four out-types.
#[test]
fn qwen2_equals_convert_hf_to_gguf() {
    check("qwen2", &[("bf16", OutType::Bf16), ("f16", OutType::F16), ("f32", OutType::F32), ("q8_0", OutType::Q8_0)]);
}

/// Qwen3: per-head q/k norms, head_dim, tied embeddings.
#[test]
fn qwen3_equals_convert_hf_to_gguf() {
    check("qwen3", &[("bf16", OutType::Bf16)]);
}

/// Mistral: LLaMA's tensors with the q/k permutation and a SentencePiece vocabulary (scores, byte tokens, the
/// pair template's add_sep).
#[test]
fn mistral_equals_convert_hf_to_gguf() {
    check("mistral", &[("bf16", OutType::Bf16)]);
}

/// Gemma 3: norms stored as 1 + weight, sliding-window and local rope keys, Gemma3Model's repeated keys, and
/// SentencePiece with add_space_prefix false; all four out-types.
#[test]
fn gemma3_equals_convert_hf_to_gguf() {
    check("gemma3", &[("bf16", OutType::Bf16), ("f16", OutType::F16), ("f32", OutType::F32), ("q8_0", OutType::Q8_0)]);
}
