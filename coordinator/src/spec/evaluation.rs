//! `evaluation:` of a release: how each level is measured against the reference (the KL-divergence text, greedy
//! prompts, probes, the peer tools run beside, the levels skipped), with its defaults.

use serde::{Deserialize, Serialize};

/// The KL-divergence pass: llama-perplexity's `--kl-divergence` over one text, spread over the farm by chunk group.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Evaluation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default = "default_ctx")]
    pub ctx: u32,
    #[serde(default = "default_batch")]
    pub batch: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompts: Option<String>,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    #[serde(default = "default_prompt_shares")]
    pub prompt_shares: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<String>,
    /// Multiple-choice tasks scored on the reference and every model as `llama-perplexity --multiple-choice` scores
    /// them: its binary task file, or a question set (`.yaml`; `quantfarm choice`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choices: Option<String>,
    #[serde(default = "default_context")]
    pub context: u32,
    /// Levels made but not measured (`Q6_K`, `MLX-4bit`): no KL-divergence, greedy or probe task runs for them, so
    /// they fail the built-in `measured` gate — a level that was not measured never passes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skip: Vec<String>,
    /// Peer tools run beside quantfarm's own measurement, on workers that advertise them (`llama-perplexity`), and
    /// GGUF files of the same base made elsewhere (a path relative to the spec, file:// or s3://, ending in `.gguf`),
    /// each scored against the same base logits beside the farm's rungs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<PeerEntry>,
    /// With MLX outputs: run the source's bf16 weights and every measured MLX rung in mlx-lm too, on workers that
    /// advertise the `mlx_lm` runtime (the cross-runtime link). On by default; `false` leaves it out, and the report
    /// says so.
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub mlx_lm: bool,
    /// With vLLM outputs or an adapter: run the source's bf16 checkpoint and every measured vLLM rung in Hugging Face
    /// transformers too (W8A8 emulated and weight-only), and a PEFT adapter unmerged on its base (link 1 in
    /// transformers), on workers that advertise the `transformers` runtime. Off by default: it
    /// asks for workers with a pinned transformers environment (`QUANTFARM_TRANSFORMERS_PYTHON`), and a farm without
    /// one would hold the release waiting for them; llama.cpp measures every vLLM rung either way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub transformers: bool,
    /// The two-sided confidence of the report's intervals and paired comparisons of the rungs' KL divergence
    /// (`quantfarm_parity::paired`; default 0.95).
    #[serde(default = "default_confidence", skip_serializing_if = "is_default_confidence")]
    pub confidence: f64,
    /// An earlier release to compare this one with (`releases/<id>`, in this farm's store): its report and per-token
    /// values are read when this release's report is made, and the diff (`quantfarm report diff`) is put in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compare_with: Option<String>,
    /// Sequential measurement: each rung's chunk groups are measured in a seeded stratified order, and measuring a
    /// rung stops once every gate that reads its KL divergence has a verdict the remaining groups cannot change at
    /// this confidence (or its mean is as precise as asked); `quantfarm_parity::sequential`, docs/statistics.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
}

/// `evaluation.stop`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Stop {
    /// The chance that a stopped rung's interval misses its full-text mean is at most `1 − confidence`.
    pub confidence: f64,
    /// No decision before this many chunks (rounded up to whole chunk groups, at least 3 groups; default 4).
    #[serde(default = "default_min_chunks")]
    pub min_chunks: u32,
    /// Also stop a rung once its interval's half-width is at most this fraction of its mean (`0.05`: ± 5 %).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<f64>,
    /// The floor under the chunk groups' coefficient of variation the interval assumes (default 0.3; measured on
    /// real texts 0.2–0.5, docs/statistics.md). Larger is more cautious.
    #[serde(default = "default_spread")]
    pub spread: f64,
}

fn default_min_chunks() -> u32 {
    4
}

fn default_spread() -> f64 {
    0.3
}

impl Stop {
    /// The rule over units of `n_seq` chunks.
    pub fn rule(&self, n_seq: u32) -> quantfarm_parity::sequential::StopRule {
        quantfarm_parity::sequential::StopRule {
            confidence: self.confidence,
            min_units: self.min_chunks.div_ceil(n_seq.max(1)) as usize,
            spread: self.spread,
            precision: self.precision,
        }
    }

    /// What is wrong with it, naming the key.
    pub fn check(&self) -> Result<(), String> {
        if !(0.5..1.0).contains(&self.confidence) {
            return Err(format!(
                "evaluation.stop.confidence: {} is not a fraction from 0.5 up to (not including) 1",
                self.confidence
            ));
        }
        if let Some(p) = self.precision {
            if !(p > 0.0 && p < 1.0) {
                return Err(format!("evaluation.stop.precision: {p} is not a fraction above 0 and below 1"));
            }
        }
        if !(0.0..=10.0).contains(&self.spread) {
            return Err(format!("evaluation.stop.spread: {} is not between 0 and 10", self.spread));
        }
        Ok(())
    }
}

fn default_confidence() -> f64 {
    0.95
}

fn is_default_confidence(c: &f64) -> bool {
    *c == default_confidence()
}

fn yes() -> bool {
    true
}

fn is_yes(b: &bool) -> bool {
    *b
}

/// A peer runtime whose own figures a release can ask for.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Hash)]
pub enum Peer {
    /// llama.cpp's `llama-perplexity --kl-divergence`, on the GGUF BF16 and every GGUF quant.
    #[serde(rename = "llama-perplexity")]
    LlamaPerplexity,
}

/// An entry of `evaluation.peers`: a peer tool, or a third party's GGUF file.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(untagged)]
pub enum PeerEntry {
    Tool(Peer),
    Gguf(String),
}

impl Evaluation {
    /// The peer tools of `peers`.
    pub fn peer_tools(&self) -> impl Iterator<Item = Peer> + '_ {
        self.peers.iter().filter_map(|p| match p {
            PeerEntry::Tool(t) => Some(*t),
            PeerEntry::Gguf(_) => None,
        })
    }

    /// The third parties' GGUF files of `peers`, as written.
    pub fn third_party(&self) -> impl Iterator<Item = &str> + '_ {
        self.peers.iter().filter_map(|p| match p {
            PeerEntry::Tool(_) => None,
            PeerEntry::Gguf(u) => Some(u.as_str()),
        })
    }
}

impl Peer {
    /// The tool's name, as workers advertise it among their runtimes.
    pub fn tool(self) -> &'static str {
        match self {
            Peer::LlamaPerplexity => "llama-perplexity",
        }
    }

    pub fn parse(s: &str) -> Option<Peer> {
        (s == "llama-perplexity").then_some(Peer::LlamaPerplexity)
    }
}

fn default_max_tokens() -> u32 {
    64
}

fn default_prompt_shares() -> u32 {
    2
}

fn default_context() -> u32 {
    4096
}

/// Tokens per chunk and per decode by default (llama-perplexity's `-c 512`, `-b 2048`), for every text the farm
/// chunks (the evaluation's and the search's).
pub(super) fn default_ctx() -> u32 {
    512
}

pub(super) fn default_batch() -> u32 {
    2048
}
