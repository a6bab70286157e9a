//! A Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) rebuilt from a GGUF's tokenizer keys, for
//! GGUF → HF / MLX when the original tokenizer files are not at hand: the inverse of what convert_hf_to_gguf writes
//! (`_set_vocab_gpt2`, `SpecialVocab`).
//!
//! GPT-2-style BPE (`tokenizer.ggml.model = gpt2`): normal tokens become the BPE vocabulary, control and
//! user-defined tokens the added tokens (`special` for control ones), `tokenizer.ggml.merges` the merges, and the
//! normalizer, pre-tokenizer and decoder come from `mappings/pre-tokenizers.yaml`'s row for `tokenizer.ggml.pre`
//! (the GGUF names the pre-tokenizer but does not hold it). The special tokens, `add_bos`/`add_eos` and the chat
//! template go to tokenizer_config.json. SentencePiece GGUFs (`llama`) are refused for now.

use serde_json::{json, Map, Value as Json};

use super::mapping::{pre_tokenizers, PRE_TOKENIZERS_FILE};
use super::tokenizer::{CONTROL, NORMAL, USER_DEFINED};
use crate::error::{Error, Result};
use crate::gguf::{Array, Value};

/// `(tokenizer.json, tokenizer_config.json)` from the GGUF metadata `kv` (`file` names it in errors).
pub fn rebuild(kv: &[(String, Value)], file: &str) -> Result<(Json, Json)> {
    let get = |k: &str| kv.iter().find(|(key, _)| key == k).map(|(_, v)| v);
    let string = |k: &str| match get(k) {
        Some(Value::String(s)) => s.as_str().map(str::to_string),
        _ => None,
    };
    let model = string("tokenizer.ggml.model").ok_or_else(|| Error::format(file, "tokenizer.ggml.model", "missing"))?;
    if model != "gpt2" {
        return Err(Error::format(
            file,
            "tokenizer.ggml.model",
            format!("{model:?}: only GPT-2-style BPE tokenizers are rebuilt yet (SentencePiece is not)"),
        ));
    }
    let Some(Value::Array(Array::String(tokens))) = get("tokenizer.ggml.tokens") else {
        return Err(Error::format(file, "tokenizer.ggml.tokens", "missing or not a list of strings"));
    };
    let types: Vec<i32> = match get("tokenizer.ggml.token_type") {
        Some(Value::Array(Array::I32(t))) if t.len() == tokens.len() => t.clone(),
        None => vec![NORMAL; tokens.len()],
        _ => return Err(Error::format(file, "tokenizer.ggml.token_type", "not one i32 per token")),
    };
    let Some(Value::Array(Array::String(merges))) = get("tokenizer.ggml.merges") else {
        return Err(Error::format(file, "tokenizer.ggml.merges", "missing: a BPE tokenizer needs its merges"));
    };
    let pre = string("tokenizer.ggml.pre").unwrap_or_else(|| "default".into());
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

    let text = |i: usize| tokens[i].to_string_lossy();
    let mut vocab = Map::new();
    let mut added = Vec::new();
    let mut decoder = Map::new();
    for (i, ty) in types.iter().enumerate() {
        match *ty {
            NORMAL => {
                vocab.entry(text(i)).or_insert(Json::from(i));
            }
            CONTROL | USER_DEFINED => {
                let special = *ty == CONTROL;
                added.push(json!({
                    "id": i, "content": text(i), "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": false, "special": special,
                }));
                decoder.insert(
                    i.to_string(),
                    json!({
                        "content": text(i), "lstrip": false, "normalized": false, "rstrip": false,
                        "single_word": false, "special": special,
                    }),
                );
            }
            _ => {} // unused padding ([PADn]) and anything else: not part of the HF vocabulary
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
    let name_of = |i: Option<usize>| i.filter(|i| *i < tokens.len()).map(text);
    let mut single = Vec::new();
    let mut specials = Map::new();
    let mut special = |i: Option<usize>, seq: &mut Vec<Json>| {
        if let Some(t) = name_of(i) {
            seq.push(json!({"SpecialToken": {"id": t, "type_id": 0}}));
            specials.insert(t.clone(), json!({"id": t, "ids": [i], "tokens": [t]}));
        }
    };
    if add_bos == Some(true) {
        special(bos, &mut single);
    }
    single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    if add_eos == Some(true) {
        special(eos, &mut single);
    }
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": sections.normalizer,
        "pre_tokenizer": sections.pre_tokenizer,
        "post_processor": {"type": "TemplateProcessing", "single": single, "pair": [], "special_tokens": specials},
        "decoder": sections.decoder,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": pairs,
        },
    });

    let mut config = Map::new();
    if let Some(b) = add_bos {
        config.insert("add_bos_token".into(), b.into());
    }
    if let Some(b) = add_eos {
        config.insert("add_eos_token".into(), b.into());
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
    Ok((tokenizer, Json::Object(config)))
}
