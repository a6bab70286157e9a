//! `release.yaml`: what a release is made of, parsed strictly (unknown keys are errors; every error names the line
//! and the key) so a typo never silently drops an output or a gate.
//!
//! ```yaml
//! name: smollm2-135m            # names the release and its artifact files
//! source: s3://models/smollm2   # HF safetensors folder, MLX folder or GGUF (bf16/f16/f32; a quantized one is
//!                               # decoded, said loudly): a path (relative to this file), file:// or s3://
//! adapter: adapters/my-lora     # optional LoRA/DoRA adapter (PEFT or mlx-lm) merged into the source first,
//!                               # one merge task per safetensors file; every output is made from the merge
//! base_name: HuggingFaceTB/SmolLM2-135M-Instruct  # optional: the base's identity for the adapter's check
//! outputs:
//!   gguf:
//!     prefix: SmolLM2-135M      # artifact file prefix (default: name)
//!     split: {max_tensors: 100} # or {max_size: 2GB}: llama.cpp split files (gguf-split's rules); default one file
//!     quants:                   # llama-quantize file types, and named recipes (made, verified, measured alike):
//!       - Q8_0                  #   a base file type with llama-quantize's --tensor-type entries (a mapping in
//!       - {name: Q4_K_XL, base: Q4_K_M, tensor_types: {ffn_down: Q6_K, "blk\\.[0-3]\\.attn_v": Q8_0},
//!          output_tensor_type: Q8_0, token_embedding_type: Q6_K}   # order, first match wins, or a list of
//!                               #   PATTERN=TYPE), --output-tensor-type and --token-embedding-type (spec/recipe.rs)
//!     imatrix: {file: imatrix.gguf}   # optional importance matrix: llama.cpp's GGUF or legacy .dat (path relative
//!                                     # to this file, file:// or s3://), or computed by the farm from a text:
//!     # imatrix: {text: calibration.txt, chunks: 100, ctx: 512, batch: 2048}  (chunks default all; ctx 512;
//!     #   batch 2048: batch/ctx chunks per `imatrix/G` task), as llama-imatrix -f -c -b --chunks;
//!     #   all_experts: true credits every MoE expert on every token (llm-compressor's calibrate_all_experts)
//!   mlx:
//!     bits: [4, 8]              # MLX affine checkpoints (mlx_lm.convert -q), one per bit width
//!     recipes: [mixed_3_6]      # and one per mlx-lm mixed recipe (--quant-predicate: mixed_2_6, mixed_3_4,
//!                               # mixed_3_6, mixed_4_6); bits, recipes or both
//!     group_size: 64            # 32, 64 or 128 (default 64)
//!   vllm:                       # compressed-tensors checkpoints vLLM loads, as llm-compressor writes them
//!     schemes: [FP8_DYNAMIC, W4A16]   # one per scheme (spec/vllm.rs: group_size, ignore, like)
//! evaluation:                   # optional: every quant (and MLX checkpoint) measured against the GGUF BF16
//!   text: texts/gpl3.txt        # KL divergence on this text, as llama-perplexity (path relative to this file,
//!                               # file:// or s3://)
//!   ctx: 512                    # tokens per chunk (-c; default 512)
//!   batch: 2048                 # tokens per decode (-b; default 2048): batch/ctx chunks per farm task
//!   chunks: 40                  # only the first N chunks (default: all)
//!   prompts: prompts.json       # greedy agreement with the reference on these prompts (JSON array); with an
//!                               # adapter, also the merge check: the merge against the base + adapter at run time
//!   max_tokens: 64              # token cap of each greedy continuation (default 64)
//!   prompt_shares: 2            # greedy tasks per model, each with every n-th prompt (default 2)
//!   probes: probes.yaml         # a task-probe suite run on the reference and every model
//!   choices: choice-basics.yaml # multiple-choice tasks (llama-perplexity's binary format, or a question set)
//!                               # scored on the reference and every model, answer flips against the reference
//!   context: 4096               # context of greedy continuations and probes (default 4096)
//!   peers: [llama-perplexity]   # also run llama.cpp's own tool on the same files, on workers that have it;
//!                               # a GGUF file of the same base made elsewhere (`x/Q4_K_M.gguf`) is scored against
//!                               # the same base logits, beside the farm's rung of nearest size (report.third_party)
//!   skip: [Q2_K]                # levels made but not measured (they then fail the built-in `measured` gate)
//!   transformers: true          # with vLLM outputs or an adapter (default false): the bf16 checkpoint and each
//!                               # vLLM rung also run in transformers (W8A8 emulated and weight-only), on workers
//!                               # with the transformers runtime: greedy agreement and KL divergence against the
//!                               # GGUF BF16, probes; a PEFT adapter also unmerged on the base (link 1 there)
//!   confidence: 0.95            # of the report's intervals and paired comparisons of the rungs' KL divergence
//!   compare_with: releases/smollm2-1a2b3c4d   # an earlier release of this farm: its diff in this report
//!   stop: {confidence: 0.99}    # measure each rung's chunk groups in a seeded stratified order and stop once
//!                               # every gate reading its KLD has its verdict at this confidence (min_chunks: 4;
//!                               # precision: 0.05 also stops at ± 5 %; spread: 0.3, the floor the interval assumes)
//!   mlx_lm: true                # with MLX outputs (default true): the source's bf16 weights and each MLX rung
//!                               # also run in mlx-lm, on workers with the mlx_lm runtime: greedy agreement and KL
//!                               # divergence against the GGUF BF16 in llama.cpp (the cross-runtime link)
//! card: {license: apache-2.0, base_model: HuggingFaceTB/SmolLM2-135M-Instruct}  # the model card's front matter
//! gates:                        # besides `measured` and the defaults (crate::gates); a same-named one replaces
//!   - {name: q8-close, check: "q8_0.kld.mean <= 0.002"}
//!   - {name: kld, levels: [Q4_K_M], check: "kld.mean <= 0.05"}   # replaces the default `kld` (every level)
//!   - {name: merge, check: "merge.greedy.agree >= 1"}  # with an adapter and prompts: the merge check (link 1)
//! ```

mod evaluation;
mod mlx;
mod recipe;
mod search;
mod target;
mod vllm;

pub use evaluation::{Evaluation, Peer, PeerEntry, Stop};
pub use mlx::MlxOutputs;
pub use recipe::{Level, Recipe, RecipeName, Rung, TensorTypeRule};
pub use search::{KldMetric, SearchRung, SearchSettings, Target, DEFAULT_CANDIDATES};
use serde::{Deserialize, Serialize};
pub use target::{EvalTarget, FpMode, MixedRecipe, MlxRung};
pub use vllm::{VllmLike, VllmOutputs, VllmRung};

#[derive(Debug, thiserror::Error)]
#[error("{file}: {msg}")]
pub struct SpecError {
    pub file: String,
    pub msg: String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseSpec {
    pub name: String,
    pub source: String,
    /// A LoRA/DoRA adapter folder merged into `source` before anything else is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    /// The base's identity for the adapter's recorded-base check (as `quantfarm merge --base-name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_name: Option<String>,
    pub outputs: Outputs,
    /// How the quants' information loss is measured; without it no level has a KL-divergence figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation: Option<Evaluation>,
    /// What the model card (README.md) says that the farm cannot know.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub card: Option<ModelCard>,
    /// The release's own gates, besides the built-in `measured` and the defaults (crate::gates); a gate named like
    /// a default replaces it.
    #[serde(default)]
    pub gates: Vec<Gate>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Outputs {
    #[serde(default)]
    pub gguf: Option<GgufOutputs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlx: Option<MlxOutputs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vllm: Option<VllmOutputs>,
    /// Tasks that do nothing but sleep: for measuring the farm's scheduling, not for releases.
    #[serde(default)]
    pub noop: Option<NoopOutputs>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NoopOutputs {
    pub tasks: u32,
    #[serde(default)]
    pub sleep_ms: u32,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GgufOutputs {
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub split: Option<Split>,
    /// The ladder: file types and named recipes, in the order given.
    #[serde(default)]
    pub quants: Vec<Rung>,
    /// An importance matrix for the quants: a file, or computed by the farm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imatrix: Option<ImatrixSource>,
    /// How the searched rungs' sensitivities are measured (defaults without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchSettings>,
}

/// Where the quants' importance matrix comes from.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(try_from = "ImatrixFields", into = "ImatrixFields")]
pub enum ImatrixSource {
    /// llama.cpp's GGUF imatrix or legacy `.dat`: a path (relative to this file), file:// or s3://.
    File(String),
    /// Computed by the farm from a calibration text, as llama-imatrix computes it: per decode group an `imatrix/G`
    /// task, then `imatrix/merge`.
    Text {
        text: String,
        /// Only the first N chunks (default: all).
        chunks: Option<u32>,
        ctx: u32,
        batch: u32,
        /// Every expert of a mixture-of-experts layer on every token (llm-compressor's `calibrate_all_experts`).
        all_experts: bool,
    },
}

/// `imatrix:` as written: exactly one of `file` and `text`; the chunking only with `text`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct ImatrixFields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chunks: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ctx: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    batch: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    all_experts: bool,
}

impl TryFrom<ImatrixFields> for ImatrixSource {
    type Error = String;

    fn try_from(f: ImatrixFields) -> Result<ImatrixSource, String> {
        match (f.file, f.text) {
            (Some(file), None) => {
                if f.chunks.is_some() || f.ctx.is_some() || f.batch.is_some() || f.all_experts {
                    return Err(
                        "imatrix: chunks, ctx, batch and all_experts go with `text` (a file was computed already)"
                            .into(),
                    );
                }
                Ok(ImatrixSource::File(file))
            }
            (None, Some(text)) => {
                let ctx = f.ctx.unwrap_or(512);
                let batch = f.batch.unwrap_or(2048);
                if ctx < 8 {
                    return Err(format!("imatrix.ctx: {ctx}: expected at least 8 tokens"));
                }
                if batch >= ctx && !batch.is_multiple_of(ctx) {
                    return Err(format!("imatrix.batch: {batch} must be below or a multiple of ctx {ctx}"));
                }
                if f.chunks == Some(0) {
                    return Err("imatrix.chunks: 0: nothing to compute from".into());
                }
                Ok(ImatrixSource::Text { text, chunks: f.chunks, ctx, batch, all_experts: f.all_experts })
            }
            (Some(_), Some(_)) => Err("imatrix: either `file` or `text`, not both".into()),
            (None, None) => Err("imatrix: expected {file: PATH} (a computed imatrix) or {text: PATH, chunks: N} \
                                 (computed by the farm)"
                .into()),
        }
    }
}

impl From<ImatrixSource> for ImatrixFields {
    fn from(s: ImatrixSource) -> ImatrixFields {
        match s {
            ImatrixSource::File(file) => {
                ImatrixFields { file: Some(file), text: None, chunks: None, ctx: None, batch: None, all_experts: false }
            }
            ImatrixSource::Text { text, chunks, ctx, batch, all_experts } => {
                ImatrixFields { file: None, text: Some(text), chunks, ctx: Some(ctx), batch: Some(batch), all_experts }
            }
        }
    }
}

/// gguf-split's two rules; exactly one is given.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Split {
    #[serde(default)]
    pub max_tensors: Option<u64>,
    /// Decimal units as gguf-split reads them: `500M` = 500·10⁶ bytes, `2G` = 2·10⁹ (also `MB`, `GB`).
    #[serde(default)]
    pub max_size: Option<String>,
}

pub use crate::gates::Gate;

pub use quantfarm_report::ModelCard;

impl ReleaseSpec {
    /// The quants' importance matrix, if any.
    pub fn imatrix(&self) -> Option<&ImatrixSource> {
        self.outputs.gguf.as_ref().and_then(|g| g.imatrix.as_ref())
    }

    /// Parses and checks `text`; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<ReleaseSpec, SpecError> {
        let err = |msg: String| SpecError { file: file.to_string(), msg };
        let spec: ReleaseSpec = serde_norway::from_str(text).map_err(|e| err(e.to_string()))?;
        spec.check().map_err(err)?;
        Ok(spec)
    }

    fn check(&self) -> Result<(), String> {
        if !valid_name(&self.name) {
            return Err(format!(
                "name: {:?} must be 1–100 characters of letters, digits, '.', '_' and '-', not starting with '.'",
                self.name
            ));
        }
        if self.source.trim().is_empty() {
            return Err("source: is empty".into());
        }
        if let Some(n) = &self.outputs.noop {
            if n.tasks == 0 || n.tasks > 1_000_000 || n.sleep_ms > 3_600_000 {
                return Err("outputs.noop: tasks must be 1–1000000 and sleep_ms at most 3600000".into());
            }
        }
        let empty = GgufOutputs { prefix: None, split: None, quants: vec![], imatrix: None, search: None };
        let gguf =
            match (&self.outputs.gguf, &self.outputs.noop, self.outputs.mlx.is_some() || self.outputs.vllm.is_some()) {
                (Some(g), _, _) => g,
                (None, Some(_), _) | (None, None, true) => &empty,
                (None, None, false) => {
                    return Err("outputs: names no output (add outputs.gguf, outputs.mlx or outputs.vllm)".into())
                }
            };
        if let Some(v) = &self.outputs.vllm {
            v.check()?;
            if self.source.starts_with("synthetic:") {
                return Err("outputs.vllm: quantizes an HF bf16 checkpoint; a synthetic source is not one".into());
            }
        }
        if let Some(m) = &self.outputs.mlx {
            m.check()?;
        }
        if self.adapter.as_deref().is_some_and(|a| a.trim().is_empty()) {
            return Err("adapter: is empty".into());
        }
        if self.adapter.is_some() && self.source.starts_with("synthetic:") {
            return Err("adapter: a synthetic source has no adapter to merge; give an HF checkpoint folder".into());
        }
        if self.adapter.is_some() && !self.converts() {
            return Err("adapter: the merged model needs an output (outputs.gguf, outputs.mlx or outputs.vllm)".into());
        }
        if self.base_name.is_some() && self.adapter.is_none() {
            return Err("base_name: names the base an adapter was trained on; there is no adapter".into());
        }
        if let Some(p) = &gguf.prefix {
            if !valid_name(p) {
                return Err(format!("outputs.gguf.prefix: {p:?} must be letters, digits, '.', '_' and '-'"));
            }
        }
        if let Some(split) = &gguf.split {
            split.rule()?;
        }
        let mut seen = std::collections::HashMap::new();
        for q in &gguf.quants {
            let level = q.level();
            // Gates name a level's figures by its lower-cased name with '-' as '_' (crate::gates::level_prefix).
            if let Some(other) = seen.insert(crate::gates::level_prefix(&level.to_string()), level) {
                return Err(if other == level {
                    format!("outputs.gguf.quants: {level} is listed twice")
                } else {
                    format!("outputs.gguf.quants: {level} and {other} have the same name in gates; rename one")
                });
            }
            if let Rung::File(f) = q {
                if !f.is_quantized() {
                    return Err(format!("outputs.gguf.quants: {f} is not a quantized type (BF16 is always made)"));
                }
            }
            if q.needs_imatrix() && gguf.imatrix.is_none() {
                let why = match q {
                    // (A searched rung never needs one by itself: its candidates are checked in `check_search`.)
                    Rung::File(_) | Rung::Search(_) => "is made only with an importance matrix".to_string(),
                    Rung::Recipe(r) => {
                        let base = r.base.needs_imatrix().then(|| r.base.to_string());
                        let types = r.named_types().filter(|t| t.quantize_requires_imatrix()).map(|t| t.to_string());
                        let what: Vec<String> = base.into_iter().chain(types).collect();
                        format!("(a recipe) names {}, made only with an importance matrix", what.join(", "))
                    }
                };
                return Err(format!(
                    "outputs.gguf.quants: {level} {why}; add `imatrix: {{file: PATH}}` (llama-imatrix's or \
                     `quantfarm imatrix`'s) or `imatrix: {{text: PATH}}` (computed by the farm) under outputs.gguf"
                ));
            }
        }
        self.check_search(gguf)?;
        if let Some(e) = &self.evaluation {
            for (key, v) in [("text", &e.text), ("prompts", &e.prompts), ("probes", &e.probes), ("choices", &e.choices)]
            {
                if v.as_deref().is_some_and(|v| v.trim().is_empty()) {
                    return Err(format!("evaluation.{key}: is empty"));
                }
            }
            if e.text.is_none() && e.prompts.is_none() && e.probes.is_none() && e.choices.is_none() {
                return Err("evaluation: names nothing to measure (give text, prompts, probes or choices)".into());
            }
            if !(1..=4096).contains(&e.max_tokens) {
                return Err(format!("evaluation.max_tokens: {} is not between 1 and 4096", e.max_tokens));
            }
            if !(1..=1000).contains(&e.prompt_shares) {
                return Err(format!("evaluation.prompt_shares: {} is not between 1 and 1000", e.prompt_shares));
            }
            for (i, p) in e.peers.iter().enumerate() {
                if let PeerEntry::Gguf(u) = p {
                    if !u.ends_with(".gguf") {
                        return Err(format!(
                            "evaluation.peers[{i}]: {u:?}: expected a peer tool (llama-perplexity) or a GGUF file \
                             (a path, file:// or s3:// URL ending in .gguf)"
                        ));
                    }
                }
            }
            if !e.peers.is_empty() && e.text.is_none() {
                return Err("evaluation.peers: the peers measure KL divergence; give evaluation.text".into());
            }
            if e.peers.iter().enumerate().any(|(i, p)| e.peers[..i].contains(p)) {
                return Err("evaluation.peers: a peer is listed twice".into());
            }
            if let Some(with) = &e.compare_with {
                let id = with.strip_prefix("releases/").unwrap_or_default();
                if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                    return Err(format!(
                        "evaluation.compare_with: {with:?}: expected releases/<id>, an earlier release of this farm"
                    ));
                }
            }
            if !(0.5..1.0).contains(&e.confidence) {
                return Err(format!(
                    "evaluation.confidence: {} is not a fraction from 0.5 up to (not including) 1",
                    e.confidence
                ));
            }
            if let Some(stop) = &e.stop {
                stop.check()?;
                if e.text.is_none() {
                    return Err("evaluation.stop: stopping is for the KL divergence; give evaluation.text".into());
                }
            }
            if !(64..=1 << 20).contains(&e.context) {
                return Err(format!("evaluation.context: {} is not between 64 and 1048576 tokens", e.context));
            }
            if !(8..=1 << 20).contains(&e.ctx) {
                return Err(format!("evaluation.ctx: {} is not between 8 and 1048576 tokens", e.ctx));
            }
            if e.batch == 0 || (e.batch >= e.ctx && !e.batch.is_multiple_of(e.ctx)) {
                return Err(format!(
                    "evaluation.batch: {} must be below or a multiple of the context {} (as llama-perplexity's -b)",
                    e.batch, e.ctx
                ));
            }
            if e.chunks == Some(0) {
                return Err("evaluation.chunks: must be at least 1".into());
            }
            if self.outputs.gguf.is_none() {
                return Err("evaluation: the reference is the GGUF BF16; add outputs.gguf".into());
            }
        }
        let levels: Vec<String> = self.levels().iter().map(EvalTarget::to_string).collect();
        if let Some(e) = &self.evaluation {
            for (i, l) in e.skip.iter().enumerate() {
                if !levels.contains(l) || e.skip[..i].contains(l) {
                    return Err(format!(
                        "evaluation.skip: {l:?} is not an output of this release, or is listed twice (its levels: {})",
                        levels.join(", ")
                    ));
                }
            }
        }
        crate::gates::check_release_gates(&self.gates, &levels)?;
        for (i, g) in self.gates.iter().enumerate() {
            let Ok(check) = crate::gates::Check::parse(&g.check, |_| true) else { continue };
            let figures = check.figures();
            let no_prompts = self.evaluation.as_ref().is_none_or(|e| e.prompts.is_none());
            let (in_tf, in_llama): (Vec<&str>, Vec<&str>) =
                figures.iter().filter(|f| f.starts_with("merge.")).partition(|f| f.starts_with("merge.transformers."));
            if !in_llama.is_empty() && (self.adapter.is_none() || no_prompts) {
                return Err(format!(
                    "gates[{i}] ({}): the merge check needs an adapter and evaluation.prompts (the prompts the merge is checked on)",
                    g.name
                ));
            }
            if !in_tf.is_empty() && (self.adapter.is_none() || !self.runs_transformers()) {
                return Err(format!(
                    "gates[{i}] ({}): {} is the merge check in transformers: it needs an adapter, outputs.gguf and \
                     evaluation.transformers: true",
                    g.name, in_tf[0]
                ));
            }
            if in_tf.iter().any(|f| f.contains(".greedy.")) && no_prompts {
                return Err(format!(
                    "gates[{i}] ({}): {} needs evaluation.prompts (the prompts the merge is checked on)",
                    g.name,
                    in_tf.iter().find(|f| f.contains(".greedy.")).copied().unwrap_or_default()
                ));
            }
            let kld = |f: &&str| f.contains("kld.") && !f.starts_with("default.");
            if figures.iter().any(kld) && self.evaluation.as_ref().is_none_or(|e| e.text.is_none()) {
                return Err(format!(
                    "gates[{i}] ({}): a KL-divergence figure needs evaluation.text (the text it is measured on)",
                    g.name
                ));
            }
        }
        Ok(())
    }

    /// Every measured output, in report order: the GGUF quant levels, the MLX checkpoints, then the vLLM ones.
    pub fn levels(&self) -> Vec<EvalTarget> {
        let quants = self.quants().iter().map(|q| EvalTarget::Quant(q.level()));
        let mlx = self.mlx_rungs().into_iter().map(EvalTarget::Mlx);
        quants.chain(mlx).chain(self.vllm_rungs().iter().map(|&r| EvalTarget::Vllm(r))).collect()
    }

    /// The vLLM schemes to make (none when there is no vLLM output).
    pub fn vllm_rungs(&self) -> &[VllmRung] {
        self.outputs.vllm.as_ref().map_or(&[], |v| &v.schemes)
    }

    /// Whether an output is measured: the release has an evaluation, and `evaluation.skip` does not name it.
    pub fn measures(&self, target: EvalTarget) -> bool {
        self.evaluation.as_ref().is_some_and(|e| !e.skip.iter().any(|s| EvalTarget::parse(s) == Some(target)))
    }

    pub fn prefix(&self) -> &str {
        self.outputs.gguf.as_ref().and_then(|g| g.prefix.as_deref()).unwrap_or(&self.name)
    }

    /// The MLX rungs to make, bit widths first (none when there is no MLX output).
    pub fn mlx_rungs(&self) -> Vec<MlxRung> {
        self.outputs.mlx.as_ref().map_or_else(Vec::new, MlxOutputs::rungs)
    }

    /// Whether the release runs models in mlx-lm (the cross-runtime link): it has MLX outputs, a GGUF BF16 to
    /// compare with, an evaluation, and does not turn it off (`evaluation.mlx_lm: false`).
    pub fn runs_mlx_lm(&self) -> bool {
        self.outputs.mlx.is_some() && self.outputs.gguf.is_some() && self.evaluation.as_ref().is_some_and(|e| e.mlx_lm)
    }

    /// Whether the release runs models in transformers: it has vLLM outputs or an adapter (either way an HF
    /// checkpoint transformers loads), a GGUF BF16 to compare with, an evaluation, and asks for it
    /// (`evaluation.transformers: true`).
    pub fn runs_transformers(&self) -> bool {
        (self.outputs.vllm.is_some() || self.adapter.is_some())
            && self.outputs.gguf.is_some()
            && self.evaluation.as_ref().is_some_and(|e| e.transformers)
    }

    /// Whether the release converts the source at all (a plan, then GGUF, MLX and/or vLLM outputs).
    pub fn converts(&self) -> bool {
        self.outputs.gguf.is_some() || self.outputs.mlx.is_some() || self.outputs.vllm.is_some()
    }

    /// The searched rungs' settings and their errors: a target names a rung of the ladder made by type or recipe;
    /// the probes have a text (`search.text` or the computed importance matrix's); candidates that need an importance
    /// matrix have one.
    fn check_search(&self, gguf: &GgufOutputs) -> Result<(), String> {
        let searched: Vec<&SearchRung> = gguf.quants.iter().filter_map(Rung::search).collect();
        let settings = gguf.search.clone().unwrap_or_default();
        settings.check()?;
        let Some(first) = searched.first() else {
            return match gguf.search {
                Some(_) => Err("outputs.gguf.search: no rung of outputs.gguf.quants is searched (give one a \
                                target_bpw)"
                    .into()),
                None => Ok(()),
            };
        };
        for s in &searched {
            if let Target::SizeOf(level) = s.target {
                match self.rung(level) {
                    Some(Rung::File(_) | Rung::Recipe(_)) => {}
                    Some(Rung::Search(_)) => {
                        return Err(format!(
                            "outputs.gguf.quants: {}: target_bpw {level} is a searched rung; name a file type or a \
                             recipe",
                            s.name
                        ))
                    }
                    None => {
                        return Err(format!(
                            "outputs.gguf.quants: {}: target_bpw {level} is not a rung of outputs.gguf.quants",
                            s.name
                        ))
                    }
                }
            }
        }
        let computed_text = matches!(gguf.imatrix, Some(ImatrixSource::Text { .. }));
        if settings.text.is_none() && !computed_text {
            return Err(format!(
                "outputs.gguf.quants: {} is searched: give outputs.gguf.search.text (the text its probes are \
                 measured on) or compute the importance matrix from one (imatrix: {{text: PATH}})",
                first.name
            ));
        }
        if let Some(t) = settings.candidates.iter().find(|t| t.quantize_requires_imatrix()) {
            if gguf.imatrix.is_none() {
                return Err(format!(
                    "outputs.gguf.search.candidates: {t} is made only with an importance matrix; add `imatrix:` \
                     under outputs.gguf or leave {t} out"
                ));
            }
        }
        Ok(())
    }

    /// The searched rungs' settings (their defaults without `outputs.gguf.search`).
    pub fn search_settings(&self) -> SearchSettings {
        self.outputs.gguf.as_ref().and_then(|g| g.search.clone()).unwrap_or_default()
    }

    /// Whether the release searches a rung's recipe.
    pub fn searches(&self) -> bool {
        self.quants().iter().any(|q| q.search().is_some())
    }

    pub fn quants(&self) -> &[Rung] {
        self.outputs.gguf.as_ref().map_or(&[], |g| &g.quants)
    }

    /// The rung a GGUF level is made by.
    pub fn rung(&self, level: Level) -> Option<&Rung> {
        self.quants().iter().find(|q| q.level() == level)
    }

    pub fn split_rule(&self) -> Option<quantfarm_proto::SplitRule> {
        self.outputs.gguf.as_ref()?.split.as_ref()?.rule().ok()
    }
}

impl Split {
    pub fn rule(&self) -> Result<quantfarm_proto::SplitRule, String> {
        use quantfarm_proto::split_rule::Rule;
        let rule = match (self.max_tensors, &self.max_size) {
            (Some(0), None) => return Err("outputs.gguf.split.max_tensors: must be at least 1".into()),
            (Some(n), None) => Rule::MaxTensors(n),
            (None, Some(s)) => {
                Rule::MaxBytes(parse_decimal_size(s).map_err(|e| format!("outputs.gguf.split.max_size: {e}"))?)
            }
            _ => return Err("outputs.gguf.split: give exactly one of max_tensors, max_size".into()),
        };
        Ok(quantfarm_proto::SplitRule { rule: Some(rule) })
    }
}

/// gguf-split's `--split-max-size` units: M = 10⁶, G = 10⁹ (a plain number is bytes).
fn parse_decimal_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.to_ascii_uppercase() {
        u if u.ends_with("GB") => (&t[..t.len() - 2], 1e9),
        u if u.ends_with("MB") => (&t[..t.len() - 2], 1e6),
        u if u.ends_with('G') => (&t[..t.len() - 1], 1e9),
        u if u.ends_with('M') => (&t[..t.len() - 1], 1e6),
        _ => (t, 1.0),
    };
    let n: f64 = num.trim().parse().map_err(|_| format!("{s:?} is not a size such as 500M or 2G"))?;
    let v = n * mult;
    if !(1.0..1e18).contains(&v) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(v as u64)
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 100
        && !s.starts_with('.')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

#[cfg(test)]
mod tests;
