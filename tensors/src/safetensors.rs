//! safetensors: single files and sharded checkpoints (`model.safetensors.index.json`), read header-first with
//! ranged reads, and written (sharded, with an index) through the staged sink.
//!
//! Format: u64 LE header length N, N bytes of JSON (`{"__metadata__": {str: str}, NAME: {"dtype", "shape",
//! "data_offsets": [begin, end]}}`, offsets relative to the byte after the header), then the data. Checks are
//! those of the `safetensors` crate's `Metadata::validate`, made into errors naming the file and tensor.

use std::collections::BTreeMap;

use serde_json::{Map, Value as Json};

use crate::dtype::Dtype;
use crate::error::{Error, Result};
use quantfarm_store::Blob;
use quantfarm_store::Location;
use quantfarm_store::{Committed, StagedSink};

/// The safetensors crate's limit on the header's size.
pub const MAX_HEADER_LEN: u64 = 100_000_000;
pub const INDEX_FILE: &str = "model.safetensors.index.json";

#[derive(Clone, Debug, PartialEq)]
pub struct StTensor {
    pub name: String,
    pub dtype: Dtype,
    /// Outermost dimension first (numpy order).
    pub shape: Vec<u64>,
    /// Offsets relative to the data start.
    pub begin: u64,
    pub end: u64,
}

impl StTensor {
    pub fn nbytes(&self) -> u64 {
        self.end - self.begin
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct StHeader {
    /// `__metadata__`, in file order.
    pub metadata: Vec<(String, String)>,
    /// Tensors in data order.
    pub tensors: Vec<StTensor>,
    /// Absolute offset of the data (8 + N).
    pub data_offset: u64,
}

impl StHeader {
    pub async fn read(blob: &Blob) -> Result<StHeader> {
        let file = blob.name();
        let mut len = [0u8; 8];
        if blob.len() >= 8 {
            blob.read_at(0, &mut len).await?;
        }
        let n = header_len(&len, blob.len(), file)?;
        let json = blob.read_vec(8, n).await?;
        StHeader::parse(&json, blob.len(), file)
    }

    /// Parses the header of a whole file held in memory.
    pub fn parse_file(bytes: &[u8], file: &str) -> Result<StHeader> {
        let n = header_len(bytes.get(..8).unwrap_or(&[]), bytes.len() as u64, file)?;
        StHeader::parse(&bytes[8..8 + n as usize], bytes.len() as u64, file)
    }

    /// Parses the JSON header `json` of a file of `file_len` bytes.
    pub fn parse(json: &[u8], file_len: u64, file: &str) -> Result<StHeader> {
        let data_offset = 8 + json.len() as u64;
        let data_len = file_len
            .checked_sub(data_offset)
            .ok_or_else(|| Error::format(file, "header length", "past the end of the file"))?;
        let text = std::str::from_utf8(json).map_err(|e| Error::format(file, "header", format!("not UTF-8: {e}")))?;
        let root: Map<String, Json> = serde_json::from_str(text.trim_end_matches(' '))
            .map_err(|e| Error::format(file, "header", format!("not a JSON object: {e}")))?;
        let mut metadata = Vec::new();
        let mut tensors = Vec::with_capacity(root.len());
        for (name, v) in root {
            if name == "__metadata__" {
                let obj = v.as_object().ok_or_else(|| Error::format(file, "__metadata__", "is not an object"))?;
                for (k, v) in obj {
                    let s = v
                        .as_str()
                        .ok_or_else(|| Error::format(file, format!("__metadata__.{k}"), "is not a string"))?;
                    metadata.push((k.clone(), s.to_string()));
                }
                continue;
            }
            tensors.push(parse_tensor(&name, &v, data_len, file)?);
        }
        tensors.sort_by_key(|t| (t.begin, t.end));
        for w in tensors.windows(2) {
            if w[1].begin < w[0].end {
                return Err(Error::format(
                    file,
                    format!("{}.data_offsets", w[1].name),
                    format!(
                        "[{}, {}] overlaps tensor {:?} [{}, {}]",
                        w[1].begin, w[1].end, w[0].name, w[0].begin, w[0].end
                    ),
                ));
            }
        }
        Ok(StHeader { metadata, tensors, data_offset })
    }
}

fn parse_tensor(name: &str, v: &Json, data_len: u64, file: &str) -> Result<StTensor> {
    let field = |f: &str| format!("{name}.{f}");
    let obj = v.as_object().ok_or_else(|| Error::format(file, name, "tensor entry is not an object"))?;
    for k in obj.keys() {
        if !matches!(k.as_str(), "dtype" | "shape" | "data_offsets") {
            return Err(Error::format(file, field(k), "unknown field"));
        }
    }
    let dtype_s = obj
        .get("dtype")
        .and_then(Json::as_str)
        .ok_or_else(|| Error::format(file, field("dtype"), "missing or not a string"))?;
    let dtype = Dtype::from_name(dtype_s)
        .ok_or_else(|| Error::format(file, field("dtype"), format!("unknown dtype {dtype_s:?}")))?;
    let shape: Vec<u64> = obj
        .get("shape")
        .and_then(Json::as_array)
        .ok_or_else(|| Error::format(file, field("shape"), "missing or not an array"))?
        .iter()
        .map(|d| {
            d.as_u64().ok_or_else(|| Error::format(file, field("shape"), format!("{d} is not a non-negative integer")))
        })
        .collect::<Result<_>>()?;
    let offs = obj
        .get("data_offsets")
        .and_then(Json::as_array)
        .filter(|a| a.len() == 2)
        .ok_or_else(|| Error::format(file, field("data_offsets"), "missing or not [begin, end]"))?;
    let (begin, end) = match (offs[0].as_u64(), offs[1].as_u64()) {
        (Some(b), Some(e)) if b <= e => (b, e),
        _ => {
            return Err(Error::format(
                file,
                field("data_offsets"),
                format!("{offs:?} is not [begin, end] with begin <= end"),
            ))
        }
    };
    // The non-zero dimensions' product must fit (so any partial product does, in any order), then the size.
    let nonzero = shape.iter().try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d.max(1)));
    if nonzero.is_none_or(|n| n > i64::MAX as u64) {
        return Err(Error::format(file, field("shape"), format!("{shape:?} overflows")));
    }
    let nbytes: u64 = shape.iter().product::<u64>() * dtype.size() as u64;
    if end - begin != nbytes {
        return Err(Error::format(
            file,
            field("data_offsets"),
            format!("[{begin}, {end}] spans {} bytes, but {dtype} {shape:?} needs {nbytes}", end - begin),
        ));
    }
    if end > data_len {
        return Err(Error::format(
            file,
            field("data_offsets"),
            format!("end {end} is past the data's end ({data_len} bytes)"),
        ));
    }
    Ok(StTensor { name: name.to_string(), dtype, shape, begin, end })
}

/// The header's length from the file's first 8 bytes, checked against the file's size and the crate's limit.
fn header_len(first8: &[u8], file_len: u64, file: &str) -> Result<u64> {
    if file_len < 8 || first8.len() < 8 {
        return Err(Error::format(
            file,
            "header length",
            format!("the file is {file_len} bytes, shorter than the 8-byte length"),
        ));
    }
    let n = u64::from_le_bytes(first8[..8].try_into().expect("8 bytes"));
    if n > file_len - 8 || n > MAX_HEADER_LEN {
        return Err(Error::format(
            file,
            "header length",
            format!(
                "{n} bytes, but the file has {} after the length (and the limit is {MAX_HEADER_LEN})",
                file_len - 8
            ),
        ));
    }
    Ok(n)
}

/// A safetensors checkpoint: one file or the shards named by an index (or, without one, every `*.safetensors`
/// file of a folder).
pub struct SafetensorsModel {
    pub files: Vec<(Blob, StHeader)>,
    /// The index's `metadata`, if there was an index.
    pub index_metadata: Option<Json>,
}

impl SafetensorsModel {
    /// Opens a `.safetensors` file, or a folder (with or without `model.safetensors.index.json`). `only_prefix`
    /// limits an index-less folder to files whose names start with it (`model` for MLX, as mlx-lm globs).
    pub async fn open(loc: &Location, only_prefix: Option<&str>) -> Result<SafetensorsModel> {
        if !loc.is_dir().await? {
            let blob = Blob::open(loc).await?;
            let h = StHeader::read(&blob).await?;
            return Ok(SafetensorsModel { files: vec![(blob, h)], index_metadata: None });
        }
        let names = loc.list().await?;
        if names.iter().any(|n| n == INDEX_FILE) {
            return Self::open_index(loc).await;
        }
        let mut files = Vec::new();
        for n in names.iter().filter(|n| n.ends_with(".safetensors") && only_prefix.is_none_or(|p| n.starts_with(p))) {
            let blob = Blob::open(&loc.child(n)?).await?;
            let h = StHeader::read(&blob).await?;
            files.push((blob, h));
        }
        if files.is_empty() {
            return Err(Error::NoModel {
                location: loc.to_string(),
                msg: "no .safetensors files in this folder".into(),
            });
        }
        let model = SafetensorsModel { files, index_metadata: None };
        model.check_unique()?;
        Ok(model)
    }

    async fn open_index(dir: &Location) -> Result<SafetensorsModel> {
        let index_loc = dir.child(INDEX_FILE)?;
        let blob = Blob::open(&index_loc).await?;
        let bytes = blob.read_vec(0, blob.len()).await?;
        let file = blob.name();
        let root: Json =
            serde_json::from_slice(&bytes).map_err(|e| Error::format(file, "index", format!("not JSON: {e}")))?;
        let map = root
            .get("weight_map")
            .and_then(Json::as_object)
            .ok_or_else(|| Error::format(file, "weight_map", "missing or not an object"))?;
        let mut by_file: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (tensor, f) in map {
            let f = f.as_str().ok_or_else(|| Error::format(file, format!("weight_map.{tensor}"), "is not a string"))?;
            by_file.entry(f.to_string()).or_default().push(tensor.clone());
        }
        let mut files = Vec::with_capacity(by_file.len());
        for (f, tensors) in &by_file {
            let blob = Blob::open(&dir.child(f)?).await?;
            let h = StHeader::read(&blob).await?;
            for t in tensors {
                if !h.tensors.iter().any(|x| &x.name == t) {
                    return Err(Error::format(
                        file,
                        format!("weight_map.{t}"),
                        format!("names {f}, which has no such tensor"),
                    ));
                }
            }
            if let Some(extra) = h.tensors.iter().find(|x| map.get(&x.name).and_then(Json::as_str) != Some(f.as_str()))
            {
                return Err(Error::format(file, "weight_map", format!("does not map tensor {:?} of {f}", extra.name)));
            }
            files.push((blob, h));
        }
        let model = SafetensorsModel { files, index_metadata: root.get("metadata").cloned() };
        model.check_unique()?;
        Ok(model)
    }

    fn check_unique(&self) -> Result<()> {
        let mut seen = std::collections::HashMap::new();
        for (b, h) in &self.files {
            for t in &h.tensors {
                if let Some(other) = seen.insert(t.name.as_str(), b.name()) {
                    return Err(Error::format(b.name(), &t.name, format!("also appears in {other}")));
                }
            }
        }
        Ok(())
    }

    pub fn tensors(&self) -> impl Iterator<Item = (usize, &StTensor)> {
        self.files.iter().enumerate().flat_map(|(i, (_, h))| h.tensors.iter().map(move |t| (i, t)))
    }

    pub fn find(&self, name: &str) -> Option<(usize, &StTensor)> {
        self.tensors().find(|(_, t)| t.name == name)
    }
}

/// A tensor to write: name, dtype and numpy shape; its bytes come later, in the same order.
#[derive(Clone, Debug)]
pub struct StTensorDesc {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
}

impl StTensorDesc {
    pub fn nbytes(&self) -> u64 {
        self.shape.iter().product::<u64>() * self.dtype.size() as u64
    }
}

/// Encodes a header for `tensors` stored back to back in the given order: the JSON, space-padded to a multiple of
/// 8 bytes as the safetensors crate does, preceded by its length.
pub fn encode_header(tensors: &[StTensorDesc], metadata: &[(String, String)]) -> Vec<u8> {
    let mut root = Map::new();
    if !metadata.is_empty() {
        let m: Map<String, Json> = metadata.iter().map(|(k, v)| (k.clone(), Json::String(v.clone()))).collect();
        root.insert("__metadata__".into(), Json::Object(m));
    }
    let mut off = 0u64;
    for t in tensors {
        let n = t.nbytes();
        let mut e = Map::new();
        e.insert("dtype".into(), Json::String(t.dtype.name().into()));
        e.insert("shape".into(), Json::Array(t.shape.iter().map(|&d| d.into()).collect()));
        e.insert("data_offsets".into(), Json::Array(vec![off.into(), (off + n).into()]));
        root.insert(t.name.clone(), Json::Object(e));
        off += n;
    }
    let mut json = serde_json::to_vec(&Json::Object(root)).expect("a JSON map serializes");
    json.resize(json.len().div_ceil(8) * 8, b' ');
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out
}

/// Splits `tensors` (in order) into shards of at most `max_shard_bytes` of data each (a larger tensor gets a shard
/// of its own), as `save_model`/`save_pretrained` do.
pub fn plan_shards(tensors: &[StTensorDesc], max_shard_bytes: u64) -> Vec<std::ops::Range<usize>> {
    let mut shards = Vec::new();
    let (mut start, mut size) = (0usize, 0u64);
    for (i, t) in tensors.iter().enumerate() {
        let n = t.nbytes();
        if i > start && size + n > max_shard_bytes {
            shards.push(start..i);
            start = i;
            size = 0;
        }
        size += n;
    }
    if start < tensors.len() || tensors.is_empty() {
        shards.push(start..tensors.len());
    }
    shards
}

/// The file name of shard `i` (0-based) of `n`: `model.safetensors` alone, else `model-0000I-of-0000N.safetensors`.
pub fn shard_file_name(i: usize, n: usize) -> String {
    if n == 1 {
        "model.safetensors".to_string()
    } else {
        format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
    }
}

/// Writes `model.safetensors.index.json` for the planned shards.
pub async fn write_index(
    dir: &Location,
    tensors: &[StTensorDesc],
    shards: &[std::ops::Range<usize>],
    overwrite: bool,
) -> Result<Committed> {
    let mut weight_map = BTreeMap::new();
    for (i, r) in shards.iter().enumerate() {
        for t in &tensors[r.clone()] {
            weight_map.insert(t.name.clone(), shard_file_name(i, shards.len()));
        }
    }
    let total: u64 = tensors.iter().map(StTensorDesc::nbytes).sum();
    let index = serde_json::json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
    let text = serde_json::to_string_pretty(&index).expect("JSON serializes");
    let mut sink = StagedSink::create(&dir.child(INDEX_FILE)?, overwrite).await?;
    sink.write(text.as_bytes()).await?;
    sink.write(b"\n").await?;
    sink.commit().await.map_err(Into::into)
}
