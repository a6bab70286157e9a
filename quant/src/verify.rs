//! `quantfarm verify SRC OUT`: is OUT what converting (or merging into) SRC gives? The direction is told by the two
//! formats; each output tensor is recomputed from the source as it streams and compared, and the structure around
//! the weights (tensor set, metadata, config.json, tokenizer files) is checked too. See
//! [`quantfarm_tensors::verify`] for the exact directions; this module adds the lossy one, MLX affine outputs:
//!
//! - first the codes, scales and biases are recomputed with the quantizer `quantfarm mlx` uses (the same bytes as
//!   `mx.quantize`), so an output made by quantfarm or by mlx-lm is **identical**;
//! - an output that is not (another quantizer, an older mlx) passes only if every dequantized value is within one
//!   quantization step (its group's scale) of the source value, beyond the rounding of the stored scale and bias:
//!   a wrong permutation, a dropped offset or a weight from another layer is many steps off.

use quantfarm_store::Location;
use quantfarm_tensors::convert::{self, HfTensor};
use quantfarm_tensors::merge::MergeOptions;
use quantfarm_tensors::verify::{self as tv, Compare, Verdict, Verification};
use quantfarm_tensors::write::{copy_tensor, PieceWriter};
use quantfarm_tensors::{Dtype, Format, TensorSource, TensorType};

use crate::mlx::{quantize_affine, MlxQuantError};
use crate::mlx_file::{mlx_config, round_to, unquantized_config, MlxQuant, MlxScheme};
use crate::mlx_fp::{quantize_fp, FpMode, FpQuantError};
use crate::mlx_recipe::MixedRecipe;
use quantfarm_tensors::convert::transform::encode_f32;
use quantfarm_tensors::dequant::float_values;
use quantfarm_tensors::mlx::CARRIED_FILES;
use quantfarm_tensors::mlx::{AffineParams, ModuleQuant};

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Tensors(#[from] quantfarm_tensors::Error),
    #[error("{0}")]
    Direction(String),
    #[error("{tensor}: {source}")]
    Quant { tensor: String, source: MlxQuantError },
    #[error("{tensor}: {source}")]
    FpQuant { tensor: String, source: FpQuantError },
}

/// A store error (a missing object, a dropped connection) is a tensors error about that file.
impl From<quantfarm_store::Error> for VerifyError {
    fn from(e: quantfarm_store::Error) -> VerifyError {
        VerifyError::Tensors(e.into())
    }
}

#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// Tensor data held at once (about three times this while an MLX tensor is checked).
    pub budget: u64,
    /// The adapter, when OUT is a merge of it into SRC.
    pub adapter: Option<Location>,
    /// The base's identity for the adapter's recorded-base check (as `quantfarm merge --base-name`).
    pub base_name: Option<String>,
}

/// Checks OUT against SRC in the direction their formats tell: HF/MLX → GGUF, GGUF → HF, GGUF, HF or MLX → MLX, or
/// a merge (with `opts.adapter`).
pub async fn verify(src: &Location, out: &Location, opts: &VerifyOptions) -> Result<Verification, VerifyError> {
    if let Some(adapter) = &opts.adapter {
        let m = MergeOptions { budget: opts.budget, overwrite: false, base_name: opts.base_name.clone(), widen: false };
        return Ok(tv::verify_merge(src, adapter, out, &m).await?);
    }
    let s = TensorSource::open(src).await?;
    let o = TensorSource::open(out).await?;
    match (s.format(), o.format()) {
        (Format::Safetensors | Format::Mlx, Format::Gguf) => Ok(tv::verify_gguf_conversion(&s, &o, opts.budget).await?),
        (Format::Gguf | Format::Mlx, Format::Safetensors) => Ok(tv::verify_hf_conversion(&s, &o, opts.budget).await?),
        // MLX → MLX: a quantized (or unquantized) MLX checkpoint quantized again.
        (Format::Gguf | Format::Safetensors | Format::Mlx, Format::Mlx) => {
            verify_mlx_conversion(&s, &o, opts.budget).await
        }
        // A release's float reference made from a GGUF source (general.file_type F32, F16 or BF16).
        (Format::Gguf, Format::Gguf) if float_file_type(&o) => Ok(tv::verify_gguf_conversion(&s, &o, opts.budget).await?),
        (a, b) => Err(VerifyError::Direction(format!(
            "{src} is {} and {out} is {}: no conversion quantfarm makes goes that way (HF/MLX -> GGUF, GGUF/MLX -> HF, \
             GGUF/HF/MLX -> MLX, a GGUF -> its float reference GGUF; a merge with --adapter; a GGUF quantized from a GGUF is checked by quantizing again)",
            a.name(),
            b.name()
        ))),
    }
}

/// Whether a GGUF's `general.file_type` is a float one (ALL_F32, MOSTLY_F16, MOSTLY_BF16).
fn float_file_type(g: &TensorSource) -> bool {
    g.gguf()
        .and_then(|m| m.header().metadata.iter().find(|(k, _)| k == "general.file_type"))
        .is_some_and(|(_, v)| matches!(v, quantfarm_tensors::gguf::Value::U32(0 | 1 | 32)))
}

/// Where an output tensor's values come from.
enum Reference {
    /// A tensor computed from the source: a GGUF tensor converted as GGUF → HF converts it, or an HF tensor
    /// mlx-lm's sanitize offsets.
    Computed(HfTensor),
    /// HF tensors read in order (one, or a block's experts stacked), of this shape.
    Hf(Vec<String>, Vec<u64>),
}

/// GGUF or HF checkpoint `src` → MLX checkpoint `out` (as `quantfarm convert --to mlx` / `quantfarm mlx` and
/// `mlx_lm.convert -q` write it).
pub async fn verify_mlx_conversion(
    src: &TensorSource,
    out: &TensorSource,
    budget: u64,
) -> Result<Verification, VerifyError> {
    let out_file = out.location().to_string();
    let mlx = out.mlx().ok_or_else(|| VerifyError::Direction(format!("{out_file} is not an MLX checkpoint")))?;
    // The output's float dtype: its scales', else its plain matrices'.
    let dtype = out
        .tensors()
        .iter()
        .find_map(|e| match e.ty {
            TensorType::MlxAffine { scale_dtype, .. } => Some(scale_dtype),
            _ => None,
        })
        .or_else(|| {
            let float = |e: &quantfarm_tensors::TensorEntry| match e.ty {
                TensorType::Dtype(d @ (Dtype::BF16 | Dtype::F16 | Dtype::F32)) => Some(d),
                _ => None,
            };
            // A matrix's, else (every matrix in a floating-point mode) a norm's: mlx-lm casts them all.
            let all = out.tensors();
            all.iter().filter(|e| e.shape.len() == 2).find_map(float).or_else(|| all.iter().find_map(float))
        })
        .ok_or_else(|| VerifyError::Direction(format!("{out_file}: no float or quantized matrix")))?;
    let mut v = Verification::new(format!("{} -> MLX ({dtype})", src.format().name()));
    let (refs, base_config, overrides) = match src.format() {
        Format::Gguf => {
            let plan = convert::plan_gguf_to_mlx(src, dtype).await?;
            for (name, want) in &plan.json_files {
                tv::compare_json_file(&mut v, out.location(), name, want).await;
            }
            for (name, want) in &plan.binary_files {
                tv::compare_binary_file(&mut v, out.location(), name, want).await;
            }
            let overrides = plan.quant_overrides.clone();
            let refs = plan.tensors.into_iter().map(|t| (t.name.clone(), Reference::Computed(t))).collect::<Vec<_>>();
            (refs, plan.config, overrides)
        }
        _ => {
            let plan = convert::plan_hf_to_mlx(src)?;
            tv::compare_carried(&mut v, src.location(), out.location(), &CARRIED_FILES).await;
            let mut refs = Vec::with_capacity(plan.tensors.len());
            for t in plan.tensors {
                let r = match (t.add, t.part, t.sources.first()) {
                    (None, None, _) | (_, _, None) => Reference::Hf(t.sources, t.shape),
                    (add, part, Some(source)) => Reference::Computed(HfTensor {
                        offset: add.map(|a| -a),
                        part,
                        ..HfTensor::plain(&t.name, source, t.shape.clone(), Dtype::F32)
                    }),
                };
                refs.push((t.name, r));
            }
            (refs, plan.config.unwrap_or_else(|| src.metadata()), plan.quant_overrides)
        }
    };
    match mlx.config.get("quantization").and_then(|q| Some((q.get("bits")?.as_u64()?, q.get("group_size")?.as_u64()?)))
    {
        Some((bits, group)) => {
            let mode = mlx.config["quantization"].get("mode").and_then(|m| m.as_str()).and_then(FpMode::parse);
            let scheme = mode.map_or(MlxScheme::Affine, MlxScheme::Fp);
            let quant = MlxQuant { bits: bits as u32, group_size: group as usize, scheme };
            let recipe = match scheme {
                MlxScheme::Affine => mixed_recipe_config(&mlx.config, &base_config, quant, &refs, out),
                MlxScheme::Mixed(_) | MlxScheme::Fp(_) => None,
            };
            let want = match recipe {
                Some(want) => want,
                None => mlx_config(base_config, &quant, &overrides),
            };
            tv::compare_json_object(&mut v, "config.json", &want, &mlx.config);
        }
        // An unquantized checkpoint (`mlx_lm.convert` without -q), which holds no quantized tensor.
        None if !mlx.config.contains_key("quantization") => {
            let want = unquantized_config(base_config);
            tv::compare_json_object(&mut v, "config.json", &want, &mlx.config);
        }
        None => v.problem("config.json's quantization has no {bits, group_size}"),
    }

    for (name, r) in &refs {
        let Ok(e) = out.entry(name) else {
            v.problem(format!("tensor {name} is missing from the output"));
            continue;
        };
        let shape = match r {
            Reference::Computed(t) => t.shape.clone(),
            Reference::Hf(_, shape) => shape.clone(),
        };
        if e.shape != shape {
            v.problem(format!("tensor {name} is {:?} in the output; {shape:?} expected", e.shape));
            continue;
        }
        let source = match r {
            Reference::Computed(t) => t.source.clone(),
            Reference::Hf(sources, _) if sources.len() == 1 => sources[0].clone(),
            Reference::Hf(sources, _) => format!("{} … ({} stacked)", sources[0], sources.len()),
        };
        let verdict = match e.ty {
            TensorType::Dtype(d) => {
                let mut c = Compare::new(out, name)?;
                match r {
                    Reference::Computed(t) => {
                        convert::write_hf_tensor(src, &HfTensor { dtype: d, ..t.clone() }, budget, &mut c).await?
                    }
                    Reference::Hf(sources, _) => {
                        for n in sources {
                            if src.entry(n)?.ty == TensorType::Dtype(d) {
                                copy_tensor(src, n, budget, &mut Vec::new(), &mut c).await?;
                                continue;
                            }
                            if let Some(t) = dequantized(src, n, d)? {
                                convert::write_hf_tensor(src, &t, budget, &mut c).await?;
                                continue;
                            }
                            let mut rows = Rows::new(src, n, budget)?;
                            while let Some(vals) = rows.next(d).await? {
                                let mut bytes = Vec::new();
                                encode_f32(vals, d, &mut bytes);
                                c.write_piece(&bytes).await?;
                            }
                        }
                    }
                }
                c.verdict()
            }
            TensorType::MlxAffine { bits, group_size, scale_dtype } => {
                let check = QuantCheck::new(
                    out,
                    name,
                    e.row_len() as usize,
                    ModuleQuant::Affine(AffineParams { bits, group_size }),
                    scale_dtype,
                );
                check_quantized(src, r, check, budget).await?
            }
            TensorType::MlxFp { mode } => {
                let check = QuantCheck::new(out, name, e.row_len() as usize, ModuleQuant::Fp(mode), dtype);
                check_quantized(src, r, check, budget).await?
            }
            TensorType::Ggml(g) => Verdict::Differs(format!("an MLX checkpoint holding a {g} tensor")),
        };
        v.push(name, &source, verdict);
    }
    let expected: std::collections::HashSet<&str> = refs.iter().map(|(n, _)| n.as_str()).collect();
    for e in out.tensors() {
        if !expected.contains(e.name.as_str()) {
            v.problem(format!("tensor {} is in the output but not made from the source", e.name));
        }
    }
    Ok(v)
}

/// An MLX affine tensor `name` of a quantized MLX source, read as `mx.dequantize` gives it in `dtype` (its scales'
/// dtype), as the MLX writer quantizes such a source again; `None` for any other tensor.
/// The `config.json` a mixed recipe would write, when the output's per-module entries carry a mode (which only a
/// recipe's do: `crate::mlx_recipe`): that of the recipe whose config is the output's, else of the first that
/// applies (so the comparison names the first difference); `None` for a checkpoint made without a recipe.
fn mixed_recipe_config(
    got: &serde_json::Map<String, serde_json::Value>,
    base: &serde_json::Map<String, serde_json::Value>,
    quant: MlxQuant,
    refs: &[(String, Reference)],
    out: &TensorSource,
) -> Option<serde_json::Map<String, serde_json::Value>> {
    let q = got.get("quantization")?.as_object()?;
    if !q.values().any(|e| e.get("mode").is_some()) {
        return None;
    }
    let modules: Vec<&str> = refs.iter().filter_map(|(n, _)| n.strip_suffix(".weight")).collect();
    let quantized: Vec<String> = out
        .tensors()
        .iter()
        .filter(|e| matches!(e.ty, TensorType::MlxAffine { .. }))
        .filter_map(|e| e.name.strip_suffix(".weight").map(str::to_string))
        .collect();
    let mut first = None;
    for recipe in MixedRecipe::ALL {
        let quant = MlxQuant { scheme: MlxScheme::Mixed(recipe), ..quant };
        let Ok(entries) = recipe.plan(&modules).and_then(|p| p.config_entries(quantized.clone(), quant.group_size))
        else {
            continue;
        };
        let want = mlx_config(base.clone(), &quant, &entries);
        if &want == got {
            return Some(want);
        }
        first.get_or_insert(want);
    }
    first
}

/// Streams the reference of a quantized output tensor through `check` (in the dtype it quantizes from).
async fn check_quantized(
    src: &TensorSource,
    r: &Reference,
    mut check: QuantCheck<'_>,
    budget: u64,
) -> Result<Verdict, VerifyError> {
    let dtype = check.dtype;
    match r {
        Reference::Computed(t) => {
            let t = HfTensor { dtype, ..t.clone() };
            convert::write_hf_tensor(src, &t, budget, &mut check).await?;
        }
        Reference::Hf(sources, _) => {
            for n in sources {
                if let Some(t) = dequantized(src, n, dtype)? {
                    convert::write_hf_tensor(src, &t, budget, &mut check).await?;
                    continue;
                }
                let mut rows = Rows::new(src, n, budget)?;
                while let Some(vals) = rows.next(dtype).await? {
                    check.rows(vals).await?;
                }
            }
        }
    }
    Ok(check.verdict())
}

fn dequantized(src: &TensorSource, name: &str, dtype: Dtype) -> Result<Option<HfTensor>, VerifyError> {
    let e = src.entry(name)?;
    Ok(match e.ty {
        TensorType::MlxAffine { scale_dtype, .. } if scale_dtype == dtype => {
            Some(HfTensor::plain(name, name, e.shape.clone(), dtype))
        }
        _ => None,
    })
}

/// An HF tensor's rows as f32 in chunks within a budget, rounded to the output dtype as `mlx_lm.convert` casts
/// before quantizing.
struct Rows<'a> {
    src: &'a TensorSource,
    name: &'a str,
    row: u64,
    rows: u64,
    step: u64,
    exact_in: TensorType,
    vals: Vec<f32>,
    scratch: Vec<u8>,
}

impl<'a> Rows<'a> {
    fn new(src: &'a TensorSource, name: &'a str, budget: u64) -> Result<Rows<'a>, VerifyError> {
        let e = src.entry(name)?;
        let step = (budget / (e.row_len().max(1) * 4)).max(1);
        Ok(Rows { src, name, row: 0, rows: e.rows(), step, exact_in: e.ty, vals: Vec::new(), scratch: Vec::new() })
    }

    async fn next(&mut self, dtype: Dtype) -> Result<Option<&[f32]>, VerifyError> {
        if self.row >= self.rows {
            return Ok(None);
        }
        let n = self.step.min(self.rows - self.row);
        let cols = self.src.entry(self.name)?.row_len().max(1);
        self.vals.resize((n * cols) as usize, 0.0);
        self.src.read_f32_rows(self.name, self.row, &mut self.vals, &mut self.scratch).await?;
        if self.exact_in != TensorType::Dtype(dtype) {
            round_to(&mut self.vals, dtype);
        }
        self.row += n;
        Ok(Some(&self.vals))
    }
}

/// Compares an MLX affine tensor with reference rows given in order: recomputed bytes first, then the one-step
/// bound where they differ.
struct QuantCheck<'a> {
    out: &'a TensorSource,
    name: &'a str,
    cols: usize,
    quant: ModuleQuant,
    dtype: Dtype,
    row: u64,
    identical: bool,
    /// The largest error seen, in quantization steps.
    worst: f64,
    first_bad: Option<String>,
    /// Reference bytes (in `dtype`) not yet a whole row.
    pending: Vec<u8>,
    bufs: [Vec<u8>; 4],
    deq: Vec<f32>,
}

impl<'a> QuantCheck<'a> {
    fn new(out: &'a TensorSource, name: &'a str, cols: usize, quant: ModuleQuant, dtype: Dtype) -> Self {
        QuantCheck {
            out,
            name,
            cols,
            quant,
            dtype,
            row: 0,
            identical: true,
            worst: 0.0,
            first_bad: None,
            pending: Vec::new(),
            bufs: Default::default(),
            deq: Vec::new(),
        }
    }

    /// Checks whole reference rows (values already in the output dtype, widened to f32).
    async fn rows(&mut self, vals: &[f32]) -> Result<(), VerifyError> {
        let n = (vals.len() / self.cols) as u64;
        if self.row + n > self.out.entry(self.name)?.rows() {
            self.identical = false;
            self.first_bad.get_or_insert_with(|| "the source has more rows than the output".into());
            self.worst = f64::INFINITY;
            return Ok(());
        }
        let (bits, group_size) = match self.quant {
            ModuleQuant::Fp(mode) => return self.fp_rows(vals, mode).await,
            ModuleQuant::Affine(p) => (u32::from(p.bits), p.group_size as usize),
        };
        let q = quantize_affine(vals, self.cols, bits, group_size, self.dtype)
            .map_err(|source| VerifyError::Quant { tensor: self.name.to_string(), source })?;
        let [codes, scales, biases, scratch] = &mut self.bufs;
        let mut parts = [std::mem::take(codes), std::mem::take(scales), std::mem::take(biases)];
        self.out.read_quantized_rows(self.name, self.row, n, &mut parts).await?;
        [*codes, *scales, *biases] = parts;
        if *codes == q.packed_bytes() && *scales == q.scales && *biases == q.biases {
            self.row += n;
            return Ok(());
        }
        self.identical = false;
        self.deq.resize(vals.len(), 0.0);
        self.out.read_f32_rows(self.name, self.row, &mut self.deq, scratch).await?;
        let (s_all, b_all) = (float_values(scales, self.dtype), float_values(biases, self.dtype));
        for (i, (&got, &want)) in self.deq.iter().zip(vals).enumerate() {
            let g = i / group_size;
            let (s, b) = (f64::from(s_all[g]).abs(), f64::from(b_all[g]).abs());
            let err = (f64::from(got) - f64::from(want)).abs();
            // The stored scale and bias are rounded to the dtype: allow that much beyond the step.
            let excess = (err - (b + f64::from(want).abs()) * 2f64.powi(-8)).max(0.0);
            let steps = if s > 0.0 {
                excess / s
            } else if excess == 0.0 {
                0.0
            } else {
                f64::INFINITY
            };
            if steps > self.worst {
                self.worst = steps;
            }
            if steps > 1.0 && self.first_bad.is_none() {
                let (r, c) = (self.row + (i / self.cols) as u64, i % self.cols);
                self.first_bad = Some(format!(
                    "row {r}, column {c}: the output dequantizes to {got}, the source is {want}, a step is {s}"
                ));
            }
        }
        self.row += n;
        Ok(())
    }

    /// Floating-point modes: the recomputed codes and scales or the first row that differs (a quantizer other than
    /// mlx 0.32.4's, such as 0.32.1's nearest-rounded scales, is not accepted within a bound: the mode's grid has
    /// no single step).
    async fn fp_rows(&mut self, vals: &[f32], mode: FpMode) -> Result<(), VerifyError> {
        let n = (vals.len() / self.cols) as u64;
        let q = quantize_fp(vals, self.cols, mode, self.dtype)
            .map_err(|source| VerifyError::FpQuant { tensor: self.name.to_string(), source })?;
        let [codes, scales, biases, _] = &mut self.bufs;
        let mut parts = [std::mem::take(codes), std::mem::take(scales), std::mem::take(biases)];
        self.out.read_quantized_rows(self.name, self.row, n, &mut parts).await?;
        [*codes, *scales, *biases] = parts;
        let want_codes: Vec<u8> = q.packed.iter().flat_map(|w| w.to_le_bytes()).collect();
        if *codes != want_codes || *scales != q.scales {
            self.identical = false;
            self.worst = f64::INFINITY;
            let code_row = codes.len() / n.max(1) as usize;
            let scale_row = scales.len() / n.max(1) as usize;
            let bad = (0..n as usize).find(|&r| {
                codes[r * code_row..(r + 1) * code_row] != want_codes[r * code_row..(r + 1) * code_row]
                    || scales[r * scale_row..(r + 1) * scale_row] != q.scales[r * scale_row..(r + 1) * scale_row]
            });
            let row = self.row + bad.unwrap_or(0) as u64;
            self.first_bad.get_or_insert_with(|| {
                format!("row {row}: its {} codes or scales are not what mx.quantize gives the source", mode.name())
            });
        }
        self.row += n;
        Ok(())
    }

    fn verdict(&self) -> Verdict {
        let rows = self.out.entry(self.name).map(|e| e.rows()).unwrap_or(0);
        if self.row != rows || !self.pending.is_empty() {
            return Verdict::Differs(format!("the source gives {} rows, the output has {rows}", self.row));
        }
        match (self.identical, &self.first_bad) {
            (true, _) => Verdict::Identical,
            (false, None) => Verdict::WithinStep { worst: self.worst },
            (false, Some(at)) => Verdict::Differs(format!("{:.1} quantization steps off at {at}", self.worst)),
        }
    }
}

impl PieceWriter for QuantCheck<'_> {
    /// Reference bytes in the output dtype, as the GGUF → HF conversion writes them.
    async fn write_piece(&mut self, data: &[u8]) -> quantfarm_tensors::Result<()> {
        self.pending.extend_from_slice(data);
        let row_bytes = self.cols * self.dtype.size();
        let whole = self.pending.len() / row_bytes * row_bytes;
        if whole == 0 {
            return Ok(());
        }
        let vals = float_values(&self.pending[..whole], self.dtype);
        self.pending.drain(..whole);
        self.rows(&vals).await.map_err(|e| match e {
            VerifyError::Tensors(t) => t,
            other => quantfarm_tensors::Error::Format {
                file: self.out.location().to_string(),
                field: self.name.to_string(),
                msg: other.to_string(),
            },
        })
    }
}
