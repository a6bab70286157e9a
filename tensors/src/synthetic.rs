//! A tiny Llama checkpoint synthesized from code, so the farm has a model on a fresh machine with no network.
//!
//! `quantfarm run` and the README's example release need a real HF checkpoint to convert, quantize and load, but a
//! download is not always possible (CI without network, air-gapped machines). [`write_tiny_llama`] writes one: a
//! 2-layer `LlamaForCausalLM` (hidden 64, 4 heads, 2 kv heads, bf16) with a 267-token GPT-2-style byte-level BPE
//! tokenizer whose `pre_tokenizer` section is SmolLM2's (so the converter names it `smollm`). Weights come from a
//! fixed-seed splitmix64 generator and are rounded to bf16 exactly, so the bytes are the same on every machine;
//! `quantfarm_proto::SYNTHETIC_MODELS` names that version of the bytes. Every row width is a multiple of 32, so Q8_0 and Q4_0 apply.

use serde_json::{json, Value as Json};

use crate::convert::transform::f32_to_bf16_bits;
use crate::dtype::Dtype;
use crate::error::Result;
use crate::safetensors::{encode_header, StTensorDesc};
use quantfarm_store::Location;
use quantfarm_store::{Committed, StagedSink};

/// The files of the checkpoint, in the order they are committed (config.json last: a folder with a config is
/// complete).
pub const TINY_LLAMA_FILES: [&str; 4] = ["tokenizer.json", "tokenizer_config.json", "model.safetensors", "config.json"];

/// Name/version of the second synthetic model, [`write_wide_llama`]; bump the version whenever its bytes change.
pub const WIDE_LLAMA: &str = "wide-llama-v1";
/// Name/version of [`write_wide_tied_llama`]'s model.
pub const WIDE_TIED_LLAMA: &str = "wide-tied-llama-v1";

/// The sizes of a synthetic Llama.
struct Shape {
    hidden: u64,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    intermediate: u64,
    /// Whether some tensors get outliers, constant rows and all-zero rows (see [`tensor_values`]).
    special_rows: bool,
    /// `tie_word_embeddings`: no `lm_head.weight`, the embeddings double as the output.
    tied: bool,
}

impl Shape {
    fn head_dim(&self) -> u64 {
        self.hidden / self.heads
    }
}

const TINY: Shape =
    Shape { hidden: 64, layers: 2, heads: 4, kv_heads: 2, intermediate: 128, special_rows: false, tied: false };
/// Every row width a multiple of 256, so the K-quant mixture rules run without the fallback; 8 layers, so the
/// `use_more_bits` and `i < n/8` layer rules pick some layers and not others.
const WIDE: Shape =
    Shape { hidden: 256, layers: 8, heads: 4, kv_heads: 2, intermediate: 512, special_rows: true, tied: false };
/// [`WIDE`] with tied embeddings: llama-quantize's output rule then applies to `token_embd.weight`.
const WIDE_TIED: Shape = Shape { tied: true, ..WIDE };
const CONTEXT: u64 = 256;

/// Special tokens, ids 0.. (as SmolLM2 numbers them); the 256 byte tokens follow, then the merged tokens.
const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// BPE merges in rank order; each merged token gets the next id after the byte tokens.
const MERGES: [(&str, &str); 8] = [
    ("\u{120}", "t"),
    ("h", "e"),
    ("i", "n"),
    ("\u{120}t", "he"),
    ("\u{120}", "a"),
    ("e", "r"),
    ("o", "n"),
    ("r", "e"),
];
const VOCAB: u64 = (SPECIALS.len() + 256 + MERGES.len()) as u64;

const CHAT_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + \
                             message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}\
                             {{ '<|im_start|>assistant\n' }}{% endif %}";

/// Seed of the weight generator; each tensor's stream is this mixed with a hash of its name.
const SEED: u64 = 0x7107_11a3_a000_0001;
/// Scale of a sum of four uniforms in [-0.5, 0.5) (std ≈ 0.577): weights have std ≈ 0.02, as `initializer_range`.
const WEIGHT_SCALE: f64 = 0.02 / 0.577_350_269_189_625_8;

/// Writes the tiny Llama HF checkpoint into folder `dst_dir` (a local folder or object-store prefix): config.json,
/// tokenizer.json, tokenizer_config.json and model.safetensors. Every file is staged and all are committed only
/// once all are written, so a partial model is never visible. A file already there with exactly these bytes is
/// kept (so a re-run after an interrupted commit completes the folder); one with other bytes is an error
/// (`quantfarm_store::Error::Exists`): put each version (`quantfarm_proto::SYNTHETIC_MODELS`) in its own folder. Returns one [`Committed`] per file, in
/// [`TINY_LLAMA_FILES`] order.
pub async fn write_tiny_llama(dst_dir: &Location) -> Result<Vec<Committed>> {
    write_files(dst_dir, tiny_llama_files()).await
}

/// Writes the wide Llama HF checkpoint into `dst_dir`, as [`write_tiny_llama`] does the tiny one: an 8-layer
/// `LlamaForCausalLM` (hidden 256, 4 heads, 2 kv heads, intermediate 512, bf16, untied output) with the tiny
/// model's tokenizer. Every row width is a multiple of 256, so the K-quants apply everywhere and llama-quantize's
/// mixture rules decide each type without the fallback; some tensors have outliers, a constant row and an
/// all-zero row, the edge cases of the quantizers' scale searches. Files in [`TINY_LLAMA_FILES`] order.
pub async fn write_wide_llama(dst_dir: &Location) -> Result<Vec<Committed>> {
    write_files(dst_dir, wide_llama_files()).await
}

/// The wide checkpoint's files and their bytes, in [`TINY_LLAMA_FILES`] order.
pub fn wide_llama_files() -> Vec<(&'static str, Vec<u8>)> {
    files(&WIDE)
}

/// [`write_wide_llama`]'s model with `tie_word_embeddings` (no `lm_head.weight`; the same other tensors), for the
/// rules and flags that treat a tied `token_embd.weight` as the output.
pub async fn write_wide_tied_llama(dst_dir: &Location) -> Result<Vec<Committed>> {
    write_files(dst_dir, files(&WIDE_TIED)).await
}

async fn write_files(dst_dir: &Location, files: Vec<(&'static str, Vec<u8>)>) -> Result<Vec<Committed>> {
    let present = existing_names(dst_dir).await?;
    let mut staged = Vec::new();
    let mut out = Vec::new();
    for (i, (name, bytes)) in files.into_iter().enumerate() {
        let target = dst_dir.child(name)?;
        if present.iter().any(|n| n == name) {
            out.push((i, keep_identical(&target, &bytes).await?));
            continue;
        }
        // Another writer may commit the file between the listing and here (a killed worker's upload reaching the
        // store, or the task's retry beside it): its bytes are kept when they are ours, as at commit.
        let mut sink = match StagedSink::create(&target, false).await {
            Ok(sink) => sink,
            Err(quantfarm_store::Error::Exists { .. }) => {
                out.push((i, keep_identical(&target, &bytes).await?));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        sink.write(&bytes).await?;
        staged.push((i, sink, target, bytes));
    }
    for (i, sink, target, bytes) in staged {
        out.push((i, commit_or_keep(sink, &target, &bytes).await?));
    }
    out.sort_by_key(|(i, _)| *i);
    Ok(out.into_iter().map(|(_, c)| c).collect())
}

/// Commits `sink` (holding `bytes`) at `target`. When another writer committed the file since the folder was
/// listed (a worker killed after its request reached the store, or one running beside us), the same bytes are as
/// good as ours and other bytes are refused ([`keep_identical`]).
async fn commit_or_keep(sink: StagedSink, target: &Location, bytes: &[u8]) -> Result<Committed> {
    match sink.commit().await {
        Ok(c) => Ok(c),
        Err(quantfarm_store::Error::Exists { .. }) => keep_identical(target, bytes).await,
        Err(e) => Err(e.into()),
    }
}

/// True when all of the checkpoint's files exist at `dst_dir` (names only; no bytes are read).
pub async fn tiny_llama_exists(dst_dir: &Location) -> Result<bool> {
    let present = existing_names(dst_dir).await?;
    Ok(TINY_LLAMA_FILES.iter().all(|f| present.iter().any(|n| n == f)))
}

/// The checkpoint's files and their bytes, in [`TINY_LLAMA_FILES`] order.
pub fn tiny_llama_files() -> Vec<(&'static str, Vec<u8>)> {
    files(&TINY)
}

fn files(shape: &Shape) -> Vec<(&'static str, Vec<u8>)> {
    TINY_LLAMA_FILES
        .iter()
        .map(|&name| {
            let bytes = match name {
                "tokenizer.json" => pretty(&tokenizer_json()),
                "tokenizer_config.json" => pretty(&tokenizer_config_json()),
                "model.safetensors" => model_safetensors(shape),
                _ => pretty(&config_json(shape)),
            };
            (name, bytes)
        })
        .collect()
}

/// Files directly in `dir`; none when the folder does not exist.
async fn existing_names(dir: &Location) -> Result<Vec<String>> {
    if !dir.is_dir().await? {
        return Ok(Vec::new());
    }
    dir.list().await.map_err(Into::into)
}

/// The [`Committed`] of a file already at `target` when its bytes are `want`; otherwise `quantfarm_store::Error::Exists`.
async fn keep_identical(target: &Location, want: &[u8]) -> Result<Committed> {
    use sha2::{Digest, Sha256};
    let blob = quantfarm_store::Blob::open(target).await?;
    let same = blob.len() == want.len() as u64 && blob.read_vec(0, blob.len()).await? == want;
    if !same {
        return Err(quantfarm_store::Error::Exists { path: target.to_string().into() }.into());
    }
    Ok(Committed {
        location: target.to_string(),
        bytes: want.len() as u64,
        sha256: quantfarm_store::hex(&Sha256::digest(want)),
    })
}

fn pretty(v: &Json) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(v).expect("a JSON value serializes");
    out.push(b'\n');
    out
}

fn config_json(shape: &Shape) -> Json {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": shape.head_dim(),
        "hidden_act": "silu",
        "hidden_size": shape.hidden,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate,
        "max_position_embeddings": CONTEXT,
        "mlp_bias": false,
        "model_type": "llama",
        "num_attention_heads": shape.heads,
        "num_hidden_layers": shape.layers,
        "num_key_value_heads": shape.kv_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-5,
        "rope_scaling": null,
        "rope_theta": 10000.0,
        "tie_word_embeddings": shape.tied,
        "torch_dtype": "bfloat16",
        "use_cache": true,
        "vocab_size": VOCAB,
    })
}

fn tokenizer_config_json() -> Json {
    json!({
        "add_bos_token": false,
        "add_eos_token": false,
        "bos_token": SPECIALS[1],
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": false,
        "eos_token": SPECIALS[2],
        "model_max_length": CONTEXT,
        "pad_token": SPECIALS[2],
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": SPECIALS[0],
    })
}

/// GPT-2's `bytes_to_unicode`: printable bytes map to themselves, the others to U+0100.. in byte order.
fn byte_to_unicode() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in out.iter_mut().enumerate() {
        let b = b as u32;
        let c = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        *slot = char::from_u32(c).expect("below U+0200 is a char");
    }
    out
}

/// Every token in id order: specials, the 256 byte tokens (in byte order), then one per merge.
fn vocab_tokens() -> Vec<String> {
    let mut tokens: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
    tokens.extend(byte_to_unicode().iter().map(char::to_string));
    tokens.extend(MERGES.iter().map(|(a, b)| format!("{a}{b}")));
    tokens
}

fn tokenizer_json() -> Json {
    let vocab: serde_json::Map<String, Json> =
        vocab_tokens().into_iter().enumerate().map(|(id, t)| (t, Json::from(id as u64))).collect();
    let added: Vec<Json> = SPECIALS
        .iter()
        .enumerate()
        .map(|(id, s)| {
            json!({"id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    let merges: Vec<Json> = MERGES.iter().map(|(a, b)| json!([a, b])).collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        // SmolLM2-135M's section exactly: mappings/pre-tokenizers.yaml names it "smollm".
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {},
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges,
        },
    })
}

/// The HF tensors, in file order, with their shapes (rows, columns).
fn tensor_descs(shape: &Shape) -> Vec<StTensorDesc> {
    let (hidden, heads, kv_heads, intermediate) = (shape.hidden, shape.heads, shape.kv_heads, shape.intermediate);
    let head_dim = shape.head_dim();
    let bf16 = |name: String, shape: Vec<u64>| StTensorDesc { name, dtype: Dtype::BF16, shape };
    let mut out = vec![bf16("model.embed_tokens.weight".into(), vec![VOCAB, hidden])];
    for i in 0..shape.layers {
        let p = format!("model.layers.{i}");
        out.push(bf16(format!("{p}.input_layernorm.weight"), vec![hidden]));
        out.push(bf16(format!("{p}.self_attn.q_proj.weight"), vec![heads * head_dim, hidden]));
        out.push(bf16(format!("{p}.self_attn.k_proj.weight"), vec![kv_heads * head_dim, hidden]));
        out.push(bf16(format!("{p}.self_attn.v_proj.weight"), vec![kv_heads * head_dim, hidden]));
        out.push(bf16(format!("{p}.self_attn.o_proj.weight"), vec![hidden, heads * head_dim]));
        out.push(bf16(format!("{p}.post_attention_layernorm.weight"), vec![hidden]));
        out.push(bf16(format!("{p}.mlp.gate_proj.weight"), vec![intermediate, hidden]));
        out.push(bf16(format!("{p}.mlp.up_proj.weight"), vec![intermediate, hidden]));
        out.push(bf16(format!("{p}.mlp.down_proj.weight"), vec![hidden, intermediate]));
    }
    out.push(bf16("model.norm.weight".into(), vec![hidden]));
    if !shape.tied {
        out.push(bf16("lm_head.weight".into(), vec![VOCAB, hidden]));
    }
    out
}

/// The safetensors file: header (`format: pt`, as `save_pretrained` writes) then every tensor's bf16 bytes.
fn model_safetensors(shape: &Shape) -> Vec<u8> {
    let descs = tensor_descs(shape);
    let mut out = encode_header(&descs, &[("format".to_string(), "pt".to_string())]);
    for d in &descs {
        out.extend(tensor_values(d, shape.special_rows).into_iter().flat_map(|x| f32_to_bf16_bits(x).to_le_bytes()));
    }
    out
}

/// Norm weights are 1.0; every other tensor is deterministic noise from its own stream. With `special_rows`, every
/// 509th value is an outlier (×12), and in the token embeddings, layer 1's q_proj and layer 2's down_proj one row is
/// constant and one is all zeros: the cases where the quantizers' scale searches meet ties, a zero maximum or a
/// block dominated by one value.
fn tensor_values(d: &StTensorDesc, special_rows: bool) -> Vec<f32> {
    let n = d.shape.iter().product::<u64>() as usize;
    if d.name.ends_with("norm.weight") {
        return vec![1.0; n];
    }
    let mut rng = SplitMix64(SEED ^ fnv1a(d.name.as_bytes()));
    let mut v: Vec<f32> = (0..n).map(|_| rng.normalish()).collect();
    if special_rows {
        v.iter_mut().step_by(509).for_each(|x| *x *= 12.0);
        let cols = d.shape.last().copied().unwrap_or(1) as usize;
        let special = [
            ("model.embed_tokens.weight", 10, 11),
            ("model.layers.1.self_attn.q_proj.weight", 3, 5),
            ("model.layers.2.mlp.down_proj.weight", 7, 0),
        ];
        if let Some((_, constant, zero)) = special.iter().find(|(name, _, _)| *name == d.name) {
            v[constant * cols..(constant + 1) * cols].fill(0.015625);
            v[zero * cols..(zero + 1) * cols].fill(0.0);
        }
    }
    v
}

/// FNV-1a, 64-bit: a stable hash of a tensor name for its stream's seed.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// splitmix64 (Steele, Lea, Flood 2014): tiny, fast and the same on every platform.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), exactly representable (53 random bits).
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Roughly normal, mean 0, std ≈ 0.02: a scaled sum of four uniforms (IEEE arithmetic, so exact everywhere).
    fn normalish(&mut self) -> f32 {
        let s = self.uniform() + self.uniform() + self.uniform() + self.uniform() - 2.0;
        (s * WEIGHT_SCALE) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_bytes_to_unicode_is_gpt2s() {
        let m = byte_to_unicode();
        assert_eq!(m[b' ' as usize], '\u{120}');
        assert_eq!(m[b'\n' as usize], '\u{10a}');
        assert_eq!(m[0], '\u{100}');
        assert_eq!(m[b'a' as usize], 'a');
        assert_eq!(m[0xad], '\u{143}');
        let mut all: Vec<char> = m.to_vec();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn synthetic_vocab_is_consistent() {
        let tokens = vocab_tokens();
        assert_eq!(tokens.len() as u64, VOCAB);
        let mut unique = tokens.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), tokens.len(), "token strings are unique");
        for (a, b) in MERGES {
            assert!(tokens.contains(&a.to_string()) && tokens.contains(&b.to_string()), "merge {a} {b}");
        }
        let tok = tokenizer_json();
        assert_eq!(tok["model"]["vocab"].as_object().map(|v| v.len() as u64), Some(VOCAB));
        assert_eq!(
            crate::convert::pre_tokenizer_sha256(&tok["pre_tokenizer"]),
            "5990693cd157d5b2abbe362cd9a0a103db4b3a87f7d029137ae0f1e70c1ee012"
        );
    }

    #[test]
    fn synthetic_weights_are_small_deterministic_bf16() {
        let a = tiny_llama_files();
        assert_eq!(a, tiny_llama_files());
        let st = &a.iter().find(|(n, _)| *n == "model.safetensors").expect("model file").1;
        let descs = tensor_descs(&TINY);
        let data: u64 = descs.iter().map(StTensorDesc::nbytes).sum();
        let header = u64::from_le_bytes(st[..8].try_into().expect("8 bytes"));
        assert_eq!(st.len() as u64, 8 + header + data);
        assert!(st.len() < 1 << 20);
        let v = tensor_values(&descs[1], false);
        assert!(v.iter().all(|x| *x == 1.0), "{} is a norm", descs[1].name);
        let w = tensor_values(&descs[0], false);
        let mean = w.iter().map(|x| f64::from(*x)).sum::<f64>() / w.len() as f64;
        let std = (w.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / w.len() as f64).sqrt();
        assert!(mean.abs() < 0.002 && (0.015..0.025).contains(&std), "mean {mean} std {std}");
        assert!(w.iter().all(|x| x.abs() < 0.07));
        for d in &descs {
            assert!(d.shape.last().is_some_and(|c| c % 32 == 0), "{}: rows are whole Q8_0 blocks", d.name);
        }
    }

    #[test]
    fn synthetic_wide_rows_are_whole_super_blocks_with_special_rows() {
        assert_eq!(wide_llama_files(), wide_llama_files());
        let descs = tensor_descs(&WIDE);
        assert_eq!(descs.len(), 3 + 9 * WIDE.layers as usize);
        for d in &descs {
            assert!(d.shape.last().is_some_and(|c| c % 256 == 0), "{}: rows are whole K-quant blocks", d.name);
        }
        let q = descs.iter().find(|d| d.name == "model.layers.1.self_attn.q_proj.weight").expect("q_proj");
        let v = tensor_values(q, true);
        let cols = q.shape[1] as usize;
        assert!(v[3 * cols..4 * cols].iter().all(|x| *x == 0.015625), "constant row");
        assert!(v[5 * cols..6 * cols].iter().all(|x| *x == 0.0), "zero row");
        let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(max > 0.2, "outliers: max {max}");
        // The special rows are the wide model's only: the tiny one is unchanged.
        assert_eq!(tensor_values(q, false)[3 * cols..4 * cols].iter().filter(|x| **x == 0.015625).count(), 0);
    }

    #[test]
    fn synthetic_write_is_atomic_and_idempotent() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let dir = tempfile::tempdir().expect("temp dir");
            let loc = Location::local(dir.path().join("tiny-llama"));
            assert!(!tiny_llama_exists(&loc).await.expect("check"));
            let first = write_tiny_llama(&loc).await.expect("write");
            assert!(tiny_llama_exists(&loc).await.expect("check"));
            // A re-run keeps identical files; a missing one is written again.
            std::fs::remove_file(dir.path().join("tiny-llama").join("config.json")).expect("remove");
            let again = write_tiny_llama(&loc).await.expect("rewrite");
            assert_eq!(first, again);
            // A file with other bytes is never replaced.
            std::fs::write(dir.path().join("tiny-llama").join("tokenizer.json"), b"{}").expect("overwrite");
            assert!(matches!(
                write_tiny_llama(&loc).await,
                Err(crate::Error::Store(quantfarm_store::Error::Exists { .. }))
            ));
        });
    }

    /// A file another writer committed between our listing and our commit (the chaos test's killed worker whose
    /// upload the store finished) is kept when its bytes are ours, refused when they are not.
    #[test]
    fn a_file_committed_meanwhile_is_kept_when_identical() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let dir = tempfile::tempdir().expect("temp dir");
            let target = Location::local(dir.path().join("tokenizer.json"));
            for (theirs, kept) in [(&b"same"[..], true), (&b"other"[..], false)] {
                let _ = std::fs::remove_file(dir.path().join("tokenizer.json"));
                let mut sink = StagedSink::create(&target, false).await.expect("stage");
                sink.write(b"same").await.expect("write");
                std::fs::write(dir.path().join("tokenizer.json"), theirs).expect("the other writer");
                let got = commit_or_keep(sink, &target, b"same").await;
                match got {
                    Ok(c) => assert!(kept, "other bytes were accepted: {c:?}"),
                    Err(e) => {
                        assert!(!kept, "identical bytes were refused: {e}");
                        assert!(matches!(e, crate::Error::Store(quantfarm_store::Error::Exists { .. })), "{e}");
                    }
                }
            }
        });
    }
}
