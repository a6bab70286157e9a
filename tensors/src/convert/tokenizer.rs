//! The GPT-2-style BPE tokenizer keys, read from `tokenizer.json`, `tokenizer_config.json`, `config.json` and the
//! chat template files as convert_hf_to_gguf writes them (`TextModel._set_vocab_gpt2`, `get_vocab_base`,
//! `gguf.SpecialVocab`; ../shared/specs/ggml-llamacpp.md §6.4), without running a tokenizer.

use serde_json::{Map, Value as Json};
use sha2::{Digest, Sha256};

use super::hf::HfFiles;
use super::mapping::{pre_tokenizers, PRE_TOKENIZERS_FILE};
use super::metadata::Kvs;
use crate::error::{Error, Result};
use crate::gguf::{Array, GgufStr, Value};

/// gguf `TokenType`.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// `SpecialVocab.special_token_types`, in order; cls has no GGUF key and is resolved but not written.
const SPECIAL_TYPES: [&str; 7] = ["bos", "eos", "unk", "sep", "pad", "cls", "mask"];

fn special_id_key(typ: &str) -> Option<&'static str> {
    Some(match typ {
        "bos" => "tokenizer.ggml.bos_token_id",
        "eos" => "tokenizer.ggml.eos_token_id",
        "unk" => "tokenizer.ggml.unknown_token_id",
        "sep" => "tokenizer.ggml.seperator_token_id",
        "pad" => "tokenizer.ggml.padding_token_id",
        "mask" => "tokenizer.ggml.mask_token_id",
        _ => return None,
    })
}

fn add_special_key(typ: &str) -> Option<&'static str> {
    Some(match typ {
        "bos" => "tokenizer.ggml.add_bos_token",
        "eos" => "tokenizer.ggml.add_eos_token",
        "sep" => "tokenizer.ggml.add_sep_token",
        _ => return None,
    })
}

/// Appends the tokenizer group to `kv`.
pub fn gpt2_keys(hf: &HfFiles, kv: &mut Kvs) -> Result<()> {
    let tok_file = hf.file_name("tokenizer.json");
    let tok = hf.tokenizer.as_ref().ok_or_else(|| {
        Error::format(
            &tok_file,
            "tokenizer.json",
            "missing: a GPT-2 BPE vocabulary is read from it (sentencepiece is not supported)",
        )
    })?;
    if hf.has_sentencepiece {
        // LlamaModel.set_vocab tries sentencepiece first; writing gpt2 keys instead would silently differ.
        return Err(Error::format(
            hf.file_name("tokenizer.model"),
            "tokenizer.model",
            "sentencepiece vocabularies are not supported yet",
        ));
    }
    let bad = |field: &str, msg: &str| Error::format(&tok_file, field, msg);
    let tc = hf.tokenizer_config.as_ref().and_then(Json::as_object);

    // LlamaModel.set_vocab: tokenizer_config.json's add_prefix_space comes first.
    if let Some(b) = tc.and_then(|c| c.get("add_prefix_space")).and_then(Json::as_bool) {
        kv.set("tokenizer.ggml.add_space_prefix", Value::Bool(b));
    }

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
    kv.set("tokenizer.ggml.pre", Value::String(pre_tokenizer_name(hf, tok)?.as_str().into()));
    kv.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    kv.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    special_vocab(hf, tok, tc, &added, kv)
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
    crate::sink::hex(&Sha256::digest(text.as_bytes()))
}

/// `tokenizer.ggml.pre` from the table in `mappings/pre-tokenizers.yaml`.
fn pre_tokenizer_name(hf: &HfFiles, tok: &Json) -> Result<String> {
    let pre = tok.get("pre_tokenizer").unwrap_or(&Json::Null);
    let sha = pre_tokenizer_sha256(pre);
    pre_tokenizers()?.into_iter().find(|p| p.sha256 == sha).map(|p| p.pre).ok_or_else(|| Error::Mapping {
        file: format!("mappings/{PRE_TOKENIZERS_FILE}"),
        msg: format!(
            "{}: pre_tokenizer {} (sha256 {sha}) is not in the table; add an entry with the tokenizer.ggml.pre \
             name convert_hf_to_gguf.py gives this model",
            hf.file_name("tokenizer.json"),
            serde_json::to_string(pre).unwrap_or_default()
        ),
    })
}

/// `gguf.SpecialVocab(load_merges=True).add_to_gguf`: merges, special token ids, add_*_token flags, the chat
/// template and normalizer flags, each group in the order the Python dicts fill.
fn special_vocab(
    hf: &HfFiles,
    tok: &Json,
    tc: Option<&Map<String, Json>>,
    added: &[&Map<String, Json>],
    kv: &mut Kvs,
) -> Result<()> {
    let tok_file = hf.file_name("tokenizer.json");
    let merges = match tok.pointer("/model/merges") {
        Some(Json::Array(m)) if !m.is_empty() => m,
        _ => return Err(Error::format(&tok_file, "model.merges", "missing or empty (merges.txt is not supported)")),
    };
    let mut out = Vec::with_capacity(merges.len());
    for m in merges {
        match m {
            Json::String(s) => out.push(GgufStr::from(s.as_str())),
            Json::Array(pair) if pair.len() == 2 && pair.iter().all(Json::is_string) => {
                // Spaces inside parts are encoded as U+0120 (chr(ord(' ') + 256)).
                let parts: Vec<String> =
                    pair.iter().filter_map(Json::as_str).map(|p| p.replace(' ', "\u{120}")).collect();
                out.push(GgufStr::from(parts.join(" ").as_str()));
            }
            _ => return Err(Error::format(&tok_file, "model.merges", "unknown merges format")),
        }
    }
    kv.set("tokenizer.ggml.merges", Value::Array(Array::String(out)));

    // _try_load_from_tokenizer_json: the post-processor decides add_bos/add_eos first.
    let token_of = |typ: &str| -> Option<String> {
        match tc?.get(&format!("{typ}_token"))? {
            Json::String(s) => Some(s.clone()),
            Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
            _ => None,
        }
    };
    let mut add_special: Vec<(&str, bool)> = Vec::new();
    let set_default = |list: &mut Vec<(&str, bool)>, typ: &'static str, v: bool, force: bool| match list
        .iter_mut()
        .find(|(t, _)| *t == typ)
    {
        Some(e) if force => e.1 = v,
        Some(_) => {}
        None => list.push((typ, v)),
    };
    if let Some(pp) = tok.get("post_processor").filter(|p| !p.is_null()) {
        let procs: Vec<&Json> = match pp.get("processors").and_then(Json::as_array) {
            Some(list) => list.iter().collect(),
            None => vec![pp],
        };
        for p in procs {
            match p.get("type").and_then(Json::as_str) {
                Some("ByteLevel") => {
                    set_default(&mut add_special, "bos", false, false);
                    set_default(&mut add_special, "eos", false, false);
                }
                Some("RobertaProcessing") => {
                    for t in ["bos", "eos", "sep"] {
                        set_default(&mut add_special, t, true, true);
                    }
                }
                Some("TemplateProcessing") => {
                    let single = p.get("single").and_then(Json::as_array).map(Vec::as_slice).unwrap_or(&[]);
                    if single.len() > 1 {
                        let special =
                            |e: &Json| e.pointer("/SpecialToken/id").and_then(Json::as_str).map(str::to_string);
                        if let Some(first) = single.first().and_then(special) {
                            let hit =
                                Some(&first) == token_of("bos").as_ref() || Some(&first) == token_of("cls").as_ref();
                            if !hit {
                                return Err(unsupported_template(&tok_file, "leading", &first));
                            }
                            set_default(&mut add_special, "bos", true, true);
                        }
                        if let Some(last) = single.last().and_then(special) {
                            if Some(&last) != token_of("eos").as_ref() {
                                return Err(unsupported_template(&tok_file, "trailing", &last));
                            }
                            set_default(&mut add_special, "eos", true, true);
                        }
                        // The pair-template separator rules (add_sep) are not reproduced.
                        if p.get("pair").and_then(Json::as_array).is_some_and(|pair| pair.len() > single.len() + 1) {
                            return Err(unsupported_template(&tok_file, "pair separator", "(pair template)"));
                        }
                    }
                }
                _ => {}
            }
        }
    }

    // Special token ids: tokenizer_config strings resolved against added_tokens, then config.json ids; the first
    // value set for a type wins, and the GGUF keys follow the order they were set in.
    let mut ids: Vec<(&str, u64)> = Vec::new();
    if tc.is_some() {
        for typ in SPECIAL_TYPES {
            if let Some(content) = token_of(typ) {
                let id = added
                    .iter()
                    .find(|a| a.get("content").and_then(Json::as_str) == Some(content.as_str()))
                    .and_then(|a| a.get("id").and_then(Json::as_u64));
                if let Some(id) = id {
                    if !ids.iter().any(|(t, _)| *t == typ) {
                        ids.push((typ, id));
                    }
                }
            }
        }
    }
    for typ in SPECIAL_TYPES {
        if let Some(id) = hf.config.get(&format!("{typ}_token_id")).and_then(Json::as_u64) {
            if !ids.iter().any(|(t, _)| *t == typ) {
                ids.push((typ, id));
            }
        }
    }
    for (typ, id) in ids {
        if let Some(key) = special_id_key(typ) {
            let id = u32::try_from(id)
                .map_err(|_| Error::format(&tok_file, format!("{typ} token"), format!("id {id} does not fit u32")))?;
            kv.set(key, Value::U32(id));
        }
    }

    // add_*_token from tokenizer_config.json where the post-processor said nothing.
    if let Some(tc) = tc {
        for typ in SPECIAL_TYPES {
            if let Some(b) = tc.get(&format!("add_{typ}_token")).and_then(Json::as_bool) {
                set_default(&mut add_special, typ, b, false);
            }
        }
    }
    for (typ, v) in add_special {
        if let Some(key) = add_special_key(typ) {
            kv.set(key, Value::Bool(v));
        }
    }

    if let Some(t) = chat_template(hf, tc)? {
        kv.set("tokenizer.chat_template", Value::String(t.as_str().into()));
    }
    if let Some(n) = tok.get("normalizer").filter(|n| !n.is_null()) {
        let (mut lower, mut strip) = (None, None);
        normalizer_flags(n, &mut lower, &mut strip);
        if let Some(b) = lower {
            kv.set("tokenizer.ggml.normalizer.lowercase", Value::Bool(b));
        }
        if let Some(b) = strip {
            kv.set("tokenizer.ggml.normalizer.strip_accents", Value::Bool(b));
        }
    }
    Ok(())
}

fn unsupported_template(file: &str, what: &str, token: &str) -> Error {
    Error::format(
        file,
        "post_processor",
        format!("TemplateProcessing {what} token {token:?} is not one convert_hf_to_gguf maps plainly; not supported"),
    )
}

/// `SpecialVocab._parse_normalizer`.
fn normalizer_flags(n: &Json, lower: &mut Option<bool>, strip: &mut Option<bool>) {
    match n.get("type").and_then(Json::as_str) {
        Some("Lowercase") => *lower = Some(true),
        Some("StripAccents") => *strip = Some(true),
        Some("BertNormalizer") => {
            if let Some(b) = n.get("lowercase").and_then(Json::as_bool) {
                *lower = Some(b);
            }
            if let Some(b) = n.get("strip_accents").and_then(Json::as_bool) {
                *strip = Some(b);
            }
        }
        Some("Sequence") => {
            for m in n.get("normalizers").and_then(Json::as_array).into_iter().flatten() {
                normalizer_flags(m, lower, strip);
            }
        }
        _ => {}
    }
}

/// tokenizer_config.json `chat_template`, else `chat_template.jinja`, else `chat_template.json`'s.
fn chat_template(hf: &HfFiles, tc: Option<&Map<String, Json>>) -> Result<Option<String>> {
    let Some(tc) = tc else { return Ok(None) };
    let alt = match (&hf.chat_template_jinja, &hf.chat_template_json) {
        (Some(j), _) => Some(Json::String(j.clone())),
        (None, Some(j)) => j.get("chat_template").cloned(),
        _ => None,
    };
    match tc.get("chat_template").cloned().or(alt) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s)),
        Some(_) => Err(Error::format(
            hf.file_name("tokenizer_config.json"),
            "chat_template",
            "a list of named templates is not supported yet",
        )),
    }
}
