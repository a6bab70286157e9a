//! The tokenizer keys as convert_hf_to_gguf writes them (`conversion/base.py`, llama.cpp 0c1e570), without running a
//! tokenizer: GPT-2-style BPE from tokenizer.json (`TextModel._set_vocab_gpt2`, `get_vocab_base`) and SentencePiece
//! from tokenizer.model (`_set_vocab_sentencepiece`, `_create_vocab_sentencepiece`), each followed by
//! [`special_vocab::add`] (`gguf-py/gguf/vocab.py::SpecialVocab`).

use serde_json::{Map, Value as Json};
use sha2::{Digest, Sha256};

use super::hf::HfFiles;
use super::mapping::{pre_tokenizers, TokenizerKind, PRE_TOKENIZERS_FILE};
use super::metadata::Kvs;
use super::sentencepiece::{self, PieceType};
use super::special_vocab;
use crate::error::{Error, Result};
use crate::gguf::{Array, GgufStr, Value};

/// gguf `TokenType`.
pub(super) const NORMAL: i32 = 1;
pub(super) const UNKNOWN: i32 = 2;
pub(super) const CONTROL: i32 = 3;
pub(super) const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;
const BYTE: i32 = 6;

/// Appends the tokenizer group from the first reader of `kinds` whose files are in the checkpoint, as the
/// converter's `set_vocab` falls through `FileNotFoundError`s.
pub fn keys(kinds: &[TokenizerKind], hf: &HfFiles, kv: &mut Kvs) -> Result<()> {
    for kind in kinds {
        match kind {
            TokenizerKind::Sentencepiece => {
                if let Some(model) = &hf.sentencepiece {
                    return spm_keys(hf, model, SpmFlavor::Text, kv);
                }
            }
            TokenizerKind::LlamaHf => {
                if is_llama_hf(hf.tokenizer.as_ref()) {
                    return Err(Error::format(
                        hf.file_name("tokenizer.json"),
                        "model",
                        "a BPE with byte_fallback (a SentencePiece vocabulary converted to tokenizer.json, \
                         convert_hf_to_gguf's LlamaHfVocab) is not supported yet; give tokenizer.model too",
                    ));
                }
            }
            TokenizerKind::Gpt2 => return gpt2_keys(hf, kv),
            TokenizerKind::Phi3 => {
                let class = hf
                    .tokenizer_config_value("tokenizer_class")
                    .ok_or_else(|| Error::format(hf.file_name("tokenizer_config.json"), "tokenizer_class", "missing"))?
                    .as_str();
                if class == Some("GPT2Tokenizer") {
                    return gpt2_keys(hf, kv);
                }
                let model = hf.sentencepiece.as_ref().ok_or_else(|| {
                    Error::format(hf.file_name("tokenizer.model"), "tokenizer.model", "missing (Phi-3 reads it)")
                })?;
                return spm_keys(hf, model, SpmFlavor::Phi3, kv);
            }
        }
    }
    Err(Error::format(
        hf.file_name("tokenizer.model"),
        "tokenizer",
        format!("none of the vocabularies this architecture reads ({kinds:?}) is in the checkpoint"),
    ))
}

/// `LlamaHfVocab`'s test: a BPE with `byte_fallback` and a `Sequence` decoder.
fn is_llama_hf(tok: Option<&Json>) -> bool {
    let Some(tok) = tok else { return false };
    tok.pointer("/model/type").and_then(Json::as_str) == Some("BPE")
        && tok.pointer("/model/byte_fallback").and_then(Json::as_bool) == Some(true)
        && tok.pointer("/decoder/type").and_then(Json::as_str) == Some("Sequence")
}

/// Which `set_vocab` reads a SentencePiece vocabulary: they differ in the vocabulary size they pad to and in how
/// they treat the added tokens.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SpmFlavor {
    /// `TextModel._create_vocab_sentencepiece` (`conversion/base.py`): padded to `vocab_size_per_layer_input` or
    /// `vocab_size` (or the model's size), pieces and added tokens past it ignored; `added_tokens_decoder`
    /// entries CONTROL when special or special-looking, else USER_DEFINED with `▁` read as a space.
    Text,
    /// `Phi3MiniModel.set_vocab` (`conversion/phi.py`): padded to `vocab_size`; `added_tokens_decoder` and then
    /// tokenizer.json's `added_tokens` written as they are, CONTROL exactly when marked special. Ids past the
    /// vocabulary are an error (the converter fails on them with an IndexError).
    Phi3,
}

/// A SentencePiece vocabulary: tokens, scores and types from the model's pieces, padded to the vocabulary size,
/// overridden by added_tokens.json, tokenizer_config.json's `added_tokens_decoder` (and for Phi-3 tokenizer.json's
/// `added_tokens`).
fn spm_keys(hf: &HfFiles, model: &[u8], flavor: SpmFlavor, kv: &mut Kvs) -> Result<()> {
    let file = hf.file_name("tokenizer.model");
    let pieces = sentencepiece::pieces(model, &file)?;
    let vocab_fields: &[&str] = match flavor {
        // find_hparam(["vocab_size_per_layer_input", "vocab_size"], optional=True) or tokenizer.vocab_size()
        SpmFlavor::Text => &["vocab_size_per_layer_input", "vocab_size"],
        // self.hparams.get('vocab_size', tokenizer.vocab_size())
        SpmFlavor::Phi3 => &["vocab_size"],
    };
    let n = vocab_fields
        .iter()
        .find_map(|f| hf.config.get(*f).filter(|v| !v.is_null()))
        .map(|v| v.as_u64().ok_or_else(|| Error::format(hf.file_name("config.json"), "vocab_size", "not an integer")))
        .transpose()?
        .filter(|n| *n > 0 || flavor == SpmFlavor::Phi3)
        .unwrap_or(pieces.len() as u64) as usize;
    if flavor == SpmFlavor::Phi3 && pieces.len() > n {
        return Err(Error::format(
            hf.file_name("config.json"),
            "vocab_size",
            format!("{n} is smaller than {file}'s {} pieces", pieces.len()),
        ));
    }
    let mut tokens: Vec<String> = (0..n).map(|i| format!("[PAD{i}]")).collect();
    let mut scores = vec![-10000.0f32; n];
    let mut types = vec![UNUSED; n];
    for (id, p) in pieces.iter().enumerate().take(n) {
        tokens[id] = p.piece.clone();
        scores[id] = p.score;
        types[id] = match p.ty {
            PieceType::Unknown => UNKNOWN,
            PieceType::Control => CONTROL,
            PieceType::Unused => UNUSED,
            PieceType::Byte => BYTE,
            // SentencePieceProcessor has no IsUserDefined: such pieces are written NORMAL.
            PieceType::Normal | PieceType::UserDefined => NORMAL,
        };
    }
    if let Some(added) = &hf.added_tokens {
        let added = added
            .as_object()
            .ok_or_else(|| Error::format(hf.file_name("added_tokens.json"), "added_tokens.json", "is not an object"))?;
        for (token, id) in added {
            let id = id
                .as_u64()
                .ok_or_else(|| Error::format(hf.file_name("added_tokens.json"), token.as_str(), "is not a token id"))?
                as usize;
            if id < n {
                tokens[id] = token.clone();
                scores[id] = -1000.0;
                types[id] = USER_DEFINED;
            }
        }
    }
    let tc_file = hf.file_name("tokenizer_config.json");
    let decoder = hf.tokenizer_config.as_ref().and_then(|c| c.get("added_tokens_decoder")).and_then(Json::as_object);
    let mut added: Vec<(usize, &str, bool, &str, String)> = Vec::new();
    for (id, data) in decoder.into_iter().flatten() {
        let bad = |msg: &str| Error::format(&tc_file, format!("added_tokens_decoder.{id}"), msg);
        let id: usize = id.parse().map_err(|_| bad("the key is not a token id"))?;
        let content = data.get("content").and_then(Json::as_str).ok_or_else(|| bad("has no content"))?;
        let special = data.get("special").and_then(Json::as_bool).unwrap_or(false);
        added.push((id, content, special, &tc_file, format!("added_tokens_decoder.{id}")));
    }
    let tok_file = hf.file_name("tokenizer.json");
    if flavor == SpmFlavor::Phi3 {
        let list = hf.tokenizer.as_ref().and_then(|t| t.get("added_tokens")).and_then(Json::as_array);
        for (i, data) in list.into_iter().flatten().enumerate() {
            let bad = |msg: &str| Error::format(&tok_file, format!("added_tokens[{i}]"), msg);
            let id = data.get("id").and_then(Json::as_u64).ok_or_else(|| bad("has no id"))? as usize;
            let content = data.get("content").and_then(Json::as_str).ok_or_else(|| bad("has no content"))?;
            let special = data.get("special").and_then(Json::as_bool).unwrap_or(false);
            added.push((id, content, special, &tok_file, format!("added_tokens[{i}]")));
        }
    }
    for (id, content, special, in_file, field) in added {
        if id >= n {
            match flavor {
                SpmFlavor::Text => continue,
                SpmFlavor::Phi3 => {
                    return Err(Error::format(in_file, field, format!("token id {id} is not below vocab_size {n}")))
                }
            }
        }
        let (token, ty) = match flavor {
            SpmFlavor::Text if special || looks_special(content) => (content.to_string(), CONTROL),
            SpmFlavor::Text => (content.replace('\u{2581}', " "), USER_DEFINED),
            SpmFlavor::Phi3 => (content.to_string(), if special { CONTROL } else { USER_DEFINED }),
        };
        tokens[id] = token;
        types[id] = ty;
        scores[id] = -1000.0;
    }
    kv.set("tokenizer.ggml.model", Value::String("llama".into()));
    kv.set("tokenizer.ggml.pre", Value::String("default".into()));
    kv.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens.iter().map(|t| t.as_str().into()).collect())));
    kv.set("tokenizer.ggml.scores", Value::Array(Array::F32(scores)));
    kv.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    special_vocab::add(hf, false, Some(n as u64), kv)
}

/// `_set_vocab_gpt2`.
fn gpt2_keys(hf: &HfFiles, kv: &mut Kvs) -> Result<()> {
    let tok_file = hf.file_name("tokenizer.json");
    let tok = hf
        .tokenizer
        .as_ref()
        .ok_or_else(|| Error::format(&tok_file, "tokenizer.json", "missing: a GPT-2 BPE vocabulary is read from it"))?;
    let bad = |field: &str, msg: &str| Error::format(&tok_file, field, msg);

    let model = tok.get("model").and_then(Json::as_object).ok_or_else(|| bad("model", "missing or not an object"))?;
    if model.get("type").and_then(Json::as_str) != Some("BPE") {
        return Err(bad("model.type", "is not BPE (only GPT-2-style BPE vocabularies are supported)"));
    }
    let vocab = model.get("vocab").and_then(Json::as_object).ok_or_else(|| bad("model.vocab", "missing"))?;
    let added: Vec<&Map<String, Json>> = match tok.get("added_tokens") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(a)) => a.iter().filter_map(Json::as_object).collect(),
        Some(_) => return Err(bad("added_tokens", "is not a list")),
    };

    // get_vocab_base: id → token from the vocab plus the added tokens.
    let mut by_id: std::collections::BTreeMap<u64, (String, Option<bool>)> = std::collections::BTreeMap::new();
    for (t, id) in vocab {
        let id = id.as_u64().ok_or_else(|| bad(&format!("model.vocab.{t}"), "is not a token id"))?;
        by_id.insert(id, (t.clone(), None));
    }
    for a in &added {
        let (Some(id), Some(content)) = (a.get("id").and_then(Json::as_u64), a.get("content").and_then(Json::as_str))
        else {
            return Err(bad("added_tokens", "an entry lacks id or content"));
        };
        let special = a.get("special").and_then(Json::as_bool).unwrap_or(false);
        by_id.insert(id, (content.to_string(), Some(special)));
    }
    let n_vocab = match hf.config.get("vocab_size") {
        Some(v) => {
            v.as_u64().ok_or_else(|| Error::format(hf.file_name("config.json"), "vocab_size", "not an integer"))?
        }
        None => by_id.len() as u64,
    };
    if let Some((&max, _)) = by_id.last_key_value() {
        if max >= n_vocab {
            return Err(bad("model.vocab", &format!("token id {max} is not below vocab_size {n_vocab}")));
        }
    }
    let mut tokens = Vec::with_capacity(n_vocab as usize);
    let mut types = Vec::with_capacity(n_vocab as usize);
    for i in 0..n_vocab {
        match by_id.get(&i) {
            None => {
                tokens.push(GgufStr::from(format!("[PAD{i}]").as_str()));
                types.push(UNUSED);
            }
            Some((t, None)) => {
                tokens.push(GgufStr::from(t.as_str()));
                types.push(NORMAL);
            }
            Some((t, Some(special))) => {
                if *special || looks_special(t) {
                    tokens.push(GgufStr::from(t.as_str()));
                    types.push(CONTROL);
                } else {
                    tokens.push(GgufStr::from(t.replace('\u{2581}', " ").as_str()));
                    types.push(USER_DEFINED);
                }
            }
        }
    }

    kv.set("tokenizer.ggml.model", Value::String("gpt2".into()));
    let token_at = |id: u64| by_id.get(&id).map(|(t, _)| t.as_str());
    kv.set("tokenizer.ggml.pre", Value::String(pre_tokenizer_name(hf, tok, &token_at)?.as_str().into()));
    kv.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    kv.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    special_vocab::add(hf, true, None, kv)
}

/// `TextModel.does_token_look_special`.
fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<\u{ff5c}") && t.ends_with("\u{ff5c}>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

/// sha256 of the `pre_tokenizer` section as compact JSON with sorted keys (independent of serde_json's
/// `preserve_order`).
pub fn pre_tokenizer_sha256(pre: &Json) -> String {
    fn sorted(v: &Json) -> Json {
        match v {
            Json::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                Json::Object(keys.into_iter().map(|k| (k.clone(), sorted(&m[k]))).collect())
            }
            Json::Array(a) => Json::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    let text = serde_json::to_string(&sorted(pre)).unwrap_or_default();
    quantfarm_store::hex(&Sha256::digest(text.as_bytes()))
}

/// Whether tokenizer.json's post-processor adds a BOS: a `TemplateProcessing` (alone or in a `Sequence`) whose
/// `single` template starts with a special token, as Llama 3's `<|begin_of_text|> $A`.
fn adds_bos(tok: &Json) -> bool {
    fn template_bos(p: &Json) -> bool {
        match p.get("type").and_then(Json::as_str) {
            Some("TemplateProcessing") => {
                p.pointer("/single/0").and_then(Json::as_object).is_some_and(|first| first.contains_key("SpecialToken"))
            }
            Some("Sequence") => {
                p.get("processors").and_then(Json::as_array).is_some_and(|ps| ps.iter().any(template_bos))
            }
            _ => false,
        }
    }
    tok.get("post_processor").is_some_and(template_bos)
}

/// `tokenizer.ggml.pre` from the table in `mappings/pre-tokenizers.yaml`.
fn pre_tokenizer_name<'v>(hf: &HfFiles, tok: &Json, token_at: &dyn Fn(u64) -> Option<&'v str>) -> Result<String> {
    let pre = tok.get("pre_tokenizer").unwrap_or(&Json::Null);
    let sha = pre_tokenizer_sha256(pre);
    let bos = adds_bos(tok);
    let matches = |p: &super::mapping::PreTokenizer| {
        p.sha256 == sha
            && p.bos.is_none_or(|b| b == bos)
            && p.tokens.iter().all(|(id, t)| token_at(*id) == Some(t.as_str()))
    };
    pre_tokenizers()?.into_iter().find(|p| matches(p)).map(|p| p.pre).ok_or_else(|| Error::Mapping {
        file: format!("mappings/{PRE_TOKENIZERS_FILE}"),
        msg: format!(
            "{}: pre_tokenizer {} (sha256 {sha}, {} BOS) is not in the table; add an entry with the \
                 tokenizer.ggml.pre name convert_hf_to_gguf.py gives this model",
            hf.file_name("tokenizer.json"),
            serde_json::to_string(pre).unwrap_or_default(),
            if bos { "adds a" } else { "adds no" }
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bos_is_read_from_the_post_processor() {
        let bos = serde_json::json!({"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]});
        assert!(adds_bos(&serde_json::json!({"post_processor": bos})));
        let seq =
            serde_json::json!({"post_processor": {"type": "Sequence", "processors": [{"type": "ByteLevel"}, bos]}});
        assert!(adds_bos(&seq));
        let plain = serde_json::json!({"post_processor": {"type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}]}});
        assert!(!adds_bos(&plain));
        assert!(!adds_bos(&serde_json::json!({"post_processor": {"type": "ByteLevel"}})));
    }
}
