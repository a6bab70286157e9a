//! LoRA merge into SmolLM2 (HF bf16): a synthetic PEFT adapter (LoRA on q/k/v/o with an alpha pattern, and an
//! embedding LoRA on the tied embedding) and a synthetic mlx-lm DoRA adapter must give, element for element, the
//! float64 reference merge rounded to bf16 (`tests/py/lora_adapters.py`, numpy, written from the formulas in
//! `docs/formats.md` §3); every other tensor keeps its bytes. A misspelled key, a wrong shape or the wrong base is
//! an error naming it, and nothing is written.
//!
//! The same adapters merged by the real tools (PEFT's `merge_and_unload`, `mlx_lm.fuse`) agree with ours within the
//! rounding those tools add (they round the delta to bf16 and add in bf16): a transposed factor or a wrong scale
//! would be off by the size of the delta itself.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use quantfarm_e2e::{convert_python, peers_python, run_py_with, smollm2_derived, tensor_bytes};
use quantfarm_store::Location;
use quantfarm_tensors::merge::{merge_adapter, MergeOptions};
use quantfarm_tensors::TensorSource;

const RECORDED_BASE: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn base() -> PathBuf {
    smollm2_derived().join("smollm2-hf")
}

/// Writes the adapter (and, unflawed, the reference merge) with `lora_adapters.py`.
fn adapter(format: &str, dir: &Path, flaw: Option<&str>) -> (PathBuf, PathBuf) {
    let (a, e) = (dir.join(format!("{format}-adapter")), dir.join(format!("{format}-expected.safetensors")));
    quantfarm_e2e::lora_adapters(format, &base(), &a, &e, flaw);
    (a, e)
}

fn merge(adapter: &Path, out: &Path, base_name: Option<&str>) -> Result<quantfarm_tensors::merge::Merged, String> {
    merge_with(adapter, out, base_name, false)
}

fn merge_with(
    adapter: &Path,
    out: &Path,
    base_name: Option<&str>,
    widen: bool,
) -> Result<quantfarm_tensors::merge::Merged, String> {
    let opts = MergeOptions { budget: 8 << 20, overwrite: false, base_name: base_name.map(str::to_string), widen };
    rt().block_on(merge_adapter(&Location::local(base()), &Location::local(adapter), &Location::local(out), &opts))
        .map_err(|e| e.to_string())
}

fn check_merged(format: &str, untied: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (a, expected_file) = adapter(format, dir.path(), None);
    let out = dir.path().join("merged");
    let done = merge(&a, &out, Some(RECORDED_BASE)).unwrap();
    assert_eq!(done.untied, untied);
    let (got, want, orig) = (tensor_bytes(&out), tensor_bytes(&expected_file), tensor_bytes(&base()));
    // The untied lm_head.weight is a copy of the original embedding, not a change.
    assert_eq!(done.changed.len(), want.len() - usize::from(untied), "changed {:?}", done.changed);
    for (name, bytes) in &got {
        match want.get(name) {
            Some(w) => {
                let differ = bytes.chunks(2).zip(w.chunks(2)).filter(|(x, y)| x != y).count();
                assert_eq!(differ, 0, "{name}: {differ} of {} elements differ from the f64 reference", w.len() / 2);
            }
            None => assert!(orig.get(name) == Some(bytes), "{name}: not in the adapter, yet changed or new"),
        }
    }
    for name in want.keys() {
        assert!(got.contains_key(name), "{name} missing from the merged checkpoint");
    }
    assert_eq!(got.len(), orig.len() + usize::from(untied));
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["tie_word_embeddings"], serde_json::Value::Bool(!untied));
    for side in ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"] {
        assert_eq!(std::fs::read(out.join(side)).unwrap(), std::fs::read(base().join(side)).unwrap(), "{side}");
    }
    eprintln!("{format}: {} tensors equal the f64 reference merge rounded to bf16", want.len());

    // `verify BASE OUT --adapter A` recomputes every tensor and side file; one flipped byte in a merged tensor fails
    // naming it.
    let v = quantfarm_e2e::verify(&base(), &out, Some((&a, RECORDED_BASE)));
    quantfarm_e2e::assert_verified_identical(&v);
    let name = want.keys().min().unwrap();
    let file = out.join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let at = 8 + n + header[name]["data_offsets"][0].as_u64().unwrap() as usize;
    bytes[at] ^= 1;
    std::fs::write(&file, &bytes).unwrap();
    let v = quantfarm_e2e::verify(&base(), &out, Some((&a, RECORDED_BASE)));
    assert!(!v.passed());
    let bad: Vec<&str> = v.tensors.iter().filter(|t| !t.verdict.passed()).map(|t| t.name.as_str()).collect();
    assert_eq!(bad, [name.as_str()]);
}

fn bf16(b: &[u8]) -> Vec<f64> {
    b.chunks_exact(2).map(|c| f64::from(f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))).collect()
}

/// One bf16 unit in the last place at |x| (the smallest subnormal's for 0).
fn ulp(x: f64) -> f64 {
    if x == 0.0 {
        return 2f64.powi(-133);
    }
    2f64.powf(x.abs().log2().floor() - 7.0).max(2f64.powi(-133))
}

/// Compares our merge with a real tool's, tensor by tensor for `names`: every element within 3 bf16 units at
/// max(|W|, |ΔW|) (the tool's two bf16 roundings against our one); returns (elements, identical).
fn agree(ours: &BTreeMap<String, Vec<u8>>, tool: &BTreeMap<String, Vec<u8>>, names: &[String]) -> (usize, usize) {
    let orig = tensor_bytes(&base());
    let (mut total, mut same) = (0, 0);
    for name in names {
        let (o, t, w) = (bf16(&ours[name]), bf16(&tool[name]), bf16(&orig[name]));
        for i in 0..o.len() {
            let bound = 3.0 * ulp(w[i].abs().max((o[i] - w[i]).abs()));
            assert!((o[i] - t[i]).abs() <= bound, "{name}[{i}]: ours {} vs the tool's {} (base {})", o[i], t[i], w[i]);
            same += usize::from(o[i] == t[i]);
        }
        total += o.len();
    }
    (total, same)
}

/// `mlx_lm fuse --model BASE --adapter-path A --save-path OUT`.
fn mlx_fuse(a: &Path, out: &Path) {
    let o = std::process::Command::new(peers_python())
        .args(["-m", "mlx_lm", "fuse", "--model"])
        .arg(base())
        .arg("--adapter-path")
        .arg(a)
        .arg("--save-path")
        .arg(out)
        .output()
        .expect("run mlx_lm fuse");
    assert!(o.status.success(), "mlx_lm fuse failed:\n{}", String::from_utf8_lossy(&o.stderr));
}

/// PEFT itself: `PeftModel.from_pretrained(bf16 base).merge_and_unload()`. (PEFT keeps the embedding tied and
/// merges the embedding LoRA into the shared tensor, changing the output layer too, with a warning — peft #2777;
/// only the tensors both sides write are compared.)
#[test]
fn peft_adapter_agrees_with_peft_merge_and_unload() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = adapter("peft", dir.path(), None);
    let ours = dir.path().join("ours");
    let done = merge(&a, &ours, Some(RECORDED_BASE)).unwrap();
    let theirs = dir.path().join("peft");
    let b = base();
    run_py_with(&convert_python(), "peft_merge.py", &[b.as_os_str(), a.as_os_str(), theirs.as_os_str()]);
    let (total, same) = agree(&tensor_bytes(&ours), &tensor_bytes(&theirs), &done.changed);
    eprintln!("PEFT merge_and_unload: {same} of {total} merged elements identical, all within its rounding");
}

/// mlx-lm itself: `mlx_lm fuse` of a LoRA adapter on q/v/down_proj (down_proj is not square, so a transposed factor
/// cannot even load).
#[test]
fn mlx_lora_adapter_agrees_with_mlx_lm_fuse() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = adapter("mlx-lora", dir.path(), None);
    let ours = dir.path().join("ours");
    let done = merge(&a, &ours, Some(RECORDED_BASE)).unwrap();
    assert_eq!(done.changed.len(), 12);
    let theirs = dir.path().join("fused");
    mlx_fuse(&a, &theirs);
    let (total, same) = agree(&tensor_bytes(&ours), &tensor_bytes(&theirs), &done.changed);
    eprintln!("mlx_lm fuse: {same} of {total} merged elements identical, all within its rounding");
}

/// PEFT: 120 attention LoRAs and an embedding LoRA; the tied embedding is untied (lm_head keeps the original).
#[test]
fn peft_adapter_equals_the_f64_reference_merge() {
    check_merged("peft", true);
}

/// mlx-lm DoRA on q/v of the last 4 layers: the transposed factor layout and the row renormalisation.
#[test]
fn mlx_dora_adapter_equals_the_f64_reference_merge() {
    check_merged("mlx", false);
}

/// The merge check's model (`merge --f32`): the same merge rounded to f32. Every tensor is F32; a tensor the adapter
/// does not touch is the base's bf16 widened exactly; a merged one is within one bf16 unit of the f64 reference's
/// bf16 rounding (it is the f32 rounding of the same exact value) and mostly not a bf16 value at all (the precision
/// the check needs is kept).
#[test]
fn a_widened_merge_is_the_merge_rounded_to_f32() {
    let dir = tempfile::tempdir().unwrap();
    let (a, expected_file) = adapter("peft-attn", dir.path(), None);
    let out = dir.path().join("merged-f32");
    let done = merge_with(&a, &out, Some(RECORDED_BASE), true).unwrap();
    let (got, want, orig) = (tensor_bytes(&out), tensor_bytes(&expected_file), tensor_bytes(&base()));
    assert_eq!(got.len(), orig.len());
    let types = |p: &Path| -> HashMap<String, String> {
        rt().block_on(async {
            let src = TensorSource::open(&Location::local(p)).await.unwrap();
            src.tensors().iter().map(|e| (e.name.clone(), e.ty.to_string())).collect()
        })
    };
    let (out_types, base_types) = (types(&out), types(&base()));
    let f32s = |b: &[u8]| -> Vec<f64> {
        b.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap()))).collect()
    };
    let (mut merged, mut not_bf16) = (0usize, 0usize);
    for (name, bytes) in &got {
        assert_eq!(out_types[name], "F32", "{name}");
        // SmolLM2's checkpoint holds its norms in F32 already, its matrices in BF16.
        let base_vals = match base_types[name].as_str() {
            "BF16" => bf16(&orig[name]),
            "F32" => f32s(&orig[name]),
            other => panic!("{name}: base dtype {other}"),
        };
        let vals = f32s(bytes);
        assert_eq!(vals.len(), base_vals.len(), "{name}");
        match want.get(name) {
            None => assert!(vals == base_vals, "{name}: not in the adapter, yet not the base widened"),
            Some(w) => {
                for (i, (&v, r)) in vals.iter().zip(bf16(w)).enumerate() {
                    // A bf16 value is an f32 whose low 16 bits are zero.
                    not_bf16 += usize::from((v as f32).to_bits() & 0xffff != 0);
                    assert!((v - r).abs() <= ulp(r), "{name}[{i}]: {v} is not within a bf16 unit of the reference {r}");
                }
                merged += vals.len();
            }
        }
    }
    assert_eq!(done.changed.len(), want.len());
    eprintln!("widened merge: {merged} merged elements, {not_bf16} of them finer than bf16");
    assert!(not_bf16 * 10 > merged * 9, "{not_bf16} of {merged} merged elements are finer than bf16");
}

#[test]
fn flawed_adapters_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    for (format, flaw, want) in [
        ("peft", "misspelled", "layers.3.self_attn.q_prj.lora_A.weight\"] but not both LoRA factors A and B"),
        ("peft", "shape", "base_model.model.model.layers.5.self_attn.k_proj.lora_A.weight"),
        ("peft", "base", "trained on \"Qwen/Qwen3-0.6B\""),
        ("mlx", "misspelled", "model.layers.29.self_attn.v_proj.lora_bb: is not lora_a, lora_b or m"),
        ("mlx", "shape", "model.layers.28.self_attn.q_proj"),
        ("mlx", "base", "trained on \"mlx-community/Qwen3-0.6B-bf16\""),
    ] {
        let (a, _) = adapter(format, &dir.path().join(flaw), Some(flaw));
        let out = dir.path().join(format!("{format}-{flaw}-out"));
        let e = merge(&a, &out, Some(RECORDED_BASE)).expect_err(&format!("{format} {flaw}: merged"));
        assert!(e.contains(want), "{format} {flaw}: {e}");
        assert!(!out.exists(), "{format} {flaw}: the output folder exists after a refused merge");
    }
    // The right adapter without --base-name: the base folder's name does not say it is SmolLM2-135M-Instruct.
    let (a, _) = adapter("peft", &dir.path().join("ok"), None);
    let e = merge(&a, &dir.path().join("unnamed"), None).unwrap_err();
    assert!(e.contains("--base-name") && e.contains(RECORDED_BASE), "{e}");
    assert!(!dir.path().join("unnamed").exists());
}

/// PEFT → GGUF LoRA against llama.cpp's own `convert_lora_to_gguf.py`: the same keys and tensors (names, q/k rope
/// order of lora_b), except where the adapter's `alpha_pattern` gives v_proj alpha 32 over the global 16:
/// convert_lora_to_gguf.py drops that (llama.cpp applies one alpha per file) and quantfarm folds it into lora_b,
/// which is therefore exactly twice the script's. llama.cpp loads the result with `--lora` over SmolLM2 and
/// generates. An embedding LoRA on SmolLM2's tied embedding is refused: the script writes it, and llama.cpp then
/// aborts on it (it applies it to the tied output layer too).
#[test]
fn peft_adapter_converts_to_the_gguf_lora_llama_cpp_reads() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let (with_embedding, _) = adapter("peft", &dir.path().join("emb"), None);
    let opts = MergeOptions { budget: 0, overwrite: false, base_name: Some(RECORDED_BASE.into()), widen: false };
    let refused = dir.path().join("refused.gguf");
    let e = rt()
        .block_on(quantfarm_tensors::merge::adapter_to_gguf(
            &Location::local(base()),
            &Location::local(&with_embedding),
            &Location::local(&refused),
            &opts,
        ))
        .unwrap_err()
        .to_string();
    assert!(e.contains("embed_tokens.lora_embedding_A") && e.contains("tied output embeddings"), "{e}");
    assert!(!refused.exists());
    let (a, _) = adapter("peft-attn", dir.path(), None);
    let b = base();
    let theirs = dir.path().join("theirs.gguf");
    let script = quantfarm_e2e::llama_src().join("convert_lora_to_gguf.py");
    let out = std::process::Command::new(convert_python())
        .arg(&script)
        .arg(&a)
        .arg("--base")
        .arg(&b)
        .arg("--outfile")
        .arg(&theirs)
        .output()
        .expect("run convert_lora_to_gguf.py");
    assert!(out.status.success(), "convert_lora_to_gguf.py: {}", String::from_utf8_lossy(&out.stderr));
    let ours = dir.path().join("ours.gguf");
    rt().block_on(quantfarm_tensors::merge::adapter_to_gguf(
        &Location::local(&b),
        &Location::local(&a),
        &Location::local(&ours),
        &opts,
    ))
    .unwrap();

    let read = |p: &Path| {
        rt().block_on(async {
            let src = TensorSource::open(&Location::local(p)).await.unwrap();
            let meta = src.gguf().unwrap().header().metadata.clone();
            let mut t = Vec::new();
            for e in src.tensors() {
                let mut v = vec![0f32; e.elements() as usize];
                src.read_f32_rows(&e.name, 0, &mut v, &mut Vec::new()).await.unwrap();
                t.push((e.name.clone(), e.shape.clone(), v));
            }
            (meta, t)
        })
    };
    let ((mo, to), (mt, tt)) = (read(&ours), read(&theirs));
    assert_eq!(mo, mt, "metadata");
    assert_eq!(to.len(), 240);
    let mut folded = 0;
    for ((n, s, v), (n2, s2, v2)) in to.iter().zip(&tt) {
        assert_eq!((n, s), (n2, s2));
        if n.ends_with("attn_v.weight.lora_b") {
            assert!(v.iter().zip(v2).all(|(x, y)| *x == 2.0 * y), "{n}: not twice convert_lora_to_gguf.py's");
            folded += 1;
        } else {
            assert!(v.iter().zip(v2).all(|(x, y)| x.to_bits() == y.to_bits()), "{n} differs");
        }
    }
    assert_eq!(folded, 30);
    let lora = ours.to_str().unwrap().to_string();
    let text = quantfarm_e2e::llama_generate(
        &smollm2_derived().join("smollm2-bf16.gguf"),
        "Hello",
        4,
        2,
        &["--no-warmup", "--simple-io", "--lora", &lora],
    );
    assert!(text.trim_start().starts_with("Hello") && text.trim().len() > "Hello".len(), "{text:?}");
}

/// Converts adapter `a` to `to` with the library (checked against the base first).
fn convert_adapter(a: &Path, to: quantfarm_tensors::merge::AdapterFormat, out: &Path) {
    let opts = MergeOptions { budget: 8 << 20, overwrite: false, base_name: Some(RECORDED_BASE.into()), widen: false };
    let b = Location::local(base());
    rt().block_on(quantfarm_tensors::merge::convert_adapter_folder(
        &Location::local(a),
        to,
        Some(&b),
        &Location::local(out),
        &opts,
    ))
    .unwrap_or_else(|e| panic!("convert {}: {e}", a.display()));
}

/// PEFT → mlx-lm (`quantfarm adapter --to mlx-lm`): v_proj's alpha_pattern scale is folded into its lora_b (a power
/// of two: exact), so merging the converted adapter gives the same bytes as merging the original; and mlx-lm itself
/// reads it: `mlx_lm fuse` with the converted adapter agrees with our merge.
#[test]
fn peft_adapter_converted_to_mlx_lm_merges_the_same_and_mlx_lm_fuses_it() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = adapter("peft-attn", dir.path(), None);
    let converted = dir.path().join("as-mlx-lm");
    convert_adapter(&a, quantfarm_tensors::merge::AdapterFormat::MlxLm, &converted);
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(converted.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(config["num_layers"], 30, "{config}");
    assert_eq!(config["lora_parameters"]["scale"], 2.0, "{config}");
    let (ours, again) = (dir.path().join("from-peft"), dir.path().join("from-mlx-lm"));
    let done = merge(&a, &ours, Some(RECORDED_BASE)).unwrap();
    merge(&converted, &again, Some(RECORDED_BASE)).unwrap();
    assert!(tensor_bytes(&ours) == tensor_bytes(&again), "the converted adapter merges to other bytes");
    let theirs = dir.path().join("fused");
    mlx_fuse(&converted, &theirs);
    let (total, same) = agree(&tensor_bytes(&ours), &tensor_bytes(&theirs), &done.changed);
    eprintln!("mlx_lm fuse of the converted PEFT adapter: {same} of {total} merged elements identical, all within its rounding");
}

/// mlx-lm DoRA → PEFT (`quantfarm adapter --to peft`): merging the converted adapter gives the same bytes, and PEFT
/// itself reads it (`PeftModel.from_pretrained(...).merge_and_unload()` agrees with our merge).
#[test]
fn mlx_dora_adapter_converted_to_peft_merges_the_same_and_peft_merges_it() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = adapter("mlx", dir.path(), None);
    let converted = dir.path().join("as-peft");
    convert_adapter(&a, quantfarm_tensors::merge::AdapterFormat::Peft, &converted);
    let (ours, again) = (dir.path().join("from-mlx-lm"), dir.path().join("from-peft"));
    let done = merge(&a, &ours, Some(RECORDED_BASE)).unwrap();
    merge(&converted, &again, Some(RECORDED_BASE)).unwrap();
    assert!(tensor_bytes(&ours) == tensor_bytes(&again), "the converted adapter merges to other bytes");
    let theirs = dir.path().join("peft");
    let b = base();
    run_py_with(&convert_python(), "peft_merge.py", &[b.as_os_str(), converted.as_os_str(), theirs.as_os_str()]);
    let (total, same) = agree(&tensor_bytes(&ours), &tensor_bytes(&theirs), &done.changed);
    eprintln!("PEFT merge of the converted mlx-lm DoRA adapter: {same} of {total} merged elements identical");
}

/// What one format cannot say is refused, naming the tensor: an embedding LoRA going to mlx-lm.
#[test]
fn an_embedding_lora_is_refused_going_to_mlx_lm() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = adapter("peft", dir.path(), None);
    let opts = MergeOptions { budget: 8 << 20, overwrite: false, base_name: Some(RECORDED_BASE.into()), widen: false };
    let out = dir.path().join("x");
    let b = Location::local(base());
    let err = rt()
        .block_on(quantfarm_tensors::merge::convert_adapter_folder(
            &Location::local(&a),
            quantfarm_tensors::merge::AdapterFormat::MlxLm,
            Some(&b),
            &Location::local(&out),
            &opts,
        ))
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.embed_tokens.weight") && err.contains("mlx-lm adapts only layers"), "{err}");
    assert!(!out.exists(), "nothing written");
}
