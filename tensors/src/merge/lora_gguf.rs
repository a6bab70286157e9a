//! A LoRA adapter as a GGUF LoRA (what llama.cpp's `convert_lora_to_gguf.py` writes, and `llama-server --lora` /
//! llama.cpp's runtime adapters read): per base tensor `NAME.lora_a` (numpy `(r, in)`) and `NAME.lora_b`
//! (`(out, r)`) in F32, the base's GGUF names from the architecture mapping, `lora_b`'s rows in the q/k rope order
//! (the permutation acts on the output rows, which are B's), `token_embd.weight.lora_a` transposed, and the keys
//! `general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`.
//!
//! llama.cpp scales every pair by one `alpha / rank`. Where the adapter's own scale differs — PEFT's
//! `alpha_pattern`/`rank_pattern`, rsLoRA's `alpha / √r`, mlx-lm's literal `scale` — the ratio is folded into
//! `lora_b` (computed in f64, rounded once to f32), so the served adapter computes what was trained;
//! `convert_lora_to_gguf.py` writes the global alpha and silently drops the difference. DoRA has no GGUF form and is
//! refused.

use serde_json::Value as Json;

use super::adapter::{Adapter, AdapterFormat, LowRank};
use crate::convert::id_to_title;
use crate::convert::mapping::{mapping_for, Mapped};
use crate::convert::transform::permuted_source_row;
use crate::error::{Error, Result};
use crate::gguf::{TensorDesc, Value};
use crate::write::GgufWriter;
use crate::GgmlType;
use quantfarm_store::Committed;
use quantfarm_store::Location;

/// One output pair.
struct Pair<'a> {
    name: String,
    lr: &'a LowRank,
    /// `lora_b` multiplied by this (the adapter's scale over llama.cpp's `alpha / rank`).
    fold: f64,
    /// Heads of the rope permutation applied to `lora_b`'s rows.
    permute_heads: Option<u64>,
    embedding: bool,
}

/// Writes `adapter` (for the HF base whose config.json is `config`) as a GGUF LoRA file at `dst`.
pub async fn write_lora_gguf(
    adapter: &Adapter,
    config: &serde_json::Map<String, Json>,
    dst: &Location,
    overwrite: bool,
) -> Result<Committed> {
    let cfg_name = "base config.json";
    let arch = config
        .get("architectures")
        .and_then(|a| a.as_array()?.first()?.as_str())
        .ok_or_else(|| Error::format(cfg_name, "architectures", "missing"))?;
    let m = mapping_for(arch)?;
    // The converter's view of the config (a `text_config` merged in, the class's defaults): the GGUF base was
    // converted from it, so its head counts are the ones the rows were permuted with.
    let config = &crate::convert::hparams::normalize(config, &m.hparams);
    if !adapter.biases.is_empty() || !adapter.replacements.is_empty() {
        let what =
            adapter.biases.first().map(|b| b.key.clone()).or(adapter.replacements.first().map(|r| r.key.clone()));
        return Err(Error::format(
            &adapter.dir,
            what.unwrap_or_default(),
            "a GGUF LoRA holds only lora_a/lora_b pairs (no lora_B.bias, modules_to_save or full weights); merge the \
             adapter instead",
        ));
    }
    // The global alpha llama.cpp will use: PEFT's lora_alpha; for mlx-lm, scale · rank of the first pair.
    let alpha = match adapter.format {
        AdapterFormat::Peft => adapter.lora_alpha.unwrap_or(8.0),
        AdapterFormat::MlxLm => adapter.low_rank.first().map(|lr| lr.scale * lr.rank as f64).unwrap_or(1.0),
    };
    let mut pairs = Vec::new();
    for lr in adapter.low_rank_in_file_order() {
        if lr.magnitude.is_some() {
            return Err(Error::format(
                &adapter.dir,
                lr.keys.join(", "),
                "DoRA has no GGUF LoRA form; merge it instead",
            ));
        }
        let (name, permute) = match m.map_tensor(&lr.target)? {
            Mapped::Rename { gguf, permute, offset: None, reorder: None, values: None, .. } => (gguf, permute),
            _ => {
                return Err(Error::format(
                    &adapter.dir,
                    lr.keys.join(", "),
                    format!("targets {}, which has no plain GGUF counterpart", lr.target),
                ))
            }
        };
        let permute_heads = match permute {
            None => None,
            Some(p) => Some(config.get(&p.heads).and_then(Json::as_u64).filter(|h| *h > 0).ok_or_else(|| {
                Error::format(cfg_name, &p.heads, format!("missing: needed to permute {}", lr.target))
            })?),
        };
        let fold = lr.scale / (alpha / lr.rank as f64);
        let embedding = name == "token_embd.weight";
        let tied = config.get("tie_word_embeddings").and_then(Json::as_bool).unwrap_or(false);
        if embedding && tied {
            // llama.cpp applies token_embd's adapter to the tied output projection too, where its layout does not
            // fit: it aborts (GGML_ASSERT(ggml_can_mul_mat)), and the trained model never had it there anyway.
            return Err(Error::format(
                &adapter.dir,
                lr.keys.join(", "),
                "an embedding LoRA on a base with tied output embeddings cannot be served by llama.cpp (it would apply \
                 it to the output layer as well, and aborts); merge the adapter instead (quantfarm merge unties them)",
            ));
        }
        pairs.push(Pair { name, lr, fold, permute_heads, embedding });
    }
    if pairs.is_empty() {
        return Err(Error::format(&adapter.dir, "adapter", "has no LoRA pairs"));
    }

    let dir_name = adapter.dir.trim_end_matches('/').rsplit('/').next().unwrap_or("adapter");
    let metadata = vec![
        ("general.architecture".to_string(), Value::String(m.architecture.as_str().into())),
        ("general.type".into(), Value::String("adapter".into())),
        ("adapter.type".into(), Value::String("lora".into())),
        ("general.name".into(), Value::String(id_to_title(dir_name).as_str().into())),
        ("adapter.lora.alpha".into(), Value::F32(alpha as f32)),
        ("general.quantization_version".into(), Value::U32(2)),
    ];
    let mut descs = Vec::new();
    for p in &pairs {
        let (r, rows, cols) = (p.lr.rank as u64, p.lr.rows as u64, p.lr.cols as u64);
        // GGUF ne (innermost first): lora_a (r, in) → [in, r]; lora_b (out, r) → [r, out]. An embedding's
        // lora_a is stored transposed, (vocab, r) → [r, vocab].
        let (a_ne, b_ne) = if p.embedding { (vec![r, rows], vec![r, cols]) } else { (vec![cols, r], vec![r, rows]) };
        descs.push(TensorDesc { name: format!("{}.lora_a", p.name), dims: a_ne, ty: GgmlType::F32 });
        descs.push(TensorDesc { name: format!("{}.lora_b", p.name), dims: b_ne, ty: GgmlType::F32 });
    }
    let mut w = GgufWriter::create(dst, 3, &metadata, &descs, overwrite).await?;
    let f32s = |v: &mut dyn Iterator<Item = f64>| -> Vec<u8> { v.flat_map(|x| (x as f32).to_le_bytes()).collect() };
    for p in &pairs {
        let lr = p.lr;
        let (r, rows, cols) = (lr.rank, lr.rows, lr.cols);
        if p.embedding {
            // Normalised: ΔE = b·a with b = A_embᵀ (vocab × r), a = B_embᵀ (r × dim). GGUF: lora_a = A_embᵀ
            // (vocab, r), lora_b = B_emb (dim, r).
            w.write(&f32s(&mut lr.b.iter().copied())).await?;
            w.write(&f32s(&mut (0..cols).flat_map(|d| (0..r).map(move |k| lr.a[k * cols + d] * p.fold)))).await?;
        } else {
            // lora_a = a (r × in); lora_b = b (out × r), rows in rope order, times the fold.
            w.write(&f32s(&mut lr.a.iter().copied())).await?;
            let hd = p.permute_heads.map(|h| rows as u64 / h);
            let src_row = |o: usize| hd.map_or(o, |hd| permuted_source_row(o as u64, hd) as usize);
            w.write(&f32s(&mut (0..rows).flat_map(|o| (0..r).map(move |k| lr.b[src_row(o) * r + k] * p.fold)))).await?;
        }
    }
    w.finish().await
}
