//! The GGUF header parser: magic, version, metadata, tensor infos, then layout checks.
//!
//! It works on a prefix of the file and knows the file's full length, so a hostile count (2^60 tensors, a string of
//! 2^63 bytes) is refused by comparing it with the bytes that could possibly hold it, before anything is allocated.
//! When the prefix ends before the header does, it asks for more ([`Parsed::NeedMore`]) instead of failing, so
//! callers can read headers of unknown length with a few ranged reads.
//! Rules follow `ggml/src/gguf.cpp::gguf_init_from_reader` (llama.cpp 0c1e570); the layout is the one described at
//! the top of `ggml/include/gguf.h`.

use super::value::{Array, GgufStr, Value, ValueType};
use super::{GgufHeader, TensorInfo, DEFAULT_ALIGNMENT, MAX_DIMS, MAX_NAME_LEN};
use crate::error::{Error, Result};
use crate::GgmlType;

pub(crate) enum Parsed {
    Done(GgufHeader),
    /// The header continues past the prefix; read at least this many bytes from the start.
    NeedMore(u64),
}

/// Nesting limit for arrays of arrays (gguf-py writes them; nothing real nests deeper than a few levels).
const MAX_ARRAY_DEPTH: usize = 8;

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    file_len: u64,
    file: &'a str,
}

/// An error from the cursor: either the prefix ran out (ask for more) or the format is wrong.
enum Fail {
    NeedMore(u64),
    Err(Error),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail::Err(e)
    }
}

type R<T> = std::result::Result<T, Fail>;

impl<'a> Cursor<'a> {
    fn err(&self, field: &str, msg: impl Into<String>) -> Fail {
        Fail::Err(Error::format(self.file, field, msg))
    }

    /// Bytes of the file after the cursor (not just of the prefix).
    fn remaining_in_file(&self) -> u64 {
        self.file_len.saturating_sub(self.pos as u64)
    }

    fn take(&mut self, n: u64, field: &str) -> R<&'a [u8]> {
        if n > self.remaining_in_file() {
            return Err(self.err(
                field,
                format!("needs {n} bytes at offset {}, but the file ends at {}", self.pos, self.file_len),
            ));
        }
        let end = self.pos as u64 + n;
        if end > self.buf.len() as u64 {
            return Err(Fail::NeedMore(end));
        }
        let start = self.pos;
        self.pos = end as usize;
        Ok(&self.buf[start..end as usize])
    }

    fn array<const N: usize>(&mut self, field: &str) -> R<[u8; N]> {
        let b = self.take(N as u64, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }

    fn u8(&mut self, f: &str) -> R<u8> {
        Ok(self.array::<1>(f)?[0])
    }
    fn u16(&mut self, f: &str) -> R<u16> {
        Ok(u16::from_le_bytes(self.array(f)?))
    }
    fn u32(&mut self, f: &str) -> R<u32> {
        Ok(u32::from_le_bytes(self.array(f)?))
    }
    fn u64(&mut self, f: &str) -> R<u64> {
        Ok(u64::from_le_bytes(self.array(f)?))
    }

    /// A count that must fit in what is left of the file at `min_size` bytes per item.
    fn count(&mut self, field: &str, min_size: u64) -> R<u64> {
        let n = self.u64(field)?;
        if n > i64::MAX as u64 {
            return Err(self.err(field, format!("count {n} is negative as the int64 the format specifies")));
        }
        if n.saturating_mul(min_size) > self.remaining_in_file() {
            return Err(self.err(
                field,
                format!(
                    "count {n} needs at least {} bytes, but only {} remain in the file",
                    n.saturating_mul(min_size),
                    self.remaining_in_file()
                ),
            ));
        }
        Ok(n)
    }

    /// A `Vec` capacity for `n` items that never allocates more than the rest of the file's size.
    fn cap<T>(&self, n: u64) -> usize {
        let most = self.remaining_in_file() / std::mem::size_of::<T>().max(1) as u64;
        n.min(most) as usize
    }

    fn bytes_string(&mut self, field: &str) -> R<GgufStr> {
        let len = self.count(field, 1)?;
        Ok(GgufStr(self.take(len, field)?.to_vec()))
    }

    fn utf8_string(&mut self, field: &str) -> R<String> {
        let start = self.pos;
        let s = self.bytes_string(field)?;
        String::from_utf8(s.0).map_err(|e| self.err(field, format!("string at offset {start} is not UTF-8: {e}")))
    }

    fn value(&mut self, ty: ValueType, field: &str, depth: usize) -> R<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8(field)?),
            ValueType::I8 => Value::I8(self.u8(field)? as i8),
            ValueType::U16 => Value::U16(self.u16(field)?),
            ValueType::I16 => Value::I16(self.u16(field)? as i16),
            ValueType::U32 => Value::U32(self.u32(field)?),
            ValueType::I32 => Value::I32(self.u32(field)? as i32),
            ValueType::F32 => Value::F32(f32::from_bits(self.u32(field)?)),
            ValueType::Bool => Value::Bool(self.bool(field)?),
            ValueType::String => Value::String(self.bytes_string(field)?),
            ValueType::U64 => Value::U64(self.u64(field)?),
            ValueType::I64 => Value::I64(self.u64(field)? as i64),
            ValueType::F64 => Value::F64(f64::from_bits(self.u64(field)?)),
            ValueType::Array => Value::Array(self.array_value(field, depth)?),
        })
    }

    fn bool(&mut self, field: &str) -> R<bool> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(self.err(field, format!("BOOL value {v} is neither 0 nor 1"))),
        }
    }

    fn value_type(&mut self, field: &str) -> R<ValueType> {
        let id = self.u32(field)?;
        ValueType::from_id(id).ok_or_else(|| self.err(field, format!("unknown value type id {id} (valid: 0..=12)")))
    }

    fn array_value(&mut self, field: &str, depth: usize) -> R<Array> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.err(field, format!("arrays nested deeper than {MAX_ARRAY_DEPTH} levels")));
        }
        let elem = self.value_type(field)?;
        let n = self.count(field, elem.min_size())?;
        macro_rules! collect {
            ($variant:ident, $elem:ty, $read:expr) => {{
                let mut v = Vec::with_capacity(self.cap::<$elem>(n));
                for _ in 0..n {
                    v.push($read(self)?);
                }
                Array::$variant(v)
            }};
        }
        Ok(match elem {
            ValueType::U8 => Array::U8(self.take(n, field)?.to_vec()),
            ValueType::I8 => Array::I8(self.take(n, field)?.iter().map(|&b| b as i8).collect()),
            ValueType::U16 => collect!(U16, u16, |c: &mut Self| c.u16(field)),
            ValueType::I16 => collect!(I16, i16, |c: &mut Self| c.u16(field).map(|v| v as i16)),
            ValueType::U32 => collect!(U32, u32, |c: &mut Self| c.u32(field)),
            ValueType::I32 => collect!(I32, i32, |c: &mut Self| c.u32(field).map(|v| v as i32)),
            ValueType::F32 => collect!(F32, f32, |c: &mut Self| c.u32(field).map(f32::from_bits)),
            ValueType::Bool => collect!(Bool, bool, |c: &mut Self| c.bool(field)),
            ValueType::String => collect!(String, GgufStr, |c: &mut Self| c.bytes_string(field)),
            ValueType::U64 => collect!(U64, u64, |c: &mut Self| c.u64(field)),
            ValueType::I64 => collect!(I64, i64, |c: &mut Self| c.u64(field).map(|v| v as i64)),
            ValueType::F64 => collect!(F64, f64, |c: &mut Self| c.u64(field).map(f64::from_bits)),
            ValueType::Array => collect!(Array, Array, |c: &mut Self| c.array_value(field, depth + 1)),
        })
    }
}

/// Parses the header from `buf`, a prefix of a file of `file_len` bytes named `file` (for messages).
pub(crate) fn parse_header(buf: &[u8], file_len: u64, file: &str) -> Result<Parsed> {
    let mut c = Cursor { buf, pos: 0, file_len, file };
    match parse(&mut c) {
        Ok(h) => Ok(Parsed::Done(h)),
        Err(Fail::NeedMore(n)) => Ok(Parsed::NeedMore(n)),
        Err(Fail::Err(e)) => Err(e),
    }
}

fn parse(c: &mut Cursor) -> R<GgufHeader> {
    let magic = c.array::<4>("magic")?;
    if &magic != b"GGUF" {
        return Err(c.err("magic", format!("expected \"GGUF\" (47 47 55 46), found {magic:02x?}")));
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        1 => return Err(c.err("version", "GGUF v1 is no longer supported (expected 2 or 3)")),
        v if v & 0xFFFF == 0 => {
            return Err(c.err("version", format!("{v:#x}: the file is probably of the other endianness (expected 3)")))
        }
        v => return Err(c.err("version", format!("{v} is not supported (expected 2 or 3)"))),
    }
    // Minimum sizes: a tensor info is name len (8) + n_dims (4) + type (4) + offset (8); a KV is key len (8) +
    // type (4) + at least one byte.
    let n_tensors = c.count("n_tensors", 24)?;
    let n_kv = c.count("n_kv", 13)?;

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(c.cap::<(String, Value)>(n_kv));
    let mut seen = std::collections::HashSet::with_capacity(c.cap::<(String, Value)>(n_kv));
    for i in 0..n_kv {
        let key = c.utf8_string(&format!("metadata[{i}].key"))?;
        if key.is_empty() {
            return Err(c.err(&format!("metadata[{i}].key"), "empty key"));
        }
        if !seen.insert(key.clone()) {
            return Err(c.err(&key, "duplicate metadata key"));
        }
        let ty = c.value_type(&key)?;
        let value = c.value(ty, &key, 0)?;
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == super::ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
        Some((_, Value::U32(a))) => {
            return Err(c.err(super::ALIGNMENT_KEY, format!("{a} is not a power of two")));
        }
        Some((_, v)) => {
            return Err(c.err(super::ALIGNMENT_KEY, format!("has type {}, expected UINT32", v.value_type().name())));
        }
    };

    let mut tensors = Vec::with_capacity(c.cap::<TensorInfo>(n_tensors));
    let mut names = std::collections::HashSet::with_capacity(c.cap::<TensorInfo>(n_tensors));
    for i in 0..n_tensors {
        let field = format!("tensor_info[{i}].name");
        let name = c.utf8_string(&field)?;
        if name.len() >= MAX_NAME_LEN {
            return Err(c.err(&field, format!("{name:?} is {} bytes (the limit is {})", name.len(), MAX_NAME_LEN - 1)));
        }
        if !names.insert(name.clone()) {
            return Err(c.err(&format!("tensor {name:?}"), "duplicate tensor name"));
        }
        let t = format!("tensor {name:?}");
        let n_dims = c.u32(&format!("{t}.n_dims"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(c.err(&format!("{t}.n_dims"), format!("{n_dims} dimensions (at most {MAX_DIMS})")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        // The product of the non-zero dimensions must fit int64: then every partial product, in any order (rows,
        // reversed shapes), fits too — also when a zero dimension makes the element count 0.
        let mut nonzero: u64 = 1;
        for d in 0..n_dims {
            let ne = c.u64(&format!("{t}.ne[{d}]"))?;
            if ne > i64::MAX as u64 {
                return Err(c.err(&format!("{t}.ne[{d}]"), format!("{} is negative", ne as i64)));
            }
            nonzero = nonzero
                .checked_mul(ne.max(1))
                .filter(|&e| e <= i64::MAX as u64)
                .ok_or_else(|| c.err(&format!("{t}.ne"), "the product of the dimensions overflows int64"))?;
            dims.push(ne);
        }
        let type_id = c.u32(&format!("{t}.type"))?;
        let ty = GgmlType::from_id(type_id)
            .ok_or_else(|| c.err(&format!("{t}.type"), format!("unknown or removed ggml type id {type_id}")))?;
        let ne0 = dims.first().copied().unwrap_or(1);
        if ne0 % ty.block_size() as u64 != 0 {
            return Err(c.err(
                &format!("{t}.ne[0]"),
                format!("{ne0} is not a multiple of {}'s block size {}", ty, ty.block_size()),
            ));
        }
        let offset = c.u64(&format!("{t}.offset"))?;
        let info = TensorInfo { name, dims, ty, offset };
        // The byte size can still overflow u64 although the element count fits i64 (e.g. F64 of 2^62 elements).
        info.checked_nbytes().ok_or_else(|| c.err(&format!("{t}.ne"), "the tensor's byte size overflows"))?;
        tensors.push(info);
    }

    let header_len = c.pos as u64;
    let data_offset = pad(header_len, alignment);
    let header = GgufHeader { version, metadata, tensors, alignment, data_offset, file_len: c.file_len };
    check_layout(&header, c.file)?;
    Ok(header)
}

pub(crate) fn pad(x: u64, alignment: u64) -> u64 {
    x.div_ceil(alignment) * alignment
}

/// Every tensor lies inside the data section, starts on the alignment and overlaps no other.
fn check_layout(h: &GgufHeader, file: &str) -> std::result::Result<(), Fail> {
    if h.tensors.is_empty() {
        return Ok(());
    }
    let data_len = h.file_len.checked_sub(h.data_offset).ok_or_else(|| {
        Fail::Err(Error::format(
            file,
            "data section",
            format!("starts at {} but the file is {} bytes", h.data_offset, h.file_len),
        ))
    })?;
    let mut spans: Vec<(u64, u64, &str)> = Vec::with_capacity(h.tensors.len());
    for t in &h.tensors {
        let field = format!("tensor {:?}.offset", t.name);
        if t.offset % h.alignment != 0 {
            return Err(Fail::Err(Error::format(
                file,
                field,
                format!("{} is not a multiple of the alignment {}", t.offset, h.alignment),
            )));
        }
        let nbytes = t.nbytes();
        let end = t.offset.checked_add(nbytes).filter(|&e| e <= data_len).ok_or_else(|| {
            Fail::Err(Error::format(
                file,
                &field,
                format!(
                    "{} + {nbytes} bytes runs past the end of the data section ({data_len} bytes from {})",
                    t.offset, h.data_offset
                ),
            ))
        })?;
        spans.push((t.offset, end, &t.name));
    }
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(Fail::Err(Error::format(
                file,
                format!("tensor {:?}.offset", w[1].2),
                format!("{} overlaps tensor {:?} (bytes {}..{})", w[1].0, w[0].2, w[0].0, w[0].1),
            )));
        }
    }
    Ok(())
}
