//! `llama-quantize` for whole GGUF models: the same output metadata, tensor order, per-tensor types and bytes,
//! streamed tensor by tensor (and row chunk by row chunk) within a memory budget, written through the staged sink.
//! Pipeline of `src/llama-quant.cpp::llama_model_quantize_impl` (llama.cpp 0c1e570).

use std::sync::Arc;

use quantfarm_store::{Committed, Location};
use quantfarm_tensors::dtype::TensorType;
use quantfarm_tensors::gguf::{split, TensorDesc, Value};
use quantfarm_tensors::write::{copy_tensor, GgufWriter};
use quantfarm_tensors::{GgmlType, TensorSource};

use crate::edits::{KvOverride, Prune};
use crate::imatrix::Imatrix;
use crate::mixture::{self, Choice, ModelFacts};
use crate::FileType;
use crate::QuantError;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(transparent)]
    Tensors(#[from] quantfarm_tensors::Error),
    #[error("{file}: quantize reads GGUF models, this is {format}")]
    NotGguf { file: String, format: &'static str },
    #[error("{file}: metadata {key}: {msg}")]
    Metadata { file: String, key: String, msg: String },
    #[error(
        "tensor {tensor:?}: requantizing from {from} to {to} is disabled: the source is quantized already (`quantfarm \
         quantize --allow-requantize`, as llama-quantize's; or a file type that keeps the tensor, such as MXFP4_MOE for \
         MXFP4 experts; or a float source: `quantfarm convert MODEL.gguf --to hf` dequantizes one)"
    )]
    Requantize { tensor: String, from: GgmlType, to: GgmlType },
    #[error("tensor {tensor:?}: {ftype} gives it type {ty}, which quantfarm cannot produce yet")]
    Unsupported { tensor: String, ftype: FileType, ty: GgmlType },
    /// llama-quantize: "imatrix size %d is different from tensor size %d for %s" (refused, except for the token
    /// embeddings, which are then quantized without it).
    #[error(
        "tensor {tensor:?}: imatrix {file} has {got} values for it, but it needs {expected} \
         ({ne0} columns × {experts} experts): is the imatrix for another model?"
    )]
    ImatrixSize { tensor: String, file: String, got: usize, expected: u64, ne0: u64, experts: u64 },
    /// An `--output-tensor-type`/`--token-embedding-type` override skips llama-quantize's fallback, so a type whose
    /// block does not divide the rows is refused here (llama-quantize would fail while quantizing).
    #[error(
        "tensor {tensor:?}: type {ty} needs rows that are whole blocks of {block}, but its rows have {ne0} values"
    )]
    BlockSize { tensor: String, ty: GgmlType, block: usize, ne0: u64 },
    #[error(transparent)]
    Mixture(#[from] mixture::MixtureError),
    /// llama-quantize: "this quantization requires an imatrix!".
    #[error(
        "tensor {tensor:?}: {ftype} gives it type {ty}, which llama-quantize makes only with an importance matrix: \
         pass one (--imatrix FILE, made by `quantfarm imatrix` or llama-imatrix)"
    )]
    ImatrixRequired { tensor: String, ftype: FileType, ty: GgmlType },
    /// llama-quantize: "Missing importance matrix for tensor … in a very low-bit quantization".
    #[error("tensor {tensor:?}: imatrix {file} has no entry for it, and its type {ty} needs one")]
    ImatrixMissing { tensor: String, ty: GgmlType, file: String },
    #[error("cannot start {threads} quantization threads: {msg}")]
    Threads { threads: usize, msg: String },
    #[error("tensor {tensor:?}: {source}")]
    Quant {
        tensor: String,
        #[source]
        source: QuantError,
    },
}

/// A store error (a missing object, a dropped connection) is a tensors error about that file.
impl From<quantfarm_store::Error> for FileError {
    fn from(e: quantfarm_store::Error) -> FileError {
        FileError::Tensors(e.into())
    }
}

#[derive(Clone)]
pub struct Options {
    pub ftype: FileType,
    /// Allow changing the type of tensors that are already quantized (llama-quantize's `--allow-requantize`).
    pub allow_requantize: bool,
    /// Bytes of f32 values (plus their quantized output) held at once.
    pub budget: u64,
    pub overwrite: bool,
    /// llama-quantize's `--imatrix`: per-tensor importance values for the quantizers, the imatrix-dependent mixture
    /// rules, and the `quantize.imatrix.*` metadata. Shared, so one loaded imatrix serves many shard tasks.
    pub imatrix: Option<Arc<Imatrix>>,
    /// Threads for the quantizers (a rayon pool of this size); `None` uses rayon's global pool (all cores).
    /// Output bytes do not depend on it.
    pub threads: Option<usize>,
    /// llama-quantize's `--pure`: no mixture rules, every quantizable tensor the file type's default type (then the
    /// fallback for rows that are not whole blocks).
    pub pure: bool,
    /// llama-quantize's `--output-tensor-type`.
    pub output_tensor_type: Option<GgmlType>,
    /// llama-quantize's `--token-embedding-type`.
    pub token_embedding_type: Option<GgmlType>,
    /// llama-quantize's `--leave-output-tensor`: `output.weight` keeps its input type.
    pub leave_output_tensor: bool,
    /// llama-quantize's `--tensor-type` and `--tensor-type-file` entries, in command-line order.
    pub tensor_types: Vec<mixture::TensorType>,
    /// llama-quantize's `--override-kv` entries, in command-line order: set in the output's metadata (before the
    /// `quantize.imatrix.*` keys), and read by the mixture rules where they read the model's hyperparameters.
    pub kv_overrides: Vec<KvOverride>,
    /// llama-quantize's `--prune-layers`: those blocks dropped, the later ones renumbered, the block count set.
    pub prune: Prune,
    /// llama-quantize's `--keep-split` ([`quantize_gguf_keep_split`]): the mixture rules visit the tensors in
    /// input-file order instead of the loader's name order.
    pub keep_split: bool,
}

impl Options {
    /// No requantizing, no imatrix, a 64 MiB budget, all cores, refuse to replace an existing output, no type flags.
    pub fn new(ftype: FileType) -> Options {
        Options {
            ftype,
            allow_requantize: false,
            budget: 64 << 20,
            overwrite: false,
            imatrix: None,
            threads: None,
            pure: false,
            output_tensor_type: None,
            token_embedding_type: None,
            leave_output_tensor: false,
            tensor_types: Vec::new(),
            kv_overrides: Vec::new(),
            prune: Prune::default(),
            keep_split: false,
        }
    }
}

/// What was written, and the type each tensor got (in file order).
pub struct Quantized {
    pub committed: Committed,
    pub choices: Vec<Choice>,
}

/// The model facts the type rules read, from the first file's metadata and the tensor names.
pub fn model_facts(src: &TensorSource) -> Result<ModelFacts, FileError> {
    model_facts_with(src, &[])
}

/// [`model_facts`] with `--override-kv` entries, which the model loader reads in place of the file's values.
fn model_facts_with(src: &TensorSource, overrides: &[KvOverride]) -> Result<ModelFacts, FileError> {
    let file = src.location().to_string();
    let gguf = src.gguf().ok_or_else(|| FileError::NotGguf { file: file.clone(), format: src.format().name() })?;
    let h = gguf.header();
    let meta_err = |key: &str, msg: &str| FileError::Metadata { file: file.clone(), key: key.into(), msg: msg.into() };
    let arch = h.architecture().ok_or_else(|| meta_err("general.architecture", "missing"))?;
    let int = |key: String| -> Result<Option<i64>, FileError> {
        if let Some(i) = overrides.iter().rev().find(|o| o.key == key).and_then(|o| o.int) {
            return Ok(Some(i));
        }
        match h.get(&key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(a.to_json().get(0).and_then(|v| v.as_i64())),
            Some(v) => {
                v.as_u64().map(|x| Some(x as i64)).ok_or_else(|| meta_err(&key, "is not a non-negative integer"))
            }
        }
    };
    let block_count = format!("{arch}.block_count");
    let n_layer = int(block_count.clone())?.ok_or_else(|| meta_err(&block_count, "missing"))?;
    let n_head = int(format!("{arch}.attention.head_count"))?.unwrap_or(1).max(1);
    let n_head_kv = int(format!("{arch}.attention.head_count_kv"))?.unwrap_or(n_head).max(1);
    let names: Vec<&str> = src.tensors().iter().map(|e| e.name.as_str()).collect();
    Ok(ModelFacts {
        n_layer,
        gqa: n_head / n_head_kv,
        tied_embeddings: !names.contains(&"output.weight"),
        n_attention_wv: names.iter().filter(|n| mixture::is_attn_v(n)).count() as i64,
        n_expert: int(format!("{arch}.expert_count"))?.unwrap_or(0),
    })
}

/// The output metadata: the input's, without split keys, then `general.quantization_version` and
/// `general.file_type`, the `--override-kv` entries, the `quantize.imatrix.*` keys when an imatrix is used, and the
/// block count when layers were pruned — each set with the C writer's remove-and-append (`gguf_set_val_*` in
/// `ggml/src/gguf.cpp`), so a key already there moves to the end (`llama_model_quantize_impl`; the imatrix keys are
/// `tools/quantize/quantize.cpp::llama_quantize`'s overrides, after the user's).
fn output_metadata(
    input: &[(String, Value)],
    opts: &Options,
    arch: Option<&str>,
    block_count: Option<u32>,
) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = input
        .iter()
        .filter(|(k, _)| ![split::SPLIT_NO, split::SPLIT_COUNT, split::SPLIT_TENSORS_COUNT].contains(&k.as_str()))
        .cloned()
        .collect();
    let mut set = |k: String, v: Value| {
        out.retain(|(x, _)| *x != k);
        out.push((k, v));
    };
    set("general.quantization_version".into(), Value::U32(2));
    set("general.file_type".into(), Value::U32(opts.ftype.id()));
    for o in &opts.kv_overrides {
        set(o.key.clone(), o.value.clone());
    }
    for (k, v) in opts.imatrix.as_deref().map(Imatrix::quantize_metadata).unwrap_or_default() {
        set(k, v);
    }
    if let (Some(n), Some(arch)) = (block_count, arch) {
        set(format!("{arch}.block_count"), Value::U32(n));
    }
    out
}

/// The imatrix slice for a tensor being quantized, as `llama_model_quantize_impl` looks it up: by name; no entry
/// means no imatrix (the `_ref` quantizers); an entry must hold `ne[0]·ne[2]` values (one block of columns per
/// expert), except that a wrong-sized entry for the token embeddings is ignored rather than refused.
fn imatrix_for<'a>(im: Option<&'a Imatrix>, name: &str, dims: &[u64]) -> Result<Option<&'a [f32]>, FileError> {
    let Some((im, w)) = im.and_then(|im| im.get(name).map(|w| (im, w))) else { return Ok(None) };
    let ne0 = dims.first().copied().unwrap_or(1);
    let experts = dims.get(2).copied().unwrap_or(1);
    let expected = ne0.saturating_mul(experts);
    if w.len() as u64 == expected {
        Ok(Some(w))
    } else if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        Ok(None)
    } else {
        Err(FileError::ImatrixSize { tensor: name.into(), file: im.file.clone(), got: w.len(), expected, ne0, experts })
    }
}

fn is_float(t: GgmlType) -> bool {
    matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// The types chosen for a model's tensors and what the output file will hold: what `--dry-run` shows, and what
/// [`quantize_gguf`] checks before it writes anything.
pub struct Plan {
    /// Every tensor of the part planned, in llama-quantize's order, by its output name.
    pub choices: Vec<Choice>,
    /// The output tensors (name, stored dimensions, type), in the same order.
    pub descs: Vec<TensorDesc>,
    /// Each planned tensor's name in the input (its output name but for `--prune-layers`' renumbering).
    pub sources: Vec<String>,
    /// The input split file of each planned tensor.
    pub shards: Vec<usize>,
    /// Input bytes of each planned tensor, in the same order.
    pub input_bytes: Vec<u64>,
    /// Elements of each planned tensor.
    pub elements: Vec<u64>,
    /// Input type of each planned tensor.
    pub input_types: Vec<GgmlType>,
    /// Input dimensions (`ne`) of each planned tensor.
    pub input_dims: Vec<Vec<u64>>,
    /// Tensors llama-quantize would make only with an importance matrix that none was given for (only when the
    /// plan was made for a dry run: quantizing refuses the first).
    pub need_imatrix: Vec<String>,
    /// The block count after `--prune-layers` (`None` without), which the output's metadata then holds.
    pub block_count: Option<u32>,
    /// Tensors in the whole output (after pruning): the split files' `split.tensors.count`.
    pub total_tensors: usize,
}

/// Plans the output of `llama-quantize SRC DST FTYPE --dry-run`: every tensor's type (rules, `--tensor-type`
/// patterns, overrides, fallbacks) and size, with every check quantizing makes before writing, except that a
/// missing importance matrix is listed in [`Plan::need_imatrix`] (llama-quantize's dry run only warns about it).
pub fn plan_gguf(src: &TensorSource, opts: &Options) -> Result<Plan, FileError> {
    let facts = model_facts_with(src, &opts.kv_overrides)?;
    plan_tensors(src, &facts, None, opts, false)
}

fn plan_tensors(
    src: &TensorSource,
    facts: &ModelFacts,
    shard: Option<usize>,
    opts: &Options,
    strict_imatrix: bool,
) -> Result<Plan, FileError> {
    let gguf = src
        .gguf()
        .ok_or_else(|| FileError::NotGguf { file: src.location().to_string(), format: src.format().name() })?;
    // (input shard, info) in input-file order: by file, then by offset (`--keep-split`'s sort).
    let mut inputs: Vec<(usize, &quantfarm_tensors::gguf::TensorInfo)> =
        gguf.tensors().map(|t| (t.shard, t.info)).collect();
    inputs.sort_by_key(|(shard, info)| (*shard, info.offset));
    // `--prune-layers`: new names, decided visiting the tensors in the loader's order.
    let mut by_loader: Vec<&str> = inputs.iter().map(|(_, i)| i.name.as_str()).collect();
    by_loader.sort_by(|a, b| mixture::tensor_order(a, b));
    let (renamed, block_count) = opts.prune.remap(by_loader.into_iter());
    // The kept tensors, by output name: (input shard, info).
    let mut kept: std::collections::HashMap<String, (usize, &quantfarm_tensors::gguf::TensorInfo)> =
        std::collections::HashMap::new();
    let mut list: Vec<(String, Vec<u64>, GgmlType)> = Vec::with_capacity(inputs.len());
    for &(shard, info) in &inputs {
        if let Some(Some(new)) = renamed.get(&info.name) {
            kept.insert(new.clone(), (shard, info));
            list.push((new.clone(), info.dims.clone(), info.ty));
        }
    }
    let total_tensors = list.len();
    let imatrix = opts.imatrix.as_deref();
    // `qs.has_imatrix`: set when llama-quantize is given a non-empty imatrix (a loaded one always has entries).
    let has_imatrix = imatrix.is_some_and(|im| !im.entries.is_empty());
    let params = mixture::Params {
        has_imatrix,
        pure: opts.pure,
        output_tensor_type: opts.output_tensor_type,
        token_embedding_type: opts.token_embedding_type,
        leave_output_tensor: opts.leave_output_tensor,
        tensor_types: opts.tensor_types.clone(),
        file_order: opts.keep_split,
    };
    let mut facts = facts.clone();
    // `init_quantize_state_counters` counts the tensors as renamed (the pruned ones gone).
    facts.n_attention_wv = list.iter().filter(|(n, _, _)| mixture::is_attn_v(n)).count() as i64;
    let choices: Vec<Choice> = mixture::choose_types_with(opts.ftype, &facts, &list, &params)?
        .into_iter()
        .filter(|c| shard.is_none_or(|s| kept[&c.name].0 == s))
        .collect();

    let mut plan = Plan {
        descs: Vec::with_capacity(choices.len()),
        sources: Vec::with_capacity(choices.len()),
        shards: Vec::with_capacity(choices.len()),
        input_bytes: Vec::with_capacity(choices.len()),
        elements: Vec::with_capacity(choices.len()),
        input_types: Vec::with_capacity(choices.len()),
        input_dims: Vec::with_capacity(choices.len()),
        need_imatrix: Vec::new(),
        choices: Vec::new(),
        block_count,
        total_tensors,
    };
    for c in &choices {
        let (in_shard, info) = kept[&c.name];
        if c.ty != info.ty {
            if !is_float(info.ty) && !opts.allow_requantize {
                return Err(FileError::Requantize { tensor: c.name.clone(), from: info.ty, to: c.ty });
            }
            if !crate::supported(c.ty) {
                return Err(FileError::Unsupported { tensor: c.name.clone(), ftype: opts.ftype, ty: c.ty });
            }
            let ne0 = info.dims.first().copied().unwrap_or(1);
            if c.ty.row_bytes(ne0).is_none() {
                return Err(FileError::BlockSize { tensor: c.name.clone(), ty: c.ty, block: c.ty.block_size(), ne0 });
            }
            // Checked up front, as in llama-quantize, so a wrong imatrix fails before anything is written. The
            // imatrix is looked up by the tensor's input name (`remap_imatrix`).
            let weights = imatrix_for(imatrix, &info.name, &info.dims)?;
            // `tensor_requires_imatrix`: without an imatrix llama-quantize refuses at the first such tensor, before
            // the file is made; with one lacking this tensor's entry, when it reaches the tensor (its file then
            // partial). Both are refused here before anything is written.
            if mixture::requires_imatrix(&c.name, c.ty, opts.ftype) && weights.is_none() {
                if !strict_imatrix {
                    plan.need_imatrix.push(c.name.clone());
                } else {
                    return Err(match imatrix {
                        None => FileError::ImatrixRequired { tensor: c.name.clone(), ftype: opts.ftype, ty: c.ty },
                        Some(im) => {
                            FileError::ImatrixMissing { tensor: c.name.clone(), ty: c.ty, file: im.file.clone() }
                        }
                    });
                }
            }
        }
        // The C writer stores `ggml_n_dims` dimensions: trailing 1s are dropped.
        let dims = info.dims[..mixture::n_dims(&info.dims).min(info.dims.len())].to_vec();
        plan.descs.push(TensorDesc { name: c.name.clone(), dims, ty: c.ty });
        plan.sources.push(info.name.clone());
        plan.shards.push(in_shard);
        let elements: u64 = info.dims.iter().product();
        plan.elements.push(elements);
        plan.input_types.push(info.ty);
        plan.input_dims.push(info.dims.clone());
        let ne0 = info.dims.first().copied().unwrap_or(1).max(1);
        plan.input_bytes.push(info.ty.row_bytes(ne0).unwrap_or(0) * (elements / ne0));
    }
    plan.choices = choices;
    Ok(plan)
}

/// Quantizes the GGUF model `src` (one file or a split) to `dst` as `llama-quantize SRC DST FTYPE` does.
/// Every decision is checked before anything is written; the file appears only when complete.
pub async fn quantize_gguf(src: &TensorSource, dst: &Location, opts: &Options) -> Result<Quantized, FileError> {
    quantize_part(src, None, dst, opts).await
}

/// Quantizes the tensors of split file `shard` of `src` into `dst`, as split file `shard` of the quantized split
/// model: the types and bytes of every tensor are those of llama-quantize on the whole model (the mixture rules
/// count layers and attention tensors across every file, in the loader's name order), and the first file carries
/// all metadata followed by the split keys, the others only the split keys. A one-file model is quantized whole.
/// This is the farm's per-shard task. It is not llama-quantize `--keep-split`'s output: that tool counts layers in
/// input-file order and writes its split keys in another order (bench/results/smollm2-release.md).
pub async fn quantize_gguf_shard(
    src: &TensorSource,
    shard: usize,
    dst: &Location,
    opts: &Options,
) -> Result<Quantized, FileError> {
    quantize_part(src, Some(shard), dst, opts).await
}

async fn quantize_part(
    src: &TensorSource,
    shard: Option<usize>,
    dst: &Location,
    opts: &Options,
) -> Result<Quantized, FileError> {
    let facts = model_facts_with(src, &opts.kv_overrides)?;
    let gguf = src.gguf().expect("model_facts checked the format");
    let n_shards = gguf.shards.len();
    if let Some(s) = shard {
        if s >= n_shards {
            return Err(FileError::Metadata {
                file: src.location().to_string(),
                key: split::SPLIT_COUNT.into(),
                msg: format!("the model has {n_shards} file(s), there is no split file {}", s + 1),
            });
        }
    }
    let shard = shard.filter(|_| n_shards > 1);
    let planned = plan_tensors(src, &facts, shard, opts, true)?;
    let header = gguf.header();
    let all = || output_metadata(&header.metadata, opts, header.architecture(), planned.block_count);
    let metadata = match shard {
        None => all(),
        Some(s) => {
            let split_keys = split::split_metadata(s as u16, n_shards as u16, planned.total_tensors as i32);
            if s == 0 {
                let mut m = all();
                m.extend(split_keys);
                m
            } else {
                split_keys
            }
        }
    };
    let every: Vec<usize> = (0..planned.choices.len()).collect();
    let committed = write_planned(src, &planned, &every, dst, &metadata, opts).await?;
    Ok(Quantized { committed, choices: planned.choices })
}

/// Quantizes a model as `llama-quantize --keep-split SRC DST FTYPE`: one output file per input split file, holding
/// the same tensors in input-file order (the mixture rules visit them in that order), named
/// `DST-00001-of-0000N.gguf` after DST less its `.gguf` (also for a one-file input, as llama-quantize names it). The
/// first file has the metadata, each file of a split the keys `split.no`, `split.count`, `split.tensors.count`
/// (in that order, at the end). Each file appears when complete; the committed files, in order.
pub async fn quantize_gguf_keep_split(
    src: &TensorSource,
    dst: &Location,
    opts: &Options,
) -> Result<Vec<Quantized>, FileError> {
    let opts = Options { keep_split: true, ..opts.clone() };
    let facts = model_facts_with(src, &opts.kv_overrides)?;
    let gguf = src.gguf().expect("model_facts checked the format");
    let planned = plan_tensors(src, &facts, None, &opts, true)?;
    let n_split = planned.shards.iter().max().map_or(1, |m| m + 1);
    // `llama_quantize`: an output name holding ".gguf" loses its last five characters.
    let name = dst.to_string();
    let prefix = if name.contains(".gguf") { &name[..name.len().saturating_sub(5)] } else { &name[..] };
    let header = gguf.header();
    let mut done = Vec::with_capacity(n_split);
    for s in 0..n_split {
        let part: Vec<usize> = (0..planned.shards.len()).filter(|&i| planned.shards[i] == s).collect();
        if part.is_empty() {
            return Err(FileError::Metadata {
                file: src.location().to_string(),
                key: split::SPLIT_COUNT.into(),
                msg: format!("--keep-split: split file {} keeps no tensor (all pruned)", s + 1),
            });
        }
        let mut metadata = if s == 0 {
            output_metadata(&header.metadata, &opts, header.architecture(), planned.block_count)
        } else {
            Vec::new()
        };
        if n_split > 1 {
            metadata.extend([
                (split::SPLIT_NO.to_string(), Value::U16(s as u16)),
                (split::SPLIT_COUNT.to_string(), Value::U16(n_split as u16)),
                (split::SPLIT_TENSORS_COUNT.to_string(), Value::I32(planned.total_tensors as i32)),
            ]);
        }
        let file = Location::parse(&format!("{prefix}-{:05}-of-{n_split:05}.gguf", s + 1))?;
        let committed = write_planned(src, &planned, &part, &file, &metadata, &opts).await?;
        let choices = part.iter().map(|&i| planned.choices[i].clone()).collect();
        done.push(Quantized { committed, choices });
    }
    Ok(done)
}

/// Writes the planned tensors `which` (indices into `planned`, in order) with `metadata` to `dst`.
async fn write_planned(
    src: &TensorSource,
    planned: &Plan,
    which: &[usize],
    dst: &Location,
    metadata: &[(String, Value)],
    opts: &Options,
) -> Result<Committed, FileError> {
    let imatrix = opts.imatrix.as_deref();
    let pool = match opts.threads {
        None => None,
        Some(n) => Some(Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .map_err(|e| FileError::Threads { threads: n, msg: e.to_string() })?,
        )),
    };
    let descs: Vec<TensorDesc> = which.iter().map(|&i| planned.descs[i].clone()).collect();
    let mut w = GgufWriter::create(dst, 3, metadata, &descs, opts.overwrite).await?;
    // Reading step k overlaps quantizing step k−1 on the pool (the two meet in `Pipeline::finish`), so neither
    // the reads (pages from the cache, or ranged GETs from a store) nor the writes wait for the quantizers.
    let mut pipe = Pipeline { pool, in_flight: None, raws: Vec::new(), outs: Vec::new() };
    for &i in which {
        let (c, d, input) = (&planned.choices[i], &planned.descs[i], planned.sources[i].as_str());
        let e = src.entry(input)?;
        let info_ty = planned.input_types[i];
        if c.ty == info_ty {
            pipe.finish(&mut w).await?;
            let mut raw = pipe.raws.pop().unwrap_or_default();
            copy_tensor(src, input, opts.budget, &mut raw, &mut w).await?;
            pipe.raws.push(raw);
            continue;
        }
        let TensorType::Ggml(src_ty) = e.ty else {
            return Err(FileError::NotGguf { file: src.location().to_string(), format: src.format().name() });
        };
        let row_len = e.row_len() as usize;
        let out_row = c.ty.row_bytes(row_len as u64).expect("types were checked against the row length") as usize;
        // Two steps of input rows as stored (one read, one quantizing) and their output; each quantizing thread
        // widens its rows to f32 itself, in pieces of `quant::MIN_CHUNK_ELEMS` values, which the budget does not
        // need to count.
        let rows_per_step = (opts.budget / (2 * (e.row_bytes() + out_row as u64)).max(1)).max(1);
        let dims = &planned.input_dims[i];
        let weights = imatrix_for(imatrix, input, dims)?;
        // Rows of one expert (`ne[1]`): a step never crosses an expert, whose imatrix slice is its own
        // (`llama_tensor_quantize_impl`'s `imatrix_for_row`).
        let rows_per_expert = dims.get(1).copied().unwrap_or(1).max(1);
        let mut row = 0;
        while row < e.rows() {
            let n = rows_per_step.min(e.rows() - row).min(rows_per_expert - row % rows_per_expert);
            let mut raw = pipe.raws.pop().unwrap_or_default();
            raw.resize((n * e.row_bytes()) as usize, 0);
            src.read_range(input, row * e.row_bytes(), &mut raw).await?;
            let expert = (row / rows_per_expert) as usize;
            let slice = match weights {
                None => None,
                // Out of range only for a 4-D tensor (`ne[3] > 1`), which llama.cpp would read past the end for.
                Some(w) => {
                    Some(w.get(expert * row_len..(expert + 1) * row_len).ok_or_else(|| FileError::ImatrixSize {
                        tensor: c.name.clone(),
                        file: imatrix.map(|im| im.file.clone()).unwrap_or_default(),
                        got: w.len(),
                        expected: e.rows() / rows_per_expert * row_len as u64,
                        ne0: row_len as u64,
                        experts: e.rows() / rows_per_expert,
                    })?)
                }
            };
            pipe.finish(&mut w).await?;
            let mut out = pipe.outs.pop().unwrap_or_default();
            out.resize(n as usize * out_row, 0u8);
            let job = Job { ty: c.ty, src_ty, raw, row_len, imatrix: slice.map(<[f32]>::to_vec), out };
            pipe.start(d.name.clone(), job);
            row += n;
        }
    }
    pipe.finish(&mut w).await?;
    Ok(w.finish().await?)
}

/// One step for the quantizing pool: owned buffers, so it can run while the caller reads the next step.
struct Job {
    ty: GgmlType,
    src_ty: GgmlType,
    raw: Vec<u8>,
    row_len: usize,
    imatrix: Option<Vec<f32>>,
    out: Vec<u8>,
}

/// A job's buffers back, with its result.
struct Done {
    raw: Vec<u8>,
    out: Vec<u8>,
    result: Result<(), QuantError>,
}

/// At most one step quantizing on the pool, and the buffers of finished steps for reuse (two of each at most).
struct Pipeline {
    pool: Option<Arc<rayon::ThreadPool>>,
    in_flight: Option<(String, futures::channel::oneshot::Receiver<Done>)>,
    raws: Vec<Vec<u8>>,
    outs: Vec<Vec<u8>>,
}

impl Pipeline {
    /// Hands `job` (for tensor `tensor`) to the pool; the previous step must be finished.
    fn start(&mut self, tensor: String, job: Job) {
        debug_assert!(self.in_flight.is_none());
        let (tx, rx) = futures::channel::oneshot::channel();
        let run = move || {
            let Job { ty, src_ty, raw, row_len, imatrix, mut out } = job;
            // A panic (a bug) becomes this file's error instead of aborting the process, as rayon's `spawn` would.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crate::quantize_raw(ty, src_ty, &raw, row_len, imatrix.as_deref(), &mut out)
            }))
            .unwrap_or(Err(QuantError::Lost));
            // The receiver is gone only when the quantization was abandoned for another error.
            let _ = tx.send(Done { raw, out, result });
        };
        match &self.pool {
            Some(p) => p.spawn(run),
            None => rayon::spawn(run),
        }
        self.in_flight = Some((tensor, rx));
    }

    /// Waits for the step in flight, if any, and writes its output.
    async fn finish(&mut self, w: &mut GgufWriter) -> Result<(), FileError> {
        let Some((tensor, rx)) = self.in_flight.take() else { return Ok(()) };
        let done = rx.await.map_err(|_| FileError::Quant { tensor: tensor.clone(), source: QuantError::Lost })?;
        done.result.map_err(|source| FileError::Quant { tensor, source })?;
        w.write(&done.out).await?;
        self.raws.push(done.raw);
        self.outs.push(done.out);
        Ok(())
    }
}
