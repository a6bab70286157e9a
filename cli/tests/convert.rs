//! `quantfarm convert --dry-run`: the whole plan is printed (metadata, and per tensor its source, operations,
//! destination, type, shape and bytes, file by file) and nothing is written.

use std::process::Command;

use quantfarm_e2e::smollm2_derived;

#[test]
fn dry_run_prints_the_plan_and_writes_nothing() {
    let hf = smollm2_derived().join("smollm2-hf");
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("out");
    let out = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
        .args(["convert", hf.to_str().unwrap(), dst.to_str().unwrap(), "--dry-run", "--split-max-tensors", "100"])
        .output()
        .expect("run quantfarm");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!dst.exists(), "a dry run writes nothing");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].contains(": 272 tensors, ") && lines[0].contains(" in 3 file(s); digest "), "{}", lines[0]);
    assert!(text.contains("\n  llama.attention.head_count = 9\n"), "{text}");
    assert!(text.contains(
        "\n  tokenizer.ggml.tokens = [\"<|endoftext|>\", \"<|im_start|>\", \"<|im_end|>\", ... (49152 items)]\n"
    ));
    for (n, count) in [(1, 100), (2, 100), (3, 72)] {
        let head = format!("file {n}: smollm2-hf-0000{n}-of-00003.gguf ({count} tensors, ");
        assert!(lines.iter().any(|l| l.starts_with(&head)), "no line {head:?}");
    }
    let tensors: Vec<&&str> = lines.iter().filter(|l| l.contains("  <-  ")).collect();
    assert_eq!(tensors.len(), 272);
    assert!(
        lines.contains(
            &"  blk.0.attn_k.weight  BF16  [576, 192]  221184 bytes  <-  model.layers.0.self_attn.k_proj.weight (BF16)  permute rows in 3 heads, copy"
        ),
        "{text}"
    );
    assert!(lines
        .iter()
        .any(|l| l.starts_with("  output_norm.weight  F32  [576]  2304 bytes  <-  model.norm.weight (")));
}

/// `convert SRC NAME.gguf --outtype f32`: the file is named by DST, every tensor is F32 and
/// `general.file_type` is 0 (ALL_F32); `--prefix` beside a file name is refused before anything is read.
#[test]
fn a_gguf_destination_names_the_file_and_outtype_sets_the_types() {
    let hf = smollm2_derived().join("smollm2-hf");
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("small-f32.gguf");
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_quantfarm"))
            .args(["convert", hf.to_str().unwrap(), dst.to_str().unwrap()])
            .args(extra)
            .output()
            .expect("run quantfarm")
    };
    let out = run(&["--outtype", "f32", "--dry-run"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("\n  general.file_type = 0\n"), "{text}");
    assert!(text.contains("file 1: small-f32.gguf (272 tensors, "), "{text}");
    assert!(!text.contains("  BF16  ["), "no BF16 tensor at --outtype f32:\n{text}");
    let bad = run(&["--outtype", "q4_k"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expected bf16, f16 or f32"));
    let bad = run(&["--prefix", "x"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("already names the file"));
    assert!(!dst.exists());
}
