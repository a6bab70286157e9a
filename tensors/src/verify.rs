//! Checking an output against its source: every output tensor recomputed from the source and compared with the
//! stored bytes as it streams (so a check needs no scratch copy and holds one budget of data), plus structural
//! checks: the tensor set, types and shapes, GGUF metadata, config.json and the tokenizer files.
//!
//! The recomputation is the writer's own per-tensor code fed into a [`Compare`] instead of a file, so a check
//! answers "is OUT exactly what converting SRC gives", whoever made OUT: an output of `convert_hf_to_gguf.py`
//! passes when it is byte-identical, a truncated, corrupted, mislabelled or foreign one fails, naming the tensor or
//! key. Lossy outputs (MLX affine) are checked in `quantfarm-quant`, which has the quantizer.

use std::fmt;

use crate::convert::{self, GgufPlan, HfPlan, OutType};
use crate::dtype::{Dtype, TensorType};
use crate::error::{Error, Result};
use crate::gguf::Value;
use crate::merge::{plan_merge, MergeOptions};
use crate::source::{Format, TensorSource};
use crate::write::PieceWriter;
use quantfarm_store::Location;

/// What became of one output tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Same bytes as recomputed.
    Identical,
    /// Not the recomputed bytes, but every value within `worst` quantization steps (≤ 1) of the source's.
    WithinStep { worst: f64 },
    /// An F32 tensor made by an elementwise function whose last bit depends on the maths library that computed
    /// it (Qwen3.5's `ssm_a = -exp(A_log)`, docs/notes/qwen3_5/README.md §3.5): `values` of its values are one
    /// ulp from the correctly rounded ones recomputed here, the rest identical.
    WithinUlp { values: u64 },
    /// Wrong: the reason, naming the first difference.
    Differs(String),
}

impl Verdict {
    pub fn passed(&self) -> bool {
        !matches!(self, Verdict::Differs(_))
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Identical => write!(f, "identical"),
            Verdict::WithinStep { worst } => write!(f, "within one quantization step (worst {worst:.3} of a step)"),
            Verdict::WithinUlp { values } => write!(f, "{values} values one ulp from the correctly rounded f32"),
            Verdict::Differs(why) => write!(f, "DIFFERS: {why}"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct TensorCheck {
    /// The output tensor.
    pub name: String,
    /// The source tensor it is made from.
    pub source: String,
    pub verdict: Verdict,
}

/// The outcome of checking an output against its source.
#[derive(Debug, Clone, Default)]
pub struct Verification {
    /// What was checked, e.g. "HF -> GGUF (BF16)".
    pub direction: String,
    pub tensors: Vec<TensorCheck>,
    /// Structural problems: missing, extra or mistyped tensors, metadata keys, side files.
    pub problems: Vec<String>,
    /// Side files and metadata found equal (for the record).
    pub checked: Vec<String>,
}

impl Verification {
    pub fn new(direction: impl Into<String>) -> Verification {
        Verification { direction: direction.into(), ..Default::default() }
    }

    pub fn passed(&self) -> bool {
        self.problems.is_empty() && self.tensors.iter().all(|t| t.verdict.passed())
    }

    pub fn problem(&mut self, p: impl Into<String>) {
        self.problems.push(p.into());
    }

    pub fn push(&mut self, name: &str, source: &str, verdict: Verdict) {
        self.tensors.push(TensorCheck { name: name.to_string(), source: source.to_string(), verdict });
    }

    /// The outcome as JSON: counts, problems, every tensor's verdict.
    pub fn to_json(&self) -> serde_json::Value {
        let (identical, within, differing) = self.counts();
        let tensors: Vec<serde_json::Value> = self
            .tensors
            .iter()
            .map(|t| {
                let (verdict, detail) = match &t.verdict {
                    Verdict::Identical => ("identical", serde_json::Value::Null),
                    Verdict::WithinStep { worst } => ("within_one_step", (*worst).into()),
                    Verdict::WithinUlp { values } => ("within_one_ulp", (*values).into()),
                    Verdict::Differs(why) => ("differs", why.clone().into()),
                };
                serde_json::json!({ "name": t.name, "source": t.source, "verdict": verdict, "detail": detail })
            })
            .collect();
        serde_json::json!({
            "direction": self.direction,
            "passed": self.passed(),
            "identical": identical,
            "within_one_step": within,
            "differing": differing,
            "problems": self.problems,
            "checked": self.checked,
            "tensors": tensors,
        })
    }

    /// Counts of identical, within-step (or ulp) and differing tensors.
    pub fn counts(&self) -> (usize, usize, usize) {
        let n = |f: fn(&Verdict) -> bool| self.tensors.iter().filter(|t| f(&t.verdict)).count();
        (
            n(|v| *v == Verdict::Identical),
            n(|v| matches!(v, Verdict::WithinStep { .. } | Verdict::WithinUlp { .. })),
            n(|v| matches!(v, Verdict::Differs(_))),
        )
    }
}

/// A [`PieceWriter`] that compares the bytes it is given with tensor `name` of `out`, in order.
pub struct Compare<'a> {
    out: &'a TensorSource,
    name: &'a str,
    len: u64,
    at: u64,
    buf: Vec<u8>,
    first_diff: Option<u64>,
    differing: u64,
    overrun: bool,
    /// F32 values one ulp apart are counted in `ulp_off`, not as differing (see [`Verdict::WithinUlp`]).
    f32_ulp: bool,
    ulp_off: u64,
}

impl<'a> Compare<'a> {
    pub fn new(out: &'a TensorSource, name: &'a str) -> Result<Compare<'a>> {
        let len = out.entry(name)?.bytes;
        Ok(Compare {
            out,
            name,
            len,
            at: 0,
            buf: Vec::new(),
            first_diff: None,
            differing: 0,
            overrun: false,
            f32_ulp: false,
            ulp_off: 0,
        })
    }

    /// Compares F32 values allowing one ulp (a tensor of [`Verdict::WithinUlp`]'s kind).
    pub fn within_one_ulp(mut self) -> Compare<'a> {
        self.f32_ulp = true;
        self
    }

    /// The verdict once the whole recomputed tensor has been written.
    pub fn verdict(&self) -> Verdict {
        if self.overrun || self.at != self.len {
            return Verdict::Differs(format!("recomputed {} bytes, the output has {}", self.at, self.len));
        }
        match self.first_diff {
            None if self.ulp_off > 0 => Verdict::WithinUlp { values: self.ulp_off },
            None => Verdict::Identical,
            Some(at) => Verdict::Differs(format!(
                "{} of {} bytes differ from the recomputed ones, the first at byte {at}",
                self.differing, self.len
            )),
        }
    }
}

impl PieceWriter for Compare<'_> {
    async fn write_piece(&mut self, data: &[u8]) -> Result<()> {
        let n = data.len() as u64;
        if self.at + n > self.len {
            self.overrun = true;
            self.at += n;
            return Ok(());
        }
        self.buf.resize(data.len(), 0);
        self.out.read_range(self.name, self.at, &mut self.buf).await?;
        if self.f32_ulp && self.at.is_multiple_of(4) && n.is_multiple_of(4) {
            for (i, (a, b)) in data.chunks_exact(4).zip(self.buf.chunks_exact(4)).enumerate() {
                let (x, y) =
                    (i32::from_le_bytes([a[0], a[1], a[2], a[3]]), i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                // Same sign, adjacent bit patterns: one ulp apart.
                if x == y {
                } else if (x < 0) == (y < 0) && x.abs_diff(y) == 1 {
                    self.ulp_off += 1;
                } else {
                    self.first_diff.get_or_insert(self.at + 4 * i as u64);
                    self.differing += 4;
                }
            }
            self.at += n;
            return Ok(());
        }
        for (i, (a, b)) in data.iter().zip(&self.buf).enumerate() {
            if a != b {
                self.first_diff.get_or_insert(self.at + i as u64);
                self.differing += 1;
            }
        }
        self.at += n;
        Ok(())
    }
}

/// Checks that the entry `name` of `out` has type `ty` and shape `shape`; a problem is recorded otherwise.
fn same_layout(v: &mut Verification, out: &TensorSource, name: &str, ty: TensorType, shape: &[u64]) -> bool {
    match out.entry(name) {
        Err(_) => {
            v.problem(format!("tensor {name} is missing from the output"));
            false
        }
        Ok(e) if e.ty != ty || e.shape != shape => {
            v.problem(format!("tensor {name} is {} {:?} in the output; {ty} {shape:?} expected", e.ty, e.shape));
            false
        }
        Ok(_) => true,
    }
}

/// Output tensors the recomputation does not make.
fn extra_tensors<'a>(v: &mut Verification, out: &TensorSource, expected: impl Iterator<Item = &'a str>) {
    let expected: std::collections::HashSet<&str> = expected.collect();
    for e in out.tensors() {
        if !expected.contains(e.name.as_str()) {
            v.problem(format!("tensor {} is in the output but not made from the source", e.name));
        }
    }
}

/// The out-type of a converted GGUF: its `general.file_type` (what the converter records), else (or for an MXFP4
/// checkpoint's conversion) the type of its largest 2-D tensor.
fn gguf_out_type(out: &TensorSource) -> Result<OutType> {
    let file = out.location().to_string();
    let model = out.gguf().ok_or_else(|| Error::format(&file, "format", "is not GGUF"))?;
    let ftype = match model.header().get("general.file_type") {
        Some(Value::U32(n)) => Some(*n),
        Some(Value::I32(n)) => Some(*n as u32),
        _ => None,
    };
    let by_tensor = || {
        let t = out.tensors().iter().filter(|e| e.shape.len() == 2).max_by_key(|e| e.bytes)?;
        Some(match t.ty.to_string().as_str() {
            "F32" => OutType::F32,
            "F16" => OutType::F16,
            "BF16" => OutType::Bf16,
            "Q8_0" => OutType::Q8_0,
            _ => return None,
        })
    };
    match ftype {
        Some(0) => Ok(OutType::F32),
        Some(1) => Ok(OutType::F16),
        Some(7) => Ok(OutType::Q8_0),
        Some(32) => Ok(OutType::Bf16),
        // MOSTLY_MXFP4_MOE: what the converter records for a float out-type of an MXFP4 checkpoint (gpt-oss), the
        // out-type then being its 2-D tensors' type.
        Some(38) => by_tensor().filter(|o| *o != OutType::Q8_0).ok_or_else(|| {
            Error::format(
                &file,
                "general.file_type",
                "is 38 (MXFP4_MOE) but its largest 2-D tensor is not F32, F16 or BF16: not a conversion of an MXFP4 \
                 checkpoint, so a llama-quantize output, checked by quantizing again (`quantfarm quantize`)",
            )
        }),
        None => by_tensor().ok_or_else(|| Error::format(&file, "general.file_type", "missing, and no 2-D tensor says")),
        Some(n) => Err(Error::format(
            &file,
            "general.file_type",
            format!(
                "is {n}, not a conversion's out-type (F32, F16, BF16, Q8_0): a llama-quantize output is checked by \
                 quantizing again (`quantfarm quantize`, the farm's verify task) and comparing sha256"
            ),
        )),
    }
}

/// HF or MLX checkpoint `src` → GGUF `out` (one file or a split): every tensor and every metadata key as
/// `quantfarm convert` (and `convert_hf_to_gguf.py`) writes them.
pub async fn verify_gguf_conversion(src: &TensorSource, out: &TensorSource, budget: u64) -> Result<Verification> {
    let outtype = gguf_out_type(out)?;
    let header = out.gguf().map(|m| m.header().metadata.clone()).unwrap_or_default();
    // A conversion that kept multi-token-prediction blocks says how many; one without the key left them out
    // (`--no-mtp`), or the checkpoint has none.
    let mtp = match header.iter().any(|(k, _)| k.ends_with(".nextn_predict_layers")) {
        true => convert::Mtp::Keep,
        false => convert::Mtp::Drop,
    };
    let plan: GgufPlan = convert::plan_hf_to_gguf_with(src, convert::ConvertOptions { out: outtype, mtp }).await?;
    let mut v = Verification::new(format!("{} -> GGUF ({})", src.format().name(), outtype.name()));
    let actual: Vec<&(String, Value)> = header.iter().filter(|(k, _)| !k.starts_with("split.")).collect();
    for (key, want) in &plan.metadata {
        match actual.iter().find(|(k, _)| k == key) {
            None => v.problem(format!("metadata key {key} is missing")),
            Some((_, got)) if got != want => v.problem(format!("metadata key {key} {}", difference(got, want))),
            Some(_) => {}
        }
    }
    for (k, _) in &actual {
        if !plan.metadata.iter().any(|(key, _)| key == k) {
            v.problem(format!("metadata key {k} is in the output but not made from the source"));
        }
    }
    v.checked.push(format!("{} metadata keys", plan.metadata.len()));
    let mut bufs = convert::write::Bufs::default();
    for t in &plan.tensors {
        let shape: Vec<u64> = t.ne.iter().rev().copied().collect();
        if !same_layout(&mut v, out, &t.name, TensorType::Ggml(t.ty), &shape) {
            continue;
        }
        let mut c = Compare::new(out, &t.name)?;
        if t.values.is_some() && t.ty == crate::GgmlType::F32 {
            c = c.within_one_ulp();
        }
        convert::write::write_tensor(src, t, budget, &mut bufs, &mut c).await?;
        v.push(&t.name, &t.source, c.verdict());
    }
    extra_tensors(&mut v, out, plan.tensors.iter().map(|t| t.name.as_str()));
    Ok(v)
}

/// The float dtype most of an output's 2-D tensors have.
fn dominant_dtype(out: &TensorSource) -> Option<Dtype> {
    let mut count: Vec<(Dtype, usize)> = Vec::new();
    for e in out.tensors().iter().filter(|e| e.shape.len() == 2) {
        if let TensorType::Dtype(d @ (Dtype::BF16 | Dtype::F16 | Dtype::F32)) = e.ty {
            match count.iter_mut().find(|(c, _)| *c == d) {
                Some((_, n)) => *n += 1,
                None => count.push((d, 1)),
            }
        }
    }
    count.into_iter().max_by_key(|(_, n)| *n).map(|(d, _)| d)
}

/// GGUF or MLX `src` → HF checkpoint folder `out`: every tensor (dequantized, unpermuted, offset removed),
/// config.json and the rebuilt (GGUF) or carried (MLX) tokenizer files.
pub async fn verify_hf_conversion(src: &TensorSource, out: &TensorSource, budget: u64) -> Result<Verification> {
    let file = out.location().to_string();
    let dtype = dominant_dtype(out).ok_or_else(|| Error::format(&file, "tensors", "no BF16, F16 or F32 matrix"))?;
    let plan: HfPlan = match src.format() {
        Format::Mlx => convert::plan_mlx_to_hf(src)?,
        _ => {
            // An unquantized MLX output reads as an HF checkpoint; its model_type tells which plan made it.
            let hf = convert::plan_gguf_to_hf(src, dtype).await;
            let model_type = out.metadata().get("model_type").cloned();
            match hf {
                Ok(p) if p.config.get("model_type").cloned() == model_type => p,
                hf => match convert::plan_gguf_to_mlx(src, dtype).await {
                    Ok(p) if p.config.get("model_type").cloned() == model_type => p,
                    _ => hf?,
                },
            }
        }
    };
    let mut v = Verification::new(format!("{} -> HF ({dtype})", src.format().name()));
    compare_json_object(&mut v, "config.json", &plan.config, &out.metadata());
    for (name, want) in &plan.json_files {
        compare_json_file(&mut v, out.location(), name, want).await;
    }
    for (name, want) in &plan.binary_files {
        compare_binary_file(&mut v, out.location(), name, want).await;
    }
    if !plan.carried.is_empty() {
        compare_carried(&mut v, src.location(), out.location(), &plan.carried).await;
    }
    for t in &plan.tensors {
        if !same_layout(&mut v, out, &t.name, TensorType::Dtype(t.dtype), &t.shape) {
            continue;
        }
        let mut c = Compare::new(out, &t.name)?;
        convert::write_hf_tensor(src, t, budget, &mut c).await?;
        v.push(&t.name, &t.source, c.verdict());
    }
    extra_tensors(&mut v, out, plan.tensors.iter().map(|t| t.name.as_str()));
    Ok(v)
}

/// Each key of `want` in `got` with an equal value (numbers compared as numbers), and no other key.
pub fn compare_json_object(
    v: &mut Verification,
    what: &str,
    want: &serde_json::Map<String, serde_json::Value>,
    got: &serde_json::Map<String, serde_json::Value>,
) {
    let before = v.problems.len();
    for (k, w) in want {
        match got.get(k) {
            None => v.problem(format!("{what}: key {k} is missing")),
            Some(g) if !json_eq(g, w) => v.problem(format!("{what}: {k} is {g}; {w} expected")),
            Some(_) => {}
        }
    }
    for k in got.keys().filter(|k| !want.contains_key(*k)) {
        v.problem(format!("{what}: key {k} is not made from the source"));
    }
    if v.problems.len() == before {
        v.checked.push(format!("{what} ({} keys)", want.len()));
    }
}

fn json_eq(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value as J;
    match (a, b) {
        (J::Number(x), J::Number(y)) => x.as_f64() == y.as_f64(),
        (J::Array(x), J::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b)),
        (J::Object(x), J::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, a)| y.get(k).is_some_and(|b| json_eq(a, b)))
        }
        _ => a == b,
    }
}

/// The JSON file `name` in folder `dir` equals `want` as JSON.
pub async fn compare_json_file(v: &mut Verification, dir: &Location, name: &str, want: &serde_json::Value) {
    let got = match read_file(dir, name).await {
        Ok(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes),
        Err(e) => return v.problem(format!("{name}: {e}")),
    };
    match got {
        Ok(g) if json_eq(&g, want) => v.checked.push(name.to_string()),
        Ok(_) => v.problem(format!("{name} differs from the one rebuilt from the source")),
        Err(e) => v.problem(format!("{name}: not JSON: {e}")),
    }
}

/// Folder `dir`'s file `name` holds exactly `want` (a rebuilt binary file: a SentencePiece tokenizer.model).
pub async fn compare_binary_file(v: &mut Verification, dir: &Location, name: &str, want: &[u8]) {
    match read_file(dir, name).await {
        Ok(bytes) if bytes == want => v.checked.push(name.to_string()),
        Ok(_) => v.problem(format!("{name} differs from the one rebuilt from the source")),
        Err(e) => v.problem(format!("{name}: {e}")),
    }
}

/// Each of the files `names` that folder `src` has, folder `out` has with the same bytes (files a conversion
/// carries over as they are: tokenizer, generation config).
pub async fn compare_carried(v: &mut Verification, src: &Location, out: &Location, names: &[impl AsRef<str>]) {
    let present = src.list().await.unwrap_or_default();
    for name in names.iter().map(AsRef::as_ref).filter(|n| present.iter().any(|p| p == n)) {
        match (read_file(src, name).await, read_file(out, name).await) {
            (Ok(a), Ok(b)) if a == b => v.checked.push(name.to_string()),
            (Ok(_), Ok(_)) => v.problem(format!("{name} differs from the source's")),
            (_, Err(e)) => v.problem(format!("{name}: {e}")),
            (Err(e), _) => v.problem(format!("{name} of the source: {e}")),
        }
    }
}

async fn read_file(dir: &Location, name: &str) -> Result<Vec<u8>> {
    let blob = quantfarm_store::Blob::open(&dir.child(name)?).await?;
    blob.read_vec(0, blob.len()).await.map_err(Into::into)
}

/// HF base + adapter → merged checkpoint `out`: every tensor recomputed (copied, or merged in f64 and rounded
/// once), in the base's files, and every side file (config.json, tokenizer files, index) byte for byte.
pub async fn verify_merge(
    base: &Location,
    adapter: &Location,
    out_dir: &Location,
    opts: &MergeOptions,
) -> Result<Verification> {
    let plan = plan_merge(base, adapter, opts).await?;
    let out = TensorSource::open(out_dir).await?;
    if out.format() != Format::Safetensors {
        return Err(Error::format(out_dir.to_string(), "format", "is not an HF safetensors checkpoint"));
    }
    let mut v = Verification::new(format!("merge of a {} adapter", plan.format().name()));
    let files = out.safetensors().map(|m| m.files.iter().map(|(b, _)| b.name().to_string()).collect::<Vec<_>>());
    let files = files.unwrap_or_default();
    let mut names = Vec::new();
    for (i, file) in plan.file_names().into_iter().enumerate() {
        let wanted: Vec<(&str, Dtype, &[u64], bool)> = plan.tensors(i).collect();
        for (k, (name, dtype, shape, changed)) in wanted.into_iter().enumerate() {
            names.push(name.to_string());
            if !same_layout(&mut v, &out, name, TensorType::Dtype(dtype), shape) {
                continue;
            }
            let in_file = out.safetensors().and_then(|m| m.find(name)).map(|(f, _)| files[f].as_str());
            if !in_file.is_some_and(|f| f.ends_with(file)) {
                v.problem(format!("tensor {name} is in {}; the merge writes it to {file}", in_file.unwrap_or("?")));
            }
            let mut c = Compare::new(&out, name)?;
            plan.tensor_bytes(i, k, opts.budget, &mut c).await?;
            let source = if changed { "base + adapter" } else { "base" };
            v.push(name, source, c.verdict());
        }
    }
    extra_tensors(&mut v, &out, names.iter().map(String::as_str));
    for (name, want) in plan.side_files().await? {
        match read_file(out_dir, &name).await {
            Ok(got) if got == want => v.checked.push(name),
            Ok(_) => v.problem(format!("{name} differs from the merge's")),
            Err(e) => v.problem(format!("{name}: {e}")),
        }
    }
    Ok(v)
}

/// How a metadata value differs from the expected one: arrays by length or first differing item, scalars as
/// they are.
fn difference(got: &Value, want: &Value) -> String {
    let brief = |j: &serde_json::Value| {
        let s = j.to_string();
        if s.chars().count() > 80 {
            format!("{}... ({} chars)", s.chars().take(60).collect::<String>(), s.chars().count())
        } else {
            s
        }
    };
    match (got.to_json(), want.to_json()) {
        (serde_json::Value::Array(g), serde_json::Value::Array(w)) if g.len() != w.len() => {
            format!("has {} items; {} expected", g.len(), w.len())
        }
        (serde_json::Value::Array(g), serde_json::Value::Array(w)) => {
            match g.iter().zip(&w).position(|(a, b)| a != b) {
                Some(i) => format!("item {i} is {}; {} expected", brief(&g[i]), brief(&w[i])),
                None => "differs in its item type".to_string(),
            }
        }
        (g, w) => format!("is {}; {} expected", brief(&g), brief(&w)),
    }
}
