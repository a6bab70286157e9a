//! Which type llama-quantize gives each tensor of a file type: the tensor order, the tensors never quantized, the
//! per-tensor mixture rules (with their layer counters) and the fallback for rows that are not whole blocks.
//! Same decisions as `src/llama-quant.cpp` (`tensor_allows_quantization`, `llama_tensor_get_type`,
//! `llama_tensor_get_type_impl`, `tensor_type_fallback`) and `src/llama-model-loader.h` (`weight_name_comparer`)
//! at llama.cpp 0c1e570, for every file type, dense models and models with experts.

use std::cmp::Ordering;

use quantfarm_tensors::GgmlType;

use crate::FileType;

/// Substrings that keep a tensor in its input type (`tensor_allows_quantization`).
const NEVER_QUANTIZED: &[&str] = &[
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
];

/// `llama_model_loader`'s tensor order: layer number from `blk.N.` (non-layer tensors, as -1, first), then bytes.
pub fn tensor_order(a: &str, b: &str) -> Ordering {
    fn layer(name: &str) -> i64 {
        name.strip_prefix("blk.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|n| n.parse::<i64>().ok())
            .unwrap_or(-1)
    }
    layer(a).cmp(&layer(b)).then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

/// `ggml_n_dims`: dimensions up to the last one larger than 1 (at least 1).
pub fn n_dims(ne: &[u64]) -> usize {
    ne.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1)
}

/// Whether llama-quantize may change this tensor's type at all.
pub fn allows_quantization(name: &str, ne: &[u64]) -> bool {
    n_dims(ne) >= 2
        && name.ends_with("weight")
        && !NEVER_QUANTIZED.iter().any(|s| name.contains(s))
        && !name.ends_with("pos_embd.weight")
        && !name.ends_with("token_types.weight")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    AttnV,
    AttnK,
    AttnQ,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

/// `tensor_get_category`: exact names first, then substrings, in this order.
fn category(name: &str) -> Category {
    match name {
        "output.weight" => return Category::Output,
        "token_embd.weight" | "per_layer_token_embd.weight" => return Category::TokenEmbd,
        _ => {}
    }
    let table = [
        ("attn_qkv.weight", Category::AttnV),
        ("attn_kv_b.weight", Category::AttnV),
        ("attn_v.weight", Category::AttnV),
        ("attn_k.weight", Category::AttnK),
        ("attn_q.weight", Category::AttnQ),
        ("attn_output.weight", Category::AttnOutput),
        ("ffn_up", Category::FfnUp),
        ("ffn_gate", Category::FfnGate),
        ("ffn_down", Category::FfnDown),
    ];
    table.iter().find(|(s, _)| name.contains(s)).map_or(Category::Other, |(_, c)| *c)
}

/// Whether a tensor counts towards `n_attention_wv`.
pub fn is_attn_v(name: &str) -> bool {
    category(name) == Category::AttnV
}

/// `use_more_bits`: the first and last eighth of the layers and every third one between.
fn use_more_bits(i: i64, n: i64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// `tensor_type_fallback`: a type whose block does not divide the row length falls back, then to F16. `None` where
/// llama-quantize defines no fallback (a type with blocks of more than 32 outside its table: Q1_0, NVFP4), which it
/// reports as an error ("no tensor type fallback is defined for type …").
pub fn fallback(ty: GgmlType, ne0: u64) -> Option<GgmlType> {
    if ne0.is_multiple_of(ty.block_size() as u64) {
        return Some(ty);
    }
    let next = match ty {
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q2_0 | GgmlType::TQ1_0 | GgmlType::TQ2_0 => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        GgmlType::IQ1_S
        | GgmlType::IQ1_M
        | GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ3_XXS
        | GgmlType::IQ3_S
        | GgmlType::IQ4_XS => GgmlType::IQ4_NL,
        // Already a block of 32 or less: nothing smaller to demote to, so F16 below.
        other if other.block_size() <= 32 => other,
        _ => return None,
    };
    Some(if ne0.is_multiple_of(next.block_size() as u64) { next } else { GgmlType::F16 })
}

/// Why no type could be chosen for a tensor.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MixtureError {
    /// llama-quantize: "no tensor type fallback is defined for type …".
    #[error(
        "tensor {tensor:?}: {ftype} gives it type {ty}, whose blocks of {block} do not divide its rows of {ne0} \
         values, and llama-quantize defines no fallback for {ty}"
    )]
    NoFallback { tensor: String, ftype: FileType, ty: GgmlType, block: usize, ne0: u64 },
    /// llama-quantize: "Failed to determine layer for tensor …" / "Bad layer …" (models with experts).
    #[error("tensor {tensor:?}: cannot tell its layer for the type rules of a model with experts: {why}")]
    Layer { tensor: String, why: String },
}

/// `tensor_requires_imatrix`: whether llama-quantize refuses to make `ty` for this tensor without an importance
/// matrix (the IQ1/IQ2 types and IQ3_XXS, and Q2_K under Q2_K_S; never the token embeddings or the output).
pub fn requires_imatrix(name: &str, ty: GgmlType, ftype: FileType) -> bool {
    let exempt = matches!(name, "token_embd.weight" | "per_layer_token_embd.weight" | "output.weight");
    let needs = match ty {
        GgmlType::IQ3_XXS
        | GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ1_M
        | GgmlType::IQ1_S => true,
        GgmlType::Q2_K => ftype == FileType::Q2_K_S,
        _ => false,
    };
    needs && !exempt
}

/// Model facts the rules read (`llama_hparams`, `init_quantize_state_counters`).
#[derive(Clone, Debug)]
pub struct ModelFacts {
    /// `{arch}.block_count`.
    pub n_layer: i64,
    /// `n_head / n_head_kv` of layer 0.
    pub gqa: i64,
    /// No tensor named exactly `output.weight`: token_embd doubles as the output.
    pub tied_embeddings: bool,
    /// Tensors in the attn_v category.
    pub n_attention_wv: i64,
    /// `{arch}.expert_count` (0 without one).
    pub n_expert: i64,
}

/// One tensor's decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub name: String,
    pub ty: GgmlType,
    /// Whether the fallback (`tensor_type_fallback`) replaced the rule's type.
    pub fell_back: bool,
    /// The `--tensor-type` pattern that decided it (its index in [`Params::tensor_types`]), if one did.
    pub pattern: Option<usize>,
}

/// One `--tensor-type PATTERN=TYPE` (llama-quantize's `tensor_type_option`): tensors whose name contains a match of
/// PATTERN (a regex, searched anywhere in the name; lower-cased as llama-quantize lower-cases it) get TYPE instead of
/// the mixture rules' choice, then the fallback. The first matching pattern wins.
///
/// llama-quantize compiles the pattern as a C++ `std::regex` (ECMAScript); here it is the `regex` crate's syntax,
/// which is the same for what tensor patterns use (literals, `.`, classes, `\d`, `|`, groups, repetition, anchors);
/// the ECMAScript-only lookarounds and backreferences are refused as invalid.
#[derive(Clone, Debug)]
pub struct TensorType {
    /// The pattern as given, lower-cased.
    pub pattern: String,
    regex: regex::Regex,
    pub ty: GgmlType,
}

impl PartialEq for TensorType {
    fn eq(&self, other: &Self) -> bool {
        (&self.pattern, self.ty) == (&other.pattern, other.ty)
    }
}

impl Eq for TensorType {}

/// Why a `--tensor-type` entry was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TensorTypeError {
    #[error("tensor type `{spec}`: expected PATTERN=TYPE, e.g. attn_v=q8_0 or \"blk\\.[0-3]\\.ffn_down=q6_K\"")]
    Syntax { spec: String },
    #[error("tensor type `{spec}`: unknown ggml type {ty:?} (one of {known})")]
    UnknownType { spec: String, ty: String, known: String },
    #[error("tensor type `{spec}`: {ty} is not a type llama-quantize can write (it quantizes to none of Q8_1, Q8_K or the integer types)")]
    NotWritable { spec: String, ty: GgmlType },
    #[error("tensor type `{spec}`: the pattern is not a valid regex: {msg}")]
    Regex { spec: String, msg: String },
}

impl TensorType {
    /// Parses `PATTERN=TYPE` as llama-quantize's `parse_tensor_type` does: the pattern is what comes before the first
    /// `=` (non-empty, lower-cased), the type a ggml type name in any case.
    pub fn parse(spec: &str) -> Result<TensorType, TensorTypeError> {
        let (pattern, ty) = spec.split_once('=').ok_or_else(|| TensorTypeError::Syntax { spec: spec.into() })?;
        if pattern.is_empty() || ty.is_empty() {
            return Err(TensorTypeError::Syntax { spec: spec.into() });
        }
        let pattern = pattern.to_ascii_lowercase();
        let ty = GgmlType::from_name(ty).ok_or_else(|| TensorTypeError::UnknownType {
            spec: spec.into(),
            ty: ty.into(),
            known: GgmlType::ALL.iter().map(|t| t.name()).collect::<Vec<_>>().join(", "),
        })?;
        if !ty.llama_quantize_writes() {
            return Err(TensorTypeError::NotWritable { spec: spec.into(), ty });
        }
        let regex = regex::Regex::new(&pattern)
            .map_err(|e| TensorTypeError::Regex { spec: spec.into(), msg: e.to_string() })?;
        Ok(TensorType { pattern, regex, ty })
    }

    /// The entries of a `--tensor-type-file`: whitespace-separated `PATTERN=TYPE` tokens (no comments), in order.
    pub fn parse_file(text: &str) -> Result<Vec<TensorType>, TensorTypeError> {
        text.split_whitespace().map(TensorType::parse).collect()
    }

    /// Whether the pattern matches anywhere in `name`.
    pub fn matches(&self, name: &str) -> bool {
        self.regex.is_match(name)
    }
}

/// llama-quantize's flags that change the types chosen (`llama_model_quantize_params` in `include/llama.h`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Params {
    /// `qs.has_imatrix`: an imatrix with at least one entry was given; some rules depend on it.
    pub has_imatrix: bool,
    /// `--pure`: no mixture rules (`llama_tensor_get_type_impl` is skipped, so its layer counters do not advance);
    /// every quantizable tensor gets the default type, then the fallback. Output and token embeddings included.
    pub pure: bool,
    /// `--output-tensor-type T`: `output.weight` gets T as is (no fallback); a tied `token_embd.weight` gets T
    /// through the mixture rules, so with the fallback (and not under `--pure`).
    pub output_tensor_type: Option<GgmlType>,
    /// `--token-embedding-type T`: token embeddings get T as is (no fallback), tied or not.
    pub token_embedding_type: Option<GgmlType>,
    /// `--leave-output-tensor` (`quantize_output_tensor = false`): `output.weight` keeps its input type.
    pub leave_output_tensor: bool,
    /// `--tensor-type` and `--tensor-type-file` entries, in command-line order.
    pub tensor_types: Vec<TensorType>,
    /// `--keep-split`: the tensors are visited in the order given (input-file order), not the loader's name order,
    /// so the layer counters of the rules advance in that order.
    pub file_order: bool,
}

/// Decides the type of every tensor, in llama-quantize's tensor order. `tensors` are (name, ne, current type).
/// `has_imatrix` is llama-quantize's `qs.has_imatrix` (an imatrix with at least one entry was given): some rules
/// depend on it. No flags; see [`choose_types_with`].
pub fn choose_types(
    ftype: FileType,
    facts: &ModelFacts,
    tensors: &[(String, Vec<u64>, GgmlType)],
    has_imatrix: bool,
) -> Result<Vec<Choice>, MixtureError> {
    choose_types_with(ftype, facts, tensors, &Params { has_imatrix, ..Params::default() })
}

/// [`choose_types`] with llama-quantize's type flags: `llama_tensor_get_type` for every tensor in order.
pub fn choose_types_with(
    ftype: FileType,
    facts: &ModelFacts,
    tensors: &[(String, Vec<u64>, GgmlType)],
    params: &Params,
) -> Result<Vec<Choice>, MixtureError> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    if !params.file_order {
        order.sort_by(|&a, &b| tensor_order(&tensors[a].0, &tensors[b].0));
    }
    let mut counters = Counters::default();
    let mut out = Vec::with_capacity(tensors.len());
    for idx in order {
        let (name, ne, current) = &tensors[idx];
        let keep = |ty| Choice { name: name.clone(), ty, fell_back: false, pattern: None };
        let pattern = params.tensor_types.iter().position(|t| t.matches(name));
        // `tensor_allows_quantization`, with `quantize_output_tensor`.
        if !allows_quantization(name, ne) || (params.leave_output_tensor && name == "output.weight") {
            out.push(keep(*current));
            continue;
        }
        let cat = category(name);
        // The two overrides come before everything else in `llama_tensor_get_type`, even for float file types, and
        // skip the fallback: a type that does not divide the rows is the caller's error.
        // `per_layer_token_embd.weight` follows `--token-embedding-type` only when no pattern names it.
        let named = name == "per_layer_token_embd.weight" && pattern.is_some();
        match (cat, params.token_embedding_type, params.output_tensor_type) {
            (Category::TokenEmbd, Some(t), _) if !named => {
                out.push(keep(t));
                continue;
            }
            (Category::Output, _, Some(t)) => {
                out.push(keep(t));
                continue;
            }
            _ => {}
        }
        let default = ftype.default_type();
        if !ftype.is_quantized() {
            out.push(keep(default));
            continue;
        }
        let ne0 = ne.first().copied().unwrap_or(1);
        // A matching pattern decides (the rules, and their layer counters, are skipped); then the fallback.
        let ruled = if let Some(p) = pattern {
            params.tensor_types[p].ty
        } else if params.pure {
            default
        } else {
            rule(ftype, cat, name, facts, params, ne, &mut counters)?
        };
        let ty = fallback(ruled, ne0).ok_or_else(|| MixtureError::NoFallback {
            tensor: name.clone(),
            ftype,
            ty: ruled,
            block: ruled.block_size(),
            ne0,
        })?;
        out.push(Choice { name: name.clone(), ty, fell_back: ty != ruled, pattern });
    }
    Ok(out)
}

/// The layer counters of `quantize_state_impl`: tensors of each category the rules have seen so far.
#[derive(Default)]
struct Counters {
    attn_v: i64,
    ffn_down: i64,
    ffn_gate: i64,
    ffn_up: i64,
}

/// `layer_info`: the layer a ffn tensor belongs to, `counter` for a dense model and parsed from `blk.N.` for one with
/// experts (whose expert tensors need not come in layer order), which must then be in `0..n`.
fn layer_of(name: &str, counter: i64, n: i64, m: &ModelFacts) -> Result<i64, MixtureError> {
    if m.n_expert.max(1) <= 1 {
        return Ok(counter);
    }
    let bad = |why: String| MixtureError::Layer { tensor: name.to_string(), why };
    // `sscanf(name, "blk.%d.", &i) == 1`: spaces skipped, an optionally signed decimal (what follows it is not
    // checked, the conversion count being 1 either way).
    let rest = name.strip_prefix("blk.").map(str::trim_start).unwrap_or("");
    let sign = usize::from(rest.starts_with(['+', '-']));
    let len = sign + rest[sign..].bytes().take_while(u8::is_ascii_digit).count();
    let i: i64 = rest[..len].parse().map_err(|_| bad("its name does not start with blk.N.".into()))?;
    if i < 0 || i >= n {
        return Err(bad(format!("layer {i} is not in [0, {n})")));
    }
    Ok(i)
}

/// `llama_tensor_get_type_impl` (llama.cpp 0c1e570 `src/llama-quant.cpp`), branch for branch, for every file type
/// and category. Not modelled: the arch-specific cases (Falcon's output and ffn_down/attn_output choices, GLM5-next's
/// Q8_0 floor, BailingMoE3's expert test under MXFP4_MOE); "70B" is read as 80 layers with grouped-query attention.
fn rule(
    ftype: FileType,
    cat: Category,
    name: &str,
    m: &ModelFacts,
    params: &Params,
    ne: &[u64],
    c: &mut Counters,
) -> Result<GgmlType, MixtureError> {
    use FileType as F;
    use GgmlType as T;
    let default = ftype.default_type();
    let has_imatrix = params.has_imatrix;
    let ne0 = ne.first().copied().unwrap_or(1);
    let n_expert = m.n_expert;
    let iq2_family = matches!(ftype, F::IQ2_XXS | F::IQ2_XS | F::IQ2_S | F::IQ2_M | F::IQ1_S | F::IQ1_M);
    let iq2_s_or_m = matches!(ftype, F::IQ2_S | F::IQ2_M);
    let is_output = cat == Category::Output || (cat == Category::TokenEmbd && m.tied_embeddings);
    if is_output {
        // Reached by `output.weight` only without `--output-tensor-type` (which returned earlier), but by a tied
        // token_embd with it: that one takes the output type here, and then the fallback.
        if let Some(t) = params.output_tensor_type {
            return Ok(t);
        }
        return Ok(if ftype == F::MXFP4_MOE || !ne0.is_multiple_of(default.block_size() as u64) {
            T::Q8_0
        } else if matches!(ftype, F::IQ2_XXS | F::IQ2_XS | F::IQ3_XXS | F::IQ1_S | F::IQ2_S | F::IQ2_M | F::IQ1_M) {
            T::Q5_K
        } else if default != T::Q8_0 {
            T::Q6_K
        } else {
            default
        });
    }
    // MXFP4_MOE: 3-D expert tensors MXFP4, every other tensor (an untied token_embd too) Q8_0.
    if ftype == F::MXFP4_MOE {
        return Ok(if ne.get(2).is_some_and(|&n| n > 1) { T::MXFP4 } else { T::Q8_0 });
    }
    if cat == Category::TokenEmbd {
        // Untied (a `--token-embedding-type` returned earlier).
        return Ok(match ftype {
            F::IQ2_XXS | F::IQ2_XS | F::IQ1_S | F::IQ1_M => T::Q2_K,
            F::IQ2_S | F::IQ2_M | F::IQ3_XXS => T::IQ3_S,
            F::TQ1_0 | F::TQ2_0 | F::Q2_0 => T::Q4_K,
            _ => default,
        });
    }
    if iq2_family {
        return Ok(match cat {
            Category::AttnV => {
                c.attn_v += 1;
                if m.gqa >= 4 || n_expert >= 4 {
                    T::Q4_K
                } else if iq2_s_or_m {
                    T::IQ3_S
                } else {
                    T::Q2_K
                }
            }
            Category::AttnK if n_expert == 8 => T::Q4_K,
            Category::FfnDown => {
                // The counter, even with experts (no layer parsing in this branch).
                let low = c.ffn_down < m.n_layer / 8;
                c.ffn_down += 1;
                match (low, iq2_s_or_m) {
                    (true, true) => T::IQ3_S,
                    (true, false) => T::Q2_K,
                    (false, _) => default,
                }
            }
            Category::AttnOutput => match ftype {
                _ if n_expert == 8 => T::Q5_K,
                F::IQ1_S | F::IQ1_M => T::IQ2_XXS,
                F::IQ2_S | F::IQ2_M => T::IQ3_S,
                _ => default,
            },
            // The ffn_gate/up counters are not advanced in this branch.
            _ => default,
        });
    }
    Ok(match cat {
        Category::Output | Category::TokenEmbd => default,
        Category::AttnV => {
            let i = c.attn_v;
            c.attn_v += 1;
            let mut t = match ftype {
                F::Q2_K if m.gqa >= 4 => T::Q4_K,
                F::Q2_K => T::Q3_K,
                F::Q2_K_S if m.gqa >= 4 => T::Q4_K,
                F::IQ3_XXS if m.gqa >= 4 => T::Q4_K,
                F::IQ3_XXS if !has_imatrix => T::IQ3_S,
                F::IQ3_XXS => T::IQ3_XXS,
                F::IQ3_XS | F::IQ3_S if m.gqa >= 4 => T::Q4_K,
                F::IQ3_M => T::Q4_K,
                F::Q3_K_M if i < 2 => T::Q5_K,
                F::Q3_K_M => T::Q4_K,
                F::Q3_K_L => T::Q5_K,
                F::IQ4_NL | F::IQ4_XS if m.gqa >= 4 => T::Q5_K,
                F::Q4_K_M | F::Q5_K_M if use_more_bits(i, m.n_attention_wv) => T::Q6_K,
                F::Q4_K_S if i < 4 => T::Q5_K,
                _ => default,
            };
            // "70B" (LLaMA with 80 layers and grouped-query attention): more bits for V.
            if m.n_layer == 80 && m.gqa > 1 && matches!(t, T::Q3_K | T::Q4_K) {
                t = T::Q5_K;
            }
            if n_expert == 8 {
                t = T::Q8_0;
            }
            t
        }
        Category::AttnK => match ftype {
            _ if n_expert == 8 => T::Q8_0,
            F::IQ3_XS => T::IQ3_XXS,
            F::IQ3_XXS => T::IQ2_S,
            _ => default,
        },
        Category::AttnQ => match ftype {
            F::IQ3_XS => T::IQ3_XXS,
            F::IQ3_XXS => T::IQ2_S,
            _ => default,
        },
        Category::FfnDown => {
            let n = m.n_layer;
            let i = layer_of(name, c.ffn_down, n, m)?;
            c.ffn_down += 1;
            match ftype {
                F::Q2_K => T::Q3_K,
                F::Q2_K_S if i < n / 8 => T::Q4_K,
                F::Q2_K_S => default,
                F::IQ3_XXS if !has_imatrix && i < n / 8 => T::Q4_K,
                F::IQ3_XXS if !has_imatrix => T::Q3_K,
                F::Q3_K_M if i < n / 16 => T::Q5_K,
                F::Q3_K_M => T::Q4_K,
                F::IQ3_M if i < n / 8 || (n_expert == 8 && use_more_bits(i, n)) => T::Q4_K,
                F::Q3_K_L => T::Q5_K,
                F::Q4_K_M if use_more_bits(i, n) => T::Q6_K,
                F::Q4_K_M => default,
                F::IQ4_NL | F::IQ4_XS if i < n / 8 && !has_imatrix => T::Q5_K,
                F::Q5_K_M if use_more_bits(i, n) => T::Q6_K,
                F::Q4_K_S if i < n / 8 => T::Q5_K,
                // Only with an imatrix (so that a plain Q4_0/Q5_0 stays what it always was): "guard against
                // craziness in the first few ffn_down layers".
                F::Q4_0 if has_imatrix && i < n / 8 => T::Q4_1,
                F::Q5_0 if has_imatrix && i < n / 8 => T::Q5_1,
                _ => default,
            }
        }
        Category::AttnOutput if n_expert == 8 => match ftype {
            F::Q2_K
            | F::IQ3_XS
            | F::IQ3_XXS
            | F::Q3_K_S
            | F::Q3_K_M
            | F::IQ4_NL
            | F::Q4_K_S
            | F::Q4_K_M
            | F::IQ3_S
            | F::IQ3_M
            | F::IQ4_XS => T::Q5_K,
            _ => default,
        },
        Category::AttnOutput => match ftype {
            F::Q2_K => T::Q3_K,
            F::IQ3_XXS => T::IQ3_S,
            F::Q3_K_M | F::IQ3_M => T::Q4_K,
            F::Q3_K_L => T::Q5_K,
            _ => default,
        },
        Category::FfnGate | Category::FfnUp => {
            let counter = if cat == Category::FfnGate { &mut c.ffn_gate } else { &mut c.ffn_up };
            let n = m.n_layer;
            let i = layer_of(name, *counter, n, m)?;
            *counter += 1;
            if ftype == F::IQ3_XS && i >= n / 8 && i < 7 * n / 8 {
                T::IQ3_XXS
            } else {
                default
            }
        }
        Category::Other => default,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_layer_then_bytes() {
        let mut v =
            vec!["blk.10.a.weight", "blk.2.b.weight", "token_embd.weight", "blk.2.a.weight", "output_norm.weight"];
        v.sort_by(|a, b| tensor_order(a, b));
        assert_eq!(
            v,
            ["output_norm.weight", "token_embd.weight", "blk.2.a.weight", "blk.2.b.weight", "blk.10.a.weight"]
        );
    }

    #[test]
    fn use_more_bits_matches_the_spec_examples() {
        let layers = |n| (0..n).filter(|&i| use_more_bits(i, n)).collect::<Vec<_>>();
        assert_eq!(layers(16), [0, 1, 4, 7, 10, 13, 14, 15]);
        assert_eq!(layers(28), [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]);
    }

    #[test]
    fn q4_0_and_q5_0_ffn_down_rule_needs_an_imatrix() {
        let facts = ModelFacts { n_layer: 16, gqa: 1, tied_embeddings: true, n_attention_wv: 16, n_expert: 0 };
        let tensors: Vec<_> =
            (0..16).map(|i| (format!("blk.{i}.ffn_down.weight"), vec![64, 64], GgmlType::F16)).collect();
        for (ftype, more) in [(FileType::Q4_0, GgmlType::Q4_1), (FileType::Q5_0, GgmlType::Q5_1)] {
            let with: Vec<_> =
                choose_types(ftype, &facts, &tensors, true).expect("types").into_iter().map(|c| c.ty).collect();
            let default = ftype.default_type();
            assert_eq!(with[..2], [more, more], "{ftype}: i < n/8");
            assert!(with[2..].iter().all(|&t| t == default), "{ftype}: {with:?}");
            let without = choose_types(ftype, &facts, &tensors, false).expect("types");
            assert!(without.iter().all(|c| c.ty == default), "{ftype}");
        }
    }

    #[test]
    fn tensor_type_entries_parse_as_llama_quantize_reads_them() {
        let t = TensorType::parse("BLK\\.[0-2]\\.FFN_DOWN=q6_k").expect("valid");
        assert_eq!((t.pattern.as_str(), t.ty), ("blk\\.[0-2]\\.ffn_down", GgmlType::Q6_K));
        assert!(t.matches("blk.1.ffn_down.weight") && !t.matches("blk.3.ffn_down.weight"));
        // Unanchored: `attn_q` also matches `attn_qkv`; the pattern ends at the first `=`.
        assert!(TensorType::parse("attn_q=q8_0").expect("valid").matches("blk.0.attn_qkv.weight"));
        let f = TensorType::parse_file(" a=q8_0\n\tb=IQ4_NL  c=f16 ").expect("valid");
        assert_eq!(
            f.iter().map(|t| (t.pattern.as_str(), t.ty)).collect::<Vec<_>>(),
            [("a", GgmlType::Q8_0), ("b", GgmlType::IQ4_NL), ("c", GgmlType::F16)]
        );
        assert!(matches!(TensorType::parse("=q8_0"), Err(TensorTypeError::Syntax { .. })));
        assert!(matches!(TensorType::parse("x"), Err(TensorTypeError::Syntax { .. })));
        assert!(matches!(TensorType::parse("x=q9"), Err(TensorTypeError::UnknownType { .. })));
        assert!(matches!(TensorType::parse("x=i8"), Err(TensorTypeError::NotWritable { .. })));
        assert!(matches!(TensorType::parse("(x=q8_0"), Err(TensorTypeError::Regex { .. })));
        assert!(matches!(TensorType::parse_file("a=q8_0 # comment"), Err(TensorTypeError::Syntax { .. })));
    }

    #[test]
    fn models_with_experts_read_the_layer_from_the_name() {
        let moe = ModelFacts { n_layer: 4, gqa: 1, tied_embeddings: true, n_attention_wv: 4, n_expert: 8 };
        let dense = ModelFacts { n_expert: 0, ..moe.clone() };
        assert_eq!(layer_of("blk.3.ffn_down_exps.weight", 0, 4, &moe), Ok(3));
        assert_eq!(layer_of("blk.3.ffn_down_exps.weight", 1, 4, &dense), Ok(1));
        assert!(matches!(layer_of("blk.4.ffn_down.weight", 0, 4, &moe), Err(MixtureError::Layer { .. })));
        assert!(matches!(layer_of("ffn_down.weight", 0, 4, &moe), Err(MixtureError::Layer { .. })));
        // n_expert == 8 under IQ3_M: attn_k and attn_v Q8_0, attn_output Q5_K; ffn_down by the parsed layer 3 (the
        // counter would say 0): use_more_bits(3, 4) → Q4_K. In llama-quantize's order (layer, then name).
        let t: Vec<(String, Vec<u64>, GgmlType)> = [
            ("blk.3.ffn_down_exps.weight", vec![256, 256, 8]),
            ("blk.0.attn_v.weight", vec![256, 256]),
            ("blk.0.attn_output.weight", vec![256, 256]),
            ("blk.0.attn_k.weight", vec![256, 256]),
        ]
        .into_iter()
        .map(|(n, ne)| (n.to_string(), ne, GgmlType::F16))
        .collect();
        let got: Vec<(String, GgmlType)> =
            choose_types(FileType::IQ3_M, &moe, &t, true).expect("types").into_iter().map(|c| (c.name, c.ty)).collect();
        let want = [
            ("blk.0.attn_k.weight", GgmlType::Q8_0),
            ("blk.0.attn_output.weight", GgmlType::Q5_K),
            ("blk.0.attn_v.weight", GgmlType::Q8_0),
            ("blk.3.ffn_down_exps.weight", GgmlType::Q4_K),
        ];
        assert_eq!(got, want.map(|(n, t)| (n.to_string(), t)));
    }

    #[test]
    fn fallbacks() {
        assert_eq!(fallback(GgmlType::Q4_K, 896), Some(GgmlType::Q5_0));
        assert_eq!(fallback(GgmlType::Q6_K, 896), Some(GgmlType::Q8_0));
        assert_eq!(fallback(GgmlType::Q4_K, 4096), Some(GgmlType::Q4_K));
        assert_eq!(fallback(GgmlType::Q2_K, 100), Some(GgmlType::F16));
        assert_eq!(fallback(GgmlType::IQ4_XS, 576), Some(GgmlType::IQ4_NL));
        assert_eq!(fallback(GgmlType::TQ2_0, 576), Some(GgmlType::Q4_0));
        assert_eq!(fallback(GgmlType::MXFP4, 48), Some(GgmlType::F16));
        // No fallback is defined for Q1_0 (blocks of 128) or NVFP4 (64): llama-quantize fails on SmolLM2's 576.
        assert_eq!(fallback(GgmlType::Q1_0, 576), None);
        assert_eq!(fallback(GgmlType::NVFP4, 96), None);
        assert_eq!(fallback(GgmlType::Q1_0, 1024), Some(GgmlType::Q1_0));
    }

    #[test]
    fn q1_0_on_rows_it_does_not_divide_is_refused_naming_the_tensor() {
        let (facts, t) = model(false, 576);
        let e = choose_types(FileType::Q1_0, &facts, &t, false).expect_err("576 is not a multiple of 128");
        assert_eq!(
            e,
            MixtureError::NoFallback {
                tensor: "token_embd.weight".into(),
                ftype: FileType::Q1_0,
                ty: GgmlType::Q1_0,
                block: 128,
                ne0: 576
            }
        );
        assert!(e.to_string().contains("no fallback for Q1_0"), "{e}");
    }

    /// A 4-layer model with rows of 256 (no fallback) unless `ne0` says otherwise; untied unless `tied`.
    fn model(tied: bool, ne0: u64) -> (ModelFacts, Vec<(String, Vec<u64>, GgmlType)>) {
        let mut t = vec![("token_embd.weight".to_string(), vec![ne0, 300], GgmlType::BF16)];
        if !tied {
            t.push(("output.weight".into(), vec![ne0, 300], GgmlType::BF16));
        }
        t.push(("output_norm.weight".into(), vec![ne0], GgmlType::F32));
        for i in 0..4 {
            for n in ["attn_v", "ffn_down", "attn_q"] {
                t.push((format!("blk.{i}.{n}.weight"), vec![ne0, ne0], GgmlType::BF16));
            }
        }
        let facts = ModelFacts { n_layer: 4, gqa: 2, tied_embeddings: tied, n_attention_wv: 4, n_expert: 0 };
        (facts, t)
    }

    fn types(ftype: FileType, tied: bool, ne0: u64, p: &Params) -> Vec<(String, GgmlType)> {
        let (facts, t) = model(tied, ne0);
        choose_types_with(ftype, &facts, &t, p).expect("types").into_iter().map(|c| (c.name, c.ty)).collect()
    }

    fn ty_of(v: &[(String, GgmlType)], name: &str) -> GgmlType {
        v.iter().find(|(n, _)| n == name).map(|(_, t)| *t).expect("tensor present")
    }

    #[test]
    fn pure_gives_every_quantizable_tensor_the_default_type_then_the_fallback() {
        let pure = Params { pure: true, ..Params::default() };
        let v = types(FileType::Q4_K_M, false, 256, &pure);
        for (n, t) in &v {
            let want = if n.ends_with("_norm.weight") { GgmlType::F32 } else { GgmlType::Q4_K };
            assert_eq!(*t, want, "{n}");
        }
        // Without --pure, the rules give output Q6_K and attn_v/ffn_down of layers 2, 3 (use_more_bits) Q6_K.
        let ruled = types(FileType::Q4_K_M, false, 256, &Params::default());
        assert_eq!(ty_of(&ruled, "output.weight"), GgmlType::Q6_K);
        assert_eq!(ty_of(&ruled, "blk.3.attn_v.weight"), GgmlType::Q6_K);
        // A tied token_embd is the default type too, and the fallback still applies (Q4_K on 96 columns → Q5_0).
        assert_eq!(ty_of(&types(FileType::Q4_K_M, true, 256, &pure), "token_embd.weight"), GgmlType::Q4_K);
        let narrow = types(FileType::Q4_K_M, true, 96, &pure);
        assert!(narrow.iter().filter(|(n, _)| !n.ends_with("_norm.weight")).all(|(_, t)| *t == GgmlType::Q5_0));
        // Float file types ignore --pure.
        assert!(types(FileType::F16, false, 256, &pure)
            .iter()
            .all(|(n, t)| n.ends_with("_norm.weight") || *t == GgmlType::F16));
    }

    #[test]
    fn output_tensor_type_sets_output_without_fallback_and_a_tied_embedding_with_it() {
        let p = Params { output_tensor_type: Some(GgmlType::Q4_K), ..Params::default() };
        // Untied: output.weight takes it as is, even where Q4_K does not divide the rows; token_embd is unaffected.
        let v = types(FileType::Q6_K, false, 96, &p);
        assert_eq!(ty_of(&v, "output.weight"), GgmlType::Q4_K);
        assert_eq!(ty_of(&v, "token_embd.weight"), GgmlType::Q8_0);
        // Tied: token_embd gets the output type through the rules, so the fallback applies.
        assert_eq!(ty_of(&types(FileType::Q6_K, true, 256, &p), "token_embd.weight"), GgmlType::Q4_K);
        assert_eq!(ty_of(&types(FileType::Q6_K, true, 96, &p), "token_embd.weight"), GgmlType::Q5_0);
        // Under --pure a tied token_embd does not reach the rules: default type.
        let pure = Params { pure: true, ..p.clone() };
        assert_eq!(ty_of(&types(FileType::Q6_K, true, 256, &pure), "token_embd.weight"), GgmlType::Q6_K);
        assert_eq!(ty_of(&types(FileType::Q6_K, false, 256, &pure), "output.weight"), GgmlType::Q4_K);
        // It applies even to float file types.
        assert_eq!(ty_of(&types(FileType::F16, false, 256, &p), "output.weight"), GgmlType::Q4_K);
        // Other tensors and the layer counters are untouched.
        assert_eq!(ty_of(&types(FileType::Q4_K_M, false, 256, &p), "blk.3.attn_v.weight"), GgmlType::Q6_K);
    }

    #[test]
    fn token_embedding_type_wins_tied_or_not_without_fallback() {
        let p = Params {
            token_embedding_type: Some(GgmlType::Q8_0),
            output_tensor_type: Some(GgmlType::Q4_K),
            ..Params::default()
        };
        for tied in [false, true] {
            let v = types(FileType::Q4_K_M, tied, 256, &p);
            assert_eq!(ty_of(&v, "token_embd.weight"), GgmlType::Q8_0, "tied {tied}");
        }
        let q2 = Params { token_embedding_type: Some(GgmlType::Q2_K), ..Params::default() };
        assert_eq!(ty_of(&types(FileType::Q8_0, false, 96, &q2), "token_embd.weight"), GgmlType::Q2_K);
        assert_eq!(ty_of(&types(FileType::BF16, false, 256, &q2), "token_embd.weight"), GgmlType::Q2_K);
        let pure = Params { pure: true, ..q2 };
        assert_eq!(ty_of(&types(FileType::Q4_0, true, 256, &pure), "token_embd.weight"), GgmlType::Q2_K);
    }

    #[test]
    fn leave_output_tensor_keeps_output_as_is_and_nothing_else() {
        let p = Params { leave_output_tensor: true, output_tensor_type: Some(GgmlType::Q8_0), ..Params::default() };
        let v = types(FileType::Q4_K_M, false, 256, &p);
        assert_eq!(ty_of(&v, "output.weight"), GgmlType::BF16);
        assert_eq!(ty_of(&v, "token_embd.weight"), GgmlType::Q4_K);
        // A tied token_embd is not output.weight: still quantized, with the output rule.
        let tied = types(FileType::Q4_K_M, true, 256, &Params { leave_output_tensor: true, ..Params::default() });
        assert_eq!(ty_of(&tied, "token_embd.weight"), GgmlType::Q6_K);
    }
}
