//! GGUF v2/v3: headers read from ranged reads, models made of one file or of `-0000N-of-0000M.gguf` splits, and a
//! writer whose layout is the canonical one both llama.cpp writers produce, so read → write gives the same bytes.

mod encode;
mod parse;
pub mod split;
pub mod value;

pub use encode::{encode_header, GgufLayout, TensorDesc};
pub use value::{Array, GgufStr, Value, ValueType};

use crate::error::{Error, Result};
use crate::GgmlType;
use quantfarm_store::Blob;
use quantfarm_store::Location;

pub const ALIGNMENT_KEY: &str = "general.alignment";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;
/// `GGML_MAX_NAME`: a tensor name must be shorter than this many bytes.
pub const MAX_NAME_LEN: usize = 64;

/// One tensor-info record.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// `ne[0..n_dims]` as stored: innermost (contiguous) dimension first, the reverse of the numpy shape.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Elements per row (`ne[0]`).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    pub fn rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    pub fn row_bytes(&self) -> u64 {
        self.row_len() / self.ty.block_size() as u64 * self.ty.type_size() as u64
    }

    pub fn nbytes(&self) -> u64 {
        self.checked_nbytes().unwrap_or(u64::MAX)
    }

    pub(crate) fn checked_nbytes(&self) -> Option<u64> {
        tensor_nbytes(self.ty, &self.dims)
    }
}

/// `ggml_nbytes`: bytes of a tensor of type `ty` and shape `ne`, or `None` when rows are not whole blocks or the
/// size overflows. The row count is formed first, so a zero dimension gives 0 however large the others are.
pub(crate) fn tensor_nbytes(ty: GgmlType, ne: &[u64]) -> Option<u64> {
    let rows = ne.iter().skip(1).try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
    ty.row_bytes(ne.first().copied().unwrap_or(1))?.checked_mul(rows)
}

/// The parsed header of one GGUF file.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufHeader {
    pub version: u32,
    /// Key/value pairs in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    pub file_len: u64,
}

impl GgufHeader {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(Value::as_str)
    }

    /// The header as it would be written: same metadata, tensors and alignment.
    pub fn layout(&self) -> Result<GgufLayout> {
        let descs: Vec<TensorDesc> =
            self.tensors.iter().map(|t| TensorDesc { name: t.name.clone(), dims: t.dims.clone(), ty: t.ty }).collect();
        encode_header(self.version, &self.metadata, &descs)
    }

    /// Reads and checks the header of the GGUF file at `blob`, with as few ranged reads as its size needs.
    pub async fn read(blob: &Blob) -> Result<GgufHeader> {
        let file_len = blob.len();
        let mut want = file_len.min(1 << 20);
        loop {
            let buf = blob.read_vec(0, want).await?;
            match parse::parse_header(&buf, file_len, blob.name())? {
                parse::Parsed::Done(h) => return Ok(h),
                parse::Parsed::NeedMore(n) => {
                    // `n` never exceeds the file length: the parser checks that first.
                    want = n.max(want.saturating_mul(2)).min(file_len);
                }
            }
        }
    }

    /// Parses a header from bytes in memory (the whole file, or at least its whole header).
    pub fn parse(bytes: &[u8], file_len: u64, name: &str) -> Result<GgufHeader> {
        match parse::parse_header(bytes, file_len, name)? {
            parse::Parsed::Done(h) => Ok(h),
            parse::Parsed::NeedMore(n) => Err(Error::format(
                name,
                "header",
                format!("continues past the {} bytes given (needs {n})", bytes.len()),
            )),
        }
    }
}

/// A tensor of a (possibly split) GGUF model: its info and which shard holds it.
#[derive(Clone, Debug)]
pub struct ModelTensor<'a> {
    pub shard: usize,
    pub info: &'a TensorInfo,
}

/// A GGUF model: one file, or all the files of a split, opened and checked as one.
pub struct GgufModel {
    pub shards: Vec<(Blob, GgufHeader)>,
}

impl GgufModel {
    /// Opens `loc`; if it is the first file of a split (`split.count` > 1) the siblings are opened too.
    pub async fn open(loc: &Location) -> Result<GgufModel> {
        GgufModel::open_resolved(loc, &|_| None).await
    }

    /// Opens `loc` as [`GgufModel::open`] does, but reads each file for which `resolve` (given the file's name, the
    /// first's included) returns a location from there instead of beside `loc`: a split set some of whose files
    /// are copies elsewhere (a worker's cache).
    pub async fn open_resolved(
        loc: &Location,
        resolve: &(dyn Fn(&str) -> Option<Location> + Sync),
    ) -> Result<GgufModel> {
        let first = resolve(loc.file_name()).unwrap_or_else(|| loc.clone());
        let blob = Blob::open(&first).await?;
        let header = GgufHeader::read(&blob).await?;
        split::open_siblings(loc, blob, header, resolve).await
    }

    /// The metadata of the first shard (the whole model's; other shards hold only the split keys).
    pub fn header(&self) -> &GgufHeader {
        &self.shards[0].1
    }

    pub fn tensors(&self) -> impl Iterator<Item = ModelTensor<'_>> {
        self.shards
            .iter()
            .enumerate()
            .flat_map(|(shard, (_, h))| h.tensors.iter().map(move |info| ModelTensor { shard, info }))
    }

    pub fn tensor(&self, name: &str) -> Result<ModelTensor<'_>> {
        self.tensors()
            .find(|t| t.info.name == name)
            .ok_or_else(|| Error::NoSuchTensor { file: self.shards[0].0.name().to_string(), name: name.to_string() })
    }
}
