//! `quantfarm vllm` against llm-compressor 0.14.0.1 itself (compressed-tensors 0.19.0, transformers 5.17.0, torch
//! 2.11.0, on the CPU: `scripts/install-llm-compressor`), on the real SmolLM2-135M-Instruct and a tiny MoE:
//! FP8_DYNAMIC and W4A16 (group 64, and 32 in the long run), made like `oneshot` and like `model_free_ptq` (the whole
//! grid in the long run), equal to what that entry point writes tensor for tensor (names, dtypes, shapes, bytes),
//! with a `quantization_config` its compressed-tensors parses to the same configuration; fused 3-D experts split
//! per expert as both entry points split them, and a Qwen3.5-MoE (offset norms, multi-token-prediction layers) as
//! oneshot makes it but for the norms oneshot rounds. And what cannot be made (SmolLM2's 576 columns in W4A16 groups
//! of 128, gpt-oss's interleaved experts) refused, naming the tensor and the rule.
//! And the farm's `outputs.vllm`: made, verified and measured like every rung, refused at its plan when it cannot be
//! made.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::bin;
use quantfarm_store::Location;
use quantfarm_tensors::TensorSource;

/// Whether the long run's extra cases run (`QUANTFARM_LONG`, `scripts/test --long`); says so when they do not.
fn long() -> bool {
    let on = std::env::var_os("QUANTFARM_LONG").is_some();
    if !on {
        eprintln!(
            "more schemes and entry points against llm-compressor run with QUANTFARM_LONG=1 (scripts/test --long)"
        );
    }
    on
}

/// Every tensor of the safetensors folder `dir`: name → (dtype, shape, bytes).
async fn tensors(dir: &Path) -> BTreeMap<String, (String, Vec<u64>, Vec<u8>)> {
    let src = TensorSource::open(&Location::local(dir)).await.unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut out = BTreeMap::new();
    for e in src.tensors() {
        let mut buf = vec![0u8; e.bytes as usize];
        src.read_range(&e.name, 0, &mut buf).await.unwrap();
        out.insert(e.name.clone(), (e.ty.to_string(), e.shape.clone(), buf));
    }
    out
}

/// llm-compressor's outputs for every job `(entry, scheme, group, out, extra ignore)` of `hf`, in one oracle process
/// (torch and llm-compressor imported once), then each `out` checked to say what `out.ours` says to
/// compressed-tensors' parser (one process too).
fn llm_compressor(hf: &Path, jobs: &[(&str, &str, u32, PathBuf, Vec<String>)]) {
    let python = quantfarm_e2e::llm_compressor_python();
    let mut cmd = Command::new(&python);
    cmd.arg(quantfarm_e2e::repo_root().join("tests/py/llmc_oracle.py")).arg("--jobs");
    for (entry, scheme, group, out, ignore) in jobs {
        cmd.args([*entry, *scheme, &group.to_string()]).arg(hf).arg(out).arg(ignore.join(","));
    }
    let o = cmd.output().expect("run llmc_oracle.py");
    assert!(o.status.success(), "llm-compressor:\n{}", String::from_utf8_lossy(&o.stderr));
    eprintln!("{}", String::from_utf8_lossy(&o.stdout).trim());
    let mut check = Command::new(&python);
    check.arg(quantfarm_e2e::repo_root().join("tests/py/ct_config_check.py"));
    for (.., out, _) in jobs {
        check.arg(out.with_extension("ours")).arg(out);
    }
    let c = check.output().expect("run ct_config_check.py");
    assert!(c.status.success(), "config check:\n{}", String::from_utf8_lossy(&c.stderr));
    let lines: Vec<String> = String::from_utf8_lossy(&c.stdout).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), jobs.len(), "{lines:?}");
    for ((entry, scheme, group, ..), line) in jobs.iter().zip(&lines) {
        assert_eq!(line.trim(), "{}", "{entry} {scheme} g{group}: quantization_config differs");
    }
}

/// oneshot's round trip of an offset norm's weight (`output * (1 + w)`: Gemma's, Qwen3.5's): while it calibrates
/// the norm holds `bf16(1 + w)`, and it restores `bf16(that - 1)` (llmcompressor 0.14.0.1,
/// `modeling/offset_norm.py`, `CalibrationOffsetNorm`), which rounds `w` to bf16's steps near 1 (2^-8). quantfarm
/// keeps the source's norms; this says oneshot's differ by exactly that.
fn offset_round_trip(bf16: &[u8]) -> Vec<u8> {
    use quantfarm_quant::compressed_tensors::bf16_bits;
    let value = |bits: u16| f32::from_bits(u32::from(bits) << 16);
    bf16.chunks_exact(2)
        .flat_map(|b| {
            let w = value(u16::from_le_bytes([b[0], b[1]]));
            bf16_bits(value(bf16_bits(1.0 + w)) - 1.0).to_le_bytes()
        })
        .collect()
}

/// `quantfarm vllm` of `hf` against llm-compressor, for each (scheme, group, entry point): the same tensors,
/// `quantized` modules of them quantized. `routers`: the modules model_free_ptq is told to leave, as its users do;
/// `ignore`: entries (names, `re:` patterns) both are given beside `lm_head`; `offset_norms`: oneshot's norms are
/// the source's through [`offset_round_trip`].
async fn against_llm_compressor(
    hf: &Path,
    runs: &[(&str, u32, &str)],
    quantized: usize,
    routers: &[String],
    ignore: &[&str],
    offset_norms: bool,
) {
    let dir = tempfile::tempdir().unwrap();
    let mut jobs = Vec::new();
    for &(scheme, group, entry) in runs {
        let like = if entry == "oneshot" { "oneshot" } else { "model-free" };
        let theirs = dir.path().join(format!("{entry}-{scheme}-{group}"));
        let mut cmd = Command::new(bin());
        cmd.arg("vllm").arg(hf).arg(theirs.with_extension("ours")).args(["--scheme", scheme, "--like", like]);
        if group > 0 {
            cmd.args(["--group-size", &group.to_string()]);
        }
        for i in std::iter::once(&"lm_head").chain(ignore) {
            cmd.args(["--ignore", i]);
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "quantfarm vllm {scheme} {like}:\n{}", String::from_utf8_lossy(&o.stderr));
        let mut extra: Vec<String> = ignore.iter().map(|i| i.to_string()).collect();
        if entry == "model_free" {
            extra.extend(routers.iter().cloned());
        }
        jobs.push((entry, scheme, group, theirs, extra));
    }
    llm_compressor(hf, &jobs);
    for (entry, scheme, group, theirs, _) in &jobs {
        let (a, b) = (tensors(&theirs.with_extension("ours")).await, tensors(theirs).await);
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "{entry} {scheme}: tensor names");
        let mut n = 0;
        for (name, (dt, shape, bytes)) in &a {
            let (dt2, shape2, bytes2) = &b[name];
            assert_eq!((dt, shape), (dt2, shape2), "{entry} {scheme} g{group}: {name}'s dtype and shape");
            if offset_norms && *entry == "oneshot" && name.ends_with("norm.weight") && bytes != bytes2 {
                assert!(&offset_round_trip(bytes) == bytes2, "{entry} {scheme}: {name} is not 1 + w rounded");
                continue;
            }
            assert!(bytes == bytes2, "{entry} {scheme} g{group}: {name}'s bytes differ");
            n += usize::from(name.ends_with("weight_scale"));
        }
        assert_eq!(n, quantized, "{entry} {scheme}: the modules quantized");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fp8_dynamic_and_w4a16_equal_llm_compressor_tensor_for_tensor() {
    let hf = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    // Each scheme like each entry point; the rest of the grid (W4A16 like model_free_ptq, group 32) is the same code
    // with other numbers: in the long run, to keep the suite inside its time.
    let mut runs = vec![("FP8_DYNAMIC", 0, "oneshot"), ("FP8_DYNAMIC", 0, "model_free"), ("W4A16", 64, "oneshot")];
    if long() {
        runs.extend([("W4A16", 64, "model_free"), ("W4A16", 32, "oneshot"), ("W4A16", 32, "model_free")]);
    }
    // Every Linear of the 30 layers, but what `ignore` names beside lm_head: a pattern (matched from the name's
    // start, as Python's re.match: every layer's down_proj) and a name; oneshot lists the modules they match,
    // model_free_ptq the entries as written (compared by compressed-tensors' parser).
    let ignore = [r"re:.*mlp\.down_proj$", "model.layers.0.self_attn.q_proj"];
    against_llm_compressor(&hf, &runs, 30 * 7 - 30 - 1, &[], &ignore, false).await;
}

/// A mixture of experts with per-expert weights (the tiny synthetic Qwen3-MoE): every expert quantized, the routers
/// left as oneshot leaves them (and as model_free_ptq's users tell it to).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixture_of_experts_has_every_expert_quantized_and_its_routers_left() {
    let dir = tempfile::tempdir().unwrap();
    let hf = quantfarm_e2e::synthetic_hf("qwen3_moe", &dir.path().join("hf"));
    let src = TensorSource::open(&Location::local(&hf)).await.unwrap();
    let routers = quantfarm_quant::vllm_file::routers(&src);
    let layers = routers.len();
    assert!(layers > 0, "the synthetic MoE has routers");
    let experts = src.tensors().iter().filter(|e| e.name.contains(".experts.")).count();
    // Attention's four Linear per layer, and every expert's three. W4A16 in the long run.
    let mut runs = vec![("FP8_DYNAMIC", 0, "oneshot"), ("FP8_DYNAMIC", 0, "model_free")];
    if long() {
        runs.extend([("W4A16", 32, "oneshot"), ("W4A16", 32, "model_free")]);
    }
    against_llm_compressor(&hf, &runs, layers * 4 + experts, &routers, &[], false).await;
}

/// Every text family quantfarm converts, as its tiny synthetic checkpoint (`tests/py/make_synthetic_hf.py`: each
/// family's own tensor names, fused qkv and gate-up projections, biases, tied embeddings): FP8_DYNAMIC and W4A16
/// (group 32) as oneshot makes them, tensor for tensor (Gemma's offset norms as the source has them, [`offset_round_trip`]). The multimodal
/// checkpoints: [`multimodal_checkpoints_are_made_as_oneshot_makes_them`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_text_family_is_made_as_oneshot_makes_it() {
    if quantfarm_e2e::skip_unless_long(
        "every_text_family_is_made_as_oneshot_makes_it",
        "14 families against oneshot (2 min); SmolLM2 and the MoE layouts run in the suite",
    ) {
        return;
    }
    let families = [
        "llama3",
        "gemma2",
        "gemma3",
        "phi3",
        "phi4",
        "smollm3",
        "granite",
        "olmo2",
        "mistral",
        "mistral_nemo",
        "ministral3",
        "qwen2",
        "qwen2_yarn",
        "qwen3",
    ];
    for family in families {
        let dir = tempfile::tempdir().unwrap();
        let hf = quantfarm_e2e::synthetic_hf(family, &dir.path().join("hf"));
        let src = TensorSource::open(&Location::local(&hf)).await.unwrap();
        let linears = src
            .tensors()
            .iter()
            .filter(|e| e.shape.len() == 2 && e.name.ends_with(".weight") && e.name != "lm_head.weight")
            .filter(|e| !e.name.ends_with("norm.weight") && !e.name.ends_with("embed_tokens.weight"))
            .count();
        eprintln!("{family}: {linears} Linear weights");
        let offset = family.starts_with("gemma");
        let runs = [("FP8_DYNAMIC", 0, "oneshot"), ("W4A16", 32, "oneshot")];
        against_llm_compressor(&hf, &runs, linears, &[], &[], offset).await;
    }
}

/// The multimodal checkpoints (Gemma 3 4B+ with a SigLIP tower, Mistral 3 with a Pixtral tower, each whole in its
/// synthetic checkpoint), loaded whole by the oracle as llm-compressor's multimodal examples load them: FP8_DYNAMIC and
/// W4A16 (group 32) as oneshot makes them with their `ignore` (`re:.*vision_tower.*`, `re:.*multi_modal_projector.*`: the text model's
/// Linear layers only, the projector's bare parameter and norm named without a Linear), and with `lm_head` alone
/// (the towers' and the projector's Linear layers quantized too, their embedding tables left as tables).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multimodal_checkpoints_are_made_as_oneshot_makes_them() {
    if quantfarm_e2e::skip_unless_long(
        "multimodal_checkpoints_are_made_as_oneshot_makes_them",
        "two multimodal families against oneshot, twice each (1 min); the text families run beside them",
    ) {
        return;
    }
    for family in ["gemma3_mm", "ministral3_mm"] {
        let dir = tempfile::tempdir().unwrap();
        let hf = quantfarm_e2e::synthetic_hf(family, &dir.path().join("hf"));
        let src = TensorSource::open(&Location::local(&hf)).await.unwrap();
        let linear = |name: &str| {
            let Some(module) = name.strip_suffix(".weight") else { return false };
            let last = module.rsplit('.').next().unwrap_or(module);
            module != "lm_head" && !last.ends_with("norm") && !last.starts_with("embed") && !last.ends_with("embedding")
        };
        let all: Vec<&str> =
            src.tensors().iter().filter(|e| e.shape.len() == 2 && linear(&e.name)).map(|e| e.name.as_str()).collect();
        let text = all.iter().filter(|n| !n.contains("vision_tower") && !n.contains("multi_modal_projector")).count();
        assert!(all.len() > text, "{family}: the towers have Linear layers: {all:?}");
        eprintln!("{family}: {text} Linear weights in the text model, {} in all", all.len());
        let offset = family.starts_with("gemma");
        let towers = [r"re:.*vision_tower.*", r"re:.*multi_modal_projector.*"];
        let runs = [("FP8_DYNAMIC", 0, "oneshot"), ("W4A16", 32, "oneshot")];
        against_llm_compressor(&hf, &runs, text, &[], &towers, offset).await;
        against_llm_compressor(&hf, &runs, all.len(), &[], &[], offset).await;
    }
}

/// Fused 3-D experts (the tiny Qwen3-MoE as transformers 5 saves it: `experts.gate_up_proj` `[E, 2I, H]`,
/// `experts.down_proj` `[E, H, I]`): split per expert as oneshot and model_free_ptq split them, every expert
/// quantized, the same tensors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fused_experts_are_split_and_quantized_as_llm_compressor_does() {
    let dir = tempfile::tempdir().unwrap();
    let hf = quantfarm_e2e::synthetic_hf("qwen3_moe_fused", &dir.path().join("hf"));
    let src = TensorSource::open(&Location::local(&hf)).await.unwrap();
    let routers = quantfarm_quant::vllm_file::routers(&src);
    let fused: Vec<_> = src.tensors().iter().filter(|e| e.name.ends_with(".experts.gate_up_proj")).collect();
    assert_eq!(fused.len(), routers.len(), "every layer's experts fused");
    let per_expert = 3 * fused.iter().map(|e| e.shape[0] as usize).sum::<usize>();
    let mut runs = vec![("FP8_DYNAMIC", 0, "oneshot"), ("FP8_DYNAMIC", 0, "model_free")];
    if long() {
        runs.extend([("W4A16", 32, "oneshot"), ("W4A16", 32, "model_free")]);
    }
    against_llm_compressor(&hf, &runs, routers.len() * 4 + per_expert, &routers, &[], false).await;
}

/// transformers' own tiny Qwen3.5-MoE (`tests/py/qwen35.py make moe`): gated-delta-net layers (a 3-D convolution
/// carried as it is), fused experts and a shared expert, a multi-token-prediction block (kept whole and unquantized
/// as oneshot copies it, `re:^mtp.*` in `ignore`), its zero-centred norms as the source has them where oneshot
/// rounds them ([`offset_round_trip`]). Against oneshot only: model_free_ptq refuses the convolution's 3-D weight
/// unless told to leave it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qwen3_5_moe_is_made_as_oneshot_makes_it() {
    if quantfarm_e2e::skip_unless_long(
        "a_qwen3_5_moe_is_made_as_oneshot_makes_it",
        "fused_experts_are_split_and_quantized_as_llm_compressor_does runs the split; this adds Qwen3.5's layers",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("qwen3_5-moe");
    let tok = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    quantfarm_e2e::run_py_with(
        &quantfarm_e2e::convert_python(),
        "qwen35.py",
        &[std::ffi::OsStr::new("make"), std::ffi::OsStr::new("moe"), hf.as_os_str(), tok.as_os_str()],
    );
    let src = TensorSource::open(&Location::local(&hf)).await.unwrap();
    // The Linear weights outside the multi-token-prediction block (not norms, the embedding, lm_head or routers),
    // and three per fused expert.
    let linears = src
        .tensors()
        .iter()
        .filter(|e| e.shape.len() == 2 && !e.name.starts_with("mtp") && e.name.ends_with(".weight"))
        .filter(|e| !["norm.weight", "embed_tokens.weight", "mlp.gate.weight"].iter().any(|s| e.name.ends_with(s)))
        .filter(|e| e.name != "lm_head.weight")
        .count();
    let experts: u64 = src
        .tensors()
        .iter()
        .filter(|e| !e.name.starts_with("mtp") && e.name.ends_with(".experts.gate_up_proj"))
        .map(|e| 3 * e.shape[0])
        .sum();
    let runs = [("FP8_DYNAMIC", 0, "oneshot"), ("W4A16", 32, "oneshot")];
    against_llm_compressor(&hf, &runs, linears + experts as usize, &[], &[], true).await;
}

#[test]
fn a_group_that_does_not_divide_the_columns_is_refused_before_any_compute() {
    let hf = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("w4");
    let o = Command::new(bin())
        .arg("vllm")
        .arg(&hf)
        .arg(&out)
        .args(["--scheme", "W4A16", "--group-size", "128"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("model.layers.0.mlp.gate_proj.weight")
            && err.contains("groups of 128 columns must divide its 576"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written");
}

#[test]
fn gpt_oss_experts_are_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let hf = quantfarm_e2e::synthetic_hf("gpt_oss_bf16", &dir.path().join("hf"));
    let out = dir.path().join("fp8");
    let o = Command::new(bin()).arg("vllm").arg(&hf).arg(&out).args(["--scheme", "FP8_DYNAMIC"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("model.layers.0.mlp.experts.") && err.contains("gpt-oss's fused experts"), "{err}");
    assert!(!out.exists(), "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transformers_decompresses_them_to_what_quantfarm_dequantizes() {
    use quantfarm_quant::vllm_read::dequantize_vllm_checkpoint;
    if quantfarm_e2e::skip_unless_long(
        "transformers_decompresses_them_to_what_quantfarm_dequantizes",
        "SmolLM2 FP8_DYNAMIC and W4A16 loaded by transformers 5.17 + compressed-tensors 0.19 on the CPU: every \
         tensor it holds (the 210 decompressed Linear weights among them) against quantfarm's dequantized \
         checkpoint (35 s)",
    ) {
        return;
    }
    let hf = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    let dir = tempfile::tempdir().unwrap();
    for (scheme, group) in [("FP8_DYNAMIC", 0u32), ("W4A16", 64)] {
        let ours = dir.path().join(scheme);
        let o = Command::new(bin())
            .arg("vllm")
            .arg(&hf)
            .arg(&ours)
            .args(["--scheme", scheme, "--group-size", &group.max(8).to_string()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        // transformers + compressed-tensors load it on the CPU and decompress every quantized Linear to bf16.
        let dump = dir.path().join(format!("{scheme}-loaded.safetensors"));
        let l = Command::new(quantfarm_e2e::llm_compressor_python())
            .arg(quantfarm_e2e::repo_root().join("tests/py/ct_load.py"))
            .arg(&ours)
            .arg(&dump)
            .output()
            .unwrap();
        assert!(l.status.success(), "{scheme}: transformers cannot load it:\n{}", String::from_utf8_lossy(&l.stderr));
        eprintln!("{scheme}: {}", String::from_utf8_lossy(&l.stdout).trim());
        // quantfarm's reading of the checkpoint (what llama.cpp measures): the bf16 checkpoint it stands for.
        let deq = dir.path().join(format!("{scheme}-dequantized"));
        let d = dequantize_vllm_checkpoint(&Location::local(&ours), &Location::local(&deq), 32 << 20, false)
            .await
            .unwrap_or_else(|e| panic!("{scheme}: {e}"));
        assert_eq!(d.modules, 210, "{scheme}: every quantized Linear dequantized");
        let (mine, loaded) = (tensors(&deq).await, tensors(&dump).await);
        let only = |a: &BTreeMap<String, _>, b: &BTreeMap<String, _>| {
            a.keys().filter(|k| !b.contains_key(*k)).cloned().collect::<Vec<String>>()
        };
        let (ours_only, theirs_only) = (only(&mine, &loaded), only(&loaded, &mine));
        assert!(
            ours_only.is_empty() && theirs_only.is_empty(),
            "{scheme}: tensors only quantfarm's dequantization has: {ours_only:?}; only transformers': {theirs_only:?}"
        );
        for (name, (ty, shape, bytes)) in &loaded {
            let m = &mine[name];
            assert_eq!((&m.0, &m.1), (ty, shape), "{scheme}: {name}");
            assert!(&m.2 == bytes, "{scheme}: {name} as transformers holds it");
        }
    }
}

/// (file name, sha256) of every file of a folder.
fn folder_files(dir: &Path) -> BTreeMap<String, String> {
    use sha2::{Digest, Sha256};
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, format!("{:x}", Sha256::digest(std::fs::read(&p).unwrap())))
        })
        .collect()
}

/// `outputs.vllm` on the farm: a SmolLM2 release with FP8_DYNAMIC and W4A16 (group 64) beside its GGUF BF16 reference,
/// run by `quantfarm run` on two workers. Each vLLM rung's folder is file for file what `quantfarm vllm` writes (which
/// the tests above hold equal to llm-compressor's), recomputed by a verify task, measured in llama.cpp on the same
/// chunks with the same figures as one `quantfarm kld` process over the folder, held to its default KLD limit, and
/// named in the model card with the `vllm serve` command that loads it. With `evaluation.transformers`, the bf16
/// checkpoint and each rung (FP8 as saved and weight-only) also run in transformers on workers given llm-compressor's
/// environment: each KLD equal to what torch and NumPy compute over the same tokens, the report valid against its
/// schema and the default `transformers-kld` gate read. A group size that does not divide a weight fails the release
/// at its plan, before any conversion, naming the tensor and the rule.
#[test]
fn a_release_makes_verifies_and_measures_its_vllm_rungs() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let hf = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    let text = quantfarm_e2e::fixtures_dir().join("texts/gpl3.txt");
    let release = dir.path().join("release.yaml");
    // Greedy continuations (4 prompts, in llama.cpp and in transformers: a helper started per task) in the long run
    // only, to keep the suite's time; the KLD in both runtimes always.
    let greedy = long();
    let prompts = if greedy {
        let p = quantfarm_e2e::prompts(4, dir.path());
        format!("  prompts: {}\n  max_tokens: 16\n  prompt_shares: 1\n", p.display())
    } else {
        String::new()
    };
    // The long run makes the acceptance release: GGUF Q8_0 and Q4_K_M and MLX 4-bit beside the vLLM rungs, every
    // one measured, side by side in the views.
    let (quants, mlx) = if greedy { ("Q8_0, Q4_K_M", "  mlx: {bits: [4]}\n") } else { ("", "") };
    let spec = |group: u32| {
        format!(
            "name: smollm2-vllm\nsource: {}\noutputs:\n  gguf: {{quants: [{quants}]}}\n{mlx}  vllm: {{schemes: \
             [FP8_DYNAMIC, W4A16], group_size: {group}}}\nevaluation:\n  text: {}\n  ctx: 256\n  batch: 512\n  \
             chunks: 2\n  probes: {}\n{prompts}  transformers: true\n",
            hf.display(),
            text.display(),
            quantfarm_e2e::repo_root().join("examples/probes-smollm2.yaml").display(),
        )
    };
    std::fs::write(&release, spec(64)).unwrap();
    let bin = Path::new(bin());
    // The workers run transformers in llm-compressor's pinned environment (torch, transformers, compressed-tensors).
    let python = quantfarm_e2e::llm_compressor_python();
    // In the long run the MLX rung is measured in mlx-lm too (the peers' Python), as every MLX rung is by default.
    let peers = quantfarm_e2e::peers_python();
    let mut env = vec![("QUANTFARM_TRANSFORMERS_PYTHON", python.as_os_str())];
    if greedy {
        env.push(("QUANTFARM_PYTHON", peers.as_os_str()));
    }
    let out = quantfarm_e2e::farm_run_output_env(bin, &release, 2, dir.path(), &env);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let sum: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    // Released, or held by a probe gate: W4A16 on this 135M model may lose a probe the reference passes (what the
    // `probes` gate is for); which one depends on a CPU's last bits, so the verdict is not asserted, the figures are.
    assert!(["released", "gate_failed"].contains(&sum["state"].as_str().unwrap_or_default()), "{sum:#}\n{stderr}");
    let artifact = |ty: &str| {
        sum["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["file_type"] == ty)
            .cloned()
            .unwrap_or_else(|| panic!("no {ty} artifact: {sum:#}"))
    };
    let gate = |name: &str| sum["gates"].as_array().unwrap().iter().find(|g| g["name"] == name).cloned().unwrap();
    let gates =
        |name: &str| sum["gates"].as_array().unwrap().iter().filter(|g| g["name"] == name).cloned().collect::<Vec<_>>();
    assert_eq!(gate("reproducible")["passed"], true, "{sum:#}");
    // Every rung measured (its KLD and probe results), each vLLM one within its default KLD limit (on 2 chunks of
    // 256, MLX 4-bit may be over the limit its 14 chunks of 512 are under).
    let vllm_kld = gates("kld").into_iter().filter(|g| g["level"].as_str().is_some_and(|l| l.starts_with("vLLM-")));
    for g in gates("measured").iter().chain(&vllm_kld.collect::<Vec<_>>()) {
        assert_eq!(g["passed"], true, "{g:#}");
    }
    let rungs: &[&str] = if greedy {
        &["Q8_0", "Q4_K_M", "MLX-4bit", "vLLM-FP8_DYNAMIC", "vLLM-W4A16"]
    } else {
        &["vLLM-FP8_DYNAMIC", "vLLM-W4A16"]
    };
    assert_eq!(gates("measured").len(), rungs.len(), "{sum:#}");
    // Side by side: one parity table in the card and in report.md holds every rung's row.
    let report_md = std::fs::read_to_string(sum["report_url"].as_str().unwrap().replace("report.json", "report.md"));
    for view in [std::fs::read_to_string(&card_url_of(&sum)).unwrap(), report_md.unwrap()] {
        for r in rungs {
            let row = format!("| smollm2-vllm-{} |", r.replace('_', "\\_"));
            assert!(view.contains(&row), "no row {row} in:\n{view}");
        }
    }
    let reference = PathBuf::from(artifact("BF16")["files"][0]["url"].as_str().unwrap());
    let card_url = card_url_of(&sum);
    let card = std::fs::read_to_string(&card_url).unwrap_or_default();
    for (scheme, group) in [("FP8_DYNAMIC", 0u32), ("W4A16", 64)] {
        let ty = format!("vLLM-{scheme}");
        let a = artifact(&ty);
        assert_eq!(a["container"], "vllm", "{a:#}");
        assert_eq!(a["verified"], true, "{a:#}");
        let folder = PathBuf::from(a["files"][0]["url"].as_str().unwrap());
        let single = dir.path().join(format!("single-{scheme}"));
        let o = Command::new(bin)
            .arg("vllm")
            .arg(&hf)
            .arg(&single)
            .args(["--scheme", scheme, "--group-size", &group.max(8).to_string()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(folder_files(&folder), folder_files(&single), "{ty}: the farm's folder and `quantfarm vllm`'s");
        // Measured on the release's chunks: the same figures as one `quantfarm kld` process over the folder.
        let k = &a["kld"];
        assert_eq!(k["n_chunks"], 2, "{k:#}");
        assert!(a["probes"]["passed"].as_u64().is_some(), "{ty}: its probes ran: {a:#}");
        let one = Command::new(bin)
            .arg("kld")
            .arg("--reference")
            .arg(&reference)
            .arg("--model")
            .arg(&folder)
            .arg("--text")
            .arg(&text)
            .args(["--ctx", "256", "--batch", "512", "--chunks", "2", "--threads", "2", "--json"])
            .output()
            .unwrap();
        assert!(one.status.success(), "{}", String::from_utf8_lossy(&one.stderr));
        let one: serde_json::Value = serde_json::from_slice(&one.stdout).unwrap();
        for key in ["mean_kld", "same_top_p", "mean_ppl_q", "mean_ppl_base"] {
            assert_eq!(one[key].as_f64(), k[key].as_f64(), "{ty} {key}: one process and the farm differ");
        }
        assert!(card.contains(&format!("vllm serve ./smollm2-vllm-{ty}")), "{ty} in the card:\n{card}");
    }
    // The size columns count each quantized weight once, its scales with it: FP8 a little over 8 bits per weight
    // (the bf16 embedding, kept, pulls it up), W4A16 group 64 a little over 4.25 (its scales).
    let mix = |ty: &str, t: &str| {
        artifact(ty)["type_mix"].as_array().unwrap().iter().find(|m| m["type"] == t).cloned().unwrap_or_default()
    };
    assert_eq!(mix("vLLM-FP8_DYNAMIC", "FP8_E4M3_CHANNEL")["tensors"], 210, "{sum:#}");
    assert_eq!(mix("vLLM-W4A16", "INT4_G64")["tensors"], 210, "{sum:#}");
    let int4 = mix("vLLM-W4A16", "INT4_G64");
    let bpw = int4["bytes"].as_f64().unwrap() * 8.0 / int4["elements"].as_f64().unwrap();
    assert!(bpw > 4.25 && bpw < 4.26, "{int4:#}");
    // W4A16 loses more than FP8 on the same chunks.
    let kld = |ty: &str| artifact(ty)["kld"]["mean_kld"].as_f64().unwrap();
    assert!(0.0 < kld("vLLM-FP8_DYNAMIC") && kld("vLLM-FP8_DYNAMIC") < kld("vLLM-W4A16"), "{sum:#}");

    // In transformers: the bf16 checkpoint and each rung, FP8 as saved (W8A8 emulated) and weight-only, each one's
    // KL divergence against llama.cpp's base logits equal to what torch and NumPy compute from the definition over
    // the same tokens and the same base file.
    let report_path = PathBuf::from(sum["report_url"].as_str().unwrap());
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
    // The report, its vLLM rungs and transformers section included, is valid against the published (strict) schema.
    let check = Command::new(quantfarm_e2e::check_tools().join("venv-check/bin/python"))
        .arg(quantfarm_e2e::repo_root().join("tests/py/check_schema.py"))
        .arg(quantfarm_e2e::repo_root().join("docs/report.schema.json"))
        .arg(&report_path)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let tf = &report["transformers"];
    let subjects: Vec<&serde_json::Value> =
        std::iter::once(&tf["bf16"]).chain(tf["rungs"].as_array().unwrap()).collect();
    let names: Vec<&str> = subjects.iter().map(|s| s["subject"].as_str().unwrap()).collect();
    assert_eq!(names, ["BF16", "vLLM-FP8_DYNAMIC", "vLLM-FP8_DYNAMIC-weight-only", "vLLM-W4A16"], "{tf:#}");
    assert!(tf["runtimes"][0]["compressed_tensors"].as_str().is_some_and(|v| !v.is_empty()), "{tf:#}");
    let task = |id: &str| {
        report["tasks"].as_array().unwrap().iter().find(|t| t["id"] == id).cloned().unwrap_or_else(|| panic!("{id}"))
    };
    // One oracle process for the four subjects (torch imported once), each subject's model, activations, base file
    // and BOS as its KLD task names them.
    let mut oracle = Command::new(&python);
    oracle.arg(quantfarm_e2e::repo_root().join("tests/py/tf_kld_oracle.py"));
    for s in &subjects {
        let name = s["subject"].as_str().unwrap();
        assert!(s["load_error"].is_null(), "{s:#}");
        if greedy {
            assert_eq!(s["greedy"]["n"], 4, "{name}: its greedy continuations: {s:#}");
        }
        assert_eq!(s["kld"]["n_chunks"], 2, "{name}: {s:#}");
        let t = task(&format!("transformers/kld/{name}/0"));
        let bos = t["inputs"]["bos"].as_i64().unwrap().to_string();
        let (model, base) = (t["inputs"]["model"].as_str().unwrap(), t["inputs"]["base"].as_str().unwrap());
        oracle.args([model, s["activations"].as_str().unwrap(), base, &bos]);
    }
    let o = oracle.output().unwrap();
    assert!(o.status.success(), "the oracle: {}", String::from_utf8_lossy(&o.stderr));
    let wants: Vec<serde_json::Value> =
        String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(wants.len(), subjects.len(), "{}", String::from_utf8_lossy(&o.stdout));
    let mut means = BTreeMap::new();
    for (s, want) in subjects.iter().zip(&wants) {
        let (name, k) = (s["subject"].as_str().unwrap(), &s["kld"]);
        let (got, exact) = (k["mean_kld"].as_f64().unwrap(), want["mean_kld"].as_f64().unwrap());
        eprintln!("transformers {name}: mean KLD {got} (torch/NumPy {exact}), same top {} %", k["same_top_p"]);
        assert!((got - exact).abs() <= 1e-6 + 1e-4 * exact, "{name}: the farm's {got}, torch/NumPy's {exact}");
        // The same positions agree (a percentage, computed in another order: equal to the last bits).
        let (top, want_top) = (k["same_top_p"].as_f64().unwrap(), want["same_top_p"].as_f64().unwrap());
        assert!((top - want_top).abs() < 1e-9, "{name}: the farm's top {top} %, torch/NumPy's {want_top} %");
        means.insert(name.to_string(), got);
    }
    // FP8 with its inputs quantized per token loses more than with bf16 inputs, and both lose something.
    let (w8a8, w8a16) = (means["vLLM-FP8_DYNAMIC"], means["vLLM-FP8_DYNAMIC-weight-only"]);
    assert!(w8a16 > 0.0 && w8a8 != w8a16, "{means:?}");
    // The default gate on the bf16 checkpoint across runtimes read that figure, and passed.
    let g = gate("transformers-kld");
    assert_eq!(g["inputs"]["transformers.bf16.kld.mean"].as_f64(), Some(means["BF16"]), "{g:#}");
    assert_eq!(g["passed"], true, "{g:#}");

    // The probe suite in transformers, each chat rendered by the checkpoint's template: every subject ran it; in
    // the long run each one's outcomes are those of transformers' own `generate` on the same chats, judged by the
    // same rules (tests/py/tf_probe_oracle.py).
    let suite = quantfarm_eval::probe::Suite::read(&quantfarm_e2e::repo_root().join("examples/probes-smollm2.yaml"))
        .expect("the example suite");
    // Probes run on the bf16 checkpoint and each rung as saved; the weight-only twin has its KL divergence.
    let probed: Vec<&serde_json::Value> = subjects.iter().copied().filter(|s| s["activations"] == "as-saved").collect();
    assert!(subjects.iter().all(|s| s["activations"] == "as-saved" || s["probes"].is_null()), "{tf:#}");
    for s in &probed {
        let p = &s["probes"];
        let runs: u64 = ["passed", "failed", "truncated"].iter().map(|k| p[*k].as_u64().unwrap_or(0)).sum();
        assert_eq!(runs as usize, suite.probes.len(), "{}: every probe ran once: {p:#}", s["subject"]);
    }
    if greedy {
        probe_oracle(&python, &suite, &probed, &task, dir.path());
    }

    publish_checks(bin, &report_path, dir.path());

    // Groups of 128 do not divide SmolLM2's 576 columns: the plan refuses the release, nothing is converted.
    let dir2 = tempfile::tempdir().unwrap();
    let release = dir2.path().join("release.yaml");
    // Without transformers (nothing is measured: the plan refuses it), so its worker starts no transformers helper
    // for its handshake; the other runtimes as above, so that `quantfarm run` gets past its check of them.
    std::fs::write(&release, spec(128).replace("  transformers: true\n", "")).unwrap();
    let twin_env: Vec<_> = env.iter().copied().filter(|(k, _)| *k != "QUANTFARM_TRANSFORMERS_PYTHON").collect();
    let out = quantfarm_e2e::farm_run_output_env(bin, &release, 1, dir2.path(), &twin_env);
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains("outputs.vllm: W4A16 cannot be made")
            && said.contains("model.layers.0.mlp.gate_proj.weight")
            && said.contains("groups of 128 columns must divide its 576"),
        "{said}"
    );
    let tasks: Vec<String> = std::fs::read_dir(dir2.path().join("data"))
        .map_or_else(|_| Vec::new(), |d| d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect());
    assert!(!tasks.iter().any(|t| t == "artifacts"), "something was converted: {tasks:?}");
}

/// Each transformers subject's probe counts equal what `tests/py/tf_probe_oracle.py` (transformers' `generate` on
/// the same chats, loaded as the subject's probe task names it) answers, judged by quantfarm's rules.
fn probe_oracle(
    python: &Path,
    suite: &quantfarm_eval::probe::Suite,
    subjects: &[&serde_json::Value],
    task: &dyn Fn(&str) -> serde_json::Value,
    dir: &Path,
) {
    use quantfarm_eval::probe::judge;
    assert!(suite.probes.iter().all(|p| p.temperature == 0.0), "the oracle decodes greedily");
    let probes: Vec<serde_json::Value> = suite
        .probes
        .iter()
        .map(|p| {
            serde_json::json!({"name": p.name, "messages": p.messages, "kwargs": p.kwargs, "max_tokens": p.max_tokens})
        })
        .collect();
    let file = dir.join("probes.json");
    std::fs::write(&file, serde_json::to_vec(&probes).unwrap()).unwrap();
    let mut oracle = Command::new(python);
    oracle.arg(quantfarm_e2e::repo_root().join("tests/py/tf_probe_oracle.py")).arg(&file);
    for s in subjects {
        let t = task(&format!("transformers/probe/{}", s["subject"].as_str().unwrap()));
        oracle.args([t["inputs"]["model"].as_str().unwrap(), t["inputs"]["activations"].as_str().unwrap()]);
    }
    let o = oracle.output().unwrap();
    assert!(o.status.success(), "the probe oracle: {}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<Vec<serde_json::Value>> =
        String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), subjects.len());
    for (s, answers) in subjects.iter().zip(&lines) {
        let (mut passed, mut failed, mut truncated) = (0u64, 0u64, 0u64);
        for (probe, a) in suite.probes.iter().zip(answers) {
            let content = a["content"].as_str().unwrap();
            match a["finish"].as_str() {
                Some("length") => truncated += 1,
                _ if judge(&probe.expect, content.trim()) => passed += 1,
                _ => failed += 1,
            }
        }
        let p = &s["probes"];
        let got = (p["passed"].as_u64(), p["failed"].as_u64(), p["truncated"].as_u64());
        eprintln!("transformers {} probes: {got:?}, generate(): {answers:?}", s["subject"]);
        assert_eq!(got, (Some(passed), Some(failed), Some(truncated)), "{}: {answers:?}", s["subject"]);
    }
}

fn card_url_of(sum: &serde_json::Value) -> String {
    sum["report_url"].as_str().unwrap().replace("report.json", "README.md")
}

/// `quantfarm publish`: the release as one folder for `hf upload` — the GGUF at the top, each vLLM rung in its own
/// folder (the one the card's `vllm serve` names), the signed report still verifying, and `SHA256SUMS` over every
/// file. Then an artifact changed in the store after the release is refused, naming it, and leaves no file under its
/// name.
fn publish_checks(bin: &Path, report_path: &Path, dir: &Path) {
    use sha2::{Digest, Sha256};
    let out = dir.join("published");
    let o = Command::new(bin).arg("publish").arg(report_path).arg(&out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let sums = std::fs::read_to_string(out.join("SHA256SUMS")).unwrap();
    let mut listed = Vec::new();
    for line in sums.lines() {
        let (sha, path) = line.split_once("  ").unwrap();
        let got = format!("{:x}", Sha256::digest(std::fs::read(out.join(path)).unwrap()));
        assert_eq!(got, sha, "{path}");
        listed.push(path.to_string());
    }
    for want in [
        "README.md",
        "VERIFY.md",
        "report.json",
        "report.intoto.json",
        "report.html",
        "kld-values.safetensors",
        "smollm2-vllm-BF16.gguf",
        "smollm2-vllm-vLLM-FP8_DYNAMIC/config.json",
        "smollm2-vllm-vLLM-W4A16/model.safetensors",
    ] {
        assert!(listed.iter().any(|p| p == want), "{want} not published: {listed:?}");
    }
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(card.contains("| `smollm2-vllm-vLLM-W4A16/` |"), "{card}");
    let v = Command::new(bin).args(["report", "verify"]).arg(out.join("report.json")).output().unwrap();
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stdout));

    // One byte of the W4A16 folder's weights changed in the store.
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report_path).unwrap()).unwrap();
    let a = report["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == "vLLM-W4A16").unwrap();
    let stored = PathBuf::from(a["files"][0]["url"].as_str().unwrap()).join("model.safetensors");
    let mut bytes = std::fs::read(&stored).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&stored, bytes).unwrap();
    let again = dir.join("published-again");
    let o = Command::new(bin).arg("publish").arg(report_path).arg(&again).output().unwrap();
    let said = String::from_utf8_lossy(&o.stderr);
    let named = said.contains("smollm2-vllm-vLLM-W4A16") && said.contains("the signed report records");
    assert!(!o.status.success() && named, "{said}");
    assert!(!again.join("smollm2-vllm-vLLM-W4A16/model.safetensors").exists());
}
