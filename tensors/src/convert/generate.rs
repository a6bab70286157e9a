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
}

impl GenerateOp {
    pub fn name(self) -> &'static str {
        match self {
            GenerateOp::Llama3RopeFactors => "llama3_rope_factors",
        }
    }

    /// The values, from the converter's hparams (see [`super::hparams`]); `file` names config.json in errors.
    pub fn values(self, h: &Map<String, Json>, file: &str) -> Result<Vec<f32>> {
        match self {
            GenerateOp::Llama3RopeFactors => llama3_rope_factors(h, file),
        }
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
        let v = GenerateOp::Llama3RopeFactors.values(h.as_object().unwrap(), "config.json").unwrap();
        assert_eq!(v.len(), 64);
        assert_eq!(v[0], 1.0);
        assert_eq!(v[63], 8.0);
        let band: Vec<f32> = v.iter().copied().filter(|x| *x != 1.0 && *x != 8.0).collect();
        assert!(!band.is_empty() && band.windows(2).all(|w| w[0] < w[1]), "{v:?}");
        let bad = json!({"head_dim": 7, "$rope": {}});
        let e = GenerateOp::Llama3RopeFactors.values(bad.as_object().unwrap(), "c.json").unwrap_err().to_string();
        assert!(e.contains("c.json") && e.contains("head_dim"), "{e}");
    }
}
