//! RFC 8785 JSON Canonicalization Scheme (JCS): one exact byte string for one JSON value.
//!
//! A signature covers bytes, not meaning. Reports are pretty-printed, re-serialized and round-tripped through tools
//! that reorder keys or respell numbers (`4.50` → `4.5`), so signing the bytes as written would make every such
//! harmless rewrite look like tampering. JCS fixes one spelling for every value, so the signer and any verifier —
//! this crate or any other RFC 8785 implementation — derive the same bytes from the same data:
//!
//! - object members sorted by their keys compared as UTF-16 code units (not UTF-8 bytes, not chars: the two orders
//!   differ once keys hold characters outside the Basic Multilingual Plane);
//! - no insignificant whitespace;
//! - strings escaped minimally: `\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u00xx` (lowercase hex) for the other
//!   control characters below U+0020, every other character written as literal UTF-8;
//! - numbers written as ECMAScript's `Number.prototype.toString` writes the IEEE 754 double (`1e+21`, `5e-7`,
//!   `-0` → `0`), via `ryu-js`.
//!
//! JCS models every number as a double, so an integer that a double cannot hold is refused rather than rounded:
//! silently signing a value that another verifier reads differently would make valid reports fail elsewhere.
//! The limit is ±2^53 (9007199254740992); larger counters or seeds belong in a report as strings.
//!
//! Canonicalization is exact only if the `Value` holds the doubles the text meant: parse with serde_json's
//! `float_roundtrip` feature, since its default float parser is off by one ULP for many 17-digit inputs (the RFC's
//! own `333333333.33333329` among them).

use std::fmt::Write as _;

use serde_json::{Map, Number, Value};

/// Largest magnitude of an integer that is accepted: every integer up to 2^53 is exactly a double.
pub const MAX_EXACT_INTEGER: u64 = 1 << 53;

/// Why a value has no RFC 8785 form.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CanonicalError {
    /// An integer beyond ±2^53 would change when read as the IEEE 754 double that JCS requires.
    #[error(
        "number {number} at {path} cannot be canonicalized: RFC 8785 reads numbers as IEEE 754 doubles, which hold \
         integers exactly only up to ±2^53 (9007199254740992); write it as a string instead"
    )]
    IntegerOutOfRange {
        /// The number as serde_json holds it.
        number: String,
        /// Where it is, as a JSON Pointer (RFC 6901); empty for the root.
        path: String,
    },
    /// Not finite (serde_json cannot hold these, but a `Number` from elsewhere could in principle).
    #[error("number at {path} is not finite; JSON has no NaN or infinity")]
    NotFinite {
        /// Where it is, as a JSON Pointer (RFC 6901).
        path: String,
    },
}

/// The RFC 8785 canonical form of `v`, as a string (sign or hash its UTF-8 bytes).
pub fn canonical_json(v: &Value) -> Result<String, CanonicalError> {
    let mut out = String::new();
    let mut path = String::new();
    write_value(&mut out, v, &mut path)?;
    Ok(out)
}

fn write_value(out: &mut String, v: &Value, path: &mut String) -> Result<(), CanonicalError> {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(out, n, path)?,
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let len = path.len();
                let _ = write!(path, "/{i}");
                write_value(out, item, path)?;
                path.truncate(len);
            }
            out.push(']');
        }
        Value::Object(map) => write_object(out, map, path)?,
    }
    Ok(())
}

fn write_object(out: &mut String, map: &Map<String, Value>, path: &mut String) -> Result<(), CanonicalError> {
    let mut members: Vec<(&String, &Value)> = map.iter().collect();
    // Keys are unique in a Map, so the order is total and stability does not matter.
    members.sort_unstable_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
    out.push('{');
    for (i, (key, value)) in members.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(out, key);
        out.push(':');
        let len = path.len();
        path.push('/');
        // JSON Pointer escaping, only for the error messages.
        path.push_str(&key.replace('~', "~0").replace('/', "~1"));
        write_value(out, value, path)?;
        path.truncate(len);
    }
    out.push('}');
    Ok(())
}

fn write_number(out: &mut String, n: &Number, path: &str) -> Result<(), CanonicalError> {
    if let Some(u) = n.as_u64() {
        if u > MAX_EXACT_INTEGER {
            return Err(CanonicalError::IntegerOutOfRange { number: n.to_string(), path: path.to_string() });
        }
        // Below 2^53 (< 1e21) ECMAScript writes an integer-valued double as its plain decimal digits.
        let _ = write!(out, "{u}");
    } else if let Some(i) = n.as_i64() {
        if i.unsigned_abs() > MAX_EXACT_INTEGER {
            return Err(CanonicalError::IntegerOutOfRange { number: n.to_string(), path: path.to_string() });
        }
        let _ = write!(out, "{i}");
    } else {
        let f = n.as_f64().ok_or_else(|| CanonicalError::NotFinite { path: path.to_string() })?;
        if !f.is_finite() {
            return Err(CanonicalError::NotFinite { path: path.to_string() });
        }
        if f == 0.0 {
            // ECMAScript writes both zeros as "0".
            out.push('0');
        } else {
            out.push_str(ryu_js::Buffer::new().format_finite(f));
        }
    }
    Ok(())
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(text: &str) -> String {
        let v: Value = serde_json::from_str(text).expect("test JSON parses");
        canonical_json(&v).expect("canonicalizes")
    }

    /// RFC 8785 section 3.2.2 / Appendix sample: literals, numbers and string escaping.
    #[test]
    fn rfc8785_sample() {
        let input = r#"{
            "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
            "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
            "literals": [null, true, false]
        }"#;
        let expected = "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],\
                        \"string\":\"\u{20ac}$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}";
        assert_eq!(canon(input), expected);
    }

    /// RFC 8785 section 3.2.3: keys sorted by UTF-16 code units.
    #[test]
    fn rfc8785_key_sorting() {
        let input = r#"{
            "\u20ac": "Euro Sign",
            "\r": "Carriage Return",
            "\ufb33": "Hebrew Letter Dalet With Dagesh",
            "1": "One",
            "\ud83d\ude00": "Emoji: Grinning Face",
            "\u0080": "Control",
            "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let expected = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
                        \"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\
                        \"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
        assert_eq!(canon(input), expected);
        // The emoji (surrogates D83D DE00) sorts before U+FB33 in UTF-16, though after it in UTF-8 and by char.
        assert!("\u{1f600}" > "\u{fb33}");
    }

    #[test]
    fn nested_objects_sorted_and_whitespace_removed() {
        let v = json!({"b": [1, {"z": 1, "a": [true, null]}], "a": {"y": "x", "x": "y"}});
        assert_eq!(canonical_json(&v).unwrap(), r#"{"a":{"x":"y","y":"x"},"b":[1,{"a":[true,null],"z":1}]}"#);
        assert_eq!(canonical_json(&json!({})).unwrap(), "{}");
        assert_eq!(canonical_json(&json!([])).unwrap(), "[]");
        assert_eq!(canonical_json(&json!("")).unwrap(), "\"\"");
    }

    #[test]
    fn numbers_in_ecmascript_form() {
        let cases: &[(&str, &str)] = &[
            ("0", "0"),
            ("-0", "0"),
            ("-0.0", "0"),
            ("0.0", "0"),
            ("1", "1"),
            ("-1", "-1"),
            ("5.0", "5"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("123456789012345678901", "123456789012345680000"),
            ("5e-7", "5e-7"),
            ("0.000001", "0.000001"),
            ("1.5", "1.5"),
            ("-1.5e-10", "-1.5e-10"),
            ("9007199254740992", "9007199254740992"),
            ("-9007199254740992", "-9007199254740992"),
            ("9007199254740992.0", "9007199254740992"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("5e-324", "5e-324"),
            ("0.1", "0.1"),
            ("0.30000000000000004", "0.30000000000000004"),
        ];
        for (input, expected) in cases {
            assert_eq!(canon(input), *expected, "canonical form of {input}");
        }
    }

    #[test]
    fn integers_beyond_2_pow_53_are_refused() {
        for big in ["9007199254740993", "-9007199254740993", "18446744073709551615", "-9223372036854775808"] {
            let v: Value = serde_json::from_str(&format!("{{\"a\":[{big}]}}")).unwrap();
            let err = canonical_json(&v).unwrap_err();
            assert_eq!(err, CanonicalError::IntegerOutOfRange { number: big.to_string(), path: "/a/0".into() });
            assert!(err.to_string().contains("2^53"), "{err}");
        }
    }

    #[test]
    fn string_escapes() {
        let s: String = (0u32..0x20).filter_map(char::from_u32).collect::<String>() + "\u{7f}\u{2028}\"\\/é😀";
        let out = canonical_json(&Value::String(s)).unwrap();
        assert_eq!(
            out,
            "\"\\u0000\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000b\\f\\r\\u000e\\u000f\
             \\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017\\u0018\\u0019\\u001a\\u001b\\u001c\\u001d\
             \\u001e\\u001f\u{7f}\u{2028}\\\"\\\\/é😀\""
        );
    }

    #[test]
    fn key_order_of_input_does_not_matter() {
        let a: Value = serde_json::from_str(r#"{"x": 1, "y": {"p": 2, "q": 3}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"y": {"q": 3, "p": 2}, "x": 1.0}"#).unwrap();
        assert_eq!(canonical_json(&a).unwrap(), canonical_json(&b).unwrap());
    }

    /// The canonical form is itself JSON that parses back to an equal value (for numbers in range).
    #[test]
    fn canonical_form_round_trips() {
        let v = json!({"a": [1.25, -3, "x\u{1}y", null], "b": {"c": 1e-9, "d": 12345678.9}});
        let text = canonical_json(&v).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(canonical_json(&back).unwrap(), text);
    }
}
