//! Exact LoRA merge: an adapter (PEFT or mlx-lm, see [`adapter`]) folded into an HF safetensors base, written as a
//! new HF checkpoint with the base's files, tensor order and dtypes (or every float matrix in F32, for the merge
//! check: [`MergeOptions::widen`]).
//!
//! `W' = W + scale·(B·A)` (DoRA: each row then rescaled to `m / ‖W + ΔW‖`) is computed in f64 and rounded once to
//! the base dtype, so the result is the exact merge correctly rounded: the converters people use add in the base
//! dtype (mlx_lm.fuse: `mlx_lm/tuner/lora.py::LoRALinear.fuse`; PEFT's `peft/tuners/lora/layer.py::Linear.merge`)
//! and lose the low bits of small deltas, which is one of the ways a merged model stops behaving like the adapter
//! (`docs/formats.md` §3; huggingface/peft#1388).
//!
//! Everything is checked before a byte is written: every adapter tensor is used exactly once, every update's shape
//! matches its base tensor, the adapter's recorded base matches the base given, the base is not quantized. A tied
//! output embedding is untied (and `tie_word_embeddings` set to false) when the adapter changes either side, since
//! merging into the shared tensor would change the output layer the adapter was trained against. All files are
//! staged and committed together at the end.

pub mod adapter;
pub mod convert_adapter;
mod lora_gguf;

use std::collections::{BTreeMap, HashMap};

use serde_json::Value as Json;

use crate::convert::transform::f64_to_bf16_bits;
use crate::dtype::{Dtype, TensorType};
use crate::error::{Error, Result};
use crate::safetensors::{StTensorDesc, INDEX_FILE};
use crate::source::{Format, TensorSource};
use crate::write::{copy_tensor, PieceWriter, SafetensorsWriter};
use quantfarm_store::Blob;
use quantfarm_store::Location;
use quantfarm_store::{Committed, StagedSink};

use adapter::LowRank;
pub use adapter::{Adapter, AdapterFormat};
pub use lora_gguf::write_lora_gguf;

/// The HF names of the input embedding and the output projection (LLaMA-family causal LMs).
const EMBED: &str = "model.embed_tokens.weight";
const LM_HEAD: &str = "lm_head.weight";

#[derive(Debug, Clone)]
pub struct MergeOptions {
    /// Tensor data held at once.
    pub budget: u64,
    pub overwrite: bool,
    /// The base model's identity, when the folder does not say it (config.json `_name_or_path`, or the folder's
    /// name); compared with the base the adapter records.
    pub base_name: Option<String>,
    /// Write every float vector and matrix as F32 instead of the base's dtype: the merge rounded to f32. This is
    /// the merge check's model (link 1), where a bf16 rounding of the merged weights would flip greedy near-ties
    /// and hide the merge's arithmetic; the published checkpoint keeps the base's dtypes.
    pub widen: bool,
}

/// What a merge did.
#[derive(Debug)]
pub struct Merged {
    pub format: AdapterFormat,
    pub files: Vec<Committed>,
    /// Base tensors changed, in output order.
    pub changed: Vec<String>,
    /// `tie_word_embeddings` was turned off and `lm_head.weight` written.
    pub untied: bool,
}

/// How one output tensor is made (indices into the adapter's updates).
#[derive(Clone, Copy)]
enum Make {
    Copy,
    LowRank(usize),
    Bias(usize),
    Replace(usize),
}

/// One output tensor: its name, where its base values come from, and what is done to them.
struct Out {
    name: String,
    /// The base tensor read (the embedding, for an untied `lm_head.weight`).
    source: String,
    dtype: Dtype,
    shape: Vec<u64>,
    make: Make,
    /// Written as F32 from a narrower base dtype ([`MergeOptions::widen`]): copied tensors are widened, not copied.
    widened: bool,
}

/// One output file: the base file's name and `__metadata__`, and its tensors in order.
struct OutFile {
    name: String,
    tensors: Vec<Out>,
    metadata: Vec<(String, String)>,
}

/// A checked merge, before any byte is written: every output file and tensor and how it is made. Writing it
/// ([`merge_adapter`]) and checking an output against it ([`crate::verify`]) share it, so both make the same bytes.
pub struct MergePlan {
    base: Location,
    base_name: String,
    src: TensorSource,
    adapter: Adapter,
    config: serde_json::Map<String, Json>,
    untie: bool,
    files: Vec<OutFile>,
}

/// Checks the adapter folder `adapter` against the HF checkpoint folder `base` and plans the merged checkpoint;
/// reads headers, the adapter's (small) tensors and the JSON files, no base weights.
pub async fn plan_merge(base: &Location, adapter: &Location, opts: &MergeOptions) -> Result<MergePlan> {
    let src = TensorSource::open(base).await?;
    let base_name = base.to_string();
    let st =
        match (src.format(), src.safetensors()) {
            (Format::Safetensors, Some(st)) => st,
            (Format::Mlx, _) => return Err(Error::format(
                &base_name,
                "base",
                "is an MLX checkpoint; a quantized base is refused (merging into rounded weights loses the adapter): \
                 dequantize it to an HF checkpoint first",
            )),
            _ => return Err(Error::format(&base_name, "base", "is not an HF safetensors checkpoint folder")),
        };
    let config_file = format!("{}/config.json", base_name.trim_end_matches('/'));
    let config_bytes = read_small(&base.child("config.json")?, &config_file).await?;
    let config: serde_json::Map<String, Json> = match serde_json::from_slice(&config_bytes) {
        Ok(Json::Object(m)) => m,
        _ => return Err(Error::format(&config_file, "config.json", "is not a JSON object")),
    };
    if config.get("quantization_config").is_some_and(|q| !q.is_null()) || config.get("quantization").is_some() {
        return Err(Error::format(
            &config_file,
            "quantization_config",
            "the base is quantized; a quantized base is refused: dequantize it to bf16 first",
        ));
    }
    let adapter = Adapter::open(adapter).await?;
    check_base_identity(&adapter, base, &config, opts)?;

    // Every base tensor by name: (dtype, shape).
    let mut base_tensors: HashMap<&str, (Dtype, &[u64])> = HashMap::new();
    for (_, h) in &st.files {
        for t in &h.tensors {
            base_tensors.insert(t.name.as_str(), (t.dtype, &t.shape[..]));
        }
    }
    let tied = base_tensors.contains_key(EMBED)
        && !base_tensors.contains_key(LM_HEAD)
        && config.get("tie_word_embeddings").and_then(Json::as_bool) != Some(false);

    // Updates by target, each target at most once; the lm_head of a tied base reads the embedding.
    let mut updates: BTreeMap<String, Make> = BTreeMap::new();
    for (i, lr) in adapter.low_rank.iter().enumerate() {
        let keys = lr.keys.join(", ");
        let (dtype, shape) = base_tensor(&base_tensors, &lr.target, tied, &adapter, &keys, &base_name)?;
        float_dtype(dtype, &lr.target, &base_name)?;
        if shape != [lr.rows as u64, lr.cols as u64] {
            return Err(Error::format(
                &adapter.dir,
                keys,
                format!(
                    "{} update is {}×{} (rank {}), but the base tensor {} is {shape:?}",
                    adapter.format.name(),
                    lr.rows,
                    lr.cols,
                    lr.rank,
                    lr.target
                ),
            ));
        }
        insert(&mut updates, &lr.target, Make::LowRank(i), &keys, &adapter.dir)?;
    }
    for (i, b) in adapter.biases.iter().enumerate() {
        let (dtype, shape) = base_tensor(&base_tensors, &b.target, false, &adapter, &b.key, &base_name)?;
        float_dtype(dtype, &b.target, &base_name)?;
        if shape != [b.values.len() as u64] {
            return Err(Error::format(
                &adapter.dir,
                &b.key,
                format!("has {} values, but the base tensor {} is {shape:?}", b.values.len(), b.target),
            ));
        }
        insert(&mut updates, &b.target, Make::Bias(i), &b.key, &adapter.dir)?;
    }
    for (i, r) in adapter.replacements.iter().enumerate() {
        let (dtype, shape) = base_tensor(&base_tensors, &r.target, tied, &adapter, &r.key, &base_name)?;
        float_dtype(dtype, &r.target, &base_name)?;
        let e = adapter.tensors.entry(&r.key)?;
        if e.shape != shape {
            return Err(Error::format(
                &adapter.dir,
                &r.key,
                format!("is {:?}, but the base tensor {} is {shape:?}", e.shape, r.target),
            ));
        }
        if !matches!(e.ty, TensorType::Dtype(Dtype::BF16 | Dtype::F16 | Dtype::F32)) {
            return Err(Error::format(&adapter.dir, &r.key, format!("is {}; BF16, F16 or F32 expected", e.ty)));
        }
        insert(&mut updates, &r.target, Make::Replace(i), &r.key, &adapter.dir)?;
    }
    if updates.is_empty() {
        return Err(Error::format(&adapter.dir, "adapter", "has no tensors: nothing to merge"));
    }
    let untie = tied && (updates.contains_key(LM_HEAD) || updates.contains_key(EMBED));

    // The output files: the base's, in its order; an untied lm_head goes after the embedding.
    let mut files: Vec<OutFile> = Vec::new();
    let widened = |d: Dtype, shape: &[u64]| opts.widen && matches!(d, Dtype::BF16 | Dtype::F16) && shape.len() <= 2;
    for (blob, h) in &st.files {
        let mut outs = Vec::new();
        for t in &h.tensors {
            let make = updates.remove(t.name.as_str()).unwrap_or(Make::Copy);
            let widened = widened(t.dtype, &t.shape);
            let dtype = if widened { Dtype::F32 } else { t.dtype };
            outs.push(Out {
                name: t.name.clone(),
                source: t.name.clone(),
                dtype,
                shape: t.shape.clone(),
                make,
                widened,
            });
            if untie && t.name == EMBED {
                let make = updates.remove(LM_HEAD).unwrap_or(Make::Copy);
                outs.push(Out {
                    name: LM_HEAD.into(),
                    source: EMBED.into(),
                    dtype,
                    shape: t.shape.clone(),
                    make,
                    widened,
                });
            }
        }
        files.push(OutFile {
            name: blob.location().file_name().to_string(),
            tensors: outs,
            metadata: h.metadata.clone(),
        });
    }
    debug_assert!(updates.is_empty(), "every update has its base tensor");
    drop(base_tensors);
    Ok(MergePlan { base: base.clone(), base_name, src, adapter, config, untie, files })
}

impl MergePlan {
    pub fn format(&self) -> AdapterFormat {
        self.adapter.format
    }

    /// The output's safetensors files, in order (the base's names).
    pub fn file_names(&self) -> Vec<&str> {
        self.files.iter().map(|f| f.name.as_str()).collect()
    }

    /// The tensors of output file `file`: name, dtype, shape, and whether the adapter changes it.
    pub fn tensors(&self, file: usize) -> impl Iterator<Item = (&str, Dtype, &[u64], bool)> {
        self.files[file].tensors.iter().map(|o| (o.name.as_str(), o.dtype, &o.shape[..], !matches!(o.make, Make::Copy)))
    }

    /// The `__metadata__` of output file `file` (the base file's).
    pub fn file_metadata(&self, file: usize) -> &[(String, String)] {
        &self.files[file].metadata
    }

    /// sha256 over what the plan writes (files, tensors, dtypes, shapes, which change) and the adapter's scales:
    /// a farm worker recomputes it and refuses to write a file of a plan that changed.
    pub fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(format!("{} untie={}\n", self.adapter.format.name(), self.untie));
        for f in &self.files {
            h.update(format!("file {}\n", f.name));
            for o in &f.tensors {
                let make = match o.make {
                    Make::Copy => "copy".to_string(),
                    Make::LowRank(i) => {
                        let lr = &self.adapter.low_rank[i];
                        format!("lora r{} scale {:e} dora {}", lr.rank, lr.scale, lr.magnitude.is_some())
                    }
                    Make::Bias(i) => format!("bias scale {:e}", self.adapter.biases[i].scale),
                    Make::Replace(i) => format!("replace {}", self.adapter.replacements[i].key),
                };
                h.update(format!("{} {} {:?} <- {} {make}\n", o.name, o.dtype, o.shape, o.source));
            }
        }
        quantfarm_store::hex(&h.finalize())
    }

    /// Tensor bytes of each output file.
    pub fn file_bytes(&self) -> Vec<u64> {
        let size = |o: &Out| o.shape.iter().product::<u64>() * o.dtype.size() as u64;
        self.files.iter().map(|f| f.tensors.iter().map(size).sum()).collect()
    }

    /// Base tensors the adapter changes, in output order.
    pub fn changed(&self) -> Vec<String> {
        let changed = self.files.iter().flat_map(|f| &f.tensors).filter(|o| !matches!(o.make, Make::Copy));
        changed.map(|o| o.name.clone()).collect()
    }

    /// The files whose bytes the merge depends on: the base's tensors and the adapter's.
    pub fn inputs(&self) -> Vec<&quantfarm_store::Blob> {
        self.src.files().into_iter().chain(self.adapter.tensors.files()).collect()
    }

    /// Whether `tie_word_embeddings` is turned off and `lm_head.weight` written.
    pub fn untied(&self) -> bool {
        self.untie
    }

    /// Streams the bytes of tensor `index` of output file `file` into `w`, within `budget`.
    pub async fn tensor_bytes(&self, file: usize, index: usize, budget: u64, w: &mut impl PieceWriter) -> Result<()> {
        let o = &self.files[file].tensors[index];
        match o.make {
            Make::Copy if !o.widened => copy_tensor(&self.src, &o.source, budget, &mut Vec::new(), w).await,
            _ => write_updated(&self.src, &self.adapter, o, budget, w).await,
        }
    }

    /// Every other file of the output (config.json, tokenizer files, the index), by name: the base's, with the
    /// index rewritten for the output's tensors and config.json's `tie_word_embeddings` turned off when untied.
    pub async fn side_files(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let shard_names = self.file_names();
        let mut out = Vec::new();
        for name in self.base.list().await? {
            if shard_names.contains(&name.as_str()) {
                continue;
            }
            let bytes = if name == INDEX_FILE {
                index_json(&self.files)
            } else if name == "config.json" && self.untie {
                let mut config = self.config.clone();
                config.insert("tie_word_embeddings".into(), Json::Bool(false));
                let mut text = serde_json::to_string_pretty(&Json::Object(config)).expect("JSON serializes");
                text.push('\n');
                text.into_bytes()
            } else {
                read_small(&self.base.child(&name)?, &format!("{}/{name}", self.base_name)).await?
            };
            out.push((name, bytes));
        }
        Ok(out)
    }

    /// Stages output file `file` at `dst` with all its bytes; not yet committed.
    pub async fn stage_file(
        &self,
        file: usize,
        dst: &Location,
        budget: u64,
        overwrite: bool,
    ) -> Result<SafetensorsWriter> {
        let f = &self.files[file];
        let descs: Vec<StTensorDesc> = f
            .tensors
            .iter()
            .map(|o| StTensorDesc { name: o.name.clone(), dtype: o.dtype, shape: o.shape.clone() })
            .collect();
        let mut w = SafetensorsWriter::create(dst, &descs, &f.metadata, overwrite).await?;
        for i in 0..f.tensors.len() {
            self.tensor_bytes(file, i, budget, &mut w).await?;
        }
        Ok(w)
    }
}

/// Merges the adapter folder `adapter` into the HF checkpoint folder `base`, writing the merged checkpoint to folder
/// `out`.
pub async fn merge_adapter(base: &Location, adapter: &Location, out: &Location, opts: &MergeOptions) -> Result<Merged> {
    let plan = plan_merge(base, adapter, opts).await?;
    // Stage every file, then commit them all.
    let mut staged_files = Vec::new();
    for (i, f) in plan.files.iter().enumerate() {
        staged_files.push(plan.stage_file(i, &out.child(&f.name)?, opts.budget, opts.overwrite).await?);
    }
    let mut small = Vec::new();
    for (name, bytes) in plan.side_files().await? {
        let mut sink = StagedSink::create(&out.child(&name)?, opts.overwrite).await?;
        sink.write(&bytes).await?;
        small.push(sink);
    }
    let mut committed = Vec::new();
    for w in staged_files {
        committed.push(w.finish().await?);
    }
    for s in small {
        committed.push(s.commit().await?);
    }
    Ok(Merged { format: plan.adapter.format, files: committed, changed: plan.changed(), untied: plan.untie })
}

/// Converts the adapter folder `adapter` to format `to` in folder `dst` (see [`convert_adapter`]). With `base`, the
/// adapter is first checked against it as a merge would be (every key, shape and the recorded base), and its layer
/// count is what mlx-lm's `num_layers` counts from.
pub async fn convert_adapter_folder(
    adapter: &Location,
    to: AdapterFormat,
    base: Option<&Location>,
    dst: &Location,
    opts: &MergeOptions,
) -> Result<Vec<Committed>> {
    let mut facts = convert_adapter::BaseFacts { num_hidden_layers: None, name: opts.base_name.clone() };
    if let Some(base) = base {
        let plan = plan_merge(base, adapter, opts).await?;
        facts.num_hidden_layers = plan.config.get("num_hidden_layers").and_then(Json::as_u64);
        if facts.name.is_none() {
            facts.name = plan.config.get("_name_or_path").and_then(Json::as_str).map(str::to_string);
        }
    }
    let adapter = Adapter::open(adapter).await?;
    convert_adapter::convert_adapter(&adapter, to, &facts, dst, opts.overwrite).await
}

/// Converts the adapter folder `adapter`, trained on the HF base folder `base` (its config.json is read, and the
/// adapter's recorded base checked against it), into a GGUF LoRA file at `dst` (see [`write_lora_gguf`]).
pub async fn adapter_to_gguf(
    base: &Location,
    adapter: &Location,
    dst: &Location,
    opts: &MergeOptions,
) -> Result<Committed> {
    let config_file = format!("{}/config.json", base.to_string().trim_end_matches('/'));
    let config: serde_json::Map<String, Json> =
        match serde_json::from_slice(&read_small(&base.child("config.json")?, &config_file).await?) {
            Ok(Json::Object(m)) => m,
            _ => return Err(Error::format(&config_file, "config.json", "is not a JSON object")),
        };
    let adapter = Adapter::open(adapter).await?;
    check_base_identity(&adapter, base, &config, opts)?;
    write_lora_gguf(&adapter, &config, dst, opts.overwrite).await
}

fn insert(updates: &mut BTreeMap<String, Make>, target: &str, m: Make, keys: &str, dir: &str) -> Result<()> {
    if updates.insert(target.to_string(), m).is_some() {
        return Err(Error::format(dir, keys, format!("updates {target}, which another adapter entry also updates")));
    }
    Ok(())
}

/// The base tensor an update targets (`lm_head.weight` of a tied base is the embedding), or an error naming the
/// adapter keys: this is where a misspelled or foreign key is caught.
fn base_tensor<'a>(
    base: &HashMap<&str, (Dtype, &'a [u64])>,
    target: &str,
    tied: bool,
    adapter: &Adapter,
    keys: &str,
    base_name: &str,
) -> Result<(Dtype, &'a [u64])> {
    let name = if tied && target == LM_HEAD { EMBED } else { target };
    base.get(name).copied().ok_or_else(|| {
        Error::format(
            &adapter.dir,
            keys,
            format!("targets {target}, which the base {base_name} does not have (a misspelled key, or another model)"),
        )
    })
}

fn float_dtype(d: Dtype, target: &str, base_name: &str) -> Result<()> {
    match d {
        Dtype::BF16 | Dtype::F16 | Dtype::F32 => Ok(()),
        other => Err(Error::format(base_name, target, format!("is {other}; only BF16, F16 or F32 weights are merged"))),
    }
}

/// The adapter's recorded base must name the base given: compared by the last path component, case-insensitively,
/// with config.json `_name_or_path`, the folder's name and `--base-name`.
fn check_base_identity(
    adapter: &Adapter,
    base: &Location,
    config: &serde_json::Map<String, Json>,
    opts: &MergeOptions,
) -> Result<()> {
    let Some(recorded) = adapter.recorded_base.as_deref().filter(|r| !r.is_empty()) else { return Ok(()) };
    let tail = |s: &str| s.trim_end_matches('/').rsplit('/').next().unwrap_or(s).to_lowercase();
    let mut names: Vec<String> = vec![base.file_name().to_string()];
    if let Some(n) = config.get("_name_or_path").and_then(Json::as_str) {
        names.push(n.to_string());
    }
    if let Some(n) = &opts.base_name {
        names.push(n.clone());
    }
    if names.iter().any(|n| tail(n) == tail(recorded)) {
        return Ok(());
    }
    Err(Error::format(
        format!("{}/adapter_config.json", adapter.dir),
        match adapter.format {
            AdapterFormat::Peft => "base_model_name_or_path",
            AdapterFormat::MlxLm => "model",
        },
        format!(
            "the adapter was trained on {recorded:?}, but the base given is known as {names:?}; if that base is \
             {recorded:?}, say so with --base-name"
        ),
    ))
}

async fn read_small(loc: &Location, name: &str) -> Result<Vec<u8>> {
    let blob = Blob::open(loc).await?;
    if blob.len() > 256 << 20 {
        return Err(Error::format(name, "file", format!("{} bytes is too large for a side file", blob.len())));
    }
    blob.read_vec(0, blob.len()).await.map_err(Into::into)
}

/// `model.safetensors.index.json` for the output files (their names are the base's).
fn index_json(files: &[OutFile]) -> Vec<u8> {
    let mut map = BTreeMap::new();
    let mut total = 0u64;
    for f in files {
        for o in &f.tensors {
            map.insert(o.name.clone(), f.name.clone());
            total += o.shape.iter().product::<u64>() * o.dtype.size() as u64;
        }
    }
    let index = serde_json::json!({ "metadata": { "total_size": total }, "weight_map": map });
    let mut text = serde_json::to_string_pretty(&index).expect("JSON serializes");
    text.push('\n');
    text.into_bytes()
}

/// Writes one changed or widened tensor, whole rows at a time within `budget`.
async fn write_updated(
    src: &TensorSource,
    adapter: &Adapter,
    o: &Out,
    budget: u64,
    w: &mut impl PieceWriter,
) -> Result<()> {
    let (rows, cols) = match o.shape[..] {
        [r, c] => (r as usize, c as usize),
        [n] => (1, n as usize),
        _ => return Err(Error::format(src.location().to_string(), &o.name, "only matrices and vectors are merged")),
    };
    let per_row = (cols * (4 + 8 + o.dtype.size())) as u64;
    let step = (budget / per_row.max(1)).max(1) as usize;
    let (mut vals, mut wide, mut bytes, mut scratch) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut r = 0;
    while r < rows {
        let n = step.min(rows - r);
        vals.resize(n * cols, 0f32);
        match o.make {
            Make::Replace(i) => {
                let key = &adapter.replacements[i].key;
                adapter.tensors.read_f32_rows(key, r as u64, &mut vals, &mut scratch).await?
            }
            _ => src.read_f32_rows(&o.source, r as u64, &mut vals, &mut scratch).await?,
        }
        wide.clear();
        wide.extend(vals.iter().map(|&x| f64::from(x)));
        match o.make {
            Make::LowRank(i) => apply_low_rank(&adapter.low_rank[i], r, cols, &mut wide),
            Make::Bias(i) => {
                let b = &adapter.biases[i];
                for (v, d) in wide.iter_mut().zip(&b.values) {
                    *v += b.scale * d;
                }
            }
            Make::Replace(_) | Make::Copy => {}
        }
        bytes.clear();
        encode(&wide, o.dtype, &mut bytes);
        w.write_piece(&bytes).await?;
        r += n;
    }
    Ok(())
}

/// Adds `scale · b[o]·a` to rows `first..` held in `rows` (and applies DoRA's row rescaling), all in f64.
pub fn apply_low_rank(lr: &LowRank, first: usize, cols: usize, rows: &mut [f64]) {
    let mut acc = vec![0f64; cols];
    for (i, row) in rows.chunks_exact_mut(cols).enumerate() {
        let o = first + i;
        acc.iter_mut().for_each(|x| *x = 0.0);
        for k in 0..lr.rank {
            let bk = lr.b[o * lr.rank + k];
            for (x, a) in acc.iter_mut().zip(&lr.a[k * cols..(k + 1) * cols]) {
                *x += bk * a;
            }
        }
        for (w, d) in row.iter_mut().zip(&acc) {
            *w += lr.scale * d;
        }
        if let Some(m) = &lr.magnitude {
            let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
            let f = m[o] / norm;
            row.iter_mut().for_each(|x| *x *= f);
        }
    }
}

/// Each value rounded once to `dtype`, little-endian.
pub(crate) fn encode(vals: &[f64], dtype: Dtype, out: &mut Vec<u8>) {
    match dtype {
        Dtype::BF16 => vals.iter().for_each(|&x| out.extend_from_slice(&f64_to_bf16_bits(x).to_le_bytes())),
        Dtype::F16 => vals.iter().for_each(|&x| out.extend_from_slice(&half::f16::from_f64(x).to_bits().to_le_bytes())),
        _ => vals.iter().for_each(|&x| out.extend_from_slice(&(x as f32).to_le_bytes())),
    }
}
