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
//!     #   batch 2048: batch/ctx chunks per `imatrix/G` task), as llama-imatrix -f -c -b --chunks
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
//!   context: 4096               # context of greedy continuations and probes (default 4096)
//!   peers: [llama-perplexity]   # also run llama.cpp's own tool on the same files, on workers that have it
//!   skip: [Q2_K]                # levels made but not measured (they then fail the built-in `measured` gate)
//!   transformers: true          # with vLLM outputs (default false): the bf16 checkpoint and each vLLM rung also
//!                               # run in transformers (W8A8 emulated and weight-only), on workers with the
//!                               # transformers runtime: greedy agreement and KL divergence against the GGUF BF16
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
mod target;
mod vllm;

pub use evaluation::{Evaluation, Peer};
pub use mlx::MlxOutputs;
pub use recipe::{Level, Recipe, RecipeName, Rung, TensorTypeRule};
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
}

impl TryFrom<ImatrixFields> for ImatrixSource {
    type Error = String;

    fn try_from(f: ImatrixFields) -> Result<ImatrixSource, String> {
        match (f.file, f.text) {
            (Some(file), None) => {
                if f.chunks.is_some() || f.ctx.is_some() || f.batch.is_some() {
                    return Err("imatrix: chunks, ctx and batch go with `text` (a file was computed already)".into());
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
                Ok(ImatrixSource::Text { text, chunks: f.chunks, ctx, batch })
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
                ImatrixFields { file: Some(file), text: None, chunks: None, ctx: None, batch: None }
            }
            ImatrixSource::Text { text, chunks, ctx, batch } => {
                ImatrixFields { file: None, text: Some(text), chunks, ctx: Some(ctx), batch: Some(batch) }
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
        let empty = GgufOutputs { prefix: None, split: None, quants: vec![], imatrix: None };
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
                    Rung::File(_) => "is made only with an importance matrix".to_string(),
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
        if let Some(e) = &self.evaluation {
            for (key, v) in [("text", &e.text), ("prompts", &e.prompts), ("probes", &e.probes)] {
                if v.as_deref().is_some_and(|v| v.trim().is_empty()) {
                    return Err(format!("evaluation.{key}: is empty"));
                }
            }
            if e.text.is_none() && e.prompts.is_none() && e.probes.is_none() {
                return Err("evaluation: names nothing to measure (give text, prompts or probes)".into());
            }
            if !(1..=4096).contains(&e.max_tokens) {
                return Err(format!("evaluation.max_tokens: {} is not between 1 and 4096", e.max_tokens));
            }
            if !(1..=1000).contains(&e.prompt_shares) {
                return Err(format!("evaluation.prompt_shares: {} is not between 1 and 1000", e.prompt_shares));
            }
            if !e.peers.is_empty() && e.text.is_none() {
                return Err("evaluation.peers: the peers measure KL divergence; give evaluation.text".into());
            }
            if e.peers.iter().enumerate().any(|(i, p)| e.peers[..i].contains(p)) {
                return Err("evaluation.peers: a peer is listed twice".into());
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
            if figures.iter().any(|f| f.starts_with("merge.")) && (self.adapter.is_none() || no_prompts) {
                return Err(format!(
                    "gates[{i}] ({}): the merge check needs an adapter and evaluation.prompts (the prompts the merge is checked on)",
                    g.name
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

    /// Whether the release runs models in transformers: it has vLLM outputs, a GGUF BF16 to compare with, an
    /// evaluation, and asks for it (`evaluation.transformers: true`).
    pub fn runs_transformers(&self) -> bool {
        self.outputs.vllm.is_some()
            && self.outputs.gguf.is_some()
            && self.evaluation.as_ref().is_some_and(|e| e.transformers)
    }

    /// Whether the release converts the source at all (a plan, then GGUF, MLX and/or vLLM outputs).
    pub fn converts(&self) -> bool {
        self.outputs.gguf.is_some() || self.outputs.mlx.is_some() || self.outputs.vllm.is_some()
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
mod tests {
    use super::*;

    const GOOD: &str =
        "name: smollm2\nsource: ./m\noutputs:\n  gguf:\n    split: {max_tensors: 100}\n    quants: [Q8_0]\n";

    #[test]
    fn an_imatrix_is_a_file_or_computed_from_a_text() {
        let with = |im: &str| ReleaseSpec::parse(&format!("{GOOD}    imatrix: {im}\n"), "release.yaml");
        assert_eq!(with("{file: im.gguf}").unwrap().imatrix(), Some(&ImatrixSource::File("im.gguf".into())));
        let t = with("{text: c.txt, chunks: 10}").unwrap();
        assert_eq!(
            t.imatrix(),
            Some(&ImatrixSource::Text { text: "c.txt".into(), chunks: Some(10), ctx: 512, batch: 2048 })
        );
        // Written back as read (the report's spec).
        let yaml = serde_norway::to_string(&t).unwrap();
        assert_eq!(ReleaseSpec::parse(&yaml, "again.yaml").unwrap().imatrix(), t.imatrix());
        for (bad, says) in [
            ("im.gguf", "imatrix"),
            ("{}", "expected {file: PATH}"),
            ("{file: a, text: b}", "not both"),
            ("{file: a, chunks: 3}", "go with `text`"),
            ("{text: b, ctx: 512, batch: 1000}", "imatrix.batch"),
            ("{text: b, chunks: 0}", "imatrix.chunks"),
            ("{text: b, chunk: 3}", "chunk"),
        ] {
            let err = with(bad).unwrap_err().to_string();
            assert!(err.contains("release.yaml") && err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn parses_without_gates_of_its_own() {
        let s = ReleaseSpec::parse(GOOD, "release.yaml").unwrap();
        assert_eq!(s.quants(), &[Rung::File(quantfarm_ggml::FileType::Q8_0)]);
        assert!(s.gates.is_empty(), "the defaults are added when the gates are evaluated");
        assert_eq!(s.prefix(), "smollm2");
        assert_eq!(s.levels().iter().map(EvalTarget::to_string).collect::<Vec<_>>(), ["Q8_0"]);
    }

    #[test]
    fn unknown_key_names_line_and_key() {
        let text = GOOD.replace("    quants", "    quant_levels: [Q4_0]\n    quants");
        let e = ReleaseSpec::parse(&text, "release.yaml").unwrap_err().to_string();
        assert!(e.contains("release.yaml") && e.contains("quant_levels") && e.contains("line 6"), "{e}");
    }

    #[test]
    fn bad_quant_type_is_named() {
        let e = ReleaseSpec::parse(&GOOD.replace("Q8_0", "Q9_X"), "r.yaml").unwrap_err().to_string();
        assert!(e.contains("Q9_X") && e.contains("line 6"), "{e}");
    }

    #[test]
    fn semantic_errors() {
        let both = GOOD.replace("{max_tensors: 100}", "{max_tensors: 100, max_size: 2G}");
        assert!(ReleaseSpec::parse(&both, "r").unwrap_err().to_string().contains("exactly one"));
        let bad_name = GOOD.replace("smollm2", "../x");
        assert!(ReleaseSpec::parse(&bad_name, "r").unwrap_err().to_string().contains("name"));
        let gate = format!("{GOOD}gates:\n  - {{name: g, check: 'q4_0.kld.mean <= 0.1'}}\n");
        assert!(ReleaseSpec::parse(&gate, "r").unwrap_err().to_string().contains("unknown figure \"q4_0.kld.mean\""));
        let unmeasured = format!("{GOOD}gates:\n  - {{name: g, check: 'q8_0.kld.mean <= 0.1'}}\n");
        assert!(ReleaseSpec::parse(&unmeasured, "r").unwrap_err().to_string().contains("needs evaluation.text"));
        let old = format!("{GOOD}gates:\n  - {{name: g, rule: kld_mean, level: Q8_0, max: 0.1}}\n");
        assert!(ReleaseSpec::parse(&old, "r").unwrap_err().to_string().contains("unknown field `rule`"));
        // A level llama-quantize makes only with an importance matrix, without one: named, with both forms.
        let e = ReleaseSpec::parse(&GOOD.replace("[Q8_0]", "[Q8_0, IQ3_XXS]"), "r").unwrap_err().to_string();
        assert!(
            e.contains("IQ3_XXS") && e.contains("imatrix: {file: PATH}") && e.contains("imatrix: {text: PATH}"),
            "{e}"
        );
        let with = GOOD.replace("[Q8_0]", "[Q8_0, IQ3_XXS]\n    imatrix: {file: im.gguf}");
        assert!(ReleaseSpec::parse(&with, "r").is_ok());
    }

    #[test]
    fn recipes_are_rungs_named_apart_and_refused_without_the_imatrix_they_need() {
        let recipe = "{name: Q4_K_XL, base: Q4_K_M, tensor_types: {ffn_down: q6_k}}";
        let s = ReleaseSpec::parse(&GOOD.replace("[Q8_0]", &format!("[Q8_0, {recipe}]")), "r").unwrap();
        assert_eq!(s.levels().iter().map(EvalTarget::to_string).collect::<Vec<_>>(), ["Q8_0", "Q4_K_XL"]);
        let xl = s.rung(Level::parse("Q4_K_XL").unwrap()).unwrap();
        assert_eq!(xl.base(), quantfarm_ggml::FileType::Q4_K_M);
        // Written back and read again (the journal keeps the spec so), the same rungs.
        let again = ReleaseSpec::parse(&serde_norway::to_string(&s).unwrap(), "again").unwrap();
        assert_eq!(again.quants(), s.quants());
        for (quants, says) in [
            (format!("[{recipe}, {recipe}]"), "Q4_K_XL is listed twice"),
            (format!("[{recipe}, {}]", recipe.replace("Q4_K_XL", "q4-k-xl")), "have the same name in gates"),
            ("[{name: R, base: Q4_K_M, tensor_types: {ffn_down: iq1_s}}]".into(), "R (a recipe) names IQ1_S"),
            ("[{name: R, base: IQ2_M}]".into(), "R (a recipe) names IQ2_M"),
        ] {
            let e = ReleaseSpec::parse(&GOOD.replace("[Q8_0]", &quants), "r").unwrap_err().to_string();
            assert!(e.contains(says), "{quants}: {e}");
            if says.contains("names") {
                assert!(e.contains("imatrix: {file: PATH}") && e.contains("imatrix: {text: PATH}"), "{e}");
            }
        }
    }

    #[test]
    fn adapter_and_mlx_outputs() {
        let text = "name: r\nsource: ./m\nadapter: ./a\nbase_name: org/m\noutputs:\n  mlx: {bits: [4, 8]}\n";
        let s = ReleaseSpec::parse(text, "r").unwrap();
        let rungs = [MlxRung::Bits(4), MlxRung::Bits(8)];
        assert_eq!((s.adapter.as_deref(), s.mlx_rungs(), s.converts()), (Some("./a"), rungs.to_vec(), true));
        assert_eq!(s.outputs.mlx.as_ref().unwrap().group_size, 64);
        for (bad, says) in [
            (text.replace("[4, 8]", "[7]"), "outputs.mlx.bits: 7"),
            (text.replace("[4, 8]", "[4, 4]"), "outputs.mlx.bits: 4"),
            (text.replace("{bits: [4, 8]}", "{bits: [4], group_size: 48}"), "outputs.mlx.group_size: 48"),
            (text.replace("{bits: [4, 8]}", "{}"), "outputs.mlx: names no bit width"),
            (text.replace("{bits: [4, 8]}", "{recipes: [mixed_3_6, mixed_3_6]}"), "mixed_3_6 is named twice"),
            (text.replace("{bits: [4, 8]}", "{recipes: [mixed_4_8]}"), "mixed_4_8"),
            (text.replace("adapter: ./a\n", ""), "base_name: names the base"),
        ] {
            let e = ReleaseSpec::parse(&bad, "r").unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn merge_gate_and_skipped_levels() {
        let text = "name: r\nsource: ./m\nadapter: ./a\noutputs:\n  gguf: {quants: [Q8_0]}\n  mlx: {bits: [4]}\n\
                    evaluation: {prompts: p.json, skip: [MLX-4bit]}\n\
                    gates:\n  - {name: merge-exact, check: 'merge.greedy.agree >= 1'}\n";
        let s = ReleaseSpec::parse(text, "r").unwrap();
        assert_eq!(s.gates[0].check, "merge.greedy.agree >= 1");
        assert_eq!(s.levels().iter().map(EvalTarget::to_string).collect::<Vec<_>>(), ["Q8_0", "MLX-4bit"]);
        let q8 = EvalTarget::parse("Q8_0").unwrap();
        assert!(s.measures(q8) && !s.measures(EvalTarget::Mlx(MlxRung::Bits(4))));
        for (bad, says) in [
            (text.replace(">= 1", ">= "), "right-hand side"),
            (text.replace("check:", "rule:"), "unknown field `rule`"),
            (text.replace("adapter: ./a\n", ""), "needs an adapter"),
            (text.replace("prompts: p.json", "probes: p.yaml"), "needs an adapter and evaluation.prompts"),
            (text.replace("skip: [MLX-4bit]", "skip: [Q6_K]"), "evaluation.skip: \"Q6_K\""),
        ] {
            let e = ReleaseSpec::parse(&bad, "r").unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn evaluation_section() {
        let text = format!("{GOOD}evaluation: {{text: t.txt, chunks: 8}}\ngates:\n  - {{name: g, levels: [Q8_0], check: 'kld.mean <= 0.01'}}\n");
        let s = ReleaseSpec::parse(&text, "r").unwrap();
        let e = s.evaluation.as_ref().unwrap();
        assert_eq!((e.text.as_deref(), e.ctx, e.batch, e.chunks), (Some("t.txt"), 512, 2048, Some(8)));
        assert_eq!((e.prompts.as_deref(), e.max_tokens, e.prompt_shares, e.context), (None, 64, 2, 4096));
        for (bad, says) in [
            (text.replace("chunks: 8", "batch: 700"), "evaluation.batch: 700"),
            (text.replace("chunks: 8", "ctx: 4"), "evaluation.ctx: 4"),
            (text.replace("chunks: 8", "chunks: 0"), "evaluation.chunks"),
            (text.replace("chunks: 8", "chunk: 8"), "chunk"),
            (text.replace("chunks: 8", "prompt_shares: 0"), "evaluation.prompt_shares: 0"),
            (text.replace("chunks: 8", "peers: [llama-bench]"), "llama-bench"),
            (text.replace("text: t.txt, chunks: 8", "ctx: 512"), "names nothing to measure"),
        ] {
            let e = ReleaseSpec::parse(&bad, "r").unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn decimal_sizes() {
        assert_eq!(parse_decimal_size("500M").unwrap(), 500_000_000);
        assert_eq!(parse_decimal_size("2GB").unwrap(), 2_000_000_000);
        assert!(parse_decimal_size("x").is_err());
    }
}
