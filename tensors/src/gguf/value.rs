//! GGUF metadata values (`enum gguf_type`), kept exactly as stored so that a read → write round trip gives the same
//! bytes. Arrays are typed (one `Vec` per element type) rather than a `Vec` of values: a tokenizer's 150k-entry
//! arrays then cost what their data costs.

use serde_json::Value as Json;

/// A GGUF value type id (`gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The smallest encoded size of one value of this type (a string or array is at least its u64 length).
    pub(crate) fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "UINT8",
            I8 => "INT8",
            U16 => "UINT16",
            I16 => "INT16",
            U32 => "UINT32",
            I32 => "INT32",
            F32 => "FLOAT32",
            Bool => "BOOL",
            String => "STRING",
            Array => "ARRAY",
            U64 => "UINT64",
            I64 => "INT64",
            F64 => "FLOAT64",
        }
    }
}

/// A GGUF string: a length and raw bytes. The format does not require UTF-8 (the C writer does not check), so the
/// bytes are kept as they are; [`GgufStr::as_str`] gives text when they are valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufStr(pub Vec<u8>);

impl GgufStr {
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    pub fn to_string_lossy(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

impl From<&str> for GgufStr {
    fn from(s: &str) -> Self {
        GgufStr(s.as_bytes().to_vec())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(GgufStr),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A typed array; `Array` holds nested arrays (gguf-py writes them; llama.cpp's reader refuses them).
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<GgufStr>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => s.as_str(),
            _ => None,
        }
    }

    /// A JSON rendering for reports and `inspect --json` (strings that are not UTF-8 are rendered lossily).
    pub fn to_json(&self) -> Json {
        match self {
            Value::U8(v) => (*v).into(),
            Value::I8(v) => (*v).into(),
            Value::U16(v) => (*v).into(),
            Value::I16(v) => (*v).into(),
            Value::U32(v) => (*v).into(),
            Value::I32(v) => (*v).into(),
            Value::F32(v) => float_json(f64::from(*v)),
            Value::Bool(v) => (*v).into(),
            Value::String(s) => s.to_string_lossy().into(),
            Value::Array(a) => a.to_json(),
            Value::U64(v) => (*v).into(),
            Value::I64(v) => (*v).into(),
            Value::F64(v) => float_json(*v),
        }
    }
}

fn float_json(v: f64) -> Json {
    serde_json::Number::from_f64(v).map(Json::Number).unwrap_or_else(|| Json::String(v.to_string()))
}

impl Array {
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn to_json(&self) -> Json {
        fn list<T>(v: &[T], f: impl Fn(&T) -> Json) -> Json {
            Json::Array(v.iter().map(f).collect())
        }
        match self {
            Array::U8(v) => list(v, |x| (*x).into()),
            Array::I8(v) => list(v, |x| (*x).into()),
            Array::U16(v) => list(v, |x| (*x).into()),
            Array::I16(v) => list(v, |x| (*x).into()),
            Array::U32(v) => list(v, |x| (*x).into()),
            Array::I32(v) => list(v, |x| (*x).into()),
            Array::F32(v) => list(v, |x| float_json(f64::from(*x))),
            Array::Bool(v) => list(v, |x| (*x).into()),
            Array::String(v) => list(v, |x| x.to_string_lossy().into()),
            Array::Array(v) => list(v, |x| x.to_json()),
            Array::U64(v) => list(v, |x| (*x).into()),
            Array::I64(v) => list(v, |x| (*x).into()),
            Array::F64(v) => list(v, |x| float_json(*x)),
        }
    }
}
