//! gguf-py's `SpecialVocab` (gguf/vocab.py), which every vocabulary reader of convert_hf_to_gguf ends with: BPE
//! merges, special token ids, `add_*_token` flags, the chat template and normalizer flags, read from
//! tokenizer.json, tokenizer_config.json, the chat template files and config.json, and written in the order the
//! Python dicts fill. The post-processor parsing follows `_try_load_from_tokenizer_json` step by step, including the
//! way it rewrites its copy of tokenizer_config.json (cls for a missing bos, EOT/EOM fallbacks).

use serde_json::{Map, Value as Json};

use super::hf::HfFiles;
use super::metadata::Kvs;
use crate::error::{Error, Result};
use crate::gguf::{Array, GgufStr, Value};

/// `SpecialVocab.special_token_types`; `eot` and `eom` are appended by the TemplateProcessing fallbacks.
const SPECIAL_TYPES: [&str; 7] = ["bos", "eos", "unk", "sep", "pad", "cls", "mask"];

/// The GGUF key of a special token id (`add_{typ}_token_id`; types without a writer method are skipped).
fn id_key(typ: &str) -> Option<&'static str> {
    Some(match typ {
        "bos" => "tokenizer.ggml.bos_token_id",
        "eos" => "tokenizer.ggml.eos_token_id",
        "unk" => "tokenizer.ggml.unknown_token_id",
        "sep" => "tokenizer.ggml.seperator_token_id",
        "pad" => "tokenizer.ggml.padding_token_id",
        "mask" => "tokenizer.ggml.mask_token_id",
        "eot" => "tokenizer.ggml.eot_token_id",
        "eom" => "tokenizer.ggml.eom_token_id",
        _ => return None,
    })
}

/// The GGUF key of an `add_{typ}_token` flag (`add_add_{typ}_token`).
fn add_key(typ: &str) -> Option<&'static str> {
    Some(match typ {
        "bos" => "tokenizer.ggml.add_bos_token",
        "eos" => "tokenizer.ggml.add_eos_token",
        "sep" => "tokenizer.ggml.add_sep_token",
        _ => return None,
    })
}

/// An ordered dict with Python's `d[k] = v` and `d.setdefault(k, v)`.
#[derive(Default)]
struct Ordered<V>(Vec<(String, V)>);

impl<V> Ordered<V> {
    fn set(&mut self, k: &str, v: V) {
        match self.0.iter_mut().find(|(x, _)| x == k) {
            Some(e) => e.1 = v,
            None => self.0.push((k.to_string(), v)),
        }
    }
    fn set_default(&mut self, k: &str, v: V) {
        if !self.contains(k) {
            self.0.push((k.to_string(), v));
        }
    }
    fn contains(&self, k: &str) -> bool {
        self.0.iter().any(|(x, _)| x == k)
    }
}

/// Python truthiness of an optional JSON value.
fn truthy(v: Option<&Json>) -> bool {
    match v {
        None | Some(Json::Null) => false,
        Some(Json::Bool(b)) => *b,
        Some(Json::String(s)) => !s.is_empty(),
        Some(Json::Array(a)) => !a.is_empty(),
        Some(Json::Object(o)) => !o.is_empty(),
        Some(Json::Number(n)) => n.as_f64() != Some(0.0),
    }
}

/// `SpecialVocab(dir, load_merges, n_vocab).add_to_gguf`.
pub fn add(hf: &HfFiles, load_merges: bool, n_vocab: Option<u64>, kv: &mut Kvs) -> Result<()> {
    let tok_file = hf.file_name("tokenizer.json");
    let tok = hf.tokenizer.as_ref();
    let mut merges = Vec::new();
    let (mut lower, mut strip) = (None, None);
    let mut added: Vec<&Map<String, Json>> = Vec::new();
    if let Some(tok) = tok {
        if load_merges {
            merges = read_merges(tok, &tok_file)?;
        }
        if let Some(n) = tok.get("normalizer").filter(|n| truthy(Some(n))) {
            normalizer_flags(n, &mut lower, &mut strip);
        }
        match tok.get("added_tokens") {
            None | Some(Json::Null) => {}
            Some(Json::Array(a)) => added = a.iter().filter_map(Json::as_object).collect(),
            Some(_) => return Err(Error::format(&tok_file, "added_tokens", "is not a list")),
        }
    }
    if load_merges && merges.is_empty() {
        return Err(Error::format(&tok_file, "model.merges", "missing or empty (merges.txt is not supported)"));
    }

    // tokenizer_config.json, as a copy the post-processor rules may rewrite.
    let mut tc: Option<Map<String, Json>> = hf.tokenizer_config.as_ref().and_then(Json::as_object).cloned();
    let mut types: Vec<&str> = SPECIAL_TYPES.to_vec();
    let mut add_special: Ordered<bool> = Ordered::default();
    if let Some(tok) = tok {
        post_processor(tok, &mut tc, &mut types, &mut add_special);
    }

    let mut ids: Ordered<u64> = Ordered::default();
    let set_id = |ids: &mut Ordered<u64>, typ: &str, v: Option<&Json>| -> Result<()> {
        let Some(v) = v else { return Ok(()) };
        // isinstance(tid, int): JSON integers only (a bool is not one here).
        let Some(id) = v.as_i64() else { return Ok(()) };
        if id < 0 {
            return Err(Error::format(
                hf.file_name("config.json"),
                format!("{typ} token"),
                format!("invalid special token id {id}"),
            ));
        }
        let id = id as u64;
        if n_vocab.is_none_or(|n| id < n) {
            ids.set_default(typ, id);
        }
        Ok(())
    };

    let mut template = None;
    // `if not tokenizer_config: return`: no template, flags or ids from an absent or empty tokenizer_config.json.
    if let Some(tcm) = tc.as_ref().filter(|m| !m.is_empty()) {
        template = chat_template(hf, tcm)?;
        for typ in &types {
            if let Some(b) = tcm.get(&format!("add_{typ}_token")).and_then(Json::as_bool) {
                add_special.set_default(typ, b);
            }
            let content = match tcm.get(&format!("{typ}_token")) {
                Some(Json::String(s)) => s.clone(),
                Some(Json::Object(o)) => match o.get("content") {
                    Some(Json::String(s)) => s.clone(),
                    _ => continue,
                },
                _ => continue,
            };
            let id = added
                .iter()
                .find(|a| a.get("content").and_then(Json::as_str) == Some(&content))
                .and_then(|a| a.get("id"));
            set_id(&mut ids, typ, id)?;
        }
    }
    for typ in &types {
        let key = format!("{typ}_token_id");
        let v = hf
            .config
            .get(&key)
            .filter(|v| !v.is_null())
            .or_else(|| hf.config.get("text_config").and_then(|t| t.get(&key)).filter(|v| !v.is_null()));
        set_id(&mut ids, typ, v)?;
    }

    if !merges.is_empty() {
        kv.set("tokenizer.ggml.merges", Value::Array(Array::String(merges)));
    }
    for (typ, id) in ids.0 {
        if let Some(key) = id_key(&typ) {
            let id = u32::try_from(id)
                .map_err(|_| Error::format(&tok_file, format!("{typ} token"), format!("id {id} does not fit u32")))?;
            kv.set(key, Value::U32(id));
        }
    }
    for (typ, v) in add_special.0 {
        if let Some(key) = add_key(&typ) {
            kv.set(key, Value::Bool(v));
        }
    }
    if let Some(t) = template {
        kv.set("tokenizer.chat_template", Value::String(t.as_str().into()));
    }
    if let Some(b) = lower {
        kv.set("tokenizer.ggml.normalizer.lowercase", Value::Bool(b));
    }
    if let Some(b) = strip {
        kv.set("tokenizer.ggml.normalizer.strip_accents", Value::Bool(b));
    }
    Ok(())
}

/// `model.merges` as GGUF strings: `"a b"` kept, `["a", "b"]` pairs joined with spaces inside parts encoded as
/// U+0120 (`chr(ord(' ') + 256)`).
fn read_merges(tok: &Json, tok_file: &str) -> Result<Vec<GgufStr>> {
    let Some(Json::Array(m)) = tok.pointer("/model/merges") else { return Ok(Vec::new()) };
    let mut out = Vec::with_capacity(m.len());
    for e in m {
        match e {
            Json::String(s) => out.push(GgufStr::from(s.as_str())),
            Json::Array(pair) if pair.len() == 2 && pair.iter().all(Json::is_string) => {
                let parts: Vec<String> =
                    pair.iter().filter_map(Json::as_str).map(|p| p.replace(' ', "\u{120}")).collect();
                out.push(GgufStr::from(parts.join(" ").as_str()));
            }
            _ => return Err(Error::format(tok_file, "model.merges", "unknown merges format")),
        }
    }
    Ok(out)
}

/// The post-processor rules of `_try_load_from_tokenizer_json` (ByteLevel, RobertaProcessing, TemplateProcessing).
fn post_processor(
    tok: &Json,
    tc: &mut Option<Map<String, Json>>,
    types: &mut Vec<&'static str>,
    add: &mut Ordered<bool>,
) {
    let get = |tc: &Option<Map<String, Json>>, k: &str| tc.as_ref().and_then(|m| m.get(k)).cloned();
    let tc_truthy = |tc: &Option<Map<String, Json>>| tc.as_ref().is_some_and(|m| !m.is_empty());
    let mut bos = get(tc, "bos_token");
    let mut cls = get(tc, "cls_token");
    let mut eos = get(tc, "eos_token");
    let mut sep = get(tc, "sep_token");
    let put = |tc: &mut Option<Map<String, Json>>, k: &str, v: &Option<Json>| {
        if let Some(m) = tc.as_mut() {
            m.insert(k.to_string(), v.clone().unwrap_or(Json::Null));
        }
    };
    if !truthy(bos.as_ref()) && truthy(cls.as_ref()) && tc_truthy(tc) {
        bos = cls.clone();
        put(tc, "bos_token", &bos);
    }
    if !truthy(eos.as_ref()) && truthy(sep.as_ref()) && tc_truthy(tc) {
        eos = sep.clone();
        put(tc, "eos_token", &eos);
    }
    let Some(pp) = tok.get("post_processor").filter(|p| truthy(Some(p))) else { return };
    let procs: Vec<&Json> = match pp.get("processors").and_then(Json::as_array) {
        Some(list) => list.iter().collect(),
        None => vec![pp],
    };
    let special_id = |e: Option<&Json>| -> Option<Json> {
        e.and_then(|e| e.pointer("/SpecialToken/id")).cloned().filter(|v| truthy(Some(v)))
    };
    for p in procs {
        match p.get("type").and_then(Json::as_str) {
            Some("ByteLevel") => {
                add.set_default("bos", false);
                add.set_default("eos", false);
            }
            Some("RobertaProcessing") => {
                add.set("bos", true);
                add.set("eos", true);
                add.set("sep", true);
                if !truthy(cls.as_ref()) && tc_truthy(tc) {
                    cls = p.get("cls").and_then(|c| c.get(0)).cloned().or_else(|| bos.clone());
                    put(tc, "cls_token", &cls);
                }
                if !truthy(sep.as_ref()) && tc_truthy(tc) {
                    sep = p.get("sep").and_then(|c| c.get(0)).cloned().or_else(|| eos.clone());
                    put(tc, "sep_token", &sep);
                }
            }
            Some("TemplateProcessing") => {
                let empty = Vec::new();
                let single = p.get("single").and_then(Json::as_array).unwrap_or(&empty);
                let mut pair: &[Json] = p.get("pair").and_then(Json::as_array).unwrap_or(&empty);
                let (mut first, mut last) = (None, None);
                if single.len() > 1 {
                    first = special_id(single.first());
                    if let Some(f) = &first {
                        if !tc_truthy(tc) {
                            bos = Some(f.clone());
                        } else if Some(f) != bos.as_ref() && Some(f) != cls.as_ref() {
                            if !truthy(bos.as_ref()) {
                                bos = Some(f.clone());
                                put(tc, "bos_token", &bos);
                            }
                            if !truthy(cls.as_ref()) {
                                cls = Some(f.clone());
                                put(tc, "cls_token", &cls);
                            }
                        }
                        add.set("bos", Some(f) == bos.as_ref() || Some(f) == cls.as_ref());
                    }
                    last = special_id(single.last());
                    if let Some(l) = &last {
                        if !tc_truthy(tc) {
                            eos = Some(l.clone());
                        } else if Some(l) != eos.as_ref() {
                            if !types.contains(&"eot") {
                                types.push("eot");
                                put(tc, "eot_token", &eos);
                            } else if !types.contains(&"eom") {
                                types.push("eom");
                                put(tc, "eom_token", &eos);
                            }
                            eos = Some(l.clone());
                            put(tc, "eos_token", &eos);
                        }
                        add.set("eos", Some(l) == eos.as_ref());
                    }
                }
                if !pair.is_empty() {
                    let start = usize::from(first.is_some() && special_id(pair.first()) == first);
                    let stop = usize::from(last.is_some() && special_id(pair.last()) == last);
                    pair = pair.get(start..pair.len().saturating_sub(stop).max(start)).unwrap_or(&[]);
                    if !pair.is_empty() {
                        fn seq(e: Option<&Json>) -> Option<&str> {
                            e.and_then(|e| e.pointer("/Sequence/id")).and_then(Json::as_str)
                        }
                        if seq(pair.first()) == Some("A") && seq(pair.last()) == Some("B") && pair.len() > 2 {
                            let mid = &pair[1..pair.len() - 1];
                            let is_sep_or_eos = |id: &Json| Some(id) == sep.as_ref() || Some(id) == eos.as_ref();
                            let mut add_sep = false;
                            if let Some(e) = special_id(mid.first()) {
                                if is_sep_or_eos(&e) && last.is_none() {
                                    add_sep = true;
                                }
                            }
                            if mid.len() == 2 {
                                if let Some(e) = special_id(mid.get(1)) {
                                    if is_sep_or_eos(&e) {
                                        add_sep = true;
                                    }
                                }
                            }
                            add.set("sep", add_sep);
                            if add_sep && !truthy(sep.as_ref()) && tc_truthy(tc) {
                                put(tc, "sep_token", &eos);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
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
fn chat_template(hf: &HfFiles, tc: &Map<String, Json>) -> Result<Option<String>> {
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
