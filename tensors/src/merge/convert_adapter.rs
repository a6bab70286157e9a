//! Adapter conversion between PEFT and mlx-lm, from the one form [`Adapter`] reads both into (`ΔW = scale · b·a`
//! in the base tensor's layout), so a LoRA trained with one tool can be served, fused or merged with the other.
//!
//! The factors are only transposed (same dtype, same bytes per value), so merging the converted adapter gives the
//! same bytes as merging the original. Where one format cannot say what the other does, the difference goes into
//! the factors or is refused, never dropped:
//! - mlx-lm has one `scale` and one `rank` per adapter: a module whose scale differs from the most common one has
//!   the ratio multiplied into its `lora_b` (exact when the ratio is a power of two, as with PEFT's usual
//!   `alpha_pattern`s; otherwise rounded once to the factor's dtype); differing ranks are refused;
//! - mlx-lm adapts the last `num_layers` transformer layers: modules outside `model.layers.N.`, embedding LoRA,
//!   `lora_B.bias` and `modules_to_save` are refused going to mlx-lm;
//! - PEFT gets per-module `rank_pattern`/`alpha_pattern` entries where a module differs from the common values, and
//!   `layers_to_transform` listing the adapted layers.
//!
//! Formats: `docs/formats.md` §3, from mlx-lm's `mlx_lm/tuner/` (`lora.py`, `utils.py`) and PEFT's
//! `peft/tuners/lora/` (`layer.py`, `config.py`).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value as Json};

use super::adapter::{transpose, Adapter, AdapterFormat, LowRank};
use crate::dtype::{Dtype, TensorType};
use crate::error::{Error, Result};
use crate::safetensors::StTensorDesc;
use crate::write::SafetensorsWriter;
use quantfarm_store::Location;
use quantfarm_store::{Committed, StagedSink};

/// Where the adapter is applied: the base's layer count (mlx-lm's `num_layers` counts from the last layer) and its
/// identity, recorded in the converted adapter when the source does not record one.
pub struct BaseFacts {
    pub num_hidden_layers: Option<u64>,
    pub name: Option<String>,
}

/// One tensor of the converted adapter.
struct Out {
    name: String,
    dtype: Dtype,
    shape: Vec<u64>,
    values: Vec<f64>,
}

/// Writes `adapter` in format `to` into folder `dst` (adapter_config.json + the safetensors file), staged and
/// committed together.
pub async fn convert_adapter(
    adapter: &Adapter,
    to: AdapterFormat,
    base: &BaseFacts,
    dst: &Location,
    overwrite: bool,
) -> Result<Vec<Committed>> {
    if to == adapter.format {
        return Err(Error::format(&adapter.dir, "format", format!("is already a {} adapter", to.name())));
    }
    if let Some(b) = adapter.biases.first() {
        return Err(Error::format(&adapter.dir, &b.key, "a lora_B.bias has no mlx-lm form"));
    }
    if let Some(r) = adapter.replacements.first() {
        return Err(Error::format(
            &adapter.dir,
            &r.key,
            "a whole replaced module (modules_to_save, full fine-tune) is not a LoRA",
        ));
    }
    if adapter.low_rank.is_empty() {
        return Err(Error::format(&adapter.dir, "adapter", "has no LoRA factors"));
    }
    let dtype_of = |lr: &LowRank| -> Dtype {
        let stored = lr.keys.iter().find_map(|k| match adapter.tensors.entry(k).map(|e| e.ty) {
            Ok(TensorType::Dtype(d @ (Dtype::BF16 | Dtype::F16 | Dtype::F32))) => Some(d),
            _ => None,
        });
        stored.unwrap_or(Dtype::F32)
    };
    let dora = adapter.low_rank.iter().any(|lr| lr.magnitude.is_some());
    if dora && adapter.low_rank.iter().any(|lr| lr.magnitude.is_none()) {
        return Err(Error::format(&adapter.dir, "adapter", "mixes DoRA and plain LoRA modules"));
    }
    let common = Common {
        scale: most_common(adapter.low_rank.iter().map(|lr| lr.scale)),
        rank: most_common(adapter.low_rank.iter().map(|lr| lr.rank as f64)) as usize,
        dora,
        recorded: adapter.recorded_base.clone().or_else(|| base.name.clone()),
        dtype_of: &dtype_of,
    };
    let (file, config, outs) = match to {
        AdapterFormat::MlxLm => to_mlx(adapter, base, &common)?,
        AdapterFormat::Peft => to_peft(adapter, &common)?,
    };
    let descs: Vec<StTensorDesc> =
        outs.iter().map(|o| StTensorDesc { name: o.name.clone(), dtype: o.dtype, shape: o.shape.clone() }).collect();
    let metadata = [("format".to_string(), if to == AdapterFormat::MlxLm { "mlx" } else { "pt" }.to_string())];
    let mut w = SafetensorsWriter::create(&dst.child(file)?, &descs, &metadata, overwrite).await?;
    let mut bytes = Vec::new();
    for o in &outs {
        bytes.clear();
        super::encode(&o.values, o.dtype, &mut bytes);
        w.write(&bytes).await?;
    }
    let mut text = serde_json::to_string_pretty(&Json::Object(config)).expect("JSON serializes");
    text.push('\n');
    let mut sink = StagedSink::create(&dst.child("adapter_config.json")?, overwrite).await?;
    sink.write(text.as_bytes()).await?;
    Ok(vec![w.finish().await?, sink.commit().await?])
}

/// What both formats record for the whole adapter: the most common scale and rank, DoRA or not, the base.
struct Common<'a> {
    scale: f64,
    rank: usize,
    dora: bool,
    recorded: Option<String>,
    /// The dtype a module's factors are stored in.
    dtype_of: &'a dyn Fn(&LowRank) -> Dtype,
}

/// The converted adapter: its weights file's name, adapter_config.json, its tensors.
type Converted = (&'static str, Map<String, Json>, Vec<Out>);

fn to_mlx(adapter: &Adapter, base: &BaseFacts, c: &Common) -> Result<Converted> {
    let (scale, rank, dora, dtype_of) = (c.scale, c.rank, c.dora, c.dtype_of);
    let mut outs = Vec::new();
    let mut keys = std::collections::BTreeSet::new();
    let mut first_layer = u64::MAX;
    for lr in &adapter.low_rank {
        let module = lr.target.strip_suffix(".weight").unwrap_or(&lr.target);
        let Some((layer, rest)) = module.strip_prefix("model.layers.").and_then(|t| t.split_once('.')) else {
            return Err(Error::format(
                &adapter.dir,
                &lr.target,
                "is not in a transformer layer (model.layers.N.…): mlx-lm adapts only layers",
            ));
        };
        let layer: u64 = layer
            .parse()
            .map_err(|_| Error::format(&adapter.dir, &lr.target, "has no layer number after model.layers."))?;
        if lr.rank != rank {
            return Err(Error::format(
                &adapter.dir,
                lr.keys.join(", "),
                format!("has rank {}, others {rank}: an mlx-lm adapter has one rank", lr.rank),
            ));
        }
        first_layer = first_layer.min(layer);
        keys.insert(rest.to_string());
        let dtype = dtype_of(lr);
        // mlx-lm: lora_a (in, r) = aᵀ, lora_b (r, out) = bᵀ, this module's scale ratio folded into lora_b.
        let ratio = lr.scale / scale;
        let b: Vec<f64> = transpose(&lr.b, lr.rows, lr.rank).into_iter().map(|x| x * ratio).collect();
        outs.push(Out {
            name: format!("{module}.lora_a"),
            dtype,
            shape: vec![lr.cols as u64, lr.rank as u64],
            values: transpose(&lr.a, lr.rank, lr.cols),
        });
        outs.push(Out {
            name: format!("{module}.lora_b"),
            dtype,
            shape: vec![lr.rank as u64, lr.rows as u64],
            values: b,
        });
        if let Some(m) = &lr.magnitude {
            outs.push(Out { name: format!("{module}.m"), dtype, shape: vec![lr.rows as u64], values: m.clone() });
        }
    }
    let layers = base.num_hidden_layers.ok_or_else(|| {
        Error::format(&adapter.dir, "num_layers", "an mlx-lm adapter counts layers from the last: give the base model")
    })?;
    if first_layer >= layers {
        return Err(Error::format(
            &adapter.dir,
            "layers",
            format!("adapts layer {first_layer} of a {layers}-layer base"),
        ));
    }
    outs.sort_by(|a, b| a.name.cmp(&b.name));
    let mut config = Map::new();
    config.insert("fine_tune_type".into(), (if dora { "dora" } else { "lora" }).into());
    if let Some(r) = &c.recorded {
        config.insert("model".into(), r.clone().into());
    }
    config.insert("num_layers".into(), (layers - first_layer).into());
    config.insert(
        "lora_parameters".into(),
        json!({"rank": rank, "scale": scale, "dropout": 0.0, "keys": keys.into_iter().collect::<Vec<_>>()}),
    );
    Ok(("adapters.safetensors", config, outs))
}

fn to_peft(adapter: &Adapter, c: &Common) -> Result<Converted> {
    let (scale, rank, dora, dtype_of) = (c.scale, c.rank, c.dora, c.dtype_of);
    let mut outs = Vec::new();
    let (mut targets, mut layers) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
    let (mut rank_pattern, mut alpha_pattern) = (Map::new(), Map::new());
    for lr in &adapter.low_rank {
        let module = lr.target.strip_suffix(".weight").unwrap_or(&lr.target);
        let leaf = module.rsplit('.').next().unwrap_or(module);
        targets.insert(leaf.to_string());
        if let Some(layer) = module.strip_prefix("model.layers.").and_then(|t| t.split_once('.')) {
            layers.insert(layer.0.parse::<u64>().unwrap_or(0));
        }
        if lr.rank != rank {
            rank_pattern.insert(module.to_string(), lr.rank.into());
        }
        if lr.scale != scale || lr.rank != rank {
            alpha_pattern.insert(module.to_string(), (lr.scale * lr.rank as f64).into());
        }
        let dtype = dtype_of(lr);
        let key = |suffix: &str| format!("base_model.model.{module}.{suffix}");
        let (rows, cols, r) = (lr.rows as u64, lr.cols as u64, lr.rank as u64);
        if super::adapter::is_embedding(module) {
            // PEFT: lora_embedding_A (r, vocab) = bᵀ, lora_embedding_B (dim, r) = aᵀ.
            outs.push(Out {
                name: key("lora_embedding_A"),
                dtype,
                shape: vec![r, rows],
                values: transpose(&lr.b, lr.rows, lr.rank),
            });
            outs.push(Out {
                name: key("lora_embedding_B"),
                dtype,
                shape: vec![cols, r],
                values: transpose(&lr.a, lr.rank, lr.cols),
            });
        } else {
            // PEFT: lora_A (r, in) = a, lora_B (out, r) = b.
            outs.push(Out { name: key("lora_A.weight"), dtype, shape: vec![r, cols], values: lr.a.clone() });
            outs.push(Out { name: key("lora_B.weight"), dtype, shape: vec![rows, r], values: lr.b.clone() });
        }
        if let Some(m) = &lr.magnitude {
            outs.push(Out { name: key("lora_magnitude_vector"), dtype, shape: vec![rows], values: m.clone() });
        }
    }
    outs.sort_by(|a, b| a.name.cmp(&b.name));
    let mut config = Map::new();
    config.insert("peft_type".into(), "LORA".into());
    config.insert("task_type".into(), "CAUSAL_LM".into());
    config.insert("base_model_name_or_path".into(), c.recorded.clone().map_or(Json::Null, Json::from));
    config.insert("r".into(), rank.into());
    config.insert("lora_alpha".into(), (scale * rank as f64).into());
    config.insert("rank_pattern".into(), Json::Object(rank_pattern));
    config.insert("alpha_pattern".into(), Json::Object(alpha_pattern));
    config.insert("target_modules".into(), targets.into_iter().collect::<Vec<_>>().into());
    if !layers.is_empty() {
        config.insert("layers_to_transform".into(), layers.into_iter().collect::<Vec<_>>().into());
        config.insert("layers_pattern".into(), "layers".into());
    }
    config.insert("lora_dropout".into(), 0.0.into());
    config.insert("use_rslora".into(), false.into());
    config.insert("use_dora".into(), dora.into());
    config.insert("fan_in_fan_out".into(), false.into());
    config.insert("bias".into(), "none".into());
    config.insert("modules_to_save".into(), Json::Null);
    config.insert("inference_mode".into(), true.into());
    Ok(("adapter_model.safetensors", config, outs))
}

/// The value most entries have (ties: the smallest), compared exactly.
fn most_common(values: impl Iterator<Item = f64>) -> f64 {
    let mut count: BTreeMap<u64, (usize, f64)> = BTreeMap::new();
    for v in values {
        count.entry(v.to_bits()).or_insert((0, v)).0 += 1;
    }
    let best = count.values().map(|(n, _)| *n).max().unwrap_or(0);
    count.values().filter(|(n, _)| *n == best).map(|(_, v)| *v).fold(f64::INFINITY, f64::min)
}
