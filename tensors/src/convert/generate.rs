//! Tensors the converter computes from the config instead of reading them (`generate_extra_tensors` in
//! llama.cpp's `conversion/*.py`), as named operators a mapping's `generate` list uses. Each returns the F32
//! values in GGUF order, computed with the same f32 operations, in the same order, as the converter's torch code,
//! so the bytes are the ones it writes.

use serde::Deserialize;
use serde_json::{Map, Value as Json};

use crate::error::{Error, Result};

/// The operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GenerateOp {
    /// Llama 3.1's rope frequency factors (`rope_freqs.weight`, `conversion/llama.py::LlamaModel.
    /// generate_extra_tensors`): one factor per rotary pair, from `$rope`'s `rope_theta`, `factor`,
    /// `low_freq_factor`, `high_freq_factor` and `original_max_position_embeddings`.
    Llama3RopeFactors,
    /// Phi-3's long-context rope factors (`rope_factors_long.weight`, `conversion/phi.py::Phi3MiniModel.
    /// generate_extra_tensors`): `$rope.long_factor` as F32, written only when the list is non-empty.
    LongropeLongFactors,
    /// `rope_factors_short.weight`: `$rope.short_factor`, under the same condition as the long factors.
    LongropeShortFactors,
}

impl GenerateOp {
    pub fn name(self) -> &'static str {
        match self {
            GenerateOp::Llama3RopeFactors => "llama3_rope_factors",
            GenerateOp::LongropeLongFactors => "longrope_long_factors",
            GenerateOp::LongropeShortFactors => "longrope_short_factors",
        }
    }

    /// The values, from the converter's hparams (see [`super::hparams`]); `file` names config.json in errors.
    /// `None`: the converter writes no tensor for this config.
    pub fn values(self, h: &Map<String, Json>, file: &str) -> Result<Option<Vec<f32>>> {
        match self {
            GenerateOp::Llama3RopeFactors => llama3_rope_factors(h, file).map(Some),
            GenerateOp::LongropeLongFactors => longrope_factors(h, file, "long_factor"),
            GenerateOp::LongropeShortFactors => longrope_factors(h, file, "short_factor"),
        }
    }

    /// The way back from a GGUF: the config.json field (name, value) from which the converter generates `values`
    /// again, given the rest of the rebuilt config (`config`: HF field names, `rope_theta` at the top).
    /// `None`: no such field is known. Only a field whose recomputation gives `values` back bit for bit is
    /// returned, so nothing is guessed.
    pub fn recover(self, values: &[f32], config: &Map<String, Json>, file: &str) -> Result<Option<(String, Json)>> {
        match self {
            GenerateOp::Llama3RopeFactors => llama3_rope_scaling(values, config, file),
            GenerateOp::LongropeLongFactors => Ok(longrope_scaling(values, "long_factor")),
            GenerateOp::LongropeShortFactors => Ok(longrope_scaling(values, "short_factor")),
        }
    }
}

/// Phi-3's `rope_scaling` part holding one factor list (`key`) of `values`: `{type: longrope, KEY: [...]}`, which
/// the caller merges with the other list's. Each factor is written as the shortest decimal of its f32, and kept only
/// when the converter's reading (`torch.tensor(list, dtype=torch.float32)`: the decimal read as an f64, then rounded
/// to f32) gives its bits back.
fn longrope_scaling(values: &[f32], key: &str) -> Option<(String, Json)> {
    let mut list = Vec::with_capacity(values.len());
    for v in values {
        let decimal: f64 = format!("{v}").parse().ok()?;
        if (decimal as f32).to_bits() != v.to_bits() {
            return None;
        }
        list.push(Json::Number(serde_json::Number::from_f64(decimal)?));
    }
    let mut scaling = Map::new();
    scaling.insert("type".into(), "longrope".into());
    scaling.insert(key.into(), Json::Array(list));
    Some(("rope_scaling".to_string(), Json::Object(scaling)))
}

/// The `rope_scaling` of Llama 3.1, 3.2 and 3.3 (their config.json's: `factor` 8 or 32, `low_freq_factor` 1,
/// `high_freq_factor` 4, `original_max_position_embeddings` 8192) that gives the factor table `values`. The factor
/// is the table's last (lowest-frequency) value; the other three are fixed by the table only up to a common scale
/// (the bands' edges are `original / low` and `original / high`), so Meta's values are the ones tried, and kept
/// when [`llama3_rope_factors`] computes `values` from them exactly.
fn llama3_rope_scaling(values: &[f32], config: &Map<String, Json>, file: &str) -> Result<Option<(String, Json)>> {
    let Some(&factor) = values.last() else { return Ok(None) };
    let mut scaling = Map::new();
    scaling.insert("factor".into(), f64::from(factor).into());
    scaling.insert("high_freq_factor".into(), 4.0.into());
    scaling.insert("low_freq_factor".into(), 1.0.into());
    scaling.insert("original_max_position_embeddings".into(), 8192.into());
    scaling.insert("rope_type".into(), "llama3".into());
    let mut rope = scaling.clone();
    if let Some(theta) = config.get("rope_theta") {
        rope.insert("rope_theta".into(), theta.clone());
    }
    let mut h = config.clone();
    h.insert(super::hparams::ROPE.into(), Json::Object(rope));
    let again = llama3_rope_factors(&h, file)?;
    let same = again.len() == values.len() && again.iter().zip(values).all(|(a, b)| a.to_bits() == b.to_bits());
    Ok(same.then(|| ("rope_scaling".to_string(), Json::Object(scaling))))
}

/// The first present integer of `fields` (`find_hparam`).
fn hparam_int(h: &Map<String, Json>, fields: &[&str], file: &str) -> Result<u64> {
    fields
        .iter()
        .find_map(|f| h.get(*f).filter(|v| !v.is_null()))
        .ok_or_else(|| Error::format(file, fields.join(" | "), "missing"))?
        .as_u64()
        .ok_or_else(|| Error::format(file, fields.join(" | "), "is not a non-negative integer"))
}

/// Phi-3's rotary dimensions, `int(partial_rotary_factor * n_embd) // n_head` (`conversion/phi.py`), the factor
/// read from `$rope` (default 1.0).
pub fn partial_rope_dimensions(h: &Map<String, Json>, file: &str) -> Result<u64> {
    let n_embd = hparam_int(h, &["hidden_size", "n_embd"], file)?;
    let n_head = hparam_int(h, &["num_attention_heads", "n_head"], file)?;
    if n_head == 0 {
        return Err(Error::format(file, "num_attention_heads", "is 0"));
    }
    let rope = h.get(super::hparams::ROPE).and_then(Json::as_object);
    let pct = number(rope.and_then(|r| r.get("partial_rotary_factor")), 1.0, file, "partial_rotary_factor")?;
    // Python's int() of the f64 product truncates toward zero.
    let dims = (pct * n_embd as f64).trunc();
    if !(0.0..=u64::MAX as f64).contains(&dims) {
        return Err(Error::format(file, "partial_rotary_factor", format!("{pct} gives no rotary dimensions")));
    }
    Ok(dims as u64 / n_head)
}

/// `$rope`'s list `key` when the converter writes longrope factors: `long_factor` non-empty. Both lists must then
/// be present and hold one factor per rotary pair (`rope_dims / 2`), as the converter checks.
fn longrope_factors(h: &Map<String, Json>, file: &str, key: &str) -> Result<Option<Vec<f32>>> {
    let rope = h.get(super::hparams::ROPE).and_then(Json::as_object);
    let list = |k: &str| -> Result<Option<Vec<f32>>> {
        match rope.and_then(|r| r.get(k)).filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(Json::Array(a)) => a
                .iter()
                .map(|v| v.as_f64().map(|x| x as f32))
                .collect::<Option<Vec<f32>>>()
                .map(Some)
                .ok_or_else(|| Error::format(file, format!("rope_scaling.{k}"), "is not a list of numbers")),
            Some(v) => Err(Error::format(file, format!("rope_scaling.{k}"), format!("{v} is not a list"))),
        }
    };
    let long = list("long_factor")?;
    if long.as_ref().is_none_or(|l| l.is_empty()) {
        return Ok(None);
    }
    let short = list("short_factor")?
        .ok_or_else(|| Error::format(file, "rope_scaling.short_factor", "missing (long_factor is given)"))?;
    let long = long.unwrap_or_default();
    let dims = partial_rope_dimensions(h, file)?;
    if dims % 2 != 0 || long.len() as u64 != dims / 2 || short.len() != long.len() {
        return Err(Error::format(
            file,
            "rope_scaling.long_factor",
            format!(
                "long_factor has {} and short_factor {} entries; both need rope dimensions / 2 = {}",
                long.len(),
                short.len(),
                dims as f64 / 2.0
            ),
        ));
    }
    Ok(Some(if key == "long_factor" { long } else { short }))
}

/// Phi-3's `rope.scaling.attn_factor` (`Phi3MiniModel.generate_extra_tensors`), written only with longrope
/// factors: `sqrt(1 + ln(s) / ln(orig))` for `s = max_pos / orig > 1`, else 1, in f64 (written as f32).
/// `None` when `long_factor` is empty or absent.
pub fn longrope_attn_factor(h: &Map<String, Json>, file: &str) -> Result<Option<f64>> {
    let rope = h.get(super::hparams::ROPE).and_then(Json::as_object);
    let has_long = rope.and_then(|r| r.get("long_factor")).and_then(Json::as_array).is_some_and(|a| !a.is_empty());
    if !has_long {
        return Ok(None);
    }
    let max_pos = hparam_int(h, &["n_positions", "max_position_embeddings"], file)? as f64;
    let orig = rope
        .and_then(|r| r.get("original_max_position_embeddings"))
        .and_then(Json::as_f64)
        .ok_or_else(|| Error::format(file, "original_max_position_embeddings", "missing"))?;
    let ty = rope.and_then(|r| r.get("rope_type")).and_then(Json::as_str).unwrap_or("").to_lowercase();
    let scale = max_pos / orig;
    match ty.as_str() {
        "su" | "longrope" => Ok(Some(if scale > 1.0 { (1.0 + scale.ln() / orig.ln()).sqrt() } else { 1.0 })),
        "yarn" => Ok(Some(if scale > 1.0 { 0.1 * scale.ln() + 1.0 } else { 1.0 })),
        other => Err(Error::format(
            file,
            "rope_scaling.type",
            format!("{other:?} with long_factor: the converter supports su, longrope and yarn"),
        )),
    }
}

fn number(v: Option<&Json>, default: f64, file: &str, field: &str) -> Result<f64> {
    match v.filter(|v| !v.is_null()) {
        None => Ok(default),
        Some(v) => v.as_f64().ok_or_else(|| Error::format(file, field, format!("{v} is not a number"))),
    }
}

/// `LlamaModel.generate_extra_tensors`, step by step in torch's f32 arithmetic:
///
/// ```text
/// freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
/// for freq in freqs:
///     wavelen = 2 * math.pi / freq                      # Tensor.__rtruediv__: freq.reciprocal() * f32(2π)
///     if wavelen < high_freq_wavelen: 1                 # the Python float compared as f32
///     elif wavelen > low_freq_wavelen: factor
///     else: smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
///           1 / ((1 - smooth) / factor + smooth)
/// ```
///
/// A Python scalar meeting an f32 tensor is rounded to f32 first (it is a "wrapped number": it does not promote),
/// and `scalar / tensor` is `tensor.reciprocal() * scalar`. `base ** t` is torch's f32 `pow`; here the f64 power
/// of the two f32 operands rounded once to f32, which is the correctly rounded f32 result except where the f64
/// value lies within one f64 ulp of an f32 tie.
fn llama3_rope_factors(h: &Map<String, Json>, file: &str) -> Result<Vec<f32>> {
    let rope = h.get(super::hparams::ROPE).and_then(Json::as_object);
    let get = |k: &str| rope.and_then(|r| r.get(k));
    let field = |k: &str| format!("rope_parameters.{k}");
    let base = number(get("rope_theta"), 10000.0, file, &field("rope_theta"))?;
    let int = |k: &str| h.get(k).and_then(Json::as_u64);
    let dim = match int("head_dim") {
        Some(d) => d,
        None => match (int("hidden_size"), int("num_attention_heads").filter(|n| *n > 0)) {
            (Some(hs), Some(n)) => hs / n,
            _ => return Err(Error::format(file, "head_dim", "missing, and hidden_size / num_attention_heads too")),
        },
    };
    if dim == 0 || dim % 2 != 0 {
        return Err(Error::format(file, "head_dim", format!("{dim} is not a positive even number")));
    }
    let factor = number(get("factor"), 8.0, file, &field("factor"))?;
    let low = number(get("low_freq_factor"), 1.0, file, &field("low_freq_factor"))?;
    let high = number(get("high_freq_factor"), 4.0, file, &field("high_freq_factor"))?;
    let old_ctx =
        number(get("original_max_position_embeddings"), 8192.0, file, &field("original_max_position_embeddings"))?;
    // Python floats, as the converter computes them (f64), then met as f32 scalars.
    let low_wavelen = (old_ctx / low) as f32;
    let high_wavelen = (old_ctx / high) as f32;
    let span = (high - low) as f32;
    let two_pi = (2.0 * std::f64::consts::PI) as f32;
    let (base32, dim32, factor32) = (base as f32, dim as f32, factor as f32);
    let (low32, old32) = (low as f32, old_ctx as f32);
    let mut out = Vec::with_capacity(dim as usize / 2);
    for i in (0..dim).step_by(2) {
        let exponent = i as f32 / dim32;
        let power = f64::from(base32).powf(f64::from(exponent)) as f32;
        let freq = 1.0f32 / power;
        let wavelen = (1.0f32 / freq) * two_pi;
        out.push(if wavelen < high_wavelen {
            1.0
        } else if wavelen > low_wavelen {
            factor32
        } else {
            let smooth = ((1.0f32 / wavelen) * old32 - low32) / span;
            1.0f32 / ((1.0f32 - smooth) / factor32 + smooth)
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Llama 3.1 8B's parameters: the high-frequency pairs keep 1, the low-frequency ones get the factor, and the
    /// band between is smooth and monotone.
    #[test]
    fn llama3_factors_have_the_three_bands() {
        let h = json!({"head_dim": 128, "$rope": {"rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}});
        let v = GenerateOp::Llama3RopeFactors.values(h.as_object().unwrap(), "config.json").unwrap().unwrap();
        assert_eq!(v.len(), 64);
        assert_eq!(v[0], 1.0);
        assert_eq!(v[63], 8.0);
        let band: Vec<f32> = v.iter().copied().filter(|x| *x != 1.0 && *x != 8.0).collect();
        assert!(!band.is_empty() && band.windows(2).all(|w| w[0] < w[1]), "{v:?}");
        let bad = json!({"head_dim": 7, "$rope": {}});
        let e = GenerateOp::Llama3RopeFactors.values(bad.as_object().unwrap(), "c.json").unwrap_err().to_string();
        assert!(e.contains("c.json") && e.contains("head_dim"), "{e}");
    }

    /// The way back: Llama 3.1 8B's and 3.2 1B's tables give their rope_scaling back; a table made from other
    /// band edges, or one entry changed by an ulp, gives none.
    #[test]
    fn llama3_rope_scaling_comes_back_from_its_table() {
        for (factor, dim) in [(8.0, 128), (32.0, 64)] {
            let rope = json!({"rope_theta": 500000.0, "factor": factor, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"});
            let h = json!({"head_dim": dim, "$rope": rope});
            let v = GenerateOp::Llama3RopeFactors.values(h.as_object().unwrap(), "c.json").unwrap().unwrap();
            let config = json!({"head_dim": dim, "rope_theta": 500000.0});
            let back = GenerateOp::Llama3RopeFactors.recover(&v, config.as_object().unwrap(), "c.json").unwrap();
            let (field, mut value) = back.unwrap();
            assert_eq!(field, "rope_scaling");
            value.as_object_mut().unwrap().insert("rope_theta".into(), 500000.0.into());
            assert_eq!(value, rope);
            let mut off = v.clone();
            off[dim / 4] = f32::from_bits(off[dim / 4].to_bits() + 1);
            let config = config.as_object().unwrap();
            assert!(GenerateOp::Llama3RopeFactors.recover(&off, config, "c.json").unwrap().is_none());
        }
        let h = json!({"head_dim": 128, "$rope": {"rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 2.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}});
        let v = GenerateOp::Llama3RopeFactors.values(h.as_object().unwrap(), "c.json").unwrap().unwrap();
        let config = json!({"head_dim": 128, "rope_theta": 500000.0});
        assert!(GenerateOp::Llama3RopeFactors.recover(&v, config.as_object().unwrap(), "c.json").unwrap().is_none());
    }

    /// Phi-3.5-mini's shape: 96 rotary dimensions, 48 factors each; no factors, no tensors; a wrong length is
    /// refused with both counts.
    #[test]
    fn longrope_factors_and_attn_factor() {
        let f = |n: usize| Json::from(vec![1.5; n]);
        let h = json!({"hidden_size": 3072, "num_attention_heads": 32, "max_position_embeddings": 131072,
            "$rope": {"rope_type": "longrope", "long_factor": f(48), "short_factor": f(48),
            "original_max_position_embeddings": 4096, "partial_rotary_factor": 1.0}});
        let h = h.as_object().unwrap();
        assert_eq!(GenerateOp::LongropeLongFactors.values(h, "c.json").unwrap().unwrap().len(), 48);
        let a = longrope_attn_factor(h, "c.json").unwrap().unwrap();
        assert_eq!(a, (1.0 + 32f64.ln() / 4096f64.ln()).sqrt());
        let mut short = h.clone();
        short.insert(
            "$rope".into(),
            json!({"rope_type": "longrope", "long_factor": f(47), "short_factor": f(47),
            "original_max_position_embeddings": 4096}),
        );
        let e = GenerateOp::LongropeShortFactors.values(&short, "c.json").unwrap_err().to_string();
        assert!(e.contains("c.json") && e.contains("47") && e.contains("48"), "{e}");
        let none = json!({"hidden_size": 64, "num_attention_heads": 4, "$rope": {"rope_type": "default"}});
        assert!(GenerateOp::LongropeLongFactors.values(none.as_object().unwrap(), "c.json").unwrap().is_none());
        assert!(longrope_attn_factor(none.as_object().unwrap(), "c.json").unwrap().is_none());
    }
}
