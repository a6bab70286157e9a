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
