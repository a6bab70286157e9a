//! The per-token KL-divergence values file published beside `report.json` (`kld-values.safetensors`, the report's
//! `paired.values`): a safetensors file with one little-endian F32 tensor `kld/FILE_TYPE` per rung measured in
//! llama.cpp, its tokens in chunk order, and string metadata `format` ([`FORMAT`]), `chunks` and `chunk_tokens`
//! (JSON arrays: the chunk indices and each chunk's token count), `tokens_sha256` and `ctx`. Read here without a
//! tensor library: the header is JSON, the data plain F32.

use std::collections::BTreeMap;

use serde_json::Value;

/// The `format` metadata this reader reads.
pub const FORMAT: &str = "quantfarm-kld-values/1";

/// A values file, read and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct KldValues {
    /// (chunk index, its token count), in chunk order.
    pub chunks: Vec<(u32, usize)>,
    pub tokens_sha256: String,
    pub ctx: u32,
    /// Per rung (`Q4_K_M`), its per-token values in chunk order.
    pub rungs: BTreeMap<String, Vec<f32>>,
}

impl KldValues {
    /// Reads `bytes` (the whole file, named `file` in errors).
    pub fn parse(bytes: &[u8], file: &str) -> Result<KldValues, String> {
        let bad = |what: String| format!("{file}: {what}");
        let n = bytes.get(..8).ok_or_else(|| bad("shorter than a safetensors header".into()))?;
        let n = u64::from_le_bytes(n.try_into().expect("8 bytes")) as usize;
        let body =
            8usize.checked_add(n).filter(|&e| e <= bytes.len()).ok_or_else(|| bad("header past its end".into()))?;
        let header: serde_json::Map<String, Value> =
            serde_json::from_slice(&bytes[8..body]).map_err(|e| bad(format!("header: {e}")))?;
        let data = &bytes[body..];
        let meta = header.get("__metadata__").and_then(Value::as_object).ok_or_else(|| bad("no metadata".into()))?;
        let text = |k: &str| meta.get(k).and_then(Value::as_str).ok_or_else(|| bad(format!("metadata {k:?} missing")));
        if text("format")? != FORMAT {
            return Err(bad(format!("format {:?}, expected {FORMAT:?}", text("format")?)));
        }
        let list = |k: &str| -> Result<Vec<u64>, String> {
            serde_json::from_str(text(k)?).map_err(|e| bad(format!("metadata {k:?}: {e}")))
        };
        let (ids, tokens) = (list("chunks")?, list("chunk_tokens")?);
        if ids.len() != tokens.len() {
            return Err(bad(format!("{} chunks but {} token counts", ids.len(), tokens.len())));
        }
        let chunks: Vec<(u32, usize)> = ids
            .iter()
            .zip(&tokens)
            .map(|(&c, &t)| Ok((u32::try_from(c).map_err(|_| bad(format!("chunk {c}")))?, t as usize)))
            .collect::<Result<_, String>>()?;
        let total: usize = chunks.iter().map(|c| c.1).sum();
        let ctx = text("ctx")?.parse().map_err(|_| bad("metadata \"ctx\": not a number".into()))?;
        let mut rungs = BTreeMap::new();
        for (name, t) in header.iter().filter(|(k, _)| *k != "__metadata__") {
            let rung = name.strip_prefix("kld/").ok_or_else(|| bad(format!("tensor {name:?}: expected kld/RUNG")))?;
            let at = |k: &str| t.get(k).ok_or_else(|| bad(format!("tensor {name:?}: no {k}")));
            if at("dtype")? != "F32" || at("shape")? != &Value::from(vec![total as u64]) {
                return Err(bad(format!("tensor {name:?}: expected F32 [{total}] (the chunks' tokens)")));
            }
            let offsets: Vec<usize> = serde_json::from_value(at("data_offsets")?.clone())
                .map_err(|e| bad(format!("tensor {name:?}: data_offsets: {e}")))?;
            let (a, b) = match offsets[..] {
                [a, b] if a <= b && b <= data.len() && b - a == 4 * total => (a, b),
                _ => return Err(bad(format!("tensor {name:?}: data_offsets {offsets:?} do not hold {total} F32"))),
            };
            let values = data[a..b].chunks_exact(4).map(|w| f32::from_le_bytes(w.try_into().expect("4 bytes")));
            rungs.insert(rung.to_string(), values.collect());
        }
        Ok(KldValues { chunks, tokens_sha256: text("tokens_sha256")?.to_string(), ctx, rungs })
    }

    /// Reads `bytes` (named `file`) as the values file `recorded` names: its sha256 must be the recorded one (else
    /// they are not the values the report was computed from).
    pub fn parse_recorded(bytes: &[u8], file: &str, recorded: &crate::model::FileRef) -> Result<KldValues, String> {
        use sha2::Digest as _;
        let sha = sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect::<String>();
        if sha != recorded.sha256 {
            return Err(format!("{file}: sha256 {sha}, but its report records {}", recorded.sha256));
        }
        KldValues::parse(bytes, file)
    }

    /// A rung's values as (chunk, values) in chunk order, for `quantfarm_parity::paired`.
    pub fn chunked(&self, rung: &str) -> Option<Vec<(u32, &[f32])>> {
        let values = self.rungs.get(rung)?;
        let mut at = 0;
        Some(
            self.chunks
                .iter()
                .map(|&(c, n)| {
                    let part = (c, &values[at..at + n]);
                    at += n;
                    part
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A values file as the coordinator writes it (header JSON padded to 8 bytes, then the F32 data).
    fn file(format: &str, tokens: &str, values: &[f32]) -> Vec<u8> {
        let header = serde_json::json!({
            "__metadata__": {"format": format, "chunks": "[0,1]", "chunk_tokens": tokens,
                             "tokens_sha256": "ab", "ctx": "128"},
            "kld/Q4_0": {"dtype": "F32", "shape": [values.len()], "data_offsets": [0, 4 * values.len()]},
        });
        let mut json = serde_json::to_vec(&header).unwrap();
        json.resize(json.len().div_ceil(8) * 8, b' ');
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend(json);
        out.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        out
    }

    #[test]
    fn reads_its_rungs_by_chunk_and_refuses_what_does_not_fit() {
        let v = KldValues::parse(&file(FORMAT, "[2,1]", &[0.5, 0.25, 1.0]), "f").unwrap();
        assert_eq!(v.chunks, [(0, 2), (1, 1)]);
        assert_eq!(v.chunked("Q4_0").unwrap(), [(0, &[0.5f32, 0.25][..]), (1, &[1.0f32][..])]);
        let err = KldValues::parse(&file(FORMAT, "[2,2]", &[0.5, 0.25, 1.0]), "f").unwrap_err();
        assert!(err.contains("kld/Q4_0") && err.contains("F32 [4]"), "{err}");
        let err = KldValues::parse(&file("other/1", "[2,1]", &[0.5, 0.25, 1.0]), "f").unwrap_err();
        assert!(err.contains("format \"other/1\""), "{err}");
        assert!(KldValues::parse(&[1, 2, 3], "f").unwrap_err().contains("shorter"));
    }
}
