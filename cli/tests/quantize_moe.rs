//! The rest of llama-quantize's ladder on a model with experts whose rows are whole 256-element super-blocks: a
//! Qwen3.5-MoE made by transformers (8 experts, a shared expert, gated-delta layers; `tests/py/qwen35.py make moe8`, without its MTP block),
//! converted by llama.cpp's own `convert_hf_to_gguf.py`, with an importance matrix made by the real `llama-imatrix`.
//! Every new file type, with and without the imatrix, made by `quantfarm quantize` and by `llama-quantize`: the same
//! file byte for byte, or refused by both (a level that needs an imatrix, without one). With 8 experts the
//! `n_expert == 8` rules and the per-layer parsing of expert tensor names decide many tensors.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use quantfarm_e2e::{convert_python, fixtures_dir, llama_bin, llama_src, run_py_with, smollm2_derived};
use quantfarm_quant::FileType;

/// Every new level (`scripts/test --long`, QUANTFARM_LONG); the default run takes the first five, which keep every
/// i-quant block type somewhere on this model (IQ2_XXS's attention output is IQ2_XXS only under IQ1_*; IQ2_S is
/// IQ3_XXS's attn_q/attn_k) and the MXFP4 experts.
const LADDER: &[FileType] = &[
    FileType::IQ3_XXS,
    FileType::IQ2_M,
    FileType::IQ2_XS,
    FileType::IQ1_S,
    FileType::MXFP4_MOE,
    FileType::IQ1_M,
    FileType::IQ2_XXS,
    FileType::IQ2_S,
    FileType::IQ3_M,
    FileType::IQ3_S,
    FileType::IQ3_XS,
    FileType::IQ4_XS,
    FileType::Q2_K_S,
    FileType::Q4_K_M,
];

fn moe8(dir: &Path) -> std::path::PathBuf {
    let hf = dir.join("hf-moe8");
    let tok = smollm2_derived().join("smollm2-hf");
    run_py_with(
        &convert_python(),
        "qwen35.py",
        &[OsStr::new("make"), OsStr::new("moe8"), hf.as_os_str(), tok.as_os_str()],
    );
    let gguf = dir.join("moe8.gguf");
    let src = llama_src();
    // Without the multi-token-prediction block, which llama-imatrix never runs (so it has no imatrix entries, and the
    // i-quants that need one would be refused by both tools).
    let args = [
        OsStr::new("gguf"),
        hf.as_os_str(),
        gguf.as_os_str(),
        OsStr::new("bf16"),
        src.as_os_str(),
        OsStr::new("smollm"),
        OsStr::new("--no-mtp"),
    ];
    run_py_with(&convert_python(), "qwen35.py", &args);
    gguf
}

#[test]
fn every_new_level_on_an_eight_expert_model_equals_llama_quantize() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().expect("tempdir");
    let gguf = moe8(dir.path());
    std::fs::copy(fixtures_dir().join("texts/gpl3.txt"), dir.path().join("gpl3.txt")).expect("copy text");
    let bin = llama_bin();
    let im = Command::new(bin.join("llama-imatrix"))
        .env("LD_LIBRARY_PATH", &bin)
        .arg("-m")
        .arg(&gguf)
        .args(["-f", "gpl3.txt", "-c", "128", "--chunks", "4", "-t", "2", "-o", "imatrix.gguf"])
        .current_dir(dir.path())
        .output()
        .expect("run llama-imatrix");
    assert!(im.status.success(), "llama-imatrix:\n{}", String::from_utf8_lossy(&im.stderr));
    let mut bad = Vec::new();
    let mut same = Vec::new();
    let long = std::env::var_os("QUANTFARM_LONG").is_some();
    let ladder = if long { LADDER } else { &LADDER[..5] };
    eprintln!("levels: {ladder:?}{}", if long { "" } else { " (the first five; QUANTFARM_LONG=1 runs all)" });
    for &ftype in ladder {
        for imatrix in [false, true] {
            let tag = format!("{ftype}{}", if imatrix { "+imatrix" } else { "" });
            let (theirs, ours) =
                (dir.path().join(format!("theirs-{tag}.gguf")), dir.path().join(format!("ours-{tag}.gguf")));
            let mut q = Command::new(bin.join("llama-quantize"));
            q.env("LD_LIBRARY_PATH", &bin).current_dir(dir.path());
            if imatrix {
                q.args(["--imatrix", "imatrix.gguf"]);
            }
            let t = q.arg(&gguf).arg(&theirs).args([ftype.name(), "2"]).output().expect("run llama-quantize");
            let mut o = Command::new(env!("CARGO_BIN_EXE_quantfarm"));
            o.current_dir(dir.path()).arg("quantize").arg(&gguf).arg(&ours).args([ftype.name(), "--threads", "2"]);
            if imatrix {
                o.args(["--imatrix", "imatrix.gguf"]);
            }
            let u = o.output().expect("run quantfarm");
            match (t.status.success(), u.status.success()) {
                (true, true) => {
                    if std::fs::read(&theirs).expect("theirs") == std::fs::read(&ours).expect("ours") {
                        same.push(tag);
                    } else {
                        bad.push(format!("{tag}: the files differ"));
                    }
                }
                (false, false) => {
                    let said = String::from_utf8_lossy(&u.stderr);
                    // IQ3_XS needs one where a tensor keeps IQ3_XXS, which this model's widths allow.
                    let needs = ftype.needs_imatrix() || ftype == FileType::IQ3_XS;
                    assert!(!imatrix && needs, "{tag}: both refused:\n{said}");
                    assert!(said.contains("importance matrix") && !ours.exists(), "{tag}: {said}");
                }
                (a, b) => bad.push(format!(
                    "{tag}: llama-quantize {} and quantfarm {}:\n{}\n{}",
                    if a { "made it" } else { "refused" },
                    if b { "made it" } else { "refused" },
                    String::from_utf8_lossy(&t.stderr).lines().last().unwrap_or(""),
                    String::from_utf8_lossy(&u.stderr)
                )),
            }
        }
    }
    eprintln!("byte-identical to llama-quantize: {}", same.join(", "));
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(same.len() >= ladder.len(), "{same:?}");
}
