//! The GGUF writer's header and layout: metadata in the given order, tensor infos, zero padding to the alignment
//! after the header and after every tensor (the last one too), offsets as running sums of padded sizes — the
//! canonical layout of both `gguf.cpp::gguf_write_out` and gguf-py's `GGUFWriter`.

use super::parse::pad;
use super::value::{Array, Value};
use super::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_DIMS, MAX_NAME_LEN};
use crate::error::{Error, Result};
use crate::GgmlType;

/// What the writer needs to know about a tensor before its bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorDesc {
    pub name: String,
    /// `ne`, innermost first; its length is the `n_dims` written.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

impl TensorDesc {
    pub fn nbytes(&self) -> Option<u64> {
        super::tensor_nbytes(self.ty, &self.dims)
    }
}

/// An encoded header and where each tensor's data goes.
#[derive(Clone, Debug)]
pub struct GgufLayout {
    /// Header bytes including the padding that ends it; tensor data starts right after.
    pub header: Vec<u8>,
    pub alignment: u64,
    /// Per tensor: offset from the data start, and byte size (without padding).
    pub tensors: Vec<(u64, u64)>,
    /// Total file size.
    pub file_len: u64,
}

impl GgufLayout {
    /// Zero bytes to write after tensor `i`'s data.
    pub fn padding_after(&self, i: usize) -> usize {
        let (_, n) = self.tensors[i];
        (pad(n, self.alignment) - n) as usize
    }
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_bits().to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, &s.0),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_bits().to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr, $f:expr) => {
            for x in $v {
                $f(out, x)
            }
        };
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each!(v, |o: &mut Vec<u8>, x: &i8| o.push(*x as u8)),
        Array::U16(v) => each!(v, |o: &mut Vec<u8>, x: &u16| o.extend_from_slice(&x.to_le_bytes())),
        Array::I16(v) => each!(v, |o: &mut Vec<u8>, x: &i16| o.extend_from_slice(&x.to_le_bytes())),
        Array::U32(v) => each!(v, |o: &mut Vec<u8>, x: &u32| o.extend_from_slice(&x.to_le_bytes())),
        Array::I32(v) => each!(v, |o: &mut Vec<u8>, x: &i32| o.extend_from_slice(&x.to_le_bytes())),
        Array::F32(v) => each!(v, |o: &mut Vec<u8>, x: &f32| o.extend_from_slice(&x.to_bits().to_le_bytes())),
        Array::Bool(v) => each!(v, |o: &mut Vec<u8>, x: &bool| o.push(u8::from(*x))),
        Array::String(v) => each!(v, |o: &mut Vec<u8>, x: &super::GgufStr| put_str(o, &x.0)),
        Array::Array(v) => each!(v, |o: &mut Vec<u8>, x: &Array| put_array(o, x)),
        Array::U64(v) => each!(v, |o: &mut Vec<u8>, x: &u64| o.extend_from_slice(&x.to_le_bytes())),
        Array::I64(v) => each!(v, |o: &mut Vec<u8>, x: &i64| o.extend_from_slice(&x.to_le_bytes())),
        Array::F64(v) => each!(v, |o: &mut Vec<u8>, x: &f64| o.extend_from_slice(&x.to_bits().to_le_bytes())),
    }
}

/// Encodes a GGUF header. Checks what a reader would refuse (duplicate keys or names, long names, too many
/// dimensions, rows that are not whole blocks, a bad alignment), so we never write a file llama.cpp cannot open.
pub fn encode_header(version: u32, metadata: &[(String, Value)], tensors: &[TensorDesc]) -> Result<GgufLayout> {
    let bad = |field: String, msg: String| Error::format("<gguf writer>", field, msg);
    let alignment = match metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
        Some(_) => return Err(bad(ALIGNMENT_KEY.into(), "must be a UINT32 power of two".into())),
    };
    let mut out = Vec::with_capacity(4096);
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    let mut keys = std::collections::HashSet::new();
    for (k, v) in metadata {
        if k.is_empty() || !keys.insert(k.as_str()) {
            return Err(bad(format!("metadata key {k:?}"), "empty or duplicate key".into()));
        }
        put_str(&mut out, k.as_bytes());
        out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
        put_value(&mut out, v);
    }
    let mut offsets = Vec::with_capacity(tensors.len());
    let mut names = std::collections::HashSet::new();
    let mut offset = 0u64;
    for t in tensors {
        let field = format!("tensor {:?}", t.name);
        if t.name.len() >= MAX_NAME_LEN || !names.insert(t.name.as_str()) {
            return Err(bad(field, format!("name is a duplicate or longer than {} bytes", MAX_NAME_LEN - 1)));
        }
        if t.dims.len() > MAX_DIMS {
            return Err(bad(field, format!("{} dimensions (at most {MAX_DIMS})", t.dims.len())));
        }
        let nbytes = t.nbytes().ok_or_else(|| {
            bad(field.clone(), format!("shape {:?} is not whole {} blocks or overflows", t.dims, t.ty))
        })?;
        put_str(&mut out, t.name.as_bytes());
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.ty.id().to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offsets.push((offset, nbytes));
        offset += pad(nbytes, alignment);
    }
    // Like gguf_write_out, pad the header even when there are no tensors.
    out.resize(pad(out.len() as u64, alignment) as usize, 0);
    let file_len = out.len() as u64 + offset;
    Ok(GgufLayout { header: out, alignment, tensors: offsets, file_len })
}
