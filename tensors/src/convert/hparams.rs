//! The converter's view of config.json. `convert_hf_to_gguf.py` does not read the file itself: it reads
//! `AutoConfig.from_pretrained(dir).to_dict()` (`conversion/base.py::ModelBase.load_hparams`), which fills in the
//! config class's defaults and (since transformers 5) moves `rope_scaling` and `rope_theta` into
//! `rope_parameters`; then `TextModel.__init__` moves a `text_config` to the root and mirrors the global rope values
//! into `rope_parameters`. A mapping's `hparams` section says, as data, what its config class does; this module
//! applies it, so every other rule of the mapping reads the same values the converter reads.
//!
//! The rope styles are transformers 5.24's `RotaryEmbeddingConfigMixin.convert_rope_params_to_dict` and
//! `standardize_rope_params` (`transformers/modeling_rope_utils.py`), and `Gemma3TextConfig`'s override of the first
//! (`transformers/models/gemma3/configuration_gemma3.py`).
//!
//! The result also holds one derived entry, [`ROPE`] (`$rope`): the converter's `rope_params`, the
//! `full_attention` dict of a per-layer-type `rope_parameters` or else the flat one, so that mappings can say
//! `$rope.rope_type` for what `TextModel.set_gguf_parameters` tests.

use serde::Deserialize;
use serde_json::{Map, Value as Json};

/// The key of the derived `rope_params` entry (never a config field: HF names do not start with `$`).
pub const ROPE: &str = "$rope";

/// transformers' `RotaryEmbeddingConfigMixin.default_theta`.
const DEFAULT_THETA: f64 = 10_000.0;

/// What a mapping's config class does to config.json before the converter sees it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HparamsRule {
    /// Fields the config class fills in when config.json leaves them out (or null), in order.
    #[serde(default)]
    pub defaults: Vec<Default>,
    /// How `rope_parameters` is standardized; absent: the config is read as it is (no rope fields are moved).
    #[serde(default)]
    pub rope: Option<RopeStyle>,
    /// The config class's `default_theta` (the `rope_theta` it gives a config without one; transformers' own
    /// default is 10000, SmolLM3's 2e6). Used by the flat styles.
    #[serde(default)]
    pub default_theta: Option<f64>,
    /// Fields the converter class removes before reading the config (GraniteModel pops `head_dim`).
    #[serde(default)]
    pub pop: Vec<String>,
}

/// One default: `field` set, when absent, to a literal, a copy of another field, or `a // b`.
#[derive(Debug, Deserialize)]
#[serde(try_from = "RawDefault")]
pub struct Default {
    pub field: String,
    pub value: DefaultValue,
}

#[derive(Debug)]
pub enum DefaultValue {
    Literal(Json),
    Copy(String),
    Div([String; 2]),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefault {
    field: String,
    value: Option<Json>,
    copy: Option<String>,
    div: Option<[String; 2]>,
}

impl TryFrom<RawDefault> for Default {
    type Error = String;
    fn try_from(r: RawDefault) -> Result<Self, String> {
        let value = match (r.value, r.copy, r.div) {
            (Some(v), None, None) => DefaultValue::Literal(v),
            (None, Some(c), None) => DefaultValue::Copy(c),
            (None, None, Some(d)) => DefaultValue::Div(d),
            _ => return Err(format!("default {:?}: exactly one of value, copy, div", r.field)),
        };
        Ok(Default { field: r.field, value })
    }
}

/// How a config class standardizes its rope parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeStyle {
    /// `RotaryEmbeddingConfigMixin`: one dict (`rope_scaling`, else `rope_parameters`, else `{}`), given
    /// `rope_theta` (default 10000), `rope_type` (its `type`, else `default`), `partial_rotary_factor` when the
    /// config has one, and for llama3 / yarn / longrope `original_max_position_embeddings` (the config's own, else
    /// `max_position_embeddings`).
    Flat,
    /// `Phi3Config`: [`RopeStyle::Flat`], with `partial_rotary_factor` always set (default 1.0) and the legacy
    /// types `su` and `yarn` renamed `longrope` after standardizing.
    Phi3,
    /// `Gemma3TextConfig`: dicts per layer type, `rope_scaling` merged into `full_attention` (theta from
    /// `rope_theta`, default 1e6) and `sliding_attention` with theta `rope_local_base_freq` (default 10000).
    Gemma3,
}

/// The converter's hparams from config.json's object under `rule`.
pub fn normalize(raw: &Map<String, Json>, rule: &HparamsRule) -> Map<String, Json> {
    // TextModel.__init__: {**hparams, **hparams["text_config"]}. The text config is a config of its own, so its
    // defaults and rope standardization apply to the merged view (the wrapper's fields cannot name rope keys).
    let mut h = raw.clone();
    if let Some(Json::Object(text)) = raw.get("text_config") {
        for (k, v) in text {
            h.insert(k.clone(), v.clone());
        }
    }
    for d in &rule.defaults {
        if present(&h, &d.field) {
            continue;
        }
        let v = match &d.value {
            DefaultValue::Literal(v) => Some(v.clone()),
            DefaultValue::Copy(f) => h.get(f).filter(|v| !v.is_null()).cloned(),
            DefaultValue::Div([a, b]) => match (int(&h, a), int(&h, b).filter(|b| *b > 0)) {
                (Some(a), Some(b)) => Some(Json::from(a / b)),
                _ => None,
            },
        };
        if let Some(v) = v {
            h.insert(d.field.clone(), v);
        }
    }
    for f in &rule.pop {
        h.remove(f);
    }
    match rule.rope {
        None => {}
        Some(RopeStyle::Flat) => flat_rope(&mut h, None, rule.default_theta.unwrap_or(DEFAULT_THETA)),
        Some(RopeStyle::Phi3) => {
            flat_rope(&mut h, Some(1.0), rule.default_theta.unwrap_or(DEFAULT_THETA));
            if let Some(Json::Object(p)) = h.get_mut("rope_parameters") {
                if matches!(p.get("rope_type").and_then(Json::as_str), Some("su" | "yarn")) {
                    p.insert("rope_type".into(), Json::from("longrope"));
                }
            }
        }
        Some(RopeStyle::Gemma3) => gemma3_rope(&mut h),
    }
    if rule.rope.is_some() {
        mirror_globals(&mut h);
    }
    let rope = match h.get("rope_parameters") {
        Some(Json::Object(p)) => {
            p.get("full_attention").filter(|v| v.is_object()).cloned().unwrap_or(Json::Object(p.clone()))
        }
        _ => Json::Object(Map::new()),
    };
    h.insert(ROPE.into(), rope);
    h
}

fn present(h: &Map<String, Json>, field: &str) -> bool {
    h.get(field).is_some_and(|v| !v.is_null())
}

fn int(h: &Map<String, Json>, field: &str) -> Option<u64> {
    h.get(field).and_then(Json::as_u64)
}

/// `convert_rope_params_to_dict` then `standardize_rope_params`, the flat case; `rope_scaling` and `rope_theta`
/// are consumed as keyword arguments (they are not fields of the config classes that use this style).
/// `partial_default`: the `partial_rotary_factor` the class sets when the config has none (Phi-3's 1.0).
fn flat_rope(h: &mut Map<String, Json>, partial_default: Option<f64>, default_theta: f64) {
    let scaling = h.remove("rope_scaling").filter(|v| v.as_object().is_some_and(|o| !o.is_empty()));
    let mut p = match scaling.or_else(|| h.get("rope_parameters").cloned()) {
        Some(Json::Object(p)) => p,
        _ => Map::new(),
    };
    let theta = h.remove("rope_theta").filter(|v| !v.is_null()).unwrap_or(Json::from(default_theta));
    p.entry("rope_theta").or_insert(theta);
    match (h.get("partial_rotary_factor").filter(|v| !v.is_null()).cloned(), partial_default) {
        (Some(f), _) => {
            p.entry("partial_rotary_factor").or_insert(f);
        }
        (None, Some(d)) => {
            p.entry("partial_rotary_factor").or_insert(Json::from(d));
        }
        (None, None) => {}
    }
    let ty = p.get("type").cloned().unwrap_or(Json::from("default"));
    p.entry("rope_type").or_insert(ty);
    if matches!(p.get("rope_type").and_then(Json::as_str), Some("llama3" | "yarn" | "longrope")) {
        match h.get("original_max_position_embeddings").filter(|v| !v.is_null()).cloned() {
            // Phi-3's class keeps the field outside rope_parameters and it wins.
            Some(o) => {
                p.insert("original_max_position_embeddings".into(), o);
            }
            None => {
                if let Some(m) = h.get("max_position_embeddings").cloned() {
                    p.entry("original_max_position_embeddings").or_insert(m);
                }
            }
        }
    }
    h.insert("rope_parameters".into(), Json::Object(p));
}

/// `Gemma3TextConfig.convert_rope_params_to_dict` and the nested case of `standardize_rope_params`.
fn gemma3_rope(h: &mut Map<String, Json>) {
    let scaling = h.remove("rope_scaling").filter(|v| !v.is_null());
    let mut p = match h.get("rope_parameters") {
        Some(Json::Object(p)) => p.clone(),
        _ => {
            let mut p = Map::new();
            p.insert("sliding_attention".into(), serde_json::json!({"rope_type": "default"}));
            p.insert("full_attention".into(), serde_json::json!({"rope_type": "default"}));
            p
        }
    };
    let full = p.entry("full_attention").or_insert_with(|| serde_json::json!({"rope_type": "default"}));
    if full.is_null() {
        *full = serde_json::json!({"rope_type": "default"});
    }
    if let (Some(Json::Object(s)), Some(f)) = (&scaling, full.as_object_mut()) {
        for (k, v) in s {
            f.insert(k.clone(), v.clone());
        }
    }
    let theta = h.remove("rope_theta").filter(|v| !v.is_null()).unwrap_or(Json::from(1_000_000.0));
    if let Some(f) = full.as_object_mut() {
        f.entry("rope_theta").or_insert(theta);
    }
    let local = h.remove("rope_local_base_freq").filter(|v| !v.is_null()).unwrap_or(Json::from(DEFAULT_THETA));
    let sliding = p.entry("sliding_attention").or_insert_with(|| serde_json::json!({"rope_type": "default"}));
    if sliding.is_null() {
        *sliding = serde_json::json!({"rope_type": "default"});
    }
    if let Some(s) = sliding.as_object_mut() {
        s.entry("rope_theta").or_insert(local);
    }
    let max_pos = h.get("max_position_embeddings").cloned();
    for kind in ["full_attention", "sliding_attention"] {
        if let Some(Json::Object(d)) = p.get_mut(kind) {
            let ty = d.get("type").cloned().unwrap_or(Json::from("default"));
            d.entry("rope_type").or_insert(ty);
            if matches!(d.get("rope_type").and_then(Json::as_str), Some("llama3" | "yarn" | "longrope")) {
                if let Some(m) = &max_pos {
                    d.entry("original_max_position_embeddings").or_insert(m.clone());
                }
            }
        }
    }
    h.insert("rope_parameters".into(), Json::Object(p));
}

/// `TextModel.__init__`'s "Ensure global params are mirrored in rope_parameters", for a flat dict.
fn mirror_globals(h: &mut Map<String, Json>) {
    let find =
        |h: &Map<String, Json>, names: &[&str]| names.iter().find_map(|n| h.get(*n).filter(|v| !v.is_null()).cloned());
    let theta =
        find(h, &["global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta", "rotary_emb_base"]);
    let local = find(
        h,
        &["local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta", "rope_local_base_freq"],
    );
    let partial = find(h, &["partial_rotary_factor", "rope_pct", "rope_percent"]);
    let orig = find(h, &["original_max_position_embeddings"]);
    let Some(Json::Object(p)) = h.get_mut("rope_parameters") else { return };
    if p.contains_key("full_attention") || p.contains_key("sliding_attention") {
        return;
    }
    if let Some(l) = local {
        p.insert("sliding_attention".into(), serde_json::json!({"rope_theta": l}));
    }
    if let Some(t) = theta {
        p.entry("rope_theta").or_insert(t);
    }
    if let Some(t) = p.get("type").cloned() {
        p.entry("rope_type").or_insert(t);
    }
    if let Some(f) = partial {
        p.entry("partial_rotary_factor").or_insert(f);
    }
    if let Some(o) = orig {
        p.entry("original_max_position_embeddings").or_insert(o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Json) -> Map<String, Json> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn llama3_rope_scaling_becomes_rope_parameters() {
        let raw = obj(json!({"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 131072,
            "rope_theta": 500000.0, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"}}));
        let rule = HparamsRule {
            defaults: vec![
                Default {
                    field: "head_dim".into(),
                    value: DefaultValue::Div(["hidden_size".into(), "num_attention_heads".into()]),
                },
                Default {
                    field: "num_key_value_heads".into(),
                    value: DefaultValue::Copy("num_attention_heads".into()),
                },
            ],
            rope: Some(RopeStyle::Flat),
            default_theta: None,
            pop: vec![],
        };
        let h = normalize(&raw, &rule);
        assert_eq!(h["head_dim"], json!(16));
        assert_eq!(h["num_key_value_heads"], json!(4));
        assert!(!h.contains_key("rope_scaling") && !h.contains_key("rope_theta"));
        let p = &h["rope_parameters"];
        assert_eq!(p["rope_type"], json!("llama3"));
        assert_eq!(p["rope_theta"], json!(500000.0));
        assert_eq!(p["original_max_position_embeddings"], json!(8192));
        assert_eq!(h[ROPE], *p);
    }

    #[test]
    fn yarn_gets_the_pretraining_length_and_no_scaling_means_default() {
        let raw = obj(json!({"max_position_embeddings": 32768, "rope_scaling": {"type": "yarn", "factor": 4.0}}));
        let h = normalize(
            &raw,
            &HparamsRule { defaults: vec![], rope: Some(RopeStyle::Flat), default_theta: None, pop: vec![] },
        );
        let p = &h["rope_parameters"];
        assert_eq!((&p["rope_type"], &p["type"]), (&json!("yarn"), &json!("yarn")));
        assert_eq!(p["original_max_position_embeddings"], json!(32768));
        assert_eq!(p["rope_theta"], json!(10000.0));
        let h = normalize(
            &obj(json!({"rope_theta": 1e6, "rope_scaling": null})),
            &HparamsRule { defaults: vec![], rope: Some(RopeStyle::Flat), default_theta: None, pop: vec![] },
        );
        assert_eq!(h["rope_parameters"], json!({"rope_theta": 1e6, "rope_type": "default"}));
    }

    #[test]
    fn gemma3_rope_is_per_layer_type_and_text_config_is_merged() {
        let raw = obj(json!({"architectures": ["Gemma3ForConditionalGeneration"], "text_config": {
            "max_position_embeddings": 131072, "rope_local_base_freq": 10000.0, "rope_theta": 1000000.0,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}}));
        let h = normalize(
            &raw,
            &HparamsRule { defaults: vec![], rope: Some(RopeStyle::Gemma3), default_theta: None, pop: vec![] },
        );
        assert_eq!(
            h["rope_parameters"]["full_attention"],
            json!({"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6})
        );
        assert_eq!(h["rope_parameters"]["sliding_attention"], json!({"rope_type": "default", "rope_theta": 1e4}));
        assert_eq!(h[ROPE]["rope_type"], json!("linear"));
        assert_eq!(h["max_position_embeddings"], json!(131072));
    }

    /// Phi-3.5's config: the legacy `su` type reads as longrope, the top-level pretraining length is mirrored in,
    /// and the partial factor defaults to 1.
    #[test]
    fn phi3_su_is_longrope_with_a_partial_factor() {
        let raw = obj(json!({"max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "rope_scaling": {"type": "su", "long_factor": [1.5], "short_factor": [1.0]}}));
        let h = normalize(
            &raw,
            &HparamsRule { defaults: vec![], rope: Some(RopeStyle::Phi3), default_theta: None, pop: vec![] },
        );
        let p = &h[ROPE];
        assert_eq!(p["rope_type"], json!("longrope"));
        assert_eq!(p["partial_rotary_factor"], json!(1.0));
        assert_eq!(p["original_max_position_embeddings"], json!(4096));
        assert_eq!(p["rope_theta"], json!(10000.0));
    }
}
