//! The weights a vLLM checkpoint is written from, as llm-compressor sees them: each source tensor is one piece, but
//! a fused 3-D expert tensor is one piece per expert and projection.
//!
//! transformers 5 saves a mixture's experts fused: `P.experts.gate_up_proj` `[E, 2I, H]` (each expert's gate rows,
//! then its up rows) and `P.experts.down_proj` `[E, H, I]`. Both of llm-compressor's entry points split them per
//! expert before quantizing (`oneshot`: `llmcompressor/modeling/moe/linear_experts.py`,
//! `ExpertMLPWithGate.copy_from_experts_module`, gate `gate_up_proj[e, :I]`, up `[e, I:]`, down `down_proj[e]`;
//! `model_free_ptq`: `entrypoints/model_free/converter.py::split_fused_moe_experts`, the same halves) and save them
//! split, never re-fused: `P.experts.{e}.gate_proj.weight` `[I, H]`, `.up_proj.weight` `[I, H]`,
//! `.down_proj.weight` `[H, I]` — the per-expert layout vLLM's MoE loaders read and transformers 5 fuses back when it
//! loads. Each piece is whole rows of its source tensor (expert `e`'s gate: rows `2I·e .. 2I·e + I` of the
//! `[E·2I, H]` view), so it is read row piece by row piece like any weight.
//!
//! Refused, naming the tensor: the transposed layout (`[E, H, 2I]`, `is_transposed` in transformers) and gpt-oss's
//! (transposed, gate and up interleaved), whose split checkpoint no vLLM or transformers loader for gpt-oss is known
//! to read (`docs/formats.md`); any other 3-D floating tensor of an `experts` module. Other 3-D tensors (a
//! convolution's weight: Qwen3.5's `linear_attn.conv1d`) are not Linear weights and are carried as they are.

use quantfarm_tensors::safetensors::StTensor;
use quantfarm_tensors::{Dtype, TensorSource};

/// One weight as the checkpoint is written: `rows` whole rows of source tensor `source` from `first_row`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Its name in the written checkpoint.
    pub name: String,
    pub shape: Vec<u64>,
    pub source: String,
    pub first_row: u64,
    pub dtype: Dtype,
}

impl Piece {
    /// Whether the piece is its source tensor whole.
    pub fn is_whole(&self) -> bool {
        self.first_row == 0 && self.name == self.source
    }

    /// Its rows: the product of every dimension but the last.
    pub fn rows(&self) -> u64 {
        let cols = self.shape.last().copied().unwrap_or(1).max(1);
        self.shape.iter().product::<u64>() / cols
    }
}

/// Why a 3-D expert tensor is not split.
#[derive(Debug, thiserror::Error)]
#[error("tensor {tensor:?}: {msg}")]
pub struct ExpertLayout {
    pub tensor: String,
    pub msg: String,
}

/// The pieces of a checkpoint, in its files' and tensors' order (a fused tensor's: expert by expert, gate before
/// up). `keep(name)`: a tensor kept whole whatever it holds (oneshot's copied multi-token-prediction layers).
pub fn pieces(src: &TensorSource, keep: impl Fn(&str) -> bool + Copy) -> Result<Vec<Piece>, ExpertLayout> {
    let mut out = Vec::new();
    for (_, header) in src.safetensors().map(|m| m.files.as_slice()).unwrap_or_default() {
        for t in &header.tensors {
            out.extend(split(src, t, keep)?);
        }
    }
    Ok(out)
}

/// The pieces of the source's tensor `t`.
pub fn split(src: &TensorSource, t: &StTensor, keep: impl Fn(&str) -> bool) -> Result<Vec<Piece>, ExpertLayout> {
    let whole = || {
        vec![Piece {
            name: t.name.clone(),
            shape: t.shape.clone(),
            source: t.name.clone(),
            first_row: 0,
            dtype: t.dtype,
        }]
    };
    let floating = matches!(t.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) && !keep(&t.name);
    let Some((parent, proj)) = t.name.rsplit_once(".experts.").filter(|_| floating && t.shape.len() == 3) else {
        return Ok(whole());
    };
    let refuse = |msg: String| ExpertLayout { tensor: t.name.clone(), msg };
    if src.metadata().get("model_type").and_then(|v| v.as_str()) == Some("gpt_oss") {
        return Err(refuse(
            "gpt-oss's fused experts (transposed, gate and up interleaved) are not quantized by this version: \
             llm-compressor's oneshot saves them split per expert, a layout no vLLM or transformers loader for \
             gpt-oss is known to read, and its model_free_ptq mis-splits them (docs/formats.md)"
                .into(),
        ));
    }
    let split: &[&str] = match proj {
        "gate_up_proj" => &["gate_proj", "up_proj"],
        "down_proj" => &["down_proj"],
        _ => {
            return Err(refuse(format!(
                "a 3-D expert tensor other than gate_up_proj or down_proj ({proj}): its layout is unknown, and \
                 left unquantized it would sit beside quantized layers"
            )))
        }
    };
    // The partner tensor says whether the layout is [E, 2I, H] + [E, H, I] (split here) or another.
    let shape_of = |p: &str| {
        let name = format!("{parent}.experts.{p}");
        src.tensors().iter().find(|e| e.name == name).map(|e| e.shape.clone()).unwrap_or_default()
    };
    let (gate_up, down) = match proj {
        "gate_up_proj" => (t.shape.clone(), shape_of("down_proj")),
        _ => (shape_of("gate_up_proj"), t.shape.clone()),
    };
    let concatenated = matches!((gate_up.as_slice(), down.as_slice()), ([g0, g1, g2], [d0, d1, d2])
        if g0 == d0 && g1 % 2 == 0 && g1 / 2 == *d2 && g2 == d1);
    if !concatenated {
        return Err(refuse(format!(
            "fused experts are split when gate_up_proj is [E, 2I, H] and down_proj [E, H, I] (transformers 5's \
             layout); here gate_up_proj is {gate_up:?} and down_proj {down:?} (a transposed layout is not split \
             by this version)"
        )));
    }
    let (experts, rows_each, cols) = (t.shape[0], t.shape[1], t.shape[2]);
    let rows = rows_each / split.len() as u64;
    let mut out = Vec::new();
    for e in 0..experts {
        for (k, p) in split.iter().enumerate() {
            out.push(Piece {
                name: format!("{parent}.experts.{e}.{p}.weight"),
                shape: vec![rows, cols],
                source: t.name.clone(),
                first_row: e * rows_each + k as u64 * rows,
                dtype: t.dtype,
            });
        }
    }
    Ok(out)
}
