//! GGUF metadata from a mapping's `metadata` list: literals, config.json fields, computed values and the tokenizer
//! group, in insertion order with gguf-py's writer semantics.

use serde_json::Value as Json;

use super::hf::HfFiles;
use super::mapping::{Computed, ConfigFile, KvType, Mapping, MetaEntry, MetaSource};
use super::tokenizer;
use crate::error::{Error, Result};
use crate::gguf::Value;

/// Metadata in insertion order, with gguf-py `GGUFWriter` semantics: setting an existing key keeps its position
/// and replaces the value; empty strings and arrays are not written (`add_string("")`, `add_array([])`).
#[derive(Default)]
pub struct Kvs(pub Vec<(String, Value)>);

impl Kvs {
    pub fn set(&mut self, key: &str, v: Value) {
        let empty = match &v {
            Value::String(s) => s.0.is_empty(),
            Value::Array(a) => a.is_empty(),
            _ => false,
        };
        if empty {
            return;
        }
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some(e) => e.1 = v,
            None => self.0.push((key.to_string(), v)),
        }
    }
}

/// What computed entries need from the tensor plan.
pub struct PlanFacts {
    /// Elements of all written tensors (`GGUFWriter.get_total_parameter_count`, no experts).
    pub total_params: u64,
    /// `general.file_type` of the output type.
    pub file_type: u32,
    /// For a model with expert tensors (`_exps.` with 3 dimensions): the average expert count and the
    /// parameters of the shared tensors plus one expert of each (`get_total_parameter_count`), which
    /// `gguf.size_label` writes as `{count}x{params}`.
    pub experts: Option<(u64, u64)>,
    /// For a mapping with multi-token-prediction blocks: (the model's layers, the blocks written after them).
    pub nextn: Option<(u64, u64)>,
}

/// Evaluates the mapping's metadata list.
pub fn build(m: &Mapping, hf: &HfFiles, facts: &PlanFacts) -> Result<Vec<(String, Value)>> {
    let mut kv = Kvs::default();
    for e in &m.metadata {
        let equal = |conds: &std::collections::BTreeMap<String, Json>| {
            conds.iter().all(|(field, want)| hf.config_value(field) == Some(want))
        };
        if !equal(&e.when)
            || (!e.unless.is_empty() && equal(&e.unless))
            || e.when_file.as_ref().is_some_and(|f| !hf.has_file(f))
            || e.present.iter().any(|f| hf.config_value(f).is_none())
            || e.absent.iter().any(|f| hf.config_value(f).is_some())
        {
            continue;
        }
        let key = e.key.replace("{arch}", &m.architecture);
        match &e.source {
            MetaSource::Tokenizer(kinds) => tokenizer::keys(kinds, hf, &mut kv)?,
            MetaSource::Authorship => super::authorship::keys(hf, facts, &mut kv)?,
            MetaSource::Include(group) => {
                return Err(Error::Mapping { file: m.file.clone(), msg: format!("include {group:?} was not expanded") })
            }
            MetaSource::Computed(Computed::Architecture) => kv.set(&key, Value::String(m.architecture.as_str().into())),
            MetaSource::Computed(Computed::FileType) => kv.set(&key, Value::U32(facts.file_type)),
            MetaSource::Computed(Computed::PartialRopeDimensions) => {
                let dims = super::generate::partial_rope_dimensions(&hf.config, &hf.file_name("config.json"))?;
                let dims = u32::try_from(dims)
                    .map_err(|_| Error::format(hf.file_name("config.json"), "hidden_size", "too large"))?;
                kv.set(&key, Value::U32(dims))
            }
            MetaSource::Computed(Computed::LongropeAttnFactor) => {
                // gguf-py packs the Python float as '<f'.
                if let Some(a) = super::generate::longrope_attn_factor(&hf.config, &hf.file_name("config.json"))? {
                    kv.set(&key, Value::F32(a as f32))
                }
            }
            MetaSource::Computed(Computed::BlockCount) => {
                let (layers, blocks) = nextn_facts(m, facts)?;
                kv.set(&key, Value::U32(u32_of(hf, "num_hidden_layers", layers + blocks)?))
            }
            MetaSource::Computed(Computed::NextnLayers) => {
                let (_, blocks) = nextn_facts(m, facts)?;
                if blocks > 0 {
                    kv.set(&key, Value::U32(u32_of(hf, "mtp_num_hidden_layers", blocks)?))
                }
            }
            MetaSource::Computed(Computed::RecurrentLayers) => {
                let (layers, blocks) = nextn_facts(m, facts)?;
                let cfg = hf.file_name("config.json");
                let bad = |msg: String| Error::format(&cfg, "layer_types", msg);
                let mut flags: Vec<bool> = match hf.config_value("layer_types") {
                    Some(types) => {
                        let types = types.as_array().ok_or_else(|| bad("is not a list".into()))?;
                        if types.len() as u64 != layers {
                            return Err(bad(format!(
                                "has {} entries, expected num_hidden_layers ({layers})",
                                types.len()
                            )));
                        }
                        types.iter().map(|t| t.as_str() == Some("linear_attention")).collect()
                    }
                    // Qwen3_5TextConfig.__post_init__ builds layer_types from a popped full_attention_interval
                    // (default 4), which the converter then no longer sees: it writes its own default, 4, for the
                    // interval. Only an interval of 4 gives one answer both ways.
                    None => match hf.config_value("full_attention_interval").map(Json::as_u64) {
                        None | Some(Some(4)) => (0..layers).map(|i| (i + 1) % 4 != 0).collect(),
                        Some(other) => {
                            return Err(bad(format!(
                                "is absent and full_attention_interval is {}: transformers builds the layer types \
                                 from the interval and drops it, so convert_hf_to_gguf.py writes interval 4 with \
                                 other layer types; add layer_types to config.json",
                                other.map_or("not a number".to_string(), |n| n.to_string())
                            )))
                        }
                    },
                };
                flags.resize((layers + blocks) as usize, false);
                kv.set(&key, Value::Array(crate::gguf::Array::Bool(flags)))
            }
            MetaSource::Computed(Computed::HeadRopeDimensions) => {
                let cfg = hf.file_name("config.json");
                let head_dim = match hf.config_value("head_dim").and_then(Json::as_u64) {
                    Some(d) => d,
                    None => match div(hf, "hidden_size", "num_attention_heads")?.and_then(|v| v.as_u64()) {
                        Some(d) => d,
                        None => return Err(Error::format(&cfg, "head_dim", "missing, and no hidden_size / heads")),
                    },
                };
                let factor = match hf.config_value("$rope.partial_rotary_factor") {
                    None => 0.25,
                    Some(f) => f.as_f64().ok_or_else(|| {
                        Error::format(&cfg, "rope_parameters.partial_rotary_factor", "is not a number")
                    })?,
                };
                // Python's int() of the float product truncates toward zero.
                let dims = (head_dim as f64 * factor).trunc();
                if !(0.0..=f64::from(u32::MAX)).contains(&dims) {
                    return Err(Error::format(&cfg, "rope_parameters.partial_rotary_factor", "gives no rotary size"));
                }
                kv.set(&key, Value::U32(dims as u32))
            }
            MetaSource::Literal(v) => kv.set(&key, typed(m, hf, e, &key, v, "value")?),
            MetaSource::Product([a, b]) => {
                let int = |f: &str| {
                    hf.config_value(f).and_then(Json::as_u64).ok_or_else(|| {
                        Error::format(
                            hf.file_name("config.json"),
                            f,
                            format!("missing or not an integer: required for {key} by mapping {}", m.file),
                        )
                    })
                };
                let v = int(a)?
                    .checked_mul(int(b)?)
                    .ok_or_else(|| Error::format(hf.file_name("config.json"), format!("{a} * {b}"), "overflows"))?;
                kv.set(&key, typed(m, hf, e, &key, &v.into(), &format!("{a} * {b}"))?)
            }
            MetaSource::Config { file, fields, else_div } => {
                let lookup = |f: &str| match file {
                    ConfigFile::Config => hf.config_value(f),
                    ConfigFile::TokenizerConfig => hf.tokenizer_config_value(f),
                };
                let found = fields.iter().find_map(|f| lookup(f).map(|v| (f, v.clone())));
                let value = match (found, else_div, &e.default) {
                    (Some((f, v)), _, _) => Some((v, f.clone())),
                    (None, Some([a, b]), _) => div(hf, a, b)?.map(|v| (v, format!("{a} / {b}"))),
                    (None, None, Some(d)) => Some((d.clone(), "(default)".to_string())),
                    (None, None, None) => None,
                };
                match value {
                    Some((v, field)) => kv.set(&key, typed(m, hf, e, &key, &v, &field)?),
                    None if e.optional => {}
                    None => {
                        return Err(Error::format(
                            hf.file_name("config.json"),
                            fields.join(" | "),
                            format!("missing: required for {key} by mapping {}", m.file),
                        ))
                    }
                }
            }
        }
    }
    Ok(kv.0)
}

/// The plan's (layers, multi-token-prediction blocks), which the mapping must declare (`nextn`).
fn nextn_facts(m: &Mapping, facts: &PlanFacts) -> Result<(u64, u64)> {
    facts.nextn.ok_or_else(|| Error::Mapping {
        file: m.file.clone(),
        msg: "block_count, nextn_predict_layers and recurrent_layers are computed from a `nextn` section".into(),
    })
}

fn u32_of(hf: &HfFiles, field: &str, v: u64) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::format(hf.file_name("config.json"), field, format!("{v} is too large")))
}

/// `a / b` of two integer config fields (integer division, as Python's `//`).
fn div(hf: &HfFiles, a: &str, b: &str) -> Result<Option<Json>> {
    let (Some(x), Some(y)) = (hf.config_value(a), hf.config_value(b)) else { return Ok(None) };
    let (Some(x), Some(y)) = (x.as_u64(), y.as_u64().filter(|y| *y > 0)) else {
        return Err(Error::format(hf.file_name("config.json"), format!("{a} / {b}"), "not positive integers"));
    };
    Ok(Some((x / y).into()))
}

/// A JSON value as the entry's GGUF type; a value that does not fit is an error naming the key and its source.
fn typed(m: &Mapping, hf: &HfFiles, e: &MetaEntry, key: &str, v: &Json, field: &str) -> Result<Value> {
    let bad = || {
        Error::format(
            hf.file_name("config.json"),
            field,
            format!("value {v} does not fit {key} ({:?}) of mapping {}", e.ty, m.file),
        )
    };
    Ok(match e.ty.ok_or_else(bad)? {
        KvType::String => Value::String(v.as_str().ok_or_else(bad)?.into()),
        KvType::U32 => Value::U32(v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(bad)?),
        KvType::I32 => Value::I32(v.as_i64().and_then(|x| i32::try_from(x).ok()).ok_or_else(bad)?),
        // gguf-py packs a Python float as '<f': the f64 is rounded to f32.
        KvType::F32 => Value::F32(v.as_f64().ok_or_else(bad)? as f32),
        KvType::Bool => Value::Bool(v.as_bool().ok_or_else(bad)?),
        KvType::I32Array => {
            let mut items = v
                .as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|x| x.as_i64().and_then(|x| i32::try_from(x).ok()))
                .collect::<Option<Vec<i32>>>()
                .ok_or_else(bad)?;
            if let Some(n) = e.pad_to {
                items.resize(items.len().max(n), 0);
                items.truncate(n);
            }
            Value::Array(crate::gguf::Array::I32(items))
        }
    })
}

/// gguf-py `Metadata.id_to_title`: words split on '-' and whitespace; all-lowercase words that are not version
/// numbers (`v1.2`) or start with a digit are title-cased (Python `str.title`).
pub fn id_to_title(s: &str) -> String {
    let version = regex::Regex::new(r"^(v\d+(?:\.\d+)*|\d.*)$").expect("constant regex");
    s.trim()
        .replace('-', " ")
        .split_whitespace()
        .map(|w| {
            let lower = w.chars().any(char::is_lowercase) && !w.chars().any(char::is_uppercase);
            if lower && !version.is_match(w) {
                py_title(w)
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Python `str.title`: a cased character after an uncased one is upper-cased, the others lower-cased.
fn py_title(w: &str) -> String {
    let mut out = String::with_capacity(w.len());
    let mut prev_cased = false;
    for c in w.chars() {
        if prev_cased {
            out.extend(c.to_lowercase());
        } else {
            out.extend(c.to_uppercase());
        }
        prev_cased = c.is_lowercase() || c.is_uppercase();
    }
    out
}

/// gguf-py `model_weight_count_rounded_notation(n, min_digits=2)`, used for `general.size_label`.
pub fn size_label(n: u64) -> String {
    let x = n as f64;
    let (scaled, suffix) = if x > 1e12 {
        (x * 1e-12, "T")
    } else if x > 1e9 {
        (x * 1e-9, "B")
    } else if x > 1e6 {
        (x * 1e-6, "M")
    } else {
        (x * 1e-3, "K")
    };
    // Python's round() is ties-to-even; str() of the int has no leading zeros except for 0 itself.
    let rounded = scaled.round_ties_even() as u64;
    let digits = rounded.to_string().trim_start_matches('0').len();
    let fix = 2usize.saturating_sub(digits);
    format!("{scaled:.fix$}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_like_gguf_py() {
        assert_eq!(id_to_title("smollm2-hf"), "Smollm2 Hf");
        assert_eq!(id_to_title("Llama-3.2-1B-v1.0"), "Llama 3.2 1B v1.0");
        assert_eq!(id_to_title("qwen3-instruct"), "Qwen3 Instruct");
    }

    #[test]
    fn size_labels_like_gguf_py() {
        assert_eq!(size_label(134_515_008), "135M");
        assert_eq!(size_label(1_235_814_400), "1.2B");
        assert_eq!(size_label(7_241_732_096), "7.2B");
        assert_eq!(size_label(494_032_768), "494M");
        assert_eq!(size_label(70_553_706_496), "71B");
    }
}
