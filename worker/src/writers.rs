//! How each deterministic output is made from its task message: a GGUF split file of the conversion, a quantized
//! split file, one file (or the side files) of a merge, an MLX checkpoint, a vLLM checkpoint. The executor that produces the output and
//! the verify executor that recomputes it both call these, so what is checked is what was made.

use quantfarm_proto as pb;
use quantfarm_quant::file::{quantize_gguf_shard, Options};
use quantfarm_quant::imatrix::Imatrix;
use quantfarm_quant::mixture::TensorType;
use quantfarm_quant::vllm_file::{write_vllm_checkpoint, Anchor, VllmOptions, VllmScheme};
use quantfarm_quant::{FileType, GgmlType};
use quantfarm_store::{Digest, Location, StagedSink};
use quantfarm_tensors::convert::{self, GgufPlan, SplitRule};
use quantfarm_tensors::merge::MergeOptions;
use quantfarm_tensors::TensorSource;

use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{exists, gguf_source, hash_object, location};
use crate::outputs::{digest_lines, folder_digest};

pub fn split_rule(r: &Option<pb::SplitRule>) -> Option<SplitRule> {
    match r.as_ref()?.rule.as_ref()? {
        pb::split_rule::Rule::MaxTensors(n) => Some(SplitRule::MaxTensors(*n as usize)),
        pb::split_rule::Rule::MaxBytes(n) => Some(SplitRule::MaxBytes(*n)),
    }
}

/// The source at `source` and its conversion plan to GGUF BF16.
pub async fn open_plan(source: &str) -> Result<(TensorSource, GgufPlan), Failure> {
    let src = TensorSource::open(&location(source)?).await?;
    let plan = convert::plan_hf_to_gguf(&src, convert::OutType::Bf16).await?;
    Ok((src, plan))
}

/// Writes split file `g.shard` of the conversion at `out`; returns its sha256 and bytes.
pub async fn write_gguf(g: &pb::GgufShardTask, out: &Location, env: &Env) -> Result<Digest, Failure> {
    let (src, plan) = open_plan(&g.source).await?;
    if plan.digest() != g.plan_digest {
        return Err(Failure::input(format!(
            "{}: the source's headers changed since the release was planned (plan {} now, {} then)",
            g.source,
            plan.digest(),
            g.plan_digest
        )));
    }
    let nbytes: Vec<u64> = plan.tensors.iter().map(|t| t.nbytes).collect();
    let ranges = convert::split_ranges(&nbytes, split_rule(&g.split));
    if ranges.len() != g.n_shards as usize || g.shard >= g.n_shards {
        return Err(Failure::input(format!(
            "split file {} of {}: the plan gives {} files",
            g.shard + 1,
            g.n_shards,
            ranges.len()
        )));
    }
    let c = convert::write_gguf_shard(&plan, &src, &ranges, g.shard as usize, out, env.budget, false).await?;
    Ok(Digest::new(c.sha256, c.bytes))
}

/// Writes split file `q.shard` of the quantized model at `out`; returns its sha256 and bytes.
pub async fn write_quantized(q: &pb::QuantizeTask, out: &Location, env: &Env) -> Result<Digest, Failure> {
    let ftype = FileType::from_name(&q.file_type)
        .ok_or_else(|| Failure::input(format!("unknown file type {:?}", q.file_type)))?;
    let src = gguf_source(&q.input, env).await?;
    let n = src.gguf().map_or(0, |g| g.shards.len());
    if n != q.n_shards as usize {
        return Err(Failure::input(format!("{}: has {n} split files, the task expects {}", q.input, q.n_shards)));
    }
    let imatrix = if q.imatrix.is_empty() {
        None
    } else {
        let loc = location(&q.imatrix)?;
        let Digest { sha256: sha, .. } = hash_object(&loc, 8 << 20).await?;
        if sha != q.imatrix_sha256 {
            return Err(Failure::input(format!(
                "{}: the importance matrix changed since the release was planned (sha256 {sha}, planned {})",
                q.imatrix, q.imatrix_sha256
            )));
        }
        let mut im = Imatrix::load(&loc).await?;
        // llama-quantize records the file as named on its command line; the farm records the file's name.
        im.file = loc.file_name().to_string();
        Some(std::sync::Arc::new(im))
    };
    // A recipe's flags, as llama-quantize parses them (mixture::TensorType); the coordinator checked them at
    // submission, so a failure here is a task made by another version.
    let tensor_types = q
        .tensor_types
        .iter()
        .map(|t| TensorType::parse(t).map_err(|e| Failure::input(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    let flag = |key: &str, name: &str| -> Result<Option<GgmlType>, Failure> {
        if name.is_empty() {
            return Ok(None);
        }
        GgmlType::from_name(name).map(Some).ok_or_else(|| Failure::input(format!("{key}: unknown ggml type {name:?}")))
    };
    let opts = Options {
        budget: env.budget,
        threads: Some(env.threads),
        imatrix,
        tensor_types,
        output_tensor_type: flag("output_tensor_type", &q.output_tensor_type)?,
        token_embedding_type: flag("token_embedding_type", &q.token_embedding_type)?,
        ..Options::new(ftype)
    };
    let done = quantize_gguf_shard(&src, q.shard as usize, out, &opts).await?;
    Ok(Digest::new(done.committed.sha256, done.committed.bytes))
}

/// The merge's options for a task naming the base as `base_name` (empty: the folder's name).
pub fn merge_options(base_name: &str, env: &Env) -> MergeOptions {
    MergeOptions {
        budget: env.budget,
        overwrite: false,
        base_name: (!base_name.is_empty()).then(|| base_name.to_string()),
        widen: false,
    }
}

/// Writes one file of the merge at `out` (or the side files into folder `out`); returns its sha256 (the folder's
/// digest for side files) and bytes.
pub async fn write_merge(m: &pb::MergeTask, out: &Location, env: &Env) -> Result<Digest, Failure> {
    let (base, adapter) = (location(&m.base)?, location(&m.adapter)?);
    let plan = quantfarm_tensors::merge::plan_merge(&base, &adapter, &merge_options(&m.base_name, env)).await?;
    if plan.digest() != m.plan_digest {
        return Err(Failure::input(format!(
            "{} + {}: the merge plan changed since the release was planned ({} now, {} then)",
            m.base,
            m.adapter,
            plan.digest(),
            m.plan_digest
        )));
    }
    if m.side_files {
        let mut names = Vec::new();
        for (name, bytes) in plan.side_files().await? {
            let target = out.child(&name)?;
            if !exists(&target).await {
                let mut sink = StagedSink::create(&target, false).await?;
                sink.write(&bytes).await?;
                if let Err(e) = sink.commit().await {
                    // Another lease wrote the same bytes meanwhile.
                    if !exists(&target).await {
                        return Err(e.into());
                    }
                }
            }
            names.push(name);
        }
        return folder_digest(out, &names, env).await;
    }
    let file = m.file as usize;
    if file >= plan.file_names().len() {
        return Err(Failure::input(format!("the merge has {} files, not file {file}", plan.file_names().len())));
    }
    let w = plan.stage_file(file, out, env.budget, false).await?;
    let c = w.finish().await?;
    Ok(Digest::new(c.sha256, c.bytes))
}

/// Writes the MLX checkpoint of `m.source` into folder `out`; returns its folder digest and bytes.
pub async fn write_mlx(m: &pb::MlxTask, out: &Location, env: &Env) -> Result<Digest, Failure> {
    use quantfarm_quant::mlx_file::{gguf_to_mlx, quantize_mlx_checkpoint, MlxOptions};
    let src = TensorSource::open(&location(&m.source)?).await?;
    // A folder left by a lease that died between commits holds some of the (deterministic) files: replace them.
    let base = match (m.recipe.as_str(), m.mode.as_str()) {
        ("", "") => MlxOptions::new(m.bits, m.group_size as usize),
        ("", mode) => match quantfarm_quant::mlx_fp::FpMode::parse(mode) {
            Some(mode) => MlxOptions::fp(mode),
            None => return Err(Failure::input(format!("MLX mode {mode:?}: expected mxfp4, nvfp4 or mxfp8"))),
        },
        (r, _) => match quantfarm_quant::mlx_recipe::MixedRecipe::parse(r) {
            Some(recipe) => MlxOptions::mixed(recipe, m.group_size as usize),
            None => {
                return Err(Failure::input(format!(
                    "MLX recipe {r:?}: expected mixed_2_6, mixed_3_4, mixed_3_6 or mixed_4_6"
                )))
            }
        },
    };
    let opts = MlxOptions { budget: env.budget, overwrite: true, ..base };
    let done = match src.format() {
        // A GGUF source: each tensor as its GGUF → HF conversion makes it in bf16 (`quantfarm convert --to mlx`).
        quantfarm_tensors::Format::Gguf => {
            let plan = quantfarm_tensors::convert::plan_gguf_to_mlx(&src, quantfarm_tensors::Dtype::BF16).await?;
            gguf_to_mlx(&src, &plan, out, &opts).await?
        }
        quantfarm_tensors::Format::Safetensors | quantfarm_tensors::Format::Mlx => {
            quantize_mlx_checkpoint(&src, out, &opts).await?
        }
    };
    let name = |c: &quantfarm_store::Committed| {
        Location::parse(&c.location).map(|l| l.file_name().to_string()).unwrap_or_default()
    };
    Ok(digest_lines(done.files.iter().map(|c| (name(c), c.sha256.clone(), c.bytes)).collect()))
}

/// The options of a vLLM scheme as the task carries it (`scheme.like` empty: `oneshot`, the default).
pub fn vllm_options(s: &Option<pb::VllmScheme>, env: &Env) -> Result<VllmOptions, Failure> {
    let s = s.as_ref().ok_or_else(|| Failure::input("the vLLM task names no scheme"))?;
    let scheme = match s.scheme.as_str() {
        "FP8_DYNAMIC" => VllmScheme::Fp8Dynamic,
        "W4A16" => VllmScheme::W4A16 { group_size: s.group_size },
        other => return Err(Failure::input(format!("vLLM scheme {other:?}: expected FP8_DYNAMIC or W4A16"))),
    };
    let like = match s.like.as_str() {
        "" | "oneshot" => Anchor::Oneshot,
        "model-free" => Anchor::ModelFree,
        other => return Err(Failure::input(format!("vLLM like {other:?}: expected oneshot or model-free"))),
    };
    Ok(VllmOptions { scheme, like, ignore: s.ignore.clone(), budget: env.budget, overwrite: true })
}

/// Writes the vLLM checkpoint folder of `v.source` at `out` (config.json last: a folder that has it is complete);
/// returns the folder digest over its files.
pub async fn write_vllm(v: &pb::VllmTask, out: &Location, env: &Env) -> Result<Digest, Failure> {
    let opts = vllm_options(&v.scheme, env)?;
    // A folder left by a lease that died between commits holds some of the (deterministic) files: replace them.
    let done = write_vllm_checkpoint(&location(&v.source)?, out, &opts).await?;
    let name = |c: &quantfarm_store::Committed| {
        Location::parse(&c.location).map(|l| l.file_name().to_string()).unwrap_or_default()
    };
    Ok(digest_lines(done.files.iter().map(|c| (name(c), c.sha256.clone(), c.bytes)).collect()))
}
