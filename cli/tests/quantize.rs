//! `quantfarm quantize --dry-run` against `llama-quantize --dry-run` on SmolLM2 (576 wide: most rules end in a
//! fallback): the same type for every tensor in the same order, the same totals, the same warning for a file type
//! that needs an importance matrix, and no output file from either.

use std::path::Path;
use std::process::Command;

use quantfarm_e2e::{llama_bin, smollm2_derived};

/// Each listed tensor as (name, final type, lower-case), from the `[ i/ n] NAME - [shape], type = T, size = …`
/// lines both tools print (the final type is in parentheses when it changes), and the two total lines' figures.
fn listing(out: &str) -> (Vec<(String, String)>, Vec<String>) {
    let line =
        regex::Regex::new(r"\[\s*\d+/\s*\d+\] (\S+)\s+- \[[^\]]*\], type =\s*(\S+), size =[^(\n]*(?:\((\S+)\))?")
            .unwrap();
    let tensors = line
        .captures_iter(out)
        .map(|c| {
            let ty = c.get(3).or(c.get(2)).unwrap().as_str().to_ascii_lowercase();
            (c[1].to_string(), ty)
        })
        .collect();
    let totals = regex::Regex::new(r"(model|quant) size\s+=\s+([\d.]+) MiB \(([\d.]+) BPW\)").unwrap();
    let totals = totals.captures_iter(out).map(|c| format!("{} {} {}", &c[1], &c[2], &c[3])).collect();
    (tensors, totals)
}

fn both(dir: &Path, args: &[&str], ftype: &str) -> (String, String) {
    let src = smollm2_derived().join("smollm2-bf16.gguf");
    let bin = llama_bin();
    let theirs_out = dir.join("theirs.gguf");
    let r = Command::new(bin.join("llama-quantize"))
        .env("LD_LIBRARY_PATH", &bin)
        .arg("--dry-run")
        .args(args)
        .arg(&src)
        .arg(&theirs_out)
        .args([ftype, "2"])
        .output()
        .unwrap();
    let theirs = String::from_utf8_lossy(&r.stderr).into_owned() + &String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "llama-quantize --dry-run {ftype}:\n{theirs}");
    let ours_out = dir.join("ours.gguf");
    let r = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
        .args(["quantize", "--dry-run"])
        .args(args)
        .arg(&src)
        .arg(&ours_out)
        .arg(ftype)
        .output()
        .unwrap();
    let ours = String::from_utf8_lossy(&r.stdout).into_owned() + &String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "quantfarm quantize --dry-run {ftype}:\n{ours}");
    assert!(!theirs_out.exists() && !ours_out.exists(), "a dry run wrote a file");
    (ours, theirs)
}

#[test]
fn dry_run_lists_llama_quantizes_types_and_totals() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("recipe.txt");
    std::fs::write(&recipe, "blk\\.1[0-9]\\.ffn_up=q8_0 attn_v=Q5_K\n").unwrap();
    let recipe = recipe.to_string_lossy().into_owned();
    let cases: [(&[&str], &str); 3] = [
        (&["--tensor-type", "blk\\.[0-3]\\.ffn_down=q8_0", "--tensor-type", "output=q8_0"], "Q4_K_M"),
        (&["--tensor-type-file", &recipe, "--tensor-type", "ffn_up=iq4_xs"], "IQ3_S"),
        (&[], "Q2_K_S"),
    ];
    for (args, ftype) in cases {
        let (ours, theirs) = both(dir.path(), args, ftype);
        let (ours_t, ours_tot) = listing(&ours);
        let (theirs_t, theirs_tot) = listing(&theirs);
        assert_eq!(ours_t.len(), 272, "{ftype} {args:?}: ours lists\n{ours}");
        assert_eq!(ours_t, theirs_t, "{ftype} {args:?}: tensors and types");
        assert_eq!(ours_tot.len(), 2, "{ftype}: totals in\n{ours}");
        assert_eq!(ours_tot, theirs_tot, "{ftype} {args:?}: totals");
        let warns = |s: &str| s.contains("importance matrix") || s.contains("require an imatrix");
        assert_eq!(warns(&ours), warns(&theirs), "{ftype}: the imatrix warning\nours:\n{ours}");
        assert_eq!(warns(&ours), ftype == "Q2_K_S", "{ftype}");
    }
}

#[test]
fn bad_tensor_type_entries_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let src = smollm2_derived().join("smollm2-bf16.gguf");
    for (arg, says) in [
        ("attn_v", "expected PATTERN=TYPE"),
        ("attn_v=q9_K", "unknown ggml type \"q9_K\""),
        ("attn_v=q8_1", "not a type llama-quantize can write"),
        ("blk\\.(0=q8_0", "not a valid regex"),
    ] {
        let r = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
            .args(["quantize", "--dry-run", "--tensor-type", arg])
            .arg(&src)
            .arg(dir.path().join("x.gguf"))
            .arg("Q4_K_M")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(!r.status.success() && err.contains(says) && err.contains(arg), "{arg}: {err}");
    }
}
