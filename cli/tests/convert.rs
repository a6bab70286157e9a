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
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expected bf16, f16, f32 or q8_0"));
    let bad = run(&["--prefix", "x"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("already names the file"));
    assert!(!dst.exists());
}

/// `convert Q4_K_M.gguf DIR --to mlx --bits 4`: an MLX 4-bit checkpoint that mlx_lm loads and greedy-generates
/// from; `--bits auto` picks the family of the dominant weight type (Q5_0 here: SmolLM2's 576-wide rows are not
/// whole 256-blocks, so llama-quantize's Q4_K_M falls back to Q5_0 for most tensors).
#[test]
fn a_q4_k_m_gguf_becomes_an_mlx_checkpoint_mlx_lm_runs() {
    use std::ffi::OsStr;
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&OsStr]| {
        let out = Command::new(env!("CARGO_BIN_EXE_quantfarm")).args(args).output().expect("run quantfarm");
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let bf16 = smollm2_derived().join("smollm2-bf16.gguf");
    let q4 = dir.path().join("q4km.gguf");
    run(&[OsStr::new("quantize"), bf16.as_os_str(), q4.as_os_str(), OsStr::new("Q4_K_M")]);
    let mlx = dir.path().join("mlx");
    let args = |bits: &str, out: &std::path::Path| {
        vec![
            OsStr::new("convert").to_owned(),
            q4.as_os_str().to_owned(),
            out.as_os_str().to_owned(),
            "--to".into(),
            "mlx".into(),
            "--bits".into(),
            bits.into(),
            "--budget".into(),
            "16MiB".into(),
        ]
    };
    let a = args("4", &mlx);
    let printed = run(&a.iter().map(|s| s.as_os_str()).collect::<Vec<_>>());
    assert!(printed.contains("quantized to 4 bits (group size 64)"), "{printed}");
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(mlx.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization"]["bits"], 4);
    let mut dry = args("auto", &dir.path().join("auto"));
    dry.push("--dry-run".into());
    let printed = run(&dry.iter().map(|s| s.as_os_str()).collect::<Vec<_>>());
    assert!(printed.contains("(MLX, 5-bit, groups of 64)"), "{printed}");
    let out = Command::new(quantfarm_e2e::peers_python())
        .args([
            "-c",
            "import sys\nfrom mlx_lm import load, generate\nm, t = load(sys.argv[1])\n\
             print(generate(m, t, prompt='The capital of France is', max_tokens=8))",
        ])
        .arg(&mlx)
        .output()
        .expect("run mlx_lm");
    assert!(out.status.success(), "mlx_lm: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("mlx_lm greedy: {text:?}");
    // A 135M model quantized twice (Q4_K_M, then MLX 4-bit) need not still know the capital; it must still speak.
    assert!(text.split_whitespace().filter(|w| w.chars().any(char::is_alphabetic)).count() >= 3, "{text:?}");
}
