//! HF safetensors checkpoints → GGUF (bf16, f16 or f32), byte-identical to llama.cpp's `convert_hf_to_gguf.py
//! --outtype …` and split-aware, driven by the architecture mappings in `mappings/*.yaml`.
//!
//! The work is cut so a farm can spread it: [`plan_hf_to_gguf`] reads only headers and the small JSON files and
//! yields a [`GgufPlan`] (metadata, and per output tensor its source, type, shape and transform) whose
//! [`GgufPlan::digest`] lets a worker check it recomputed the coordinator's plan; [`split_ranges`] cuts the tensor
//! list into files by gguf-split's rules; [`write_gguf_shard`] streams one file within a memory budget through the
//! staged sink, so nothing partial is ever visible.

mod authorship;
pub mod generate;
mod hf;
mod hf_join;
mod hf_pieces;
mod hf_to_mlx;
mod hf_tokenizer;
pub mod hparams;
pub mod mapping;
mod metadata;
mod sentencepiece;
mod special_vocab;
mod split;
mod to_hf;
mod tokenizer;
pub mod transform;
pub(crate) mod write;

use std::ops::Range;

use sha2::{Digest, Sha256};

pub use authorship::{id_components, IdComponents};
pub use hf_pieces::{HfBufs, HfCut, HfPiece};
pub use hf_to_mlx::{mlx_cast_dtype, plan_hf_to_mlx, HfToMlxPlan, MlxTensor};
pub use metadata::{id_to_title, size_label};
pub use split::{output_file_name, split_ranges, SplitRule};
pub use to_hf::{
    convert_gguf_to_hf, plan_gguf_to_hf, plan_gguf_to_mlx, plan_mlx_to_hf, unpermuted_source_row, write_hf,
    write_hf_tensor, HeadOrder, HfPlan, HfTensor, PartOf,
};
pub use tokenizer::pre_tokenizer_sha256;

use crate::dtype::{Dtype, TensorType};
use crate::error::{Error, Result};
use crate::gguf::{encode_header, TensorDesc, Value};
use crate::source::{Format, TensorSource};
use crate::GgmlType;
use quantfarm_store::Committed;
use quantfarm_store::Location;

use hf::HfFiles;
use mapping::{mapping_for, FusedParts, Mapped, Mxfp4Part, NextnName};
use write::stage_shard;

/// The GGUF version written (gguf-py and gguf.cpp both write 3).
const GGUF_VERSION: u32 = 3;

/// The type of the converted weights (`--outtype`); 1-D tensors and norms are F32 whatever it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OutType {
    #[default]
    Bf16,
    F16,
    F32,
    /// gguf-py's Q8_0 for 2-D weights whose rows are whole 32-blocks; others fall back to F16 as gguf-py does.
    Q8_0,
}

impl OutType {
    pub fn parse(s: &str) -> Option<OutType> {
        Some(match s {
            "bf16" => OutType::Bf16,
            "f16" => OutType::F16,
            "f32" => OutType::F32,
            "q8_0" => OutType::Q8_0,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            OutType::Bf16 => "bf16",
            OutType::F16 => "f16",
            OutType::F32 => "f32",
            OutType::Q8_0 => "q8_0",
        }
    }

    fn ggml(self) -> GgmlType {
        match self {
            OutType::Bf16 => GgmlType::BF16,
            OutType::F16 => GgmlType::F16,
            OutType::F32 => GgmlType::F32,
            OutType::Q8_0 => GgmlType::Q8_0,
        }
    }

    /// `general.file_type` (gguf-py `LlamaFileType`: ALL_F32, MOSTLY_F16, MOSTLY_BF16, MOSTLY_Q8_0).
    fn file_type(self) -> u32 {
        match self {
            OutType::Bf16 => 32,
            OutType::F16 => 1,
            OutType::F32 => 0,
            OutType::Q8_0 => 7,
        }
    }
}

/// What becomes of a checkpoint's multi-token-prediction blocks (`mtp.*`, Qwen3.5's NextN head).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mtp {
    /// Written as trailing blocks, as `convert_hf_to_gguf.py` does by default.
    #[default]
    Keep,
    /// Left out (`--no-mtp`): a smaller file with no speculative-decoding head.
    Drop,
}

/// The choices of a conversion (`convert_hf_to_gguf.py`'s flags that change the file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ConvertOptions {
    pub out: OutType,
    pub mtp: Mtp,
}

impl From<OutType> for ConvertOptions {
    /// The converter's defaults but for the out-type.
    fn from(out: OutType) -> ConvertOptions {
        ConvertOptions { out, mtp: Mtp::Keep }
    }
}

/// Everything needed to write the GGUF files of a conversion, computed from headers alone.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufPlan {
    /// Key/values in file order, without the split keys (those depend on how the plan is cut into files).
    pub metadata: Vec<(String, Value)>,
    /// Output tensors in file order.
    pub tensors: Vec<PlannedTensor>,
}

/// One output tensor and how to make it from its source.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedTensor {
    /// GGUF name.
    pub name: String,
    /// HF (safetensors) name; for an MLX checkpoint, the logical name of a dense tensor or an affine triple.
    pub source: String,
    /// A floating dtype, or MLX affine (dequantized as `mx.dequantize` does, then converted).
    pub source_type: TensorType,
    pub ty: GgmlType,
    /// GGUF `ne`, innermost first (the HF shape reversed).
    pub ne: Vec<u64>,
    pub nbytes: u64,
    /// Rows are permuted within heads of `rows / heads` rows (q/k rope permutation), when set.
    pub permute_heads: Option<u64>,
    /// Added to every element in f32 before the output conversion (the mapping's `offset`).
    pub offset: Option<f32>,
    /// The bytes of a tensor the mapping computes (its `generate` list), written as they are; `source` then names
    /// the operator in parentheses and nothing is read.
    pub generated: Option<Vec<u8>>,
    /// Where the output's rows come from when they are not the source's rows one to one.
    pub rows: RowSource,
    /// The grouped v-head reorder of linear-attention layers (Qwen3.5): the rows, or each row's values, in this
    /// order (`_LinearAttentionVReorderBase._reorder_v_heads`).
    pub reorder: Option<HeadOrder>,
    /// An elementwise function of the f32 values, before the offset (Qwen3.5's `ssm_a = -exp(A_log)`).
    pub values: Option<mapping::ValueFn>,
}

/// How a planned tensor's rows (all axes but the last flattened) are gathered from the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum RowSource {
    /// The source's own rows, in order (permuted within heads when `permute_heads` is set).
    #[default]
    Direct,
    /// The rows of each tensor in turn, all of `source`'s shape and dtype (`torch.stack(dim=0)` of per-expert
    /// weights, as `Qwen2MoeModel.modify_tensors` stacks them).
    Stack(Vec<String>),
    /// Part `part` of `parts` equal pieces of the second-to-last axis (a fused `gate_up_proj` split at
    /// `shape[-2] // 2`): output row `r` is source row `(r / block)·block·parts + part·block + r % block`.
    Split { parts: u64, part: u64, block: u64 },
    /// The source's rows, each row's elements `part, part + parts, …` (a fused tensor's parts interleaved along
    /// its last axis, gpt-oss's `gate_up_proj_bias`).
    Columns { parts: u64, part: u64 },
    /// MXFP4 codes (`source`, `uint8 [experts, rows, n/32, 16]`) and their E8M0 exponents (`scales`,
    /// `[experts, rows, n/32]`) repacked as GGUF MXFP4 blocks; output row `r` of each expert is its row
    /// `r·parts + part` (gpt-oss's `gate_up_proj`, gate = rows `::2`). See [`mxfp4_block`].
    Mxfp4 { scales: String, parts: u64, part: u64 },
    /// The transpose of each matrix (the last two axes) of a source stored `(…, k, n·parts)`: output row `r` of
    /// each matrix is its column `r·parts + part` (gpt-oss's dequantized experts).
    Transposed { parts: u64, part: u64 },
}

/// One GGUF MXFP4 block (`block_mxfp4`: the E8M0 exponent, then 16 bytes whose low nibble is value `j` and high
/// nibble value `j + 16`) from an HF MXFP4 block's exponent and 16 bytes, whose byte `i` holds values `2i` (low
/// nibble) and `2i + 1` (high). Only bits move: `GptOssModel.transform_nibble_layout` (llama.cpp
/// `conversion/gpt_oss.py`) swaps nibbles, interleaves the halves and swaps back, which is this.
pub(crate) fn mxfp4_block(scale: u8, codes: &[u8; 16], out: &mut Vec<u8>) {
    let value = |m: usize| (codes[m / 2] >> (4 * (m % 2))) & 0x0F;
    out.push(scale);
    out.extend((0..16).map(|j| value(j) | (value(j + 16) << 4)));
}

impl PlannedTensor {
    /// `(parts, part)` when each output row is every `parts`-th element of its source row from `part`.
    pub(crate) fn columns(&self) -> Option<(usize, usize)> {
        match self.rows {
            RowSource::Columns { parts, part } => Some((parts as usize, part as usize)),
            _ => None,
        }
    }
}

impl GgufPlan {
    /// sha256 (hex) of the plan: the GGUF header it describes (metadata and tensor infos, encoded exactly as
    /// written) followed by each tensor's source, source dtype and permutation.
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        match encode_header(GGUF_VERSION, &self.metadata, &self.descs(0..self.tensors.len())) {
            Ok(layout) => h.update(&layout.header),
            // An unencodable plan still gets a digest; writing it will report the problem.
            Err(e) => h.update(format!("unencodable: {e}").as_bytes()),
        }
        for t in &self.tensors {
            h.update(format!("\n{}\t{}\t{:?}\t{:?}", t.source, t.source_type, t.permute_heads, t.offset).as_bytes());
            if let Some(bytes) = &t.generated {
                h.update(Sha256::digest(bytes));
            }
            if t.rows != RowSource::Direct {
                h.update(format!("\t{:?}", t.rows).as_bytes());
            }
            if t.reorder.is_some() || t.values.is_some() {
                h.update(format!("\t{:?}\t{:?}", t.reorder, t.values).as_bytes());
            }
        }
        quantfarm_store::hex(&h.finalize())
    }

    pub(crate) fn descs(&self, r: Range<usize>) -> Vec<TensorDesc> {
        self.tensors[r].iter().map(|t| TensorDesc { name: t.name.clone(), dims: t.ne.clone(), ty: t.ty }).collect()
    }

    /// Bytes of each tensor, for [`split_ranges`].
    pub fn nbytes(&self) -> Vec<u64> {
        self.tensors.iter().map(|t| t.nbytes).collect()
    }
}

/// Plans the conversion of the HF checkpoint folder `source` (LLaMA family: the mapping is chosen by config.json
/// `architectures`). Reads tensor headers, config.json, tokenizer.json, tokenizer_config.json and the chat template
/// files; no tensor bytes.
///
/// An MLX checkpoint folder (`mlx_lm.convert` output, quantized or not) converts the same way: each affine triple
/// (`P.weight` codes, `P.scales`, `P.biases`) is one source tensor `P.weight`, dequantized as `mx.dequantize`
/// computes it and then converted like an F32 weight. (`convert_hf_to_gguf.py` has no such path: given an MLX
/// folder it stops at the first `*.scales` tensor it cannot map.)
pub async fn plan_hf_to_gguf(source: &TensorSource, out: OutType) -> Result<GgufPlan> {
    plan_hf_to_gguf_with(source, out.into()).await
}

/// [`plan_hf_to_gguf`] with every choice of [`ConvertOptions`].
pub async fn plan_hf_to_gguf_with(source: &TensorSource, options: ConvertOptions) -> Result<GgufPlan> {
    let out = options.out;
    let loc = source.location();
    // Per part file, in file order: each tensor's name, type and shape.
    let files: Vec<Vec<(&str, TensorType, &[u64])>> = match (source.format(), source.safetensors(), source.mlx()) {
        (Format::Safetensors, Some(st), _) => st
            .files
            .iter()
            .map(|(_, h)| {
                h.tensors.iter().map(|t| (t.name.as_str(), TensorType::Dtype(t.dtype), &t.shape[..])).collect()
            })
            .collect(),
        (Format::Mlx, _, Some(m)) => {
            let mut per_file = vec![Vec::new(); m.files.files.len()];
            for t in &m.tensors {
                // An affine triple belongs to the file that holds its codes.
                let file = t.main_part().0;
                if let Some(f) = per_file.get_mut(file) {
                    f.push((t.name.as_str(), t.ty, &t.shape[..]));
                }
            }
            per_file
        }
        (Format::Gguf, ..) => return plan_gguf_reference(source, out),
        _ => return Err(Error::format(loc.to_string(), "format", "is not an HF safetensors or MLX checkpoint")),
    };
    if !loc.is_dir().await? {
        return Err(Error::format(loc.to_string(), "location", "give the checkpoint folder (config.json is read too)"));
    }
    let mut hf = HfFiles::read(loc).await?;
    let config_file = hf.file_name("config.json");
    let arch = hf
        .config_value("architectures")
        .and_then(|a| a.as_array()?.first()?.as_str())
        .ok_or_else(|| Error::format(&config_file, "architectures", "missing or not a list of names"))?
        .to_string();
    let m = mapping_for(&arch)?;
    // From here on the config is what the converter reads: AutoConfig's view, as the mapping models it.
    hf.config = hparams::normalize(&hf.config, &m.hparams);
    for u in &m.unsupported {
        if let Some(v) = hf.config_value(&u.config) {
            if !u.allow.contains(v) {
                return Err(Error::format(
                    &config_file,
                    &u.config,
                    format!("{v} is not supported by mapping {} (allowed: {:?})", m.file, u.allow),
                ));
            }
        }
    }

    // convert_hf_to_gguf order: part files by name, names sorted within each part (`ModelBase.index_tensors` in
    // `conversion/base.py`, `gguf-py/gguf/utility.py::SafetensorsLocal`).
    let mut tensors = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut multimodal = Vec::new();
    // `prepare_tensors` writes `generate_extra_tensors()` first.
    for g in &m.generate {
        if !g.when.iter().all(|(field, want)| hf.config_value(field) == Some(want)) {
            continue;
        }
        let Some(values) = g.op.values(&hf.config, &config_file)? else { continue };
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        seen.insert(g.gguf.clone());
        tensors.push(PlannedTensor {
            name: g.gguf.clone(),
            source: format!("({})", g.op.name()),
            source_type: TensorType::Dtype(Dtype::F32),
            ty: GgmlType::F32,
            ne: vec![values.len() as u64],
            nbytes: bytes.len() as u64,
            permute_heads: None,
            offset: None,
            generated: Some(bytes),
            rows: RowSource::Direct,
            reorder: None,
            values: None,
        });
    }
    // _QwenMtpMixin: multi-token-prediction tensors renamed into blocks after the model's `first` layers.
    let first_nextn = match &m.nextn {
        None => None,
        Some(n) => {
            Some(n.after.iter().find_map(|f| hf.config_value(f).and_then(serde_json::Value::as_u64)).ok_or_else(
                || Error::format(&config_file, n.after.join(" | "), "missing: the layer count is needed"),
            )?)
        }
    };
    let (mut nextn_found, mut nextn_dropped) = (0u64, 0usize);
    // An MLX checkpoint holds the weights as mlx-lm's sanitize left them (Qwen3.5: norms + 1, conv1d's axes
    // moved), and no multi-token-prediction head: both are undone or taken as they are below.
    let sanitized = match source.format() {
        Format::Mlx => m.mlx.as_ref().filter(|x| !x.sanitize.is_empty()),
        _ => None,
    };
    let mtp = if matches!(source.format(), Format::Mlx) { Mtp::Drop } else { options.mtp };
    // Per-expert weights waiting for the rest of their block: (rule, block) → (expert, weight) → tensor.
    type Parts<'n> = std::collections::BTreeMap<(u64, String), (&'n str, TensorType, &'n [u64])>;
    let mut pending: Vec<(usize, String, Parts)> = Vec::new();
    // MXFP4 blocks waiting for their scales (by stem), and the pairs repacked, written after the generated tensors.
    let mut mxfp4_blocks: std::collections::BTreeMap<String, (&str, &[u64])> = Default::default();
    let mut repacked: Vec<PlannedTensor> = Vec::new();
    let n_generated = tensors.len();
    for mut names in files {
        names.sort_by(|a, b| a.0.cmp(b.0));
        for (name, source_type, shape) in names {
            let bad = |msg: String| Error::format(loc.to_string(), format!("tensor {name:?}"), msg);
            // uint8 only as one of an MXFP4 pair (checked where it is mapped).
            if !matches!(
                source_type,
                TensorType::Dtype(Dtype::BF16 | Dtype::F16 | Dtype::F32 | Dtype::U8)
                    | TensorType::MlxAffine { .. }
                    | TensorType::MlxFp { .. }
            ) {
                return Err(bad(format!(
                    "type {source_type} cannot be converted (BF16, F16, F32 or MLX quantized only)"
                )));
            }
            let ne: Vec<u64> = shape.iter().rev().copied().collect();
            let renamed = match (&m.nextn, first_nextn) {
                (Some(n), Some(first)) => match n.rename(name, first) {
                    NextnName::Model => None,
                    NextnName::Nextn { .. } if mtp == Mtp::Drop => {
                        nextn_dropped += 1;
                        continue;
                    }
                    NextnName::Nextn { name, layer } => {
                        nextn_found = nextn_found.max(layer.map_or(0, |k| k + 1));
                        Some(name)
                    }
                },
                _ => None,
            };
            let mapped = m.map_tensor(renamed.as_deref().unwrap_or(name))?;
            if source_type == TensorType::Dtype(Dtype::U8) && !matches!(mapped, Mapped::Mxfp4 { .. } | Mapped::Drop) {
                return Err(bad(format!(
                    "type {source_type} cannot be converted (BF16, F16, F32 or MLX affine; uint8 only as MXFP4 \
                     blocks and scales)"
                )));
            }
            let (gguf, permute, offset, reorder, values, hf_shape) = match mapped {
                Mapped::Drop => continue,
                Mapped::Multimodal => {
                    multimodal.push(name.to_string());
                    continue;
                }
                Mapped::Rename { gguf, permute, offset, reorder, values, hf_shape } => {
                    (gguf, permute, offset, reorder, values, hf_shape)
                }
                Mapped::Fused { gguf, parts: FusedParts::InterleavedColumns } => {
                    let parts = gguf.len() as u64;
                    let cols = ne.first().copied().unwrap_or(0);
                    if parts == 0 || cols % parts != 0 {
                        return Err(bad(format!("shape {shape:?}: its last axis is not {parts} interleaved parts")));
                    }
                    for (part, g) in gguf.into_iter().enumerate() {
                        let mut pne = ne.clone();
                        pne[0] = cols / parts;
                        let rows = RowSource::Columns { parts, part: part as u64 };
                        let t = planned(&m, out, g, name, source_type, pne, None, None, rows, &bad)?;
                        push_unique(&mut tensors, &mut seen, t, &bad)?;
                    }
                    continue;
                }
                Mapped::Fused { gguf, parts: FusedParts::TransposedRows } => {
                    let parts = gguf.len() as u64;
                    let (cols, inner) = (ne.first().copied().unwrap_or(0), ne.get(1).copied().unwrap_or(0));
                    if ne.len() < 2 || parts == 0 || cols % parts != 0 {
                        return Err(bad(format!(
                            "shape {shape:?}: its last axis is not {parts} interleaved parts to transpose"
                        )));
                    }
                    for (part, g) in gguf.into_iter().enumerate() {
                        let mut pne = ne.clone();
                        (pne[0], pne[1]) = (inner, cols / parts);
                        let rows = RowSource::Transposed { parts, part: part as u64 };
                        let t = planned(&m, out, g, name, source_type, pne, None, None, rows, &bad)?;
                        push_unique(&mut tensors, &mut seen, t, &bad)?;
                    }
                    continue;
                }
                Mapped::Mxfp4 { gguf: _, stem, part: Mxfp4Part::Blocks } => {
                    mxfp4_blocks.insert(stem, (name, shape));
                    continue;
                }
                Mapped::Mxfp4 { gguf, stem, part: Mxfp4Part::Scales } => {
                    // GptOssModel.generate_extra_tensors repacks a pair when it reads the scales, after the blocks
                    // (names sorted: `_blocks` < `_scales`).
                    let (blocks, bshape) = mxfp4_blocks.remove(&stem).ok_or_else(|| {
                        bad(format!("has no {stem}_blocks before it (MXFP4 blocks and scales come in pairs)"))
                    })?;
                    let parts = gguf.len() as u64;
                    let [e, r, nb] = *shape else {
                        return Err(bad(format!("shape {shape:?} is not [experts, rows, blocks]")));
                    };
                    if bshape != [e, r, nb, 16] || parts == 0 || r % parts != 0 {
                        return Err(bad(format!(
                            "shape {shape:?} does not go with {blocks} {bshape:?} as [E, R, B] and [E, R, B, 16] with \
                             R a multiple of {parts}"
                        )));
                    }
                    for (part, g) in gguf.into_iter().enumerate() {
                        let ne = vec![nb * 32, r / parts, e];
                        let nbytes = crate::gguf::tensor_nbytes(GgmlType::MXFP4, &ne)
                            .ok_or_else(|| bad(format!("ne {ne:?} overflows")))?;
                        let t = PlannedTensor {
                            name: g,
                            source: blocks.to_string(),
                            source_type: TensorType::Dtype(Dtype::U8),
                            ty: GgmlType::MXFP4,
                            ne,
                            nbytes,
                            permute_heads: None,
                            offset: None,
                            generated: None,
                            rows: RowSource::Mxfp4 { scales: name.to_string(), parts, part: part as u64 },
                            reorder: None,
                            values: None,
                        };
                        push_unique(&mut repacked, &mut seen, t, &bad)?;
                    }
                    continue;
                }
                Mapped::Fused { gguf, parts: FusedParts::Halves } => {
                    let parts = gguf.len() as u64;
                    let axis = ne.get(1).copied().unwrap_or(0);
                    if ne.len() < 2 || parts == 0 || axis % parts != 0 {
                        return Err(bad(format!(
                            "shape {shape:?}: its second-to-last axis is not {parts} equal parts"
                        )));
                    }
                    for (part, g) in gguf.into_iter().enumerate() {
                        let mut pne = ne.clone();
                        pne[1] = axis / parts;
                        let rows = RowSource::Split { parts, part: part as u64, block: axis / parts };
                        let t = planned(&m, out, g, name, source_type, pne, None, None, rows, &bad)?;
                        push_unique(&mut tensors, &mut seen, t, &bad)?;
                    }
                    continue;
                }
                Mapped::Expert { rule: key, block, expert, weight } => {
                    let rule = &m.experts[key];
                    let i = match pending.iter().position(|(r, b, _)| *r == key && *b == block) {
                        Some(i) => i,
                        None => {
                            pending.push((key, block.clone(), Parts::new()));
                            pending.len() - 1
                        }
                    };
                    if !rule.gguf.contains_key(&weight) {
                        return Err(bad(format!("expert weight {weight:?} is not one of {:?}", rule.gguf.keys())));
                    }
                    pending[i].2.insert((expert, weight), (name, source_type, shape));
                    let count = rule
                        .count
                        .iter()
                        .find_map(|f| hf.config_value(f).and_then(serde_json::Value::as_u64))
                        .ok_or_else(|| {
                            Error::format(&config_file, rule.count.join(" | "), "missing: the expert count is needed")
                        })?;
                    // Qwen2MoeModel.modify_tensors: written once the block holds count × weights tensors.
                    if (pending[i].2.len() as u64) < count * rule.gguf.len() as u64 {
                        continue;
                    }
                    let (_, block, parts) = pending.remove(i);
                    for (w, template) in &rule.gguf {
                        let names: Vec<(&str, TensorType, &[u64])> = (0..count)
                            .map(|e| {
                                parts.get(&(e, w.clone())).copied().ok_or_else(|| {
                                    bad(format!("block {block} has no expert {e} {w} (experts must be 0..{count})"))
                                })
                            })
                            .collect::<Result<_>>()?;
                        let (first, ty0, shape0) = names[0];
                        if let Some((other, ..)) = names.iter().find(|(_, t, s)| *t != ty0 || *s != shape0) {
                            return Err(bad(format!(
                                "{other} is not {ty0} {shape0:?} like {first}, so they cannot stack"
                            )));
                        }
                        let mut sne: Vec<u64> = shape0.iter().rev().copied().collect();
                        sne.push(count);
                        let rows = RowSource::Stack(names.iter().map(|n| n.0.to_string()).collect());
                        let g = template.replace("{b}", &block);
                        let t = planned(&m, out, g, first, ty0, sne, None, None, rows, &bad)?;
                        push_unique(&mut tensors, &mut seen, t, &bad)?;
                    }
                    continue;
                }
            };
            // mlx-lm's sanitize undone: its offset is in the stored values already (the GGUF's offset less it is
            // applied), a moved size-1 axis goes back to the HF layout (the same bytes).
            let (offset, shape) = match sanitized.zip(m.text_name(name)) {
                None => (offset, shape.to_vec()),
                Some((x, text)) => {
                    let rule = x.sanitize.iter().find(|r| r.name.is_match(&text));
                    let offset = match (rule.and_then(|r| r.add).filter(|_| shape.len() == 1), offset) {
                        (None, o) => o,
                        (Some(a), o) => Some(o.unwrap_or(0.0) - a).filter(|d| *d != 0.0),
                    };
                    let mut hf_layout = shape.to_vec();
                    if let Some([from, to]) = rule.and_then(|r| r.moveaxis) {
                        // The MLX layout is the moved one (mlx-lm saves what it sanitized).
                        if to < hf_layout.len() && from < hf_layout.len() {
                            let axis = hf_layout.remove(to);
                            hf_layout.insert(from, axis);
                        }
                    }
                    (offset, hf_layout)
                }
            };
            let shape = shape.as_slice();
            // The converter's squeeze of a size-1 axis (Qwen3.5's conv1d (C, 1, K) written {K, C}).
            let gguf_shape = match hf_shape {
                None => shape.to_vec(),
                Some(r) => {
                    r.to_gguf(shape).ok_or_else(|| bad(format!("shape {shape:?} has no size-1 axis as {r:?} says")))?
                }
            };
            let ne: Vec<u64> = gguf_shape.iter().rev().copied().collect();
            let reorder = match reorder {
                None => None,
                Some(r) => {
                    to_hf::head_order(r, &hf.config, &m, &config_file, name, &gguf_shape, to_hf::Direction::ToGguf)?
                }
            };
            let rows = shape.first().copied().unwrap_or(1);
            let permute_heads = match permute {
                None => None,
                Some(p) => {
                    let heads =
                        hf.config_value(&p.heads).and_then(serde_json::Value::as_u64).filter(|h| *h > 0).ok_or_else(
                            || Error::format(&config_file, &p.heads, format!("missing: needed to permute {name}")),
                        )?;
                    if shape.len() != 2 || rows % heads != 0 || (rows / heads) % 2 != 0 {
                        return Err(bad(format!("shape {shape:?} cannot be permuted in {heads} heads of even size")));
                    }
                    Some(heads)
                }
            };
            if permute_heads.is_some() && reorder.is_some() {
                return Err(bad("is both permuted and reordered, which no converter does".into()));
            }
            let mut t = planned(&m, out, gguf, name, source_type, ne, permute_heads, offset, RowSource::Direct, &bad)?;
            (t.reorder, t.values) = (reorder, values);
            push_unique(&mut tensors, &mut seen, t, &bad)?;
        }
    }
    if let Some((_, block, parts)) = pending.first() {
        let names: Vec<&str> = parts.values().map(|p| p.0).collect();
        return Err(Error::format(
            loc.to_string(),
            format!("block {block}'s experts"),
            format!("{} expert tensors do not make whole experts (unprocessed: {names:?})", names.len()),
        ));
    }
    if let Some((stem, (blocks, _))) = mxfp4_blocks.first_key_value() {
        return Err(Error::format(loc.to_string(), format!("tensor {blocks:?}"), format!("has no {stem}_scales")));
    }
    tensors.splice(n_generated..n_generated, repacked).for_each(drop);
    if !multimodal.is_empty() {
        tracing::warn!(
            checkpoint = %loc,
            tensors = multimodal.len(),
            first = %multimodal[0],
            "the checkpoint's vision/audio tower is NOT converted: only its text model is written (as \
             convert_hf_to_gguf.py does without --mmproj); a multimodal projector GGUF is out of scope"
        );
    }
    let nextn = match (&m.nextn, first_nextn) {
        (Some(n), Some(first)) => Some(nextn_blocks(n, &hf, &config_file, first, mtp, nextn_found, nextn_dropped)?),
        _ => None,
    };
    let total_params = tensors.iter().map(|t| t.ne.iter().product::<u64>()).sum();
    // `ModelBase.prepare_metadata`: a float out-type of an MXFP4 checkpoint (`quantization_config.quant_method:
    // mxfp4`) is MOSTLY_MXFP4_MOE.
    let mxfp4 = hf.config_value("quantization_config.quant_method").and_then(|v| v.as_str()) == Some("mxfp4");
    let file_type = match out {
        OutType::Bf16 | OutType::F16 | OutType::F32 if mxfp4 => quantfarm_ggml::FileType::MXFP4_MOE as u32,
        _ => out.file_type(),
    };
    let metadata = metadata::build(
        &m,
        &hf,
        &metadata::PlanFacts { total_params, file_type, experts: expert_params(&tensors), nextn },
    )?;
    Ok(GgufPlan { metadata, tensors })
}

/// `(layers, nextn blocks)` as `_QwenMtpMixin.__init__` counts them: the config's count (`mtp_num_hidden_layers`),
/// else the blocks the checkpoint holds; none when they are dropped (`--no-mtp`).
fn nextn_blocks(
    n: &mapping::Nextn,
    hf: &HfFiles,
    config_file: &str,
    first: u64,
    mtp: Mtp,
    found: u64,
    dropped: usize,
) -> Result<(u64, u64)> {
    if mtp == Mtp::Drop {
        if dropped > 0 {
            tracing::info!(tensors = dropped, "the multi-token-prediction blocks are left out (--no-mtp)");
        }
        return Ok((first, 0));
    }
    let configured = n.count.iter().find_map(|f| hf.config_value(f).and_then(serde_json::Value::as_u64)).unwrap_or(0);
    let blocks = match configured {
        0 if found == 0 => {
            return Err(Error::format(
                config_file,
                n.count.join(" | "),
                "is 0 or absent and the checkpoint has no mtp.layers.N tensors, so convert_hf_to_gguf.py stops \
                 (its assertion); convert without the multi-token-prediction head (--no-mtp)",
            ))
        }
        0 => found,
        c => c,
    };
    if found < blocks {
        tracing::warn!(
            config = %config_file,
            declared = blocks,
            found,
            "the config declares more multi-token-prediction blocks than the checkpoint holds (a fine-tune saved \
             without them?): the GGUF counts them in block_count and nextn_predict_layers with no tensors, as \
             convert_hf_to_gguf.py writes it; llama.cpp loads it without its MTP head (--no-mtp leaves them out)"
        );
    }
    Ok((first, blocks))
}

/// The reference GGUF of a release whose source is a GGUF (one file or a split set): every key and tensor as the
/// source has them, in its order, with the out-type's `general.file_type`; tensors stored F32 (and all 1-D ones)
/// stay F32, the others are written in the out-type, a block-quantized one decoded exactly first (as
/// `quantfarm convert --to hf` decodes it). The split keys and a quantized source's `quantize.*` keys are not
/// carried over. A quantized source makes a lossy reference, and a source in another float type is rounded: both
/// are said loudly.
fn plan_gguf_reference(source: &TensorSource, out: OutType) -> Result<GgufPlan> {
    let loc = source.location();
    let gguf = source.gguf().ok_or_else(|| Error::format(loc.to_string(), "format", "is not a GGUF"))?;
    let mut metadata: Vec<(String, Value)> = Vec::new();
    let mut has_file_type = false;
    for (k, v) in &gguf.header().metadata {
        if k.starts_with("split.") || k.starts_with("quantize.") {
            continue;
        }
        if k == "general.file_type" {
            has_file_type = true;
            metadata.push((k.clone(), Value::U32(out.file_type())));
        } else {
            metadata.push((k.clone(), v.clone()));
        }
    }
    if !has_file_type {
        metadata.push(("general.file_type".into(), Value::U32(out.file_type())));
    }
    let mut tensors = Vec::new();
    let (mut quantized, mut rounded) = (Vec::new(), Vec::new());
    for e in source.tensors() {
        let TensorType::Ggml(g) = e.ty else {
            return Err(Error::format(loc.to_string(), format!("tensor {:?}", e.name), "is not a GGUF tensor"));
        };
        let ne: Vec<u64> = e.shape.iter().rev().copied().collect();
        let ty = if g == GgmlType::F32 || ne.len() <= 1 {
            GgmlType::F32
        } else if out == OutType::Q8_0 && ne.first().is_some_and(|c| c % 32 != 0) {
            GgmlType::F16
        } else {
            out.ggml()
        };
        match Dtype::from_ggml(g) {
            None if matches!(g, GgmlType::I8 | GgmlType::I16 | GgmlType::I32 | GgmlType::I64 | GgmlType::F64) => {
                return Err(Error::format(
                    loc.to_string(),
                    format!("tensor {:?}", e.name),
                    format!("type {g} cannot be a reference tensor (float or block-quantized types only)"),
                ))
            }
            None => quantized.push(e.name.clone()),
            Some(d) if d.as_ggml() != Some(ty) && ty != GgmlType::F32 => rounded.push(e.name.clone()),
            Some(_) => {}
        }
        let bad = |msg: String| Error::format(loc.to_string(), format!("tensor {:?}", e.name), msg);
        let nbytes = crate::gguf::tensor_nbytes(ty, &ne).ok_or_else(|| bad(format!("ne {ne:?} overflows")))?;
        tensors.push(PlannedTensor {
            name: e.name.clone(),
            source: e.name.clone(),
            source_type: e.ty,
            ty,
            ne,
            nbytes,
            permute_heads: None,
            offset: None,
            generated: None,
            rows: RowSource::Direct,
            reorder: None,
            values: None,
        });
    }
    if !quantized.is_empty() {
        tracing::warn!(
            source = %loc,
            tensors = quantized.len(),
            first = %quantized[0],
            "the source GGUF is QUANTIZED: the reference every level is measured against is its exact decoding, \
             already lossy against the model that was trained; give the bf16/f16 GGUF or the HF checkpoint for a \
             lossless reference"
        );
    }
    if !rounded.is_empty() {
        tracing::warn!(
            source = %loc,
            tensors = rounded.len(),
            first = %rounded[0],
            "the source GGUF's float tensors are rounded to the reference's {} (as convert_hf_to_gguf.py --outtype \
             rounds an f32 or f16 checkpoint)",
            out.name()
        );
    }
    Ok(GgufPlan { metadata, tensors })
}

/// One output tensor: its GGUF type by the mapping's F32 rule and the out-type (`ModelBase.prepare_tensors`).
#[allow(clippy::too_many_arguments)]
fn planned(
    m: &mapping::Mapping,
    out: OutType,
    name: String,
    source: &str,
    source_type: TensorType,
    ne: Vec<u64>,
    permute_heads: Option<u64>,
    offset: Option<f32>,
    rows: RowSource,
    bad: &dyn Fn(String) -> Error,
) -> Result<PlannedTensor> {
    let ty = if m.f32.forces_f32(&name, ne.len()) {
        GgmlType::F32
    } else if out == OutType::Q8_0 && ne.first().is_some_and(|c| c % 32 != 0) {
        // gguf-py's QuantError fallback: rows that are not whole blocks are written F16.
        GgmlType::F16
    } else {
        out.ggml()
    };
    let nbytes = crate::gguf::tensor_nbytes(ty, &ne).ok_or_else(|| bad(format!("ne {ne:?} overflows")))?;
    Ok(PlannedTensor {
        name,
        source: source.to_string(),
        source_type,
        ty,
        ne,
        nbytes,
        permute_heads,
        offset,
        generated: None,
        rows,
        reorder: None,
        values: None,
    })
}

/// Appends `t` unless another tensor already has its GGUF name.
fn push_unique(
    tensors: &mut Vec<PlannedTensor>,
    seen: &mut std::collections::HashSet<String>,
    t: PlannedTensor,
    bad: &dyn Fn(String) -> Error,
) -> Result<()> {
    if !seen.insert(t.name.clone()) {
        return Err(bad(format!("maps to {:?}, as another tensor does", t.name)));
    }
    tensors.push(t);
    Ok(())
}

/// gguf-py `GGUFWriter.get_total_parameter_count`'s expert figures: (average expert count, shared parameters plus
/// one expert's share of each `_exps.` tensor), when there are expert tensors.
fn expert_params(tensors: &[PlannedTensor]) -> Option<(u64, u64)> {
    let (mut shared, mut expert, mut sum, mut n) = (0u64, 0u64, 0u64, 0u64);
    for t in tensors {
        let size: u64 = t.ne.iter().product();
        if t.name.contains("_exps.") && t.ne.len() >= 3 {
            // numpy's shape[-3] (shape[-2] for a bias) is ne[2] (ne[1]).
            let count = if t.name.contains(".bias") { t.ne[1] } else { t.ne[2] }.max(1);
            expert += size / count;
            sum += count;
            n += 1;
        } else {
            shared += size;
        }
    }
    (n > 0).then(|| (sum / n, shared + expert))
}

/// Writes file `shard` of the plan cut by `ranges` (see [`split_ranges`]) at `dst` (the file itself, see
/// [`output_file_name`]), reading at most about `budget` bytes of tensor data at a time; the file appears only
/// complete.
pub async fn write_gguf_shard(
    plan: &GgufPlan,
    source: &TensorSource,
    ranges: &[Range<usize>],
    shard: usize,
    dst: &Location,
    budget: u64,
    overwrite: bool,
) -> Result<Committed> {
    stage_shard(plan, source, ranges, shard, dst, budget, overwrite).await?.finish().await
}

/// Converts the checkpoint folder `src` into `dst_dir/PREFIX.gguf`, or split files `PREFIX-0000N-of-0000M.gguf`
/// by `rule`. All files are staged first and committed together at the end.
#[allow(clippy::too_many_arguments)]
pub async fn convert_hf_to_gguf(
    src: &Location,
    dst_dir: &Location,
    prefix: &str,
    options: impl Into<ConvertOptions>,
    rule: Option<SplitRule>,
    budget: u64,
    overwrite: bool,
) -> Result<Vec<Committed>> {
    let source = TensorSource::open(src).await?;
    let plan = plan_hf_to_gguf_with(&source, options.into()).await?;
    let ranges = split_ranges(&plan.nbytes(), rule);
    let mut staged = Vec::with_capacity(ranges.len());
    for i in 0..ranges.len() {
        let dst = dst_dir.child(&output_file_name(prefix, i, ranges.len()))?;
        staged.push(stage_shard(&plan, &source, &ranges, i, &dst, budget, overwrite).await?);
    }
    let mut out = Vec::with_capacity(staged.len());
    for w in staged {
        out.push(w.finish().await?);
    }
    Ok(out)
}
