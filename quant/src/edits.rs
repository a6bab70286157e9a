//! What llama-quantize changes in a model besides tensor types: `--override-kv` (metadata values) and
//! `--prune-layers` (whole blocks dropped, the rest renumbered), as `tools/quantize/quantize.cpp` parses them and
//! `llama_model_quantize_impl` (`src/llama-quant.cpp`) applies them.

use std::collections::BTreeMap;

use quantfarm_tensors::gguf::Value;

/// Why an `--override-kv` or `--prune-layers` argument was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EditError {
    #[error("--override-kv {arg:?}: expected KEY=TYPE:VALUE with TYPE int, float, bool or str (e.g. general.name=str:My model), and a key under 128 bytes")]
    KvSyntax { arg: String },
    #[error("--override-kv {arg:?}: a bool is `true` or `false`")]
    KvBool { arg: String },
    #[error("--override-kv {arg:?}: a string value is at most 127 bytes")]
    KvString { arg: String },
    #[error("--prune-layers {arg:?}: expected comma-separated layer numbers (0 or more), e.g. 20,21,22")]
    Prune { arg: String },
}

/// One `--override-kv KEY=TYPE:VALUE`: the key and the value as llama-quantize writes it into the output.
#[derive(Clone, Debug, PartialEq)]
pub struct KvOverride {
    pub key: String,
    /// `int:` is written as a u32 of the absolute value (llama.cpp PR 14182), `float:` as f32.
    pub value: Value,
    /// The value the model loader reads for its hyperparameters (`int:` as parsed, before the u32 cast).
    pub int: Option<i64>,
}

impl KvOverride {
    /// Parses as `string_parse_kv_override` (`common/common.cpp`): the key is what precedes the first `=`; an int
    /// or float is C's `atol`/`atof` of the rest (leading digits; nothing numeric reads 0).
    pub fn parse(arg: &str) -> Result<KvOverride, EditError> {
        let syntax = || EditError::KvSyntax { arg: arg.into() };
        let (key, rest) = arg.split_once('=').ok_or_else(syntax)?;
        if key.len() >= 128 {
            return Err(syntax());
        }
        let (value, int) = if let Some(v) = rest.strip_prefix("int:") {
            let i = atol(v);
            (Value::U32(i.unsigned_abs() as u32), Some(i))
        } else if let Some(v) = rest.strip_prefix("float:") {
            (Value::F32(atof(v) as f32), None)
        } else if let Some(v) = rest.strip_prefix("bool:") {
            match v {
                "true" => (Value::Bool(true), None),
                "false" => (Value::Bool(false), None),
                _ => return Err(EditError::KvBool { arg: arg.into() }),
            }
        } else if let Some(v) = rest.strip_prefix("str:") {
            if v.len() > 127 {
                return Err(EditError::KvString { arg: arg.into() });
            }
            (Value::String(v.into()), None)
        } else {
            return Err(syntax());
        };
        Ok(KvOverride { key: key.to_string(), value, int })
    }
}

/// C's `atol`: optional whitespace and sign, then decimal digits up to the first other character (saturating where
/// C's result would be undefined).
fn atol(s: &str) -> i64 {
    let t = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let mut v: i64 = 0;
    for b in digits.bytes().take_while(u8::is_ascii_digit) {
        v = v.saturating_mul(10).saturating_add((b - b'0') as i64);
    }
    if neg {
        -v
    } else {
        v
    }
}

/// C's `atof` for what an override holds: the longest prefix that parses as a decimal float (`strtod`'s decimal
/// form; hex floats, `inf` and `nan` are read as Rust reads them), 0 without one.
fn atof(s: &str) -> f64 {
    let t = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    (1..=t.len()).rev().filter(|&n| t.is_char_boundary(n)).find_map(|n| t[..n].parse::<f64>().ok()).unwrap_or(0.0)
}

/// `--prune-layers`: the layers dropped, sorted and without repeats (`parse_layer_prune`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prune(Vec<u32>);

impl Prune {
    pub fn parse(arg: &str) -> Result<Prune, EditError> {
        let mut v = Vec::new();
        for id in arg.split(',') {
            // `std::stoi`: leading whitespace and digits, the rest ignored; a failure or a negative is refused.
            let n = atol(id);
            let starts_numeric =
                id.trim_start().trim_start_matches(['+', '-']).starts_with(|c: char| c.is_ascii_digit());
            if !starts_numeric || n < 0 || n > u32::MAX as i64 {
                return Err(EditError::Prune { arg: arg.into() });
            }
            v.push(n as u32);
        }
        v.sort_unstable();
        v.dedup();
        Ok(Prune(v))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn layers(&self) -> &[u32] {
        &self.0
    }

    /// Every tensor's new name (`None`: pruned), visiting `names` in the loader's order as `remap_layer` does, and
    /// the new block count (`next_id` after the last layer; `None` without pruning, when the key is not set).
    pub fn remap<'a>(&self, names: impl Iterator<Item = &'a str>) -> (BTreeMap<String, Option<String>>, Option<u32>) {
        let mut out = BTreeMap::new();
        if self.0.is_empty() {
            return (names.map(|n| (n.to_string(), Some(n.to_string()))).collect(), None);
        }
        let mut mapped: BTreeMap<u32, Option<u32>> = BTreeMap::new();
        let mut next_id: u32 = 0;
        for name in names {
            // `blk\.(\d+)\.` anywhere in the name, as the regex searches it.
            let Some((at, len, blk)) = find_block(name) else {
                out.insert(name.to_string(), Some(name.to_string()));
                continue;
            };
            let new = *mapped.entry(blk).or_insert_with(|| {
                if self.0.contains(&blk) {
                    None
                } else if blk < self.0[0] {
                    next_id = blk + 1;
                    Some(blk)
                } else {
                    next_id += 1;
                    Some(next_id - 1)
                }
            });
            let renamed = new.map(|id| format!("{}{id}{}", &name[..at], &name[at + len..]));
            out.insert(name.to_string(), renamed);
        }
        (out, Some(next_id))
    }
}

/// The first `blk.N.` in `name`: where N starts, its length, and its value (`std::stoi` of the digits).
fn find_block(name: &str) -> Option<(usize, usize, u32)> {
    let b = name.as_bytes();
    let mut from = 0;
    while let Some(i) = name[from..].find("blk.").map(|i| i + from) {
        let start = i + 4;
        let len = b[start..].iter().take_while(|c| c.is_ascii_digit()).count();
        if len > 0 && b.get(start + len) == Some(&b'.') {
            let n = name[start..start + len].parse::<u32>().ok()?;
            return Some((start, len, n));
        }
        from = i + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_parse_as_llama_cpp_does() {
        let p = |s| KvOverride::parse(s).map(|o| (o.key, o.value));
        assert_eq!(p("a.b=int:-12x"), Ok(("a.b".into(), Value::U32(12))));
        assert_eq!(p("a=int:"), Ok(("a".into(), Value::U32(0))));
        assert_eq!(p("a=float:1.5e3abc"), Ok(("a".into(), Value::F32(1500.0))));
        assert_eq!(p("a=bool:true"), Ok(("a".into(), Value::Bool(true))));
        assert_eq!(p("general.name=str:x=y"), Ok(("general.name".into(), Value::String("x=y".into()))));
        for bad in
            ["a", "a=i32:3", "a=bool:1", &format!("a=str:{}", "x".repeat(128)), &format!("{}=int:1", "k".repeat(128))]
        {
            assert!(KvOverride::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pruning_renumbers_the_layers_after_the_first_pruned() {
        let p = Prune::parse("5,2,2").unwrap();
        assert_eq!(p.layers(), [2, 5]);
        let names = ["token_embd.weight", "blk.0.a", "blk.1.a", "blk.2.a", "blk.3.a", "blk.4.a", "blk.5.a", "blk.6.a"];
        let (map, n) = p.remap(names.into_iter());
        assert_eq!(n, Some(5));
        let new = |s: &str| map[s].clone();
        assert_eq!(new("token_embd.weight").as_deref(), Some("token_embd.weight"));
        assert_eq!(new("blk.1.a").as_deref(), Some("blk.1.a"));
        assert_eq!(new("blk.2.a"), None);
        assert_eq!(new("blk.3.a").as_deref(), Some("blk.2.a"));
        assert_eq!(new("blk.6.a").as_deref(), Some("blk.4.a"));
        for bad in ["", "a", "1,,2", "-1", "3,x"] {
            assert!(Prune::parse(bad).is_err(), "{bad:?}");
        }
    }
}
