//! `quantfarm convert` and `quantfarm verify` as users run them: the dry-run plan, out-types, GGUF → MLX, and
//! verify's verdicts on good and damaged outputs.

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

    // `verify`: every tensor recomputed from the Q4_K_M source is identical, config and tokenizer files too.
    let verify = || {
        let out = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
            .args([OsStr::new("verify"), q4.as_os_str(), mlx.as_os_str()])
            .output()
            .expect("run quantfarm verify");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
        (out.status.code(), text)
    };
    let (code, text) = verify();
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("PASSED: 272 tensors identical, 0 within one quantization step, 0 differ; 0 problems"));
    assert!(text.contains("ok: tokenizer.json") && text.contains("ok: config.json"), "{text}");
    // One scale one bf16 ulp off: not the recomputed bytes, but every value still within one step.
    let file = mlx.join("model.safetensors");
    let at = |name: &str| stored_at(&file, name);
    let mut bytes = std::fs::read(&file).unwrap();
    let s = at("model.layers.0.mlp.down_proj.scales");
    let ulp = u16::from_le_bytes([bytes[s], bytes[s + 1]]) + 1;
    bytes[s..s + 2].copy_from_slice(&ulp.to_le_bytes());
    std::fs::write(&file, &bytes).unwrap();
    let (code, text) = verify();
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("model.layers.0.mlp.down_proj.weight  <-  blk.0.ffn_down.weight  within one quantization step")
    );
    // A group of codes zeroed: its values collapse to the group's bias, many steps from the source.
    let w = at("model.layers.0.mlp.down_proj.weight");
    bytes[w..w + 32].fill(0);
    std::fs::write(&file, &bytes).unwrap();
    let (code, text) = verify();
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("model.layers.0.mlp.down_proj.weight  <-  blk.0.ffn_down.weight  DIFFERS: "), "{text}");
    assert!(text.contains("quantization steps off at row 0, column "), "{text}");
}

/// The absolute offset of tensor `name`'s bytes in a safetensors file.
fn stored_at(file: &std::path::Path, name: &str) -> usize {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    8 + n + header[name]["data_offsets"][0].as_u64().unwrap() as usize
}

/// `verify HF OUT.gguf`: a conversion passes; one changed byte of one tensor fails naming that tensor, and a
/// changed metadata value fails naming the key; the exit status says which.
#[test]
fn verify_names_a_changed_tensor_byte_and_metadata_value() {
    let hf = smollm2_derived().join("smollm2-hf");
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("s.gguf");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_quantfarm")).args(args).output().expect("run quantfarm");
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
    };
    let (code, text) = run(&["convert", hf.to_str().unwrap(), gguf.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{text}");
    let verify = || run(&["verify", hf.to_str().unwrap(), gguf.to_str().unwrap()]);
    let (code, text) = verify();
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("PASSED: 272 tensors identical"), "{text}");

    let original = std::fs::read(&gguf).unwrap();
    let header = quantfarm_tensors::gguf::GgufHeader::parse(&original, original.len() as u64, "s.gguf").unwrap();
    let t = header.tensors.iter().find(|t| t.name == "blk.3.ffn_up.weight").unwrap();
    let at = (header.data_offset + t.offset) as usize + 1000;
    let mut bytes = original.clone();
    bytes[at] ^= 0x40;
    std::fs::write(&gguf, &bytes).unwrap();
    let (code, text) = verify();
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("blk.3.ffn_up.weight  <-  model.layers.3.mlp.up_proj.weight  DIFFERS: 1 of 1769472 bytes differ from the recomputed ones, the first at byte 1000"),
        "{text}"
    );
    assert!(text.contains("FAILED: 271 tensors identical"), "{text}");

    // llama.rope.freq_base: the f32 after its key and type.
    let key = b"llama.rope.freq_base";
    let k = original.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4;
    let mut bytes = original.clone();
    bytes[k..k + 4].copy_from_slice(&2.0f32.to_le_bytes());
    std::fs::write(&gguf, &bytes).unwrap();
    let (code, text) = verify();
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("PROBLEM: metadata key llama.rope.freq_base is 2.0; 100000.0 expected"), "{text}");
}
