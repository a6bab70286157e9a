//! A Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) rebuilt from a GGUF's tokenizer keys, for
//! GGUF → HF / MLX when the original tokenizer files are not at hand: the inverse of what convert_hf_to_gguf writes
//! (`_set_vocab_gpt2`, `SpecialVocab`).
//!
//! GPT-2-style BPE (`tokenizer.ggml.model = gpt2`): normal tokens become the BPE vocabulary, control and
//! user-defined tokens the added tokens (`special` for control ones), `tokenizer.ggml.merges` the merges, and the
//! normalizer, pre-tokenizer and decoder come from `mappings/pre-tokenizers.yaml`'s row for `tokenizer.ggml.pre`
//! (the GGUF names the pre-tokenizer but does not hold it).
//!
//! SentencePiece (`tokenizer.ggml.model = llama`): every piece is in the vocabulary in id order, the merges are
//! generated from the pieces and their scores as transformers' `generate_merges` does (every split of a piece into
//! two pieces, ordered by the piece's score, highest first: the order llama.cpp's SPM tokenizer merges in), byte
//! fallback on, spaces replaced by `▁` and one `▁` prepended when `add_space_prefix` (Llama's legacy normalizer,
//! which is what llama.cpp does), and the Llama decoder. Unknown and control pieces are special added tokens, user-defined ones plain added tokens.
//!
//! The special tokens, `add_bos`/`add_eos` and the chat template go to tokenizer_config.json.

use serde_json::{json, Map, Value as Json};

use super::mapping::{pre_tokenizers, PRE_TOKENIZERS_FILE};
use super::tokenizer::{CONTROL, NORMAL, UNKNOWN, USER_DEFINED};
use crate::error::{Error, Result};
use crate::gguf::{Array, Value};

/// The tokenizer files rebuilt from a GGUF.
pub struct Rebuilt {
    pub tokenizer_json: Json,
    pub tokenizer_config: Json,
    /// A SentencePiece vocabulary's `tokenizer.model`, which convert_hf_to_gguf reads before tokenizer.json.
    pub sentencepiece: Option<Vec<u8>>,
}

/// The tokenizer files from the GGUF metadata `kv` (`file` names it in errors).
pub fn rebuild(kv: &[(String, Value)], file: &str) -> Result<Rebuilt> {
    let get = |k: &str| kv.iter().find(|(key, _)| key == k).map(|(_, v)| v);
    let string = |k: &str| match get(k) {
        Some(Value::String(s)) => s.as_str().map(str::to_string),
        _ => None,
    };
    let model = string("tokenizer.ggml.model").ok_or_else(|| Error::format(file, "tokenizer.ggml.model", "missing"))?;
    let Some(Value::Array(Array::String(tokens))) = get("tokenizer.ggml.tokens") else {
        return Err(Error::format(file, "tokenizer.ggml.tokens", "missing or not a list of strings"));
    };
    let tokens: Vec<String> = tokens.iter().map(|t| t.to_string_lossy()).collect();
    let types: Vec<i32> = match get("tokenizer.ggml.token_type") {
        Some(Value::Array(Array::I32(t))) if t.len() == tokens.len() => t.clone(),
        None => vec![NORMAL; tokens.len()],
        _ => return Err(Error::format(file, "tokenizer.ggml.token_type", "not one i32 per token")),
    };
    let (sections, spm) = match model.as_str() {
        "gpt2" => (gpt2(kv, file, &tokens, &types)?, false),
        "llama" => (sentencepiece(kv, file, &tokens)?, true),
        other => {
            return Err(Error::format(
                file,
                "tokenizer.ggml.model",
                format!("{other:?}: only GPT-2-style BPE (gpt2) and SentencePiece (llama) tokenizers are rebuilt"),
            ))
        }
    };
    let text = |i: usize| tokens[i].clone();
    let scores = match get("tokenizer.ggml.scores") {
        Some(Value::Array(Array::F32(s))) if s.len() == tokens.len() => Some(s.clone()),
        _ => None,
    };
    let mut added = Vec::new();
    let mut decoder = Map::new();
    for (i, ty) in types.iter().enumerate() {
        let special = match *ty {
            CONTROL => true,
            UNKNOWN if spm => true,
            USER_DEFINED => false,
            _ => continue, // normal pieces, bytes, unused padding ([PADn]): not added tokens
        };
        added.push(json!({
            "id": i, "content": text(i), "single_word": false, "lstrip": false, "rstrip": false,
            "normalized": false, "special": special,
        }));
        // With tokenizer.model beside it, `_create_vocab_sentencepiece` takes the pieces' own types and scores and
        // makes every entry of added_tokens_decoder a control (or user-defined) token scored -1000: only those that
        // were so go in.
        if spm && scores.as_ref().is_some_and(|s| s[i] != -1000.0 || *ty == UNKNOWN) {
            continue;
        }
        decoder.insert(
            i.to_string(),
            json!({
                "content": text(i), "lstrip": false, "normalized": false, "rstrip": false,
                "single_word": false, "special": special,
            }),
        );
    }

    let id = |k: &str| match get(k) {
        Some(Value::U32(x)) => Some(*x as usize),
        _ => None,
    };
    let flag = |k: &str| match get(k) {
        Some(Value::Bool(b)) => Some(*b),
        _ => None,
    };
    let (bos, eos) = (id("tokenizer.ggml.bos_token_id"), id("tokenizer.ggml.eos_token_id"));
    let (add_bos, add_eos) = (flag("tokenizer.ggml.add_bos_token"), flag("tokenizer.ggml.add_eos_token"));
    let add_sep = flag("tokenizer.ggml.add_sep_token");
    // gguf-py's name for the separator's id.
    let sep = id("tokenizer.ggml.seperator_token_id").or(eos);
    let name_of = |i: Option<usize>| i.filter(|i| *i < tokens.len()).map(text);
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = Map::new();
    let mut special = |i: Option<usize>, seq: &mut Vec<Json>, type_id: u32| {
        if let Some(t) = name_of(i) {
            seq.push(json!({"SpecialToken": {"id": t, "type_id": type_id}}));
            specials.insert(t.clone(), json!({"id": t, "ids": [i], "tokens": [t]}));
        }
    };
    let sequence = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
    let (bos_first, eos_last) = (add_bos == Some(true), add_eos == Some(true));
    if bos_first {
        special(bos, &mut single, 0);
    }
    single.push(sequence("A", 0));
    if eos_last {
        special(eos, &mut single, 0);
    }
    // The pair template, from which gguf-py's SpecialVocab reads add_sep_token (`_try_load_from_tokenizer_json`):
    // what lies between A and B past the single template's ends. A separator (or EOS) there adds it; with an EOS
    // closing each sequence only a second one does. Without one, Llama 3's `BOS A BOS B` says it adds none.
    let middle: Option<Vec<Option<usize>>> = match add_sep {
        Some(true) if eos_last => Some(vec![eos, sep]),
        Some(true) => Some(vec![sep]),
        Some(false) if bos_first && eos_last => Some(vec![eos, bos]),
        Some(false) if bos_first => Some(vec![bos]),
        _ => None,
    };
    if let Some(middle) = middle.filter(|m| m.iter().all(|i| name_of(*i).is_some())) {
        if bos_first {
            special(bos, &mut pair, 0);
        }
        pair.push(sequence("A", 0));
        for i in middle {
            special(i, &mut pair, 1);
        }
        pair.push(sequence("B", 1));
        if eos_last {
            special(eos, &mut pair, 1);
        }
    }
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": sections.normalizer,
        "pre_tokenizer": sections.pre_tokenizer,
        "post_processor": {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials},
        "decoder": sections.decoder,
        "model": sections.model,
    });

    let mut config = Map::new();
    if let Some(b) = add_bos {
        config.insert("add_bos_token".into(), b.into());
    }
    if let Some(b) = add_eos {
        config.insert("add_eos_token".into(), b.into());
    }
    // LlamaModel.set_vocab reads tokenizer.ggml.add_space_prefix back from here (Granite's `false`).
    if let Some(b) = flag("tokenizer.ggml.add_space_prefix") {
        config.insert("add_prefix_space".into(), b.into());
    }
    config.insert("added_tokens_decoder".into(), Json::Object(decoder));
    for (field, key) in [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
    ] {
        if let Some(t) = name_of(id(key)) {
            config.insert(field.into(), t.into());
        }
    }
    if let Some(t) = string("tokenizer.chat_template") {
        config.insert("chat_template".into(), t.into());
    }
    config.insert("clean_up_tokenization_spaces".into(), false.into());
    config.insert("tokenizer_class".into(), "PreTrainedTokenizerFast".into());
    let sentencepiece = match (spm, &scores) {
        (true, Some(scores)) => Some(sentencepiece_model(&tokens, scores, &types, kv, file)?),
        _ => None,
    };
    Ok(Rebuilt { tokenizer_json: tokenizer, tokenizer_config: Json::Object(config), sentencepiece })
}

/// A SentencePiece `tokenizer.model` holding every GGUF token as a piece with its score and type (the converter's
/// `[PADn]` padding as unused pieces, which it reads back as such); the unknown token is the model's unknown piece
/// (SentencePiece needs one), whatever type added_tokens_decoder gave it.
fn sentencepiece_model(
    tokens: &[String],
    scores: &[f32],
    types: &[i32],
    kv: &[(String, Value)],
    file: &str,
) -> Result<Vec<u8>> {
    use super::sentencepiece::{write_model, ModelSpec, Piece, PieceType};
    let id = |k: &str| match get(kv, k) {
        Some(Value::U32(x)) => Some(*x),
        _ => None,
    };
    let unk = id("tokenizer.ggml.unknown_token_id");
    let mut pieces = Vec::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        let ty = match types[i] {
            _ if unk == Some(i as u32) => PieceType::Unknown,
            NORMAL => PieceType::Normal,
            UNKNOWN => PieceType::Unknown,
            CONTROL => PieceType::Control,
            USER_DEFINED => PieceType::UserDefined,
            5 => PieceType::Unused,
            6 => PieceType::Byte,
            other => {
                return Err(Error::format(
                    file,
                    format!("tokenizer.ggml.token_type[{i}]"),
                    format!("{other} is no SentencePiece piece type (1-6)"),
                ))
            }
        };
        pieces.push(Piece { piece: t.clone(), score: scores[i], ty });
    }
    let spec = ModelSpec {
        add_dummy_prefix: !matches!(get(kv, "tokenizer.ggml.add_space_prefix"), Some(Value::Bool(false))),
        unk_id: unk,
        bos_id: id("tokenizer.ggml.bos_token_id"),
        eos_id: id("tokenizer.ggml.eos_token_id"),
        pad_id: id("tokenizer.ggml.padding_token_id"),
    };
    Ok(write_model(&pieces, &spec))
}

/// The model-specific parts of tokenizer.json.
struct Sections {
    model: Json,
    normalizer: Json,
    pre_tokenizer: Json,
    decoder: Json,
}

fn get<'a>(kv: &'a [(String, Value)], key: &str) -> Option<&'a Value> {
    kv.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// GPT-2-style BPE: normal tokens are the vocabulary, the GGUF's merges the merges, the pre-tokenizer's sections from
/// `mappings/pre-tokenizers.yaml`.
fn gpt2(kv: &[(String, Value)], file: &str, tokens: &[String], types: &[i32]) -> Result<Sections> {
    let Some(Value::Array(Array::String(merges))) = get(kv, "tokenizer.ggml.merges") else {
        return Err(Error::format(file, "tokenizer.ggml.merges", "missing: a BPE tokenizer needs its merges"));
    };
    let pre = match get(kv, "tokenizer.ggml.pre") {
        Some(Value::String(s)) => s.to_string_lossy(),
        _ => "default".into(),
    };
    let sections = pre_tokenizers()?
        .into_iter()
        .find(|p| p.pre == pre && p.sections.is_some())
        .and_then(|p| p.sections)
        .ok_or_else(|| Error::Mapping {
            file: format!("mappings/{PRE_TOKENIZERS_FILE}"),
            msg: format!(
                "{file}: pre-tokenizer {pre:?} has no tokenizer.json sections to rebuild it from; add the model's \
                 normalizer, pre_tokenizer and decoder to its row"
            ),
        })?;
    // The normal tokens, and the added ones that lie inside their range (tekken's 1,000 control tokens before
    // them, StarCoder's 19 in Granite's): the tokenizers library gives an added token missing from the vocabulary
    // the next free id, which for those is not theirs (ids after the last normal token are, as Qwen's are).
    let last_normal = types.iter().rposition(|t| *t == NORMAL).unwrap_or(0);
    let mut vocab = Map::new();
    for (i, ty) in types.iter().enumerate() {
        if *ty == NORMAL || (matches!(*ty, CONTROL | USER_DEFINED) && i < last_normal) {
            vocab.entry(tokens[i].clone()).or_insert(Json::from(i));
        }
    }
    let mut pairs = Vec::with_capacity(merges.len());
    for (i, m) in merges.iter().enumerate() {
        let m = m.to_string_lossy();
        let (a, b) = m.split_once(' ').ok_or_else(|| {
            Error::format(file, format!("tokenizer.ggml.merges[{i}]"), format!("{m:?} is not two parts"))
        })?;
        // SpecialVocab writes a space inside a part of the pair format as U+0120; in a byte-level vocabulary U+0120
        // is itself the space byte's character, so a part is taken as written whenever the vocabulary has it.
        let part = |p: &str| if vocab.contains_key(p) { p.to_string() } else { p.replace('\u{120}', " ") };
        pairs.push(json!([part(a), part(b)]));
    }
    Ok(Sections {
        model: json!({
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": pairs,
        }),
        normalizer: sections.normalizer,
        pre_tokenizer: sections.pre_tokenizer,
        decoder: sections.decoder,
    })
}

/// SentencePiece (Llama's BPE with byte fallback): every piece in id order, merges from the scores.
fn sentencepiece(kv: &[(String, Value)], file: &str, tokens: &[String]) -> Result<Sections> {
    let scores = match get(kv, "tokenizer.ggml.scores") {
        Some(Value::Array(Array::F32(s))) if s.len() == tokens.len() => s.clone(),
        _ => return Err(Error::format(file, "tokenizer.ggml.scores", "missing or not one f32 per token")),
    };
    // As transformers' `{piece: id}`: a repeated piece keeps its first place and its last id.
    let mut vocab = Map::new();
    let mut ids = std::collections::HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t.clone(), Json::from(i));
        ids.insert(t.as_str(), i);
    }
    let pairs: Vec<Json> = merges_by_score(tokens, &scores, &ids).into_iter().map(|(a, b)| json!([a, b])).collect();
    let prefix = !matches!(get(kv, "tokenizer.ggml.add_space_prefix"), Some(Value::Bool(false)));
    let unk = match get(kv, "tokenizer.ggml.unknown_token_id") {
        Some(Value::U32(i)) => tokens.get(*i as usize).map_or(Json::Null, |t| Json::from(t.as_str())),
        _ => Json::Null,
    };
    let mut normalizers = vec![json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"})];
    if prefix {
        normalizers.insert(0, json!({"type": "Prepend", "prepend": "\u{2581}"}));
    }
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    Ok(Sections {
        model: json!({
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab, "merges": pairs,
        }),
        // llama.cpp prepends the space even to text that starts with one (Metaspace's "first" would not).
        normalizer: json!({"type": "Sequence", "normalizers": normalizers}),
        pre_tokenizer: Json::Null,
        decoder: json!({"type": "Sequence", "decoders": decoders}),
    })
}

/// transformers' `generate_merges(vocab, vocab_scores)`: for each piece in id order, every split into two pieces of
/// the vocabulary (ordered by the parts' ids), then all of them sorted by (score, left length, right length),
/// highest first and otherwise stable. Lengths count characters, as Python's `len` does.
fn merges_by_score(
    tokens: &[String],
    scores: &[f32],
    ids: &std::collections::HashMap<&str, usize>,
) -> Vec<(String, String)> {
    let mut merges: Vec<(&str, &str, f32)> = Vec::new();
    // A dict keyed by piece: a repeated piece keeps its first place and its last score.
    let mut last_score = std::collections::HashMap::with_capacity(tokens.len());
    for (t, &score) in tokens.iter().zip(scores) {
        last_score.insert(t.as_str(), score);
    }
    let mut seen = std::collections::HashSet::new();
    for t in tokens {
        if !seen.insert(t.as_str()) {
            continue;
        }
        let score = last_score[t.as_str()];
        let mut local: Vec<(&str, &str, f32)> = t
            .char_indices()
            .skip(1)
            .map(|(at, _)| (&t[..at], &t[at..]))
            .filter(|(l, r)| ids.contains_key(l) && ids.contains_key(r))
            .map(|(l, r)| (l, r, score))
            .collect();
        local.sort_by_key(|(l, r, _)| (ids[l], ids[r]));
        merges.extend(local);
    }
    let key = |m: &(&str, &str, f32)| (m.2, m.0.chars().count(), m.1.chars().count());
    merges.sort_by(|a, b| key(b).partial_cmp(&key(a)).unwrap_or(std::cmp::Ordering::Equal));
    merges.into_iter().map(|(l, r, _)| (l.to_string(), r.to_string())).collect()
}
