//! Importance matrices as llama-quantize reads them: the GGUF imatrix `llama-imatrix` writes by default
//! (`<weight>.in_sum2` / `<weight>.counts` tensors) and the legacy `.dat` format, from any [`Location`].
//!
//! The values kept are the ones llama-quantize hands to the quantizers: `tools/quantize/quantize.cpp::load_imatrix`
//! applied to what `common/imatrix-loader.cpp::common_imatrix_load` read (llama.cpp 0c1e570).
//! GGUF: `w[j·ne0 + i] = in_sum2[j·ne0 + i] / (float)lround(counts[j])`, or 1 where the count is 0 (per expert `j`).
//! Legacy: `w[i] = value[i] / (float)ncall` when `ncall > 0`, else the value as stored.
//!
//! Stricter than llama.cpp, on purpose: sizes that do not divide, negative or non-finite sums and counts, and
//! truncated files are refused with the file and entry named, where llama.cpp would read garbage or abort later
//! ("imatrix contains non-finite value").
//!
//! [`sums`] holds the statistics before that division: what a farm collects, merges and writes.

pub mod sums;

use std::collections::{BTreeMap, HashMap};

use quantfarm_store::Blob;
use quantfarm_store::Location;
use quantfarm_tensors::gguf::{Array, GgufHeader, Value};
use quantfarm_tensors::GgmlType;

/// `LLM_KV_IMATRIX_*` (`common/imatrix-loader.h`).
pub const KEY_DATASETS: &str = "imatrix.datasets";
pub const KEY_CHUNK_COUNT: &str = "imatrix.chunk_count";
pub const KEY_CHUNK_SIZE: &str = "imatrix.chunk_size";

/// `LLM_KV_QUANTIZE_IMATRIX_*` (`tools/quantize/quantize.cpp`): what llama-quantize records about the imatrix.
pub const KEY_QUANTIZE_FILE: &str = "quantize.imatrix.file";
pub const KEY_QUANTIZE_DATASET: &str = "quantize.imatrix.dataset";
pub const KEY_QUANTIZE_ENTRIES: &str = "quantize.imatrix.entries_count";
pub const KEY_QUANTIZE_CHUNKS: &str = "quantize.imatrix.chunks_count";

const SUFFIX_SUMS: &str = ".in_sum2";
const SUFFIX_COUNTS: &str = ".counts";

/// llama-quantize copies the strings it records with `strncpy(…, 127)`.
const KV_STRING_MAX: usize = 127;

#[derive(Debug, thiserror::Error)]
pub enum ImatrixError {
    /// Reading the file, or its GGUF header (these errors name the file themselves).
    #[error(transparent)]
    Tensors(#[from] quantfarm_tensors::Error),
    #[error("imatrix {file}: {msg}")]
    File { file: String, msg: String },
    #[error("imatrix {file}: entry {entry:?}: {msg}")]
    Entry { file: String, entry: String, msg: String },
}

/// A store error (a missing object, a dropped connection) is a tensors error about that file.
impl From<quantfarm_store::Error> for ImatrixError {
    fn from(e: quantfarm_store::Error) -> ImatrixError {
        ImatrixError::Tensors(e.into())
    }
}

/// A loaded importance matrix: per weight name, one importance value per column (× experts), ready to pass to
/// [`crate::quantize`].
#[derive(Clone, Debug, PartialEq)]
pub struct Imatrix {
    /// Weight name → `ne0 · n_expert` values, expert-major (llama-quantize's `imatrix_data`).
    pub entries: HashMap<String, Vec<f32>>,
    /// `imatrix.datasets` (legacy: the trailer's file name, if any).
    pub datasets: Vec<String>,
    /// `imatrix.chunk_count` (legacy: the trailer's chunk count; 0 if absent or negative).
    pub chunk_count: u32,
    /// `imatrix.chunk_size` (0 for legacy files, which do not record it).
    pub chunk_size: u32,
    /// Whether the file was in the legacy `.dat` format.
    pub legacy: bool,
    /// The name recorded as `quantize.imatrix.file`: llama-quantize records the `--imatrix` argument exactly as
    /// given. [`Imatrix::load`] sets the location as written; callers that know the user's spelling set it.
    pub file: String,
}

impl Imatrix {
    /// Reads the imatrix at `loc` (whole: an imatrix is a few values per weight column).
    pub async fn load(loc: &Location) -> Result<Imatrix, ImatrixError> {
        let blob = Blob::open(loc).await?;
        let bytes = blob.read_vec(0, blob.len()).await?;
        Imatrix::from_bytes(&bytes, &loc.to_string())
    }

    /// Parses a whole imatrix file named `file`: GGUF when it starts with the GGUF magic, else legacy `.dat`
    /// (`common_imatrix_load` tries GGUF first and falls back to the legacy reader).
    pub fn from_bytes(bytes: &[u8], file: &str) -> Result<Imatrix, ImatrixError> {
        if bytes.starts_with(b"GGUF") {
            let (header, data) = gguf_parts(bytes, file)?;
            from_gguf(&header, data, file)
        } else {
            from_legacy(bytes, file)
        }
    }

    /// The importance values for weight `name`, if the imatrix has an entry for it.
    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.entries.get(name).map(Vec::as_slice)
    }

    /// The keys llama-quantize appends when given an imatrix, in its order (the kv overrides of
    /// `tools/quantize/quantize.cpp::llama_quantize`): the file name and first dataset truncated to 127 bytes, the
    /// counts as UINT32 (`abs` of the INT override); the dataset only if there is one, the chunk count only if
    /// positive.
    pub fn quantize_metadata(&self) -> Vec<(String, Value)> {
        let string = |s: &str| {
            let b = s.as_bytes();
            Value::String(quantfarm_tensors::gguf::GgufStr(b[..b.len().min(KV_STRING_MAX)].to_vec()))
        };
        let mut out = vec![(KEY_QUANTIZE_FILE.to_string(), string(&self.file))];
        if let Some(d) = self.datasets.first() {
            out.push((KEY_QUANTIZE_DATASET.to_string(), string(d)));
        }
        out.push((KEY_QUANTIZE_ENTRIES.to_string(), Value::U32(self.entries.len() as u32)));
        // `m_last_call` is an int32 in llama-quantize; only a positive one is recorded.
        if i32::try_from(self.chunk_count).is_ok_and(|c| c > 0) {
            out.push((KEY_QUANTIZE_CHUNKS.to_string(), Value::U32(self.chunk_count)));
        }
        out
    }
}

/// A GGUF file's header and its data section.
fn gguf_parts<'a>(bytes: &'a [u8], file: &str) -> Result<(GgufHeader, &'a [u8]), ImatrixError> {
    let header = GgufHeader::parse(bytes, bytes.len() as u64, file)?;
    let data = usize::try_from(header.data_offset)
        .ok()
        .and_then(|o| bytes.get(o..))
        .ok_or_else(|| file_err(file, "the data section starts past the end of the file (truncated?)"))?;
    Ok((header, data))
}

fn file_err(file: &str, msg: impl Into<String>) -> ImatrixError {
    ImatrixError::File { file: file.to_string(), msg: msg.into() }
}

fn entry_err(file: &str, entry: &str, msg: impl Into<String>) -> ImatrixError {
    ImatrixError::Entry { file: file.to_string(), entry: entry.to_string(), msg: msg.into() }
}

/// `common_imatrix_load` (GGUF branch) followed by `load_imatrix`'s per-expert normalisation. `data` is the
/// whole data section.
fn from_gguf(h: &GgufHeader, data: &[u8], file: &str) -> Result<Imatrix, ImatrixError> {
    if h.tensors.is_empty() {
        return Err(file_err(file, "no data (the file has no tensors)"));
    }
    // llama-quantize: "missing imatrix metadata" unless all three keys are present.
    for key in [KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE] {
        if h.get(key).is_none() {
            return Err(file_err(file, format!("missing imatrix metadata {key}")));
        }
    }
    // `gguf_get_val_u32` asserts the type.
    let u32_key = |key: &str| match h.get(key) {
        Some(Value::U32(v)) => Ok(*v),
        Some(v) => Err(file_err(file, format!("metadata {key} is {}, expected UINT32", v.value_type().name()))),
        None => Err(file_err(file, format!("missing imatrix metadata {key}"))),
    };
    let chunk_count = u32_key(KEY_CHUNK_COUNT)?;
    let chunk_size = u32_key(KEY_CHUNK_SIZE)?;
    // Read only when it is an array of strings, as llama.cpp does.
    let datasets = match h.get(KEY_DATASETS) {
        Some(Value::Array(Array::String(v))) => v.iter().map(|s| s.to_string_lossy()).collect(),
        _ => Vec::new(),
    };

    // llama.cpp's loader passes over other tensors.
    let (pairs, _others) = pair_tensors(h);
    let read = |i: usize| -> Result<Vec<f32>, ImatrixError> {
        let t = &h.tensors[i];
        if t.ty != GgmlType::F32 {
            return Err(file_err(file, format!("tensor {:?} is {}, sums and counts must be F32", t.name, t.ty)));
        }
        let n = usize::try_from(t.elements()).map_err(|_| file_err(file, format!("tensor {:?} too large", t.name)))?;
        let start = usize::try_from(t.offset).unwrap_or(usize::MAX);
        let bytes = start
            .checked_add(n.saturating_mul(4))
            .and_then(|end| data.get(start..end))
            .ok_or_else(|| file_err(file, format!("tensor {:?} runs past the end of the file (truncated?)", t.name)))?;
        Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    };

    let mut entries = HashMap::with_capacity(pairs.len());
    for (name, (sums, counts)) in pairs {
        let (Some(sums), Some(counts)) = (sums, counts) else {
            return Err(entry_err(file, name, "mismatched sums and counts (one of .in_sum2/.counts is missing)"));
        };
        let sums = read(sums)?;
        let counts = read(counts)?;
        entries.insert(name.to_string(), normalise_gguf(name, &sums, &counts, file)?);
    }
    Ok(Imatrix { entries, datasets, chunk_count, chunk_size, legacy: false, file: file.to_string() })
}

/// Weight name → indices of its `.in_sum2` and `.counts` tensors, by name like the loader's std::map; and the
/// first tensor that is neither.
type Pairs<'h> = BTreeMap<&'h str, (Option<usize>, Option<usize>)>;

fn pair_tensors(h: &GgufHeader) -> (Pairs<'_>, Option<&str>) {
    let mut pairs = Pairs::new();
    let mut other = None;
    for (i, t) in h.tensors.iter().enumerate() {
        if let Some(name) = t.name.strip_suffix(SUFFIX_SUMS) {
            pairs.entry(name).or_default().0 = Some(i);
        } else if let Some(name) = t.name.strip_suffix(SUFFIX_COUNTS) {
            pairs.entry(name).or_default().1 = Some(i);
        } else {
            other = other.or(Some(t.name.as_str()));
        }
    }
    (pairs, other)
}

/// `load_imatrix`, GGUF branch: the mean of x² per column, per expert; 1 for an expert that saw no tokens.
fn normalise_gguf(name: &str, sums: &[f32], counts: &[f32], file: &str) -> Result<Vec<f32>, ImatrixError> {
    if counts.is_empty() || sums.is_empty() || !sums.len().is_multiple_of(counts.len()) {
        return Err(entry_err(
            file,
            name,
            format!("{} sums are not a whole number of columns for {} counts", sums.len(), counts.len()),
        ));
    }
    check_values(name, "count", counts, file)?;
    check_values(name, "sum", sums, file)?;
    let ne0 = sums.len() / counts.len();
    let mut w = Vec::with_capacity(sums.len());
    for (j, &c) in counts.iter().enumerate() {
        // `std::lround` (half away from zero, like `f32::round`), stored as int64, divided as float.
        let count = c.round() as i64 as f32;
        let col = &sums[j * ne0..(j + 1) * ne0];
        if count > 0.0 {
            w.extend(col.iter().map(|&s| s / count));
        } else {
            w.extend(std::iter::repeat_n(1.0f32, ne0));
        }
    }
    check_values(name, "importance", &w, file)?;
    Ok(w)
}

/// Sums of squares and token counts are finite and non-negative in any file llama-imatrix writes.
fn check_values(name: &str, what: &str, v: &[f32], file: &str) -> Result<(), ImatrixError> {
    match v.iter().position(|x| !x.is_finite() || *x < 0.0) {
        Some(i) => Err(entry_err(file, name, format!("{what} {i} is {} (must be finite and >= 0)", v[i]))),
        None => Ok(()),
    }
}

/// `common_imatrix_load_legacy` + `load_imatrix`'s legacy branch. Layout: i32 n_entries; per entry i32 len, name,
/// i32 ncall, i32 nval, nval f32; optional trailer i32 chunk_count, i32 len, dataset name.
fn from_legacy(bytes: &[u8], file: &str) -> Result<Imatrix, ImatrixError> {
    let mut r = Reader { bytes, pos: 0 };
    let n_entries = r.i32().ok_or_else(|| file_err(file, "no data (shorter than 4 bytes)"))?;
    if n_entries < 1 {
        return Err(file_err(file, format!("no data ({n_entries} entries); not a GGUF or legacy imatrix")));
    }
    let mut entries = HashMap::new();
    for i in 0..n_entries {
        let truncated = |what: &str| file_err(file, format!("truncated: entry {} of {n_entries}: {what}", i + 1));
        let len = r.i32().ok_or_else(|| truncated("name length"))?;
        let len = usize::try_from(len).map_err(|_| truncated(&format!("negative name length {len}")))?;
        let raw = r.take(len).ok_or_else(|| truncated(&format!("name of {len} bytes")))?;
        // The name is read into a C string: it ends at the first NUL.
        let name = String::from_utf8_lossy(raw.split(|&b| b == 0).next().unwrap_or_default()).into_owned();
        let ncall = r.i32().ok_or_else(|| entry_err(file, &name, "truncated: call count"))?;
        let nval = r.i32().ok_or_else(|| entry_err(file, &name, "truncated: value count"))?;
        if nval < 1 {
            return Err(entry_err(file, &name, format!("{nval} values")));
        }
        let raw = r
            .take((nval as usize).saturating_mul(4))
            .ok_or_else(|| entry_err(file, &name, format!("truncated: {nval} values")))?;
        let sums: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        check_values(&name, "value", &sums, file)?;
        let w: Vec<f32> = if ncall > 0 { sums.iter().map(|&s| s / ncall as f32).collect() } else { sums };
        entries.insert(name, w);
    }
    // Optional trailer. llama.cpp ignores a partial one; here it means the file was cut short.
    let mut chunk_count = 0;
    let mut datasets = Vec::new();
    if r.remaining() > 0 {
        let trailer = |what: &str| file_err(file, format!("truncated: trailer {what}"));
        let n = r.i32().ok_or_else(|| trailer("chunk count"))?;
        chunk_count = u32::try_from(n).unwrap_or(0);
        let len = r.i32().ok_or_else(|| trailer("dataset name length"))?;
        if len > 0 {
            let raw = r.take(len as usize).ok_or_else(|| trailer(&format!("dataset name of {len} bytes")))?;
            datasets.push(String::from_utf8_lossy(raw.split(|&b| b == 0).next().unwrap_or_default()).into_owned());
        }
    }
    Ok(Imatrix { entries, datasets, chunk_count, chunk_size: 0, legacy: true, file: file.to_string() })
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }

    fn i32(&mut self) -> Option<i32> {
        self.take(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn legacy_bytes(entries: &[(&str, i32, &[f32])], trailer: Option<(i32, &str)>) -> Vec<u8> {
        let mut b = (entries.len() as i32).to_le_bytes().to_vec();
        for (name, ncall, vals) in entries {
            b.extend((name.len() as i32).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend(ncall.to_le_bytes());
            b.extend((vals.len() as i32).to_le_bytes());
            vals.iter().for_each(|v| b.extend(v.to_le_bytes()));
        }
        if let Some((n, d)) = trailer {
            b.extend(n.to_le_bytes());
            b.extend((d.len() as i32).to_le_bytes());
            b.extend(d.as_bytes());
        }
        b
    }

    #[test]
    fn legacy_values_are_divided_by_ncall() {
        let b = legacy_bytes(&[("a.weight", 4, &[8.0, 2.0]), ("b.weight", 0, &[3.0])], Some((14, "gpl3.txt")));
        let im = from_legacy(&b, "x.dat").unwrap();
        assert_eq!(im.get("a.weight"), Some(&[2.0f32, 0.5][..]));
        assert_eq!(im.get("b.weight"), Some(&[3.0f32][..]));
        assert_eq!((im.chunk_count, im.datasets.as_slice()), (14, &["gpl3.txt".to_string()][..]));
        let m = im.quantize_metadata();
        let keys: Vec<&str> = m.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, [KEY_QUANTIZE_FILE, KEY_QUANTIZE_DATASET, KEY_QUANTIZE_ENTRIES, KEY_QUANTIZE_CHUNKS]);
        assert_eq!(m[2].1, Value::U32(2));
    }

    #[test]
    fn legacy_without_trailer_records_no_dataset_or_chunks() {
        let im = from_legacy(&legacy_bytes(&[("a.weight", 1, &[1.0])], None), "x.dat").unwrap();
        let keys: Vec<String> = im.quantize_metadata().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, [KEY_QUANTIZE_FILE, KEY_QUANTIZE_ENTRIES]);
    }

    #[test]
    fn legacy_errors_name_file_and_entry() {
        let b = legacy_bytes(&[("a.weight", 4, &[8.0, 2.0])], None);
        let err = from_legacy(&b[..b.len() - 2], "x.dat").unwrap_err().to_string();
        assert!(err.contains("x.dat") && err.contains("a.weight") && err.contains("truncated"), "{err}");
        let b = legacy_bytes(&[("a.weight", 4, &[f32::NAN])], None);
        let err = from_legacy(&b, "x.dat").unwrap_err().to_string();
        assert!(err.contains("a.weight") && err.contains("NaN"), "{err}");
        let b = legacy_bytes(&[("a.weight", 4, &[-1.0])], None);
        assert!(from_legacy(&b, "x.dat").is_err());
        let err = from_legacy(&[0, 0, 0, 0], "x.dat").unwrap_err().to_string();
        assert!(err.contains("x.dat") && err.contains("no data"), "{err}");
    }

    #[test]
    fn gguf_normalisation_is_per_expert_with_zero_counts_as_one() {
        let w = normalise_gguf("e", &[2.0, 4.0, 6.0, 8.0, 1.0, 1.0], &[2.0, 0.4, 3.0], "f").unwrap();
        // Expert 1's count rounds to 0: all ones.
        assert_eq!(w, [1.0, 2.0, 1.0, 1.0, 1.0 / 3.0, 1.0 / 3.0]);
        let err = normalise_gguf("e", &[1.0; 5], &[1.0, 1.0], "f").unwrap_err().to_string();
        assert!(err.contains("\"e\"") && err.contains("5 sums"), "{err}");
        assert!(normalise_gguf("e", &[1.0; 4], &[], "f").is_err());
        assert!(normalise_gguf("e", &[1.0; 4], &[f32::INFINITY], "f").is_err());
    }

    #[test]
    fn long_names_are_truncated_to_127_bytes() {
        let im = Imatrix {
            entries: HashMap::new(),
            datasets: vec!["d".repeat(200)],
            chunk_count: 0,
            chunk_size: 0,
            legacy: false,
            file: "f".repeat(300),
        };
        let m = im.quantize_metadata();
        for (_, v) in &m[..2] {
            let Value::String(s) = v else { panic!("{v:?}") };
            assert_eq!(s.0.len(), 127);
        }
        assert_eq!(m.len(), 3, "no chunk count when it is 0");
    }
}
