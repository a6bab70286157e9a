//! What llama-imatrix accumulates before llama-quantize divides it: per weight matrix, per expert, the sum over
//! tokens of each input column's square and the number of tokens (`IMatrixCollector::m_stats` in
//! `tools/imatrix/imatrix.cpp`, llama.cpp 0c1e570).
//!
//! Sums of parts add up, so a farm computes chunk groups anywhere and merges them. They are kept in f64 (a square
//! of an f32 is exact in f64) and parts are added in chunk order, so the merged file does not depend on how many
//! workers there were. The result is written as llama.cpp's GGUF imatrix (F32, `IMatrixCollector::save_imatrix`),
//! which llama-quantize and `llama-imatrix --in-file` read; a part is the same layout with F64 tensors and the key
//! [`KEY_FIRST_CHUNK`].

use std::collections::BTreeMap;

use quantfarm_store::sink::Committed;
use quantfarm_store::Blob;
use quantfarm_store::Location;
use quantfarm_tensors::gguf::{Array, GgufHeader, GgufStr, TensorDesc, Value};
use quantfarm_tensors::write::GgufWriter;
use quantfarm_tensors::GgmlType;

use super::{file_err, ImatrixError, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE, KEY_DATASETS, SUFFIX_COUNTS, SUFFIX_SUMS};

/// A part's first chunk in the whole text (parts only).
pub const KEY_FIRST_CHUNK: &str = "quantfarm.imatrix.first_chunk";
const KEY_TYPE: &str = "general.type";

/// One weight's statistics: `values[e·ne0 + j]` = Σ x_j² over the tokens routed to expert `e`, `counts[e]` = those
/// tokens (one expert for a dense matrix).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub values: Vec<f64>,
    pub counts: Vec<u64>,
}

impl Stats {
    /// Columns per expert.
    pub fn ne0(&self) -> usize {
        self.values.len() / self.counts.len().max(1)
    }
}

/// Collected statistics of chunks `first_chunk .. first_chunk + chunk_count` of a text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImatrixSums {
    /// Weight name → statistics, sorted by name (the order llama-imatrix writes).
    pub entries: BTreeMap<String, Stats>,
    pub first_chunk: u32,
    pub chunk_count: u32,
    /// Tokens per chunk (llama-imatrix's `n_ctx / n_parallel`).
    pub chunk_size: u32,
    /// The calibration texts, as named by the user (`imatrix.datasets`).
    pub datasets: Vec<String>,
}

impl ImatrixSums {
    /// Adds `next`, the part that follows this one: the same chunk size, its chunks right after these, and the same
    /// shape for every weight both hold. Adding the parts of a text in order gives the same bytes however the
    /// chunks were spread.
    pub fn append(&mut self, next: &ImatrixSums, what: &str) -> Result<(), ImatrixError> {
        // The first part: every part names the same text.
        if self.entries.is_empty() && self.chunk_count == 0 {
            *self = next.clone();
            return Ok(());
        }
        if next.chunk_size != self.chunk_size {
            return Err(file_err(
                what,
                format!("chunks of {} tokens, the parts before it {}", next.chunk_size, self.chunk_size),
            ));
        }
        let expected = self.first_chunk + self.chunk_count;
        if next.first_chunk != expected {
            return Err(file_err(
                what,
                format!("starts at chunk {}, expected {expected} (parts are merged in chunk order)", next.first_chunk),
            ));
        }
        for (name, s) in &next.entries {
            match self.entries.get_mut(name) {
                None => {
                    self.entries.insert(name.clone(), s.clone());
                }
                Some(acc) => {
                    if acc.values.len() != s.values.len() || acc.counts.len() != s.counts.len() {
                        return Err(super::entry_err(
                            what,
                            name,
                            format!(
                                "{} values for {} experts, the parts before it {} for {}",
                                s.values.len(),
                                s.counts.len(),
                                acc.values.len(),
                                acc.counts.len()
                            ),
                        ));
                    }
                    acc.values.iter_mut().zip(&s.values).for_each(|(a, b)| *a += b);
                    acc.counts.iter_mut().zip(&s.counts).for_each(|(a, b)| *a += b);
                }
            }
        }
        self.chunk_count += next.chunk_count;
        Ok(())
    }

    /// The GGUF imatrix llama-imatrix writes (`save_imatrix`): `general.type`, `imatrix.datasets`,
    /// `imatrix.chunk_count`, `imatrix.chunk_size`; per weight by name `W.in_sum2` (ne0 × experts) then `W.counts`
    /// (1 × experts), F32 — or, for a part, F64 and the first chunk.
    pub async fn write(&self, target: &Location, part: bool, overwrite: bool) -> Result<Committed, ImatrixError> {
        let mut meta = vec![
            (KEY_TYPE.to_string(), Value::String(GgufStr(b"imatrix".to_vec()))),
            (
                KEY_DATASETS.to_string(),
                Value::Array(Array::String(self.datasets.iter().map(|d| GgufStr(d.as_bytes().to_vec())).collect())),
            ),
            (KEY_CHUNK_COUNT.to_string(), Value::U32(self.chunk_count)),
            (KEY_CHUNK_SIZE.to_string(), Value::U32(self.chunk_size)),
        ];
        if part {
            meta.push((KEY_FIRST_CHUNK.to_string(), Value::U32(self.first_chunk)));
        }
        let ty = if part { GgmlType::F64 } else { GgmlType::F32 };
        // ggml_n_dims: trailing dimensions of 1 are not written.
        let dims = |a: u64, b: u64| if b == 1 { vec![a] } else { vec![a, b] };
        let mut descs = Vec::with_capacity(self.entries.len() * 2);
        for (name, s) in &self.entries {
            let n_mat = s.counts.len() as u64;
            descs.push(TensorDesc { name: format!("{name}{SUFFIX_SUMS}"), dims: dims(s.ne0() as u64, n_mat), ty });
            descs.push(TensorDesc { name: format!("{name}{SUFFIX_COUNTS}"), dims: dims(1, n_mat), ty });
        }
        let mut w = GgufWriter::create(target, 3, &meta, &descs, overwrite).await?;
        if !part {
            // llama-imatrix stops on a non-finite sum; an F32 file cannot hold one past f32's range.
            for (name, s) in &self.entries {
                if let Some(v) = s.values.iter().find(|v| !(**v as f32).is_finite()) {
                    return Err(super::entry_err(&target.to_string(), name, format!("sum {v} does not fit an F32")));
                }
            }
        }
        let mut buf = Vec::new();
        for s in self.entries.values() {
            let counts: Vec<f64> = s.counts.iter().map(|&c| c as f64).collect();
            for values in [&s.values, &counts] {
                buf.clear();
                if part {
                    values.iter().for_each(|v| buf.extend_from_slice(&v.to_le_bytes()));
                } else {
                    values.iter().for_each(|&v| buf.extend_from_slice(&(v as f32).to_le_bytes()));
                }
                w.write(&buf).await?;
            }
        }
        Ok(w.finish().await?)
    }

    /// Reads a GGUF imatrix (llama-imatrix's, F32) or a part (F64) as raw sums and counts.
    pub async fn load(loc: &Location) -> Result<ImatrixSums, ImatrixError> {
        let blob = Blob::open(loc).await?;
        let bytes = blob.read_vec(0, blob.len()).await?;
        ImatrixSums::from_bytes(&bytes, &loc.to_string())
    }

    /// Parses a whole GGUF imatrix or part named `file`.
    pub fn from_bytes(bytes: &[u8], file: &str) -> Result<ImatrixSums, ImatrixError> {
        let (header, data) = super::gguf_parts(bytes, file)?;
        from_gguf(&header, data, file)
    }

    /// Every mixture-of-experts weight (more than one expert) with the experts no token was routed to, in name
    /// order: what `llama-imatrix` warns about when it saves (`entry '…' has partial data (P%)`, P the share of
    /// experts with tokens; `IMatrixCollector::save_imatrix`, tools/imatrix/imatrix.cpp). llama-quantize then uses
    /// an importance of 1 for those experts' columns (no data), which low-bit types quantize worst.
    pub fn expert_coverage(&self) -> Vec<ExpertCoverage> {
        self.entries
            .iter()
            .filter(|(_, st)| st.counts.len() > 1)
            .map(|(name, st)| ExpertCoverage {
                weight: name.clone(),
                experts: st.counts.len() as u32,
                unrouted: (0..st.counts.len() as u32).filter(|&e| st.counts[e as usize] == 0).collect(),
            })
            .collect()
    }
}

/// One mixture-of-experts weight's experts and those no calibration token reached.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExpertCoverage {
    pub weight: String,
    pub experts: u32,
    /// The experts (by index) with no token.
    pub unrouted: Vec<u32>,
}

impl ExpertCoverage {
    /// The share of experts with tokens, in percent, as llama-imatrix prints it (`%.2f`).
    pub fn percent(&self) -> f64 {
        let all = f64::from(self.experts.max(1));
        100.0 * (all - self.unrouted.len() as f64) / all
    }
}

fn from_gguf(h: &GgufHeader, data: &[u8], file: &str) -> Result<ImatrixSums, ImatrixError> {
    let u32_key = |key: &str| match h.get(key) {
        Some(Value::U32(v)) => Ok(*v),
        Some(v) => Err(file_err(file, format!("metadata {key} is {}, expected UINT32", v.value_type().name()))),
        None => Err(file_err(file, format!("missing imatrix metadata {key}"))),
    };
    let datasets = match h.get(KEY_DATASETS) {
        Some(Value::Array(Array::String(v))) => v.iter().map(|s| s.to_string_lossy()).collect(),
        Some(_) => return Err(file_err(file, format!("metadata {KEY_DATASETS} is not an array of strings"))),
        None => return Err(file_err(file, format!("missing imatrix metadata {KEY_DATASETS}"))),
    };
    let mut out = ImatrixSums {
        entries: BTreeMap::new(),
        first_chunk: if h.get(KEY_FIRST_CHUNK).is_some() { u32_key(KEY_FIRST_CHUNK)? } else { 0 },
        chunk_count: u32_key(KEY_CHUNK_COUNT)?,
        chunk_size: u32_key(KEY_CHUNK_SIZE)?,
        datasets,
    };
    let read = |i: usize| -> Result<Vec<f64>, ImatrixError> {
        let t = &h.tensors[i];
        let width = match t.ty {
            GgmlType::F32 => 4,
            GgmlType::F64 => 8,
            other => return Err(file_err(file, format!("tensor {:?} is {other}, expected F32 or F64", t.name))),
        };
        let n = usize::try_from(t.elements()).map_err(|_| file_err(file, format!("tensor {:?} too large", t.name)))?;
        let start = usize::try_from(t.offset).unwrap_or(usize::MAX);
        let bytes = start
            .checked_add(n.saturating_mul(width))
            .and_then(|end| data.get(start..end))
            .ok_or_else(|| file_err(file, format!("tensor {:?} runs past the end of the file (truncated?)", t.name)))?;
        let v: Vec<f64> = if width == 4 {
            bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64).collect()
        } else {
            bytes.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap_or_default())).collect()
        };
        match v.iter().position(|x| !x.is_finite() || *x < 0.0) {
            Some(j) => {
                Err(file_err(file, format!("tensor {:?}: value {j} is {} (must be finite and >= 0)", t.name, v[j])))
            }
            None => Ok(v),
        }
    };
    let (pairs, other) = super::pair_tensors(h);
    if let Some(name) = other {
        return Err(file_err(file, format!("tensor {name:?} is neither .in_sum2 nor .counts")));
    }
    for (name, (sums, counts)) in pairs {
        let (Some(sums), Some(counts)) = (sums, counts) else {
            return Err(super::entry_err(
                file,
                name,
                "mismatched sums and counts (one of .in_sum2/.counts is missing)",
            ));
        };
        let values = read(sums)?;
        let counts = read(counts)?;
        if counts.is_empty() || !values.len().is_multiple_of(counts.len()) {
            return Err(super::entry_err(
                file,
                name,
                format!("{} sums are not a whole number of columns for {} counts", values.len(), counts.len()),
            ));
        }
        if let Some(c) = counts.iter().find(|c| c.fract() != 0.0 || **c > (1u64 << 53) as f64) {
            return Err(super::entry_err(file, name, format!("token count {c} is not a whole number")));
        }
        let counts = counts.iter().map(|&c| c as u64).collect();
        out.entries.insert(name.to_string(), Stats { values, counts });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn expert_coverage_names_the_experts_no_token_reached() {
        let mut sums = ImatrixSums::default();
        let stats = |counts: Vec<u64>| Stats { values: vec![1.0; counts.len() * 2], counts };
        sums.entries.insert("blk.0.attn_q.weight".into(), stats(vec![64]));
        sums.entries.insert("blk.0.ffn_up_exps.weight".into(), stats(vec![10, 0, 7, 0]));
        sums.entries.insert("blk.1.ffn_up_exps.weight".into(), stats(vec![1, 2, 3, 4]));
        let cov = sums.expert_coverage();
        assert_eq!(cov.len(), 2, "dense weights have no experts: {cov:?}");
        assert_eq!(
            (cov[0].weight.as_str(), cov[0].experts, cov[0].unrouted.clone()),
            ("blk.0.ffn_up_exps.weight", 4, vec![1, 3])
        );
        assert_eq!(format!("{:.2}", cov[0].percent()), "50.00");
        assert!(cov[1].unrouted.is_empty() && cov[1].percent() == 100.0);
    }

    use super::*;

    fn part(first: u32, n: u32, v: f64) -> ImatrixSums {
        let mut entries = BTreeMap::new();
        entries
            .insert("blk.0.ffn_up.weight".to_string(), Stats { values: vec![v, 2.0 * v], counts: vec![n as u64 * 4] });
        entries
            .insert("blk.0.ffn_up_exps.weight".to_string(), Stats { values: vec![v, v, 0.0, 0.0], counts: vec![3, 0] });
        ImatrixSums { entries, first_chunk: first, chunk_count: n, chunk_size: 4, datasets: vec!["t.txt".into()] }
    }

    #[test]
    fn parts_add_in_chunk_order_only() {
        let mut acc = ImatrixSums::default();
        acc.append(&part(0, 2, 1.0), "p0").unwrap();
        acc.append(&part(2, 1, 0.5), "p1").unwrap();
        assert_eq!((acc.first_chunk, acc.chunk_count), (0, 3));
        let s = &acc.entries["blk.0.ffn_up.weight"];
        assert_eq!((s.values.as_slice(), s.counts.as_slice()), (&[1.5, 3.0][..], &[12u64][..]));
        assert_eq!(acc.entries["blk.0.ffn_up_exps.weight"].counts, [6, 0]);
        let err = acc.append(&part(5, 1, 1.0), "p9").unwrap_err().to_string();
        assert!(err.contains("p9") && err.contains("expected 3"), "{err}");
        let mut wide = part(3, 1, 1.0);
        wide.entries.get_mut("blk.0.ffn_up.weight").unwrap().values.push(1.0);
        let err = acc.append(&wide, "p3").unwrap_err().to_string();
        assert!(err.contains("blk.0.ffn_up.weight") && err.contains("3 values"), "{err}");
    }

    /// The fuzz seeds (written by gguf-py, `fuzz/seeds/imatrix/`) are valid files, so the fuzzer starts from inputs
    /// that reach past the header checks.
    #[test]
    fn the_fuzz_seeds_are_valid_imatrix_files() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/imatrix");
        let read = |n: &str| std::fs::read(dir.join(n)).unwrap();
        let f = ImatrixSums::from_bytes(&read("imatrix.gguf"), "imatrix.gguf").unwrap();
        let p = ImatrixSums::from_bytes(&read("part.gguf"), "part.gguf").unwrap();
        assert_eq!((f.first_chunk, p.first_chunk, f.datasets.as_slice()), (0, 4, &["calib.txt".to_string()][..]));
        assert_eq!(f.entries, p.entries);
        assert_eq!(f.entries["blk.0.ffn_up_exps.weight"].counts, [3, 0]);
        let im = crate::imatrix::Imatrix::from_bytes(&read("imatrix.gguf"), "imatrix.gguf").unwrap();
        assert_eq!(im.get("blk.0.ffn_up.weight").unwrap(), [1.5 / 1024.0, 2.0 / 1024.0, 0.0, 4.25 / 1024.0]);
        let legacy = crate::imatrix::Imatrix::from_bytes(&read("legacy.dat"), "legacy.dat").unwrap();
        assert_eq!(legacy.get("blk.0.attn_q.weight").unwrap(), [2.0, 0.5]);
        assert!(ImatrixSums::from_bytes(&read("legacy.dat"), "legacy.dat").is_err(), "sums are GGUF only");
    }

    #[tokio::test]
    async fn files_round_trip_and_parts_keep_every_bit() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = part(7, 2, 1.0 / 3.0);
        p.entries.get_mut("blk.0.ffn_up.weight").unwrap().values[1] = 1e300;
        let loc = Location::local(dir.path().join("part.gguf"));
        p.write(&loc, true, false).await.unwrap();
        assert_eq!(ImatrixSums::load(&loc).await.unwrap(), p);
        // The final file holds F32, as llama.cpp writes it: a sum past f32's range is refused, naming the weight,
        // and nothing is left behind.
        let loc = Location::local(dir.path().join("final.gguf"));
        let err = p.write(&loc, false, false).await.unwrap_err().to_string();
        assert!(err.contains("blk.0.ffn_up.weight") && err.contains("F32"), "{err}");
        assert!(!dir.path().join("final.gguf").exists());
        p.entries.get_mut("blk.0.ffn_up.weight").unwrap().values[1] = 2.5;
        p.write(&loc, false, false).await.unwrap();
        let back = ImatrixSums::load(&loc).await.unwrap();
        let s = &back.entries["blk.0.ffn_up.weight"];
        assert_eq!(s.values, [(1.0f64 / 3.0) as f32 as f64, 2.5]);
        assert_eq!(back.entries["blk.0.ffn_up_exps.weight"].counts, [3, 0]);
        // llama-quantize's reading of the same file: the mean of x² per column.
        let im = crate::imatrix::Imatrix::load(&loc).await.unwrap();
        assert_eq!(im.get("blk.0.ffn_up.weight").unwrap(), [(1.0f64 / 3.0) as f32 / 8.0, 2.5 / 8.0]);
        assert_eq!(im.get("blk.0.ffn_up_exps.weight").unwrap(), [1.0 / 3.0 / 3.0, 1.0 / 3.0 / 3.0, 1.0, 1.0]);
    }
}
