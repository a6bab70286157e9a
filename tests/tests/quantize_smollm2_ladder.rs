//! The rest of llama-quantize's ladder on a real model: SmolLM2-135M (576 wide, so most i-quant choices end in the
//! IQ4_NL or Q4_0 fallback and only ffn_down, 1536 wide, keeps the rule's type), with and without the real
//! `llama-imatrix` file of the fixtures, against the real `llama-quantize`: the same file, byte for byte, for every
//! level that llama-quantize makes; Q1_0 refused by both (576 is not a multiple of its 128-element blocks).
//!
//! The whole ladder takes minutes (`scripts/test --long`); the default run checks a few rungs that cover every new
//! block type that SmolLM2 keeps.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use quantfarm_e2e::{fixtures_dir, llama_bin, smollm2_derived};
use quantfarm_quant::file::{quantize_gguf, Options};
use quantfarm_quant::imatrix::Imatrix;
use quantfarm_quant::FileType;
use quantfarm_store::Location;
use quantfarm_tensors::TensorSource;

/// Every file type added with the rest of the ladder, and whether llama-quantize needs an imatrix for it here.
const LADDER: &[FileType] = &[
    FileType::IQ4_NL,
    FileType::IQ4_XS,
    FileType::IQ3_M,
    FileType::IQ3_S,
    FileType::IQ3_XS,
    FileType::IQ3_XXS,
    FileType::IQ2_M,
    FileType::IQ2_S,
    FileType::IQ2_XS,
    FileType::IQ2_XXS,
    FileType::IQ1_M,
    FileType::IQ1_S,
    FileType::Q2_K_S,
    FileType::TQ1_0,
    FileType::TQ2_0,
    FileType::Q2_0,
    FileType::MXFP4_MOE,
];

/// The rungs of the default run (each takes about 25 s on 2 cores): IQ2_M with the imatrix keeps IQ2_S on ffn_down,
/// IQ3_S on the token embeddings and attn_v, and falls back to IQ4_NL everywhere else; IQ1_M without one is refused
/// by both at the first ffn_down that keeps IQ1_M. The wide and MoE models (`quantize_wide_model.rs`,
/// `cli/tests/quantize_moe.rs`) check every block type where it is kept.
const DEFAULT_RUNGS: &[(FileType, bool)] = &[(FileType::IQ2_M, true), (FileType::IQ1_M, false)];

fn imatrix_file() -> PathBuf {
    fixtures_dir().join("smollm2/imatrix-gpl3.gguf")
}

fn sha256_file(p: &Path) -> String {
    quantfarm_store::hex(&<sha2::Sha256 as sha2::Digest>::digest(std::fs::read(p).unwrap()))
}

/// llama-quantize and quantfarm on one rung: `Ok(sha256)` when both made the same file, `Err(what)` otherwise
/// (both refusing counts as agreement only for the caller that expects it).
fn rung(dir: &Path, ftype: FileType, with_imatrix: bool) -> Result<Option<String>, String> {
    let src = smollm2_derived().join("smollm2-bf16.gguf");
    let label = format!("{ftype}{}", if with_imatrix { " +imatrix" } else { "" });
    let theirs = dir.join(format!("theirs-{ftype}-{with_imatrix}.gguf"));
    let ours = dir.join(format!("ours-{ftype}-{with_imatrix}.gguf"));
    let bin = llama_bin();
    let mut cmd = Command::new(bin.join("llama-quantize"));
    cmd.env("LD_LIBRARY_PATH", &bin);
    if with_imatrix {
        cmd.arg("--imatrix").arg(imatrix_file());
    }
    let r = cmd.arg(&src).arg(&theirs).args([ftype.name(), "2"]).output().unwrap();
    let their_ok = r.status.success() && theirs.exists();
    let said = String::from_utf8_lossy(&r.stderr).into_owned();
    let result = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
        let source = TensorSource::open(&Location::local(&src)).await.unwrap();
        let imatrix = if with_imatrix {
            let mut im = Imatrix::load(&Location::local(imatrix_file())).await.unwrap();
            im.file = imatrix_file().to_string_lossy().into_owned();
            Some(Arc::new(im))
        } else {
            None
        };
        let opts = Options { imatrix, threads: Some(2), ..Options::new(ftype) };
        quantize_gguf(&source, &Location::local(&ours), &opts).await
    });
    match (their_ok, result) {
        (true, Ok(q)) if q.committed.sha256 == sha256_file(&theirs) => {
            let _ = std::fs::remove_file(&theirs);
            let _ = std::fs::remove_file(&ours);
            Ok(Some(q.committed.sha256))
        }
        (true, Ok(q)) => {
            Err(format!("{label}: ours {} differs from llama-quantize's {}", q.committed.sha256, sha256_file(&theirs)))
        }
        (false, Err(e)) => {
            assert!(!ours.exists(), "{label}: quantfarm refused but left {}", ours.display());
            eprintln!("{label}: both refuse — llama-quantize: {} — quantfarm: {e}", said.lines().last().unwrap_or(""));
            Ok(None)
        }
        (true, Err(e)) => Err(format!("{label}: llama-quantize made it, quantfarm refused: {e}")),
        (false, Ok(_)) => Err(format!("{label}: quantfarm made it, llama-quantize refused:\n{said}")),
    }
}

fn check(cases: &[(FileType, bool)]) {
    let dir = tempfile::tempdir().unwrap();
    let mut bad = Vec::new();
    for &(ftype, with) in cases {
        match rung(dir.path(), ftype, with) {
            Ok(Some(sha)) => eprintln!("{ftype}{}: identical, sha256 {sha}", if with { " +imatrix" } else { "" }),
            Ok(None) => {
                // Only the levels that need an imatrix may be refused, and only without one.
                assert!(!with && ftype.needs_imatrix(), "{ftype}: refused by both");
            }
            Err(e) => {
                eprintln!("MISMATCH {e}");
                bad.push(e);
            }
        }
    }
    assert!(bad.is_empty(), "{} rungs differ from llama-quantize:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn new_rungs_equal_llama_quantize_on_smollm2() {
    check(DEFAULT_RUNGS);
}

#[test]
fn q1_0_is_refused_by_both_naming_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let r = rung(dir.path(), FileType::Q1_0, false);
    assert!(matches!(r, Ok(None)), "{r:?}");
}

/// Every rung ± the imatrix (`scripts/test --long`, QUANTFARM_LONG).
#[test]
fn the_whole_ladder_equals_llama_quantize_on_smollm2() {
    if quantfarm_e2e::skip_unless_long(
        "the_whole_ladder_equals_llama_quantize_on_smollm2",
        "the whole ladder takes minutes",
    ) {
        return;
    }
    let cases: Vec<(FileType, bool)> = LADDER.iter().flat_map(|&f| [(f, false), (f, true)]).collect();
    check(&cases);
}
