//! The two hybrid families as mappings (`mappings/qwen3_5.yaml`, `mappings/qwen3_5_moe.yaml`): Qwen3.5 and
//! Qwen3.5-MoE GGUFs with the real tensor inventory (gated-delta-net and attention layers, a multi-token-prediction
//! block, the MoE experts, router and gated shared expert) become the MLX checkpoints mlx-lm makes itself.
//!
//! Every file is made by the real tool: transformers builds a tiny random HF checkpoint (bf16, A_log f32), llama.cpp's
//! `convert_hf_to_gguf.py` converts it to GGUF (so the v-head reorder, `-exp(A_log)`, the norms' +1, the conv1d
//! squeeze and the expert stacking are llama.cpp's), and `mlx_lm.convert` makes the reference MLX checkpoint from the
//! same HF checkpoint. Ours, made from the GGUF, must hold the same tensors with the same bytes (A_log: within an
//! ulp, it goes through `log(-(-exp(a)))`), the same quantization (MoE: router and shared-expert gate at 8 bits), load
//! in `mlx_lm.load`, give mlx-lm's logits and generate; `verify` passes. GGUF → HF gives both checkpoints back
//! tensor for tensor (the MoE's stacked experts joined again into transformers 5's fused `experts.gate_up_proj`).
//!
//! HF → GGUF: `quantfarm convert` of the same checkpoints equals `convert_hf_to_gguf.py`'s file, with the
//! multi-token-prediction block kept (the converter's default) and left out (`--no-mtp`): every metadata key,
//! tensor info and tensor byte, but for `ssm_a = -exp(A_log)`, whose values may be one ulp apart (torch's f32 exp
//! is not correctly rounded and depends on its build: docs/notes/qwen3_5/README.md §3.5; ours is, so it is the same
//! on every machine).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use quantfarm_e2e::{
    assert_verified_identical, convert_python, fixtures_dir, llama_bin, llama_src, run_py, run_py_with, smollm2_derived,
};
use quantfarm_quant::mlx_file::{gguf_to_mlx, quantize_mlx_checkpoint, MlxOptions};
use quantfarm_store::Location;
use quantfarm_tensors::convert::{
    convert_hf_to_gguf, plan_gguf_to_hf, plan_gguf_to_mlx, write_hf, ConvertOptions, Mtp, OutType,
};
use quantfarm_tensors::gguf::{GgufHeader, Value};
use quantfarm_tensors::verify::Verdict;
use quantfarm_tensors::{Dtype, TensorSource};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// The tiny HF checkpoint of `kind` (`tests/py/qwen35.py make`).
fn checkpoint(kind: &str, dir: &Path) -> PathBuf {
    let hf = dir.join(format!("hf-{kind}"));
    let tok = smollm2_derived().join("smollm2-hf");
    run_py_with(
        &convert_python(),
        "qwen35.py",
        &[OsStr::new("make"), OsStr::new(kind), hf.as_os_str(), tok.as_os_str()],
    );
    hf
}

/// convert_hf_to_gguf.py on `hf`, told the pre-tokenizer is `pre` (the checkpoint carries SmolLM2's tokenizer),
/// with `flags`.
fn converter(hf: &Path, out: &Path, outtype: &str, pre: &str, flags: &[&str]) {
    let src = llama_src();
    let mut args = vec![OsStr::new("gguf"), hf.as_os_str(), out.as_os_str(), OsStr::new(outtype), src.as_os_str()];
    args.push(OsStr::new(pre));
    args.extend(flags.iter().map(OsStr::new));
    run_py_with(&convert_python(), "qwen35.py", &args);
}

/// The HF checkpoint of `kind` and its bf16 GGUF made by convert_hf_to_gguf.py (the dense one says its
/// pre-tokenizer is Qwen3.5's, so its rebuilt tokenizer is checked against llama.cpp's).
fn inputs(kind: &str, dir: &Path) -> (PathBuf, PathBuf) {
    let hf = checkpoint(kind, dir);
    let gguf = dir.join(format!("{kind}.gguf"));
    converter(&hf, &gguf, "bf16", if kind == "dense" { "qwen35" } else { "smollm" }, &[]);
    (hf, gguf)
}

/// GGUF → MLX through the library, as `quantfarm convert --to mlx --bits B` does (0: unquantized bf16), with a small
/// budget so row gathers and expert tensors go in several chunks.
fn ours(gguf: &Path, bits: u32, out: &Path) {
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(gguf)).await.unwrap();
        let plan = plan_gguf_to_mlx(&src, Dtype::BF16).await.unwrap();
        let dst = Location::local(out);
        if bits == 0 {
            write_hf(&src, &plan, &dst, 4096, false).await.unwrap();
        } else {
            let opts = MlxOptions { budget: 4096, ..MlxOptions::new(bits, 64) };
            gguf_to_mlx(&src, &plan, &dst, &opts).await.unwrap();
        }
    });
}

fn check_family(kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (hf, gguf) = inputs(kind, dir.path());
    for bits in [4u32, 0] {
        let mine = dir.path().join(format!("ours-{kind}-{bits}"));
        let gold = dir.path().join(format!("mlx-lm-{kind}-{bits}"));
        ours(&gguf, bits, &mine);
        run_py("qwen35.py", &[OsStr::new("golden"), hf.as_os_str(), gold.as_os_str(), OsStr::new(&bits.to_string())]);
        let report = run_py("qwen35.py", &[OsStr::new("compare"), mine.as_os_str(), gold.as_os_str()]);
        eprintln!("{kind} {bits}-bit: {report}");
        let r: serde_json::Value = serde_json::from_str(report.trim().lines().last().unwrap()).unwrap();
        assert_eq!(r["logit_diff"], 0.0, "{report}");
        assert_verified_identical(&quantfarm_e2e::verify(&gguf, &mine, None));
    }
    // HF → MLX straight from the checkpoint (mlx-lm's sanitize applied: norms + 1 in bf16, conv1d's axes, the MTP
    // head dropped, A_log kept f32; the MoE's fused experts split, gate_up by halves): mlx_lm.convert's own 4-bit
    // checkpoint, tensor for tensor.
    let from_hf = dir.path().join(format!("ours-hf-{kind}-4"));
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(&hf)).await.unwrap();
        // A small budget: the experts' halves are read in several pieces.
        let opts = MlxOptions { budget: 16 << 10, ..MlxOptions::new(4, 64) };
        quantize_mlx_checkpoint(&src, &Location::local(&from_hf), &opts).await.unwrap_or_else(|e| panic!("{kind}: {e}"))
    });
    let gold = dir.path().join(format!("mlx-lm-{kind}-4"));
    let report = run_py("qwen35.py", &[OsStr::new("compare"), from_hf.as_os_str(), gold.as_os_str()]);
    eprintln!("{kind} HF -> MLX 4-bit: {report}");
    let r: serde_json::Value = serde_json::from_str(report.trim().lines().last().unwrap()).unwrap();
    assert_eq!((r["logit_diff"].as_f64(), r["a_log_rel"].as_f64()), (Some(0.0), Some(0.0)), "{report}");
    assert_verified_identical(&quantfarm_e2e::verify(&hf, &from_hf, None));
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(format!("ours-{kind}-4/config.json"))).unwrap()).unwrap();
    let overrides = config["quantization"].as_object().unwrap().keys().filter(|k| k.contains("layers")).count();
    assert_eq!(overrides, if kind == "moe" { 8 } else { 0 }, "{}", config["quantization"]);
    assert_eq!(config["text_config"]["num_hidden_layers"], 4, "the NextN block is not a layer");

    let back = dir.path().join(format!("hf-back-{kind}"));
    let planned = rt().block_on(async {
        let src = TensorSource::open(&Location::local(&gguf)).await.unwrap();
        match plan_gguf_to_hf(&src, Dtype::BF16).await {
            // A small budget: the joined experts are read in several pieces.
            Ok(plan) => write_hf(&src, &plan, &Location::local(&back), 4096, false).await.map(|_| ()),
            Err(e) => Err(e),
        }
    });
    planned.unwrap_or_else(|e| panic!("{kind}: GGUF -> HF: {e}"));
    let report =
        run_py_with(&convert_python(), "qwen35.py", &[OsStr::new("compare_hf"), back.as_os_str(), hf.as_os_str()]);
    eprintln!("{kind} GGUF -> HF: {report}");
    assert_verified_identical(&quantfarm_e2e::verify(&gguf, &back, None));
    if kind == "dense" {
        // The tokenizer.json rebuilt with Qwen3.5's pre-tokenizer encodes like llama.cpp's qwen35 tokenizer.
        let server = llama_bin().join("llama-server");
        let text = fixtures_dir().join("texts/gpl3.txt");
        let tok = back.join("tokenizer.json");
        let summary = run_py(
            "tokenize_compare.py",
            &[server.as_os_str(), gguf.as_os_str(), tok.as_os_str(), text.as_os_str(), OsStr::new("2000")],
        );
        assert!(summary.contains("\"identical\": true"), "{summary}");
        eprintln!("qwen35 tokenizer rebuilt from the GGUF: {summary}");
    }
}

#[test]
fn qwen3_5_dense_gguf_becomes_mlx_lms_own_checkpoint() {
    check_family("dense");
}

#[test]
fn qwen3_5_moe_gguf_becomes_mlx_lms_own_checkpoint() {
    check_family("moe");
}

fn header(p: &Path) -> (GgufHeader, TensorSource) {
    rt().block_on(async {
        let src = TensorSource::open(&Location::local(p)).await.unwrap();
        (src.gguf().unwrap().shards[0].1.clone(), src)
    })
}

/// Our GGUF equals the converter's key for key and tensor for tensor, `ssm_a` within one ulp (notes §3.5); returns
/// how many of ssm_a's values are one ulp apart.
fn assert_same_gguf(ours: &Path, theirs: &Path) -> usize {
    let mut ulps = 0;
    for (name, x, y) in quantfarm_e2e::assert_same_gguf_layout(ours, theirs) {
        if name.ends_with(".ssm_a") {
            for (p, q) in x.chunks_exact(4).zip(y.chunks_exact(4)) {
                let (p, q) = (f32::from_le_bytes(p.try_into().unwrap()), f32::from_le_bytes(q.try_into().unwrap()));
                assert!(p.to_bits().abs_diff(q.to_bits()) <= 1 && p < 0.0 && q < 0.0, "{name}: {p} vs {q}");
                ulps += usize::from(p != q);
            }
            continue;
        }
        let at = x.iter().zip(&y).position(|(p, q)| p != q);
        assert!(at.is_none(), "{name}: first differing byte at {at:?}");
    }
    // The offsets of the tensor data, hence the files, are then the same too.
    assert_eq!(std::fs::metadata(ours).unwrap().len(), std::fs::metadata(theirs).unwrap().len(), "file sizes");
    ulps
}

fn u32_key(h: &GgufHeader, key: &str) -> Option<u32> {
    h.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| match v {
        Value::U32(n) => *n,
        other => panic!("{key}: {other:?}"),
    })
}

/// `budget`: small, so that the reordered, stacked and split tensors are written in several pieces.
fn hf_to_gguf_equals_the_converter(kind: &str, arch: &str, budget: u64) {
    let dir = tempfile::tempdir().unwrap();
    let flat = checkpoint(kind, dir.path());
    // Also as the released models store it (Qwen3_5[Moe]ForConditionalGeneration: the text model under
    // model.language_model., the config nested); the converter writes the same file for both.
    let nested = dir.path().join(format!("nested-{kind}"));
    run_py_with(&convert_python(), "qwen35.py", &[OsStr::new("nest"), flat.as_os_str(), nested.as_os_str()]);
    for hf in [flat, nested] {
        hf_to_gguf_of(&hf, kind, arch, budget, dir.path());
    }
}

fn hf_to_gguf_of(hf: &Path, kind: &str, arch: &str, budget: u64, dir: &Path) {
    let layout = hf.file_name().unwrap().to_string_lossy().into_owned();
    let dir = dir.join(format!("gguf-{layout}"));
    std::fs::create_dir_all(&dir).unwrap();
    let hf = hf.to_path_buf();
    for (mtp, flags, blocks) in [(Mtp::Keep, &[][..], 5), (Mtp::Drop, &["--no-mtp"][..], 4)] {
        let theirs = dir.join(format!("{kind}-{mtp:?}.oracle.gguf"));
        converter(&hf, &theirs, "bf16", "smollm", flags);
        let out = dir.join(format!("ours-{mtp:?}"));
        let options = ConvertOptions { out: OutType::Bf16, mtp };
        let done = rt()
            .block_on(convert_hf_to_gguf(
                &Location::local(&hf),
                &Location::local(&out),
                "ours",
                options,
                None,
                budget,
                false,
            ))
            .unwrap_or_else(|e| panic!("{kind} {mtp:?}: {e}"));
        let mine = PathBuf::from(&done[0].location);
        let ulps = assert_same_gguf(&mine, &theirs);
        let (h, _) = header(&mine);
        assert_eq!(u32_key(&h, &format!("{arch}.block_count")), Some(blocks));
        let nextn = u32_key(&h, &format!("{arch}.nextn_predict_layers"));
        assert_eq!(nextn, (mtp == Mtp::Keep).then_some(1));
        assert_eq!(h.tensors.iter().any(|t| t.name == "blk.4.nextn.eh_proj.weight"), mtp == Mtp::Keep);
        // `verify` recomputes the converter's file from the checkpoint (and tells --no-mtp from the file).
        let v = quantfarm_e2e::verify(&hf, &theirs, None);
        assert!(v.passed(), "{:?}", v.problems);
        for t in &v.tensors {
            let fine = t.verdict == Verdict::Identical
                || (t.name.ends_with(".ssm_a") && matches!(t.verdict, Verdict::WithinUlp { .. }));
            assert!(fine, "{}: {}", t.name, t.verdict);
        }
        quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(&hf, &mine, None));
        if mtp == Mtp::Keep && layout.starts_with("hf-") {
            ssm_a_one_ulp_off_passes_and_two_do_not(&hf, &theirs, &dir);
        }
        eprintln!(
            "{kind} ({layout}) {mtp:?}: identical to convert_hf_to_gguf.py but {ulps} ssm_a values one ulp apart ({} \
             tensors)",
            h.tensors.len()
        );
    }
}

/// A copy of the converter's GGUF with one `ssm_a` value moved by one ulp (what another torch build may write)
/// verifies as within one ulp; by two, it differs.
fn ssm_a_one_ulp_off_passes_and_two_do_not(hf: &Path, gguf: &Path, dir: &Path) {
    let name = "blk.0.ssm_a";
    let values = quantfarm_e2e::tensor_bytes(gguf).remove(name).expect("blk.0.ssm_a");
    let file = std::fs::read(gguf).unwrap();
    let at = file.windows(values.len()).position(|w| w == values.as_slice()).expect("ssm_a's bytes in the file");
    for (steps, within) in [(1u32, true), (2, false)] {
        let mut bytes = file.clone();
        let v = f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        bytes[at..at + 4].copy_from_slice(&f32::from_bits(v.to_bits() + steps).to_le_bytes());
        let moved = dir.join(format!("ssm_a-{steps}-ulp.gguf"));
        std::fs::write(&moved, &bytes).unwrap();
        let v = quantfarm_e2e::verify(hf, &moved, None);
        let verdict = &v.tensors.iter().find(|t| t.name == name).expect("ssm_a verified").verdict;
        match within {
            true => assert!(v.passed() && *verdict == Verdict::WithinUlp { values: 1 }, "{steps} ulp: {verdict}"),
            false => assert!(!v.passed() && matches!(verdict, Verdict::Differs(_)), "{steps} ulps: {verdict}"),
        }
    }
}

#[test]
fn qwen3_5_dense_hf_to_gguf_equals_convert_hf_to_gguf() {
    hf_to_gguf_equals_the_converter("dense", "qwen35", 3000);
}

#[test]
fn qwen3_5_moe_hf_to_gguf_equals_convert_hf_to_gguf() {
    // An expert row of the fused gate_up tensor is 16 KiB read and converted.
    hf_to_gguf_equals_the_converter("moe", "qwen35moe", 40_000);
}
