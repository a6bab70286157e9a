//! LoRA adapters as trained: Hugging Face PEFT (`adapter_config.json` + `adapter_model.safetensors`) and mlx-lm
//! (`adapter_config.json` + `adapters.safetensors`), read into one form: per base tensor, a low-rank update
//! `ΔW = scale · B·A` in the base weight's own layout, or a whole replacement. Formats and formulas, side by side in
//! `docs/formats.md` §3: mlx-lm's `mlx_lm/tuner/lora.py` and `dora.py` (`lora_a (in, r)`, `lora_b (r, out)`, literal
//! `scale`, DoRA `m`) and PEFT's `peft/tuners/lora/layer.py` and `config.py` (`lora_A (r, in)`, `lora_B (out, r)`,
//! `lora_alpha / r` or `/ √r` with rsLoRA, rank/alpha patterns, `fan_in_fan_out`, embeddings,
//! `lora_magnitude_vector`, `lora_B.bias`, `modules_to_save`).

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::{Map, Value as Json};

use crate::error::{Error, Result};
use crate::source::TensorSource;
use quantfarm_store::Location;

/// Module names whose weight is an embedding `(vocab, dim)` rather than a linear `(out, in)`: their LoRA factors
/// are stored the other way round in both formats.
const EMBEDDING_MODULES: &[&str] = &["embed_tokens", "wte", "word_embeddings", "embed_in", "tok_embeddings"];

/// Whether `module` (a path) is an embedding by its last component.
pub(crate) fn is_embedding(module: &str) -> bool {
    EMBEDDING_MODULES.contains(&module.rsplit('.').next().unwrap_or(module))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterFormat {
    Peft,
    MlxLm,
}

impl AdapterFormat {
    pub fn name(self) -> &'static str {
        match self {
            AdapterFormat::Peft => "PEFT",
            AdapterFormat::MlxLm => "mlx-lm",
        }
    }
}

/// `ΔW[o, i] = scale · Σ_k b[o, k] · a[k, i]` for a base tensor of `rows × cols` (its stored layout), then, for
/// DoRA, each row rescaled to `magnitude[o] / ‖W[o] + ΔW[o]‖`.
#[derive(Debug, Clone)]
pub struct LowRank {
    /// The base tensor it updates (`model.layers.0.self_attn.q_proj.weight`).
    pub target: String,
    pub rows: usize,
    pub cols: usize,
    pub rank: usize,
    /// `rows × rank`, row-major.
    pub b: Vec<f64>,
    /// `rank × cols`, row-major.
    pub a: Vec<f64>,
    pub scale: f64,
    pub magnitude: Option<Vec<f64>>,
    /// The adapter keys this update was read from, for messages.
    pub keys: Vec<String>,
}

/// A base tensor added to: `target += scale · values` (PEFT's `lora_B.bias`).
#[derive(Debug, Clone)]
pub struct BiasUpdate {
    pub target: String,
    pub values: Vec<f64>,
    pub scale: f64,
    pub key: String,
}

/// A base tensor replaced whole by the adapter's copy (PEFT `modules_to_save`, mlx-lm full fine-tunes).
#[derive(Debug, Clone)]
pub struct Replacement {
    pub target: String,
    pub key: String,
}

/// An adapter read and checked on its own (shapes against the base are checked by the merge plan).
pub struct Adapter {
    pub format: AdapterFormat,
    /// The folder, for messages.
    pub dir: String,
    /// The base model it records (`base_model_name_or_path` / `model`), when it records one.
    pub recorded_base: Option<String>,
    /// PEFT's global `lora_alpha`.
    pub lora_alpha: Option<f64>,
    pub low_rank: Vec<LowRank>,
    pub biases: Vec<BiasUpdate>,
    pub replacements: Vec<Replacement>,
    /// The adapter's tensors (replacements are copied from here).
    pub tensors: TensorSource,
}

impl Adapter {
    /// Reads the adapter folder `dir`, telling the format by its files.
    pub async fn open(dir: &Location) -> Result<Adapter> {
        let names = dir.list().await?;
        let has = |n: &str| names.iter().any(|x| x == n);
        let config_file = format!("{dir}/adapter_config.json");
        if !has("adapter_config.json") {
            return Err(Error::format(
                &config_file,
                "adapter_config.json",
                "missing: not a PEFT or mlx-lm adapter folder",
            ));
        }
        let blob = quantfarm_store::Blob::open(&dir.child("adapter_config.json")?).await?;
        let config: Map<String, Json> = match serde_json::from_slice(&blob.read_vec(0, blob.len().min(16 << 20)).await?)
        {
            Ok(Json::Object(m)) => m,
            Ok(_) => return Err(Error::format(&config_file, "adapter_config.json", "is not a JSON object")),
            Err(e) => return Err(Error::format(&config_file, "adapter_config.json", format!("not JSON: {e}"))),
        };
        let (format, file) = if has("adapter_model.safetensors") {
            (AdapterFormat::Peft, "adapter_model.safetensors")
        } else if has("adapters.safetensors") {
            (AdapterFormat::MlxLm, "adapters.safetensors")
        } else if has("adapter_model.bin") {
            return Err(Error::format(
                format!("{dir}/adapter_model.bin"),
                "adapter_model.bin",
                "pickled PyTorch weights are not read (they can run code); save the adapter with safetensors",
            ));
        } else {
            return Err(Error::format(
                format!("{dir}"),
                "adapter weights",
                "neither adapter_model.safetensors (PEFT) nor adapters.safetensors (mlx-lm) is in the folder",
            ));
        };
        let tensors = TensorSource::open(&dir.child(file)?).await?;
        let tensor_file = format!("{dir}/{file}");
        let mut adapter = Adapter {
            format,
            dir: dir.to_string(),
            recorded_base: None,
            lora_alpha: None,
            low_rank: Vec::new(),
            biases: Vec::new(),
            replacements: Vec::new(),
            tensors,
        };
        match format {
            AdapterFormat::Peft => adapter.read_peft(&config, &config_file, &tensor_file).await?,
            AdapterFormat::MlxLm => adapter.read_mlx(&config, &config_file, &tensor_file).await?,
        }
        Ok(adapter)
    }

    /// The low-rank updates in the order their first tensor appears in the adapter file (the order
    /// convert_lora_to_gguf.py writes them in).
    pub fn low_rank_in_file_order(&self) -> Vec<&LowRank> {
        let pos: std::collections::HashMap<&str, usize> =
            self.tensors.tensors().iter().enumerate().map(|(i, e)| (e.name.as_str(), i)).collect();
        let first = |lr: &LowRank| lr.keys.iter().filter_map(|k| pos.get(k.as_str())).min().copied().unwrap_or(0);
        let mut v: Vec<&LowRank> = self.low_rank.iter().collect();
        v.sort_by_key(|lr| first(lr));
        v
    }

    /// Reads the factors `ka` and `kb` of `module` and checks that their rank axes (picked from (rows, cols) by
    /// `rank_a` and `rank_b`) agree.
    #[allow(clippy::type_complexity)]
    async fn factor_pair(
        &self,
        file: &str,
        module: &str,
        ka: &str,
        kb: &str,
        rank_a: fn((usize, usize)) -> usize,
        rank_b: fn((usize, usize)) -> usize,
    ) -> Result<((Vec<f64>, usize, usize), (Vec<f64>, usize, usize))> {
        let (a, ar, ac) = self.matrix(ka, file).await?;
        let (b, br, bc) = self.matrix(kb, file).await?;
        let (ra, rb) = (rank_a((ar, ac)), rank_b((br, bc)));
        if ra != rb {
            return Err(Error::format(
                file,
                module,
                format!("{ka} is {ar}×{ac} and {kb} is {br}×{bc}: the ranks ({ra} and {rb}) differ"),
            ));
        }
        Ok(((a, ar, ac), (b, br, bc)))
    }

    async fn matrix(&self, key: &str, file: &str) -> Result<(Vec<f64>, usize, usize)> {
        let e = self.tensors.entry(key)?;
        let (rows, cols) = match e.shape[..] {
            [r, c] => (r as usize, c as usize),
            [n] => (1, n as usize),
            _ => return Err(Error::format(file, key, format!("shape {:?}: expected a matrix or a vector", e.shape))),
        };
        let mut v = vec![0f32; rows * cols];
        self.tensors.read_f32_rows(key, 0, &mut v, &mut Vec::new()).await?;
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(Error::format(file, key, format!("element {i} is {}", v[i])));
        }
        Ok((v.into_iter().map(f64::from).collect(), rows, cols))
    }

    async fn read_peft(&mut self, c: &Map<String, Json>, config_file: &str, file: &str) -> Result<()> {
        let bad = |field: &str, msg: String| Error::format(config_file, field, msg);
        match c.get("peft_type").and_then(Json::as_str) {
            Some("LORA") => {}
            other => return Err(bad("peft_type", format!("{other:?}: only LORA adapters are merged"))),
        }
        self.recorded_base = c.get("base_model_name_or_path").and_then(Json::as_str).map(str::to_string);
        let num = |k: &str, default: f64| -> Result<f64> {
            match c.get(k) {
                None | Some(Json::Null) => Ok(default),
                Some(v) => v.as_f64().ok_or_else(|| bad(k, format!("{v} is not a number"))),
            }
        };
        let r_default = num("r", 8.0)?;
        let alpha_default = num("lora_alpha", 8.0)?;
        self.lora_alpha = Some(alpha_default);
        let flag = |k: &str| c.get(k).and_then(Json::as_bool).unwrap_or(false);
        let (rslora, fan_in_fan_out, dora) = (flag("use_rslora"), flag("fan_in_fan_out"), flag("use_dora"));
        let patterns = |k: &str| -> Result<Vec<(Regex, f64)>> {
            let mut out = Vec::new();
            for (p, v) in c.get(k).and_then(Json::as_object).into_iter().flatten() {
                // PEFT's get_pattern_key: the key matches the module name, or its tail after a dot.
                let re = Regex::new(&format!(r"^(?:.*\.)?(?:{p})$")).map_err(|e| bad(k, format!("{p:?}: {e}")))?;
                out.push((re, v.as_f64().ok_or_else(|| bad(k, format!("{p:?}: {v} is not a number")))?));
            }
            Ok(out)
        };
        let (rank_pattern, alpha_pattern) = (patterns("rank_pattern")?, patterns("alpha_pattern")?);
        let saved: Vec<String> = match c.get("modules_to_save") {
            None | Some(Json::Null) => Vec::new(),
            Some(Json::Array(a)) => a.iter().filter_map(Json::as_str).map(str::to_string).collect(),
            Some(v) => return Err(bad("modules_to_save", format!("{v} is not a list of module names"))),
        };

        // Group keys by module: base_model.model.<module>.<suffix>.
        let mut modules: BTreeMap<String, BTreeMap<&'static str, String>> = BTreeMap::new();
        const SUFFIXES: [(&str, &str); 7] = [
            (".lora_A.weight", "A"),
            (".lora_B.weight", "B"),
            (".lora_B.bias", "bias"),
            (".lora_embedding_A", "EA"),
            (".lora_embedding_B", "EB"),
            (".lora_magnitude_vector.weight", "m"),
            (".lora_magnitude_vector", "m"),
        ];
        let keys: Vec<String> = self.tensors.tensors().iter().map(|e| e.name.clone()).collect();
        for key in &keys {
            let path = key.strip_prefix("base_model.model.").ok_or_else(|| {
                Error::format(file, key, "does not start with base_model.model. (not a PEFT adapter key)")
            })?;
            if let Some((module, part)) =
                SUFFIXES.iter().find_map(|(s, part)| path.strip_suffix(s).map(|m| (m.to_string(), *part)))
            {
                if modules.entry(module).or_default().insert(part, key.clone()).is_some() {
                    return Err(Error::format(file, key, "a second tensor for the same part of the same module"));
                }
                continue;
            }
            // modules_to_save: a whole parameter of a listed module (PEFT stores it under its plain name).
            let module = path.rsplit_once('.').map(|(m, _)| m).unwrap_or(path);
            let leaf = module.rsplit('.').next().unwrap_or(module);
            if saved.iter().any(|s| s == leaf || s == module) {
                self.replacements.push(Replacement { target: path.to_string(), key: key.clone() });
                continue;
            }
            return Err(Error::format(
                file,
                key,
                "is not a LoRA tensor (lora_A/lora_B/lora_embedding_A/B/lora_magnitude_vector) nor a parameter of a \
                 module in modules_to_save",
            ));
        }

        for (module, parts) in modules {
            let take = |p: &str| parts.get(p).cloned();
            let embedding = take("EA").is_some() || take("EB").is_some();
            let (ka, kb) = if embedding { (take("EA"), take("EB")) } else { (take("A"), take("B")) };
            let (Some(ka), Some(kb)) = (ka, kb) else {
                let have: Vec<&String> = parts.values().collect();
                return Err(Error::format(file, &module, format!("has {have:?} but not both LoRA factors A and B")));
            };
            if embedding && (take("A").is_some() || take("B").is_some()) {
                return Err(Error::format(file, &module, "has both linear and embedding LoRA factors"));
            }
            // PEFT: A is (r, in), B is (out, r).
            let ((a, ar, ac), (b, br, bc)) = self.factor_pair(file, &module, &ka, &kb, |(r, _)| r, |(_, c)| c).await?;
            let rank = ar;
            let pattern = |list: &[(Regex, f64)], default: f64| {
                list.iter().find(|(re, _)| re.is_match(&module)).map(|(_, v)| *v).unwrap_or(default)
            };
            let r = pattern(&rank_pattern, r_default);
            if r != rank as f64 {
                return Err(Error::format(
                    config_file,
                    "r",
                    format!("module {module}: the config gives rank {r}, its tensors have rank {rank}"),
                ));
            }
            let alpha = pattern(&alpha_pattern, alpha_default);
            let scale = if rslora { alpha / r.sqrt() } else { alpha / r };
            // Normalise to ΔW = scale · b·a in the base tensor's stored layout.
            let (b_n, a_n, rows, cols) = if embedding || fan_in_fan_out {
                // (B·A)ᵀ = Aᵀ·Bᵀ: embeddings are stored (vocab, dim), Conv1D weights (in, out).
                (transpose(&a, ar, ac), transpose(&b, br, bc), ac, br)
            } else {
                (b, a, br, ac)
            };
            let target = format!("{module}.weight");
            let magnitude = match take("m") {
                None if dora => {
                    return Err(Error::format(file, &module, "use_dora is set but lora_magnitude_vector is missing"))
                }
                None => None,
                Some(k) => {
                    if embedding {
                        return Err(Error::format(file, &k, "DoRA on an embedding is not supported"));
                    }
                    let (m, _, n) = self.matrix(&k, file).await?;
                    if n != rows {
                        return Err(Error::format(file, &k, format!("has {n} values for {rows} output rows")));
                    }
                    Some(m)
                }
            };
            if let Some(k) = take("bias") {
                let (v, _, n) = self.matrix(&k, file).await?;
                if n != rows {
                    return Err(Error::format(file, &k, format!("has {n} values for {rows} output rows")));
                }
                self.biases.push(BiasUpdate { target: format!("{module}.bias"), values: v, scale, key: k });
            }
            let mut used: Vec<String> = parts.values().cloned().collect();
            used.sort();
            self.low_rank.push(LowRank { target, rows, cols, rank, b: b_n, a: a_n, scale, magnitude, keys: used });
        }
        Ok(())
    }

    async fn read_mlx(&mut self, c: &Map<String, Json>, config_file: &str, file: &str) -> Result<()> {
        let bad = |field: &str, msg: String| Error::format(config_file, field, msg);
        self.recorded_base = c.get("model").and_then(Json::as_str).map(str::to_string);
        let kind = c.get("fine_tune_type").and_then(Json::as_str).unwrap_or("lora");
        let keys: Vec<String> = self.tensors.tensors().iter().map(|e| e.name.clone()).collect();
        if kind == "full" {
            self.replacements = keys.iter().map(|k| Replacement { target: k.clone(), key: k.clone() }).collect();
            return Ok(());
        }
        if kind != "lora" && kind != "dora" {
            return Err(bad("fine_tune_type", format!("{kind:?}: expected lora, dora or full")));
        }
        let scale = match c.get("lora_parameters").and_then(|p| p.get("scale")) {
            None | Some(Json::Null) => 20.0,
            Some(v) => v.as_f64().ok_or_else(|| bad("lora_parameters.scale", format!("{v} is not a number")))?,
        };
        let mut modules: BTreeMap<String, BTreeMap<&'static str, String>> = BTreeMap::new();
        for key in &keys {
            let (module, part) = match key.rsplit_once('.') {
                Some((m, "lora_a")) => (m, "a"),
                Some((m, "lora_b")) => (m, "b"),
                Some((m, "m")) => (m, "m"),
                _ => {
                    return Err(Error::format(
                        file,
                        key,
                        "is not lora_a, lora_b or m (mlx-lm's load_adapters refuses it too)",
                    ))
                }
            };
            modules.entry(module.to_string()).or_default().insert(part, key.clone());
        }
        for (module, parts) in modules {
            let (Some(ka), Some(kb)) = (parts.get("a").cloned(), parts.get("b").cloned()) else {
                let have: Vec<&String> = parts.values().collect();
                return Err(Error::format(file, &module, format!("has {have:?} but not both lora_a and lora_b")));
            };
            // mlx-lm: lora_a is (in, r), lora_b is (r, out).
            let ((a, ar, ac), (b, br, bc)) = self.factor_pair(file, &module, &ka, &kb, |(_, c)| c, |(r, _)| r).await?;
            let leaf = module.rsplit('.').next().unwrap_or(&module);
            let embedding = EMBEDDING_MODULES.contains(&leaf);
            let (b_n, a_n, rows, cols) = if embedding {
                // ΔE = scale · lora_a · lora_b, (vocab, r)·(r, dim).
                (a, b, ar, bc)
            } else {
                // ΔW = scale · lora_bᵀ · lora_aᵀ, (out, r)·(r, in).
                (transpose(&b, br, bc), transpose(&a, ar, ac), bc, ar)
            };
            let magnitude = match parts.get("m") {
                None if kind == "dora" => return Err(Error::format(file, &module, "a DoRA adapter without m")),
                None => None,
                Some(k) => {
                    let (m, _, n) = self.matrix(k, file).await?;
                    if embedding || n != rows {
                        return Err(Error::format(file, k, format!("has {n} values for {rows} output rows")));
                    }
                    Some(m)
                }
            };
            let mut used: Vec<String> = parts.values().cloned().collect();
            used.sort();
            self.low_rank.push(LowRank {
                target: format!("{module}.weight"),
                rows,
                cols,
                rank: ac,
                b: b_n,
                a: a_n,
                scale,
                magnitude,
                keys: used,
            });
        }
        Ok(())
    }
}

pub(crate) fn transpose(m: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut t = vec![0.0; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = m[r * cols + c];
        }
    }
    t
}
