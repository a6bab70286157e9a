//! The report's `paired` section: every rung measured in llama.cpp (all scored against the same base logits, on the
//! same tokens) as a mean KL divergence with its chunk-clustered interval, each against the next larger rung as a
//! per-token paired difference (`quantfarm_parity::paired`), and the per-token values file they are computed from,
//! published beside `report.json` so that anyone can recompute them (and `quantfarm report diff` can pair two
//! releases' rungs).

use std::collections::BTreeMap;

use quantfarm_parity::paired::{kld_chunks, mean_interval, paired_kld};
use quantfarm_parity::{ChunkStats, KldSummary};
use quantfarm_tensors::safetensors::{encode_header, StTensorDesc};
use quantfarm_tensors::Dtype;

use super::model::*;
use crate::sched::Release;

/// The values file's name, beside `report.json`.
pub const VALUES_FILE: &str = "kld-values.safetensors";

/// The values file's `format` metadata.
pub const VALUES_FORMAT: &str = "quantfarm-kld-values/1";

/// The section and the values file's bytes, or `None` when no rung has its KL divergence measured in llama.cpp.
/// `values_url`: where the file is published.
pub(super) fn section(
    rel: &Release,
    chunks: &BTreeMap<String, Vec<ChunkStats>>,
    klds: &BTreeMap<String, Result<KldSummary, String>>,
    artifacts: &[Artifact],
    values_url: &str,
) -> Option<(Paired, Vec<u8>)> {
    let confidence = rel.spec.evaluation.as_ref()?.confidence;
    // The rungs measured whole, by size (then name): each with its chunks in chunk order. One the stop rule
    // stopped early (`evaluation.stop`) is not paired: its interval is the `sequential` section's.
    let whole = rel.result(&crate::kinds::Kld::Plan.into()).and_then(|r| r.kld_plan()).map_or(0, |k| k.n_chunks);
    let mut rungs: Vec<(&Artifact, Vec<&ChunkStats>, &[ChunkStats])> = artifacts
        .iter()
        .filter(|a| klds.get(&a.file_type).is_some_and(|k| k.as_ref().is_ok_and(|s| s.n_chunks == u64::from(whole))))
        .filter_map(|a| {
            let all = chunks.get(&a.file_type)?;
            let mut list: Vec<&ChunkStats> = all.iter().collect();
            list.sort_by_key(|c| c.chunk);
            Some((a, list, all.as_slice()))
        })
        .collect();
    rungs.sort_by(|x, y| (x.0.bytes, &x.0.file_type).cmp(&(y.0.bytes, &y.0.file_type)));
    let layout = |list: &[&ChunkStats]| list.iter().map(|c| (c.chunk, c.kld_values.len())).collect::<Vec<_>>();
    let first = layout(&rungs.first()?.1);
    // Every merged rung has every chunk of the text; one that does not (it cannot) is left out rather than paired.
    rungs.retain(|(_, list, _)| layout(list) == first);
    let mut means = Vec::new();
    for (a, _, all) in &rungs {
        if let Ok(m) = mean_interval(&kld_chunks(all), confidence) {
            means.push(RungInterval { file_type: a.file_type.clone(), bytes: a.bytes, kld: Interval::from(&m) });
        }
    }
    let mut pairs = Vec::new();
    for w in rungs.windows(2) {
        let ((small, _, a), (large, _, b)) = (&w[0], &w[1]);
        let Ok(d) = paired_kld(a, b, confidence) else { continue };
        let se = |ft: &str| means.iter().find(|m| m.file_type == ft).map_or(f64::NAN, |m| m.kld.se_chunks);
        pairs.push(PairedComparison {
            smaller: small.file_type.clone(),
            larger: large.file_type.clone(),
            diff: Interval::from(&d),
            se_unpaired: se(&small.file_type).hypot(se(&large.file_type)),
            distinguishable: d.excludes(0.0),
        });
    }
    let bytes = values_file(rel, &rungs);
    let values = FileRef {
        url: values_url.to_string(),
        sha256: quantfarm_store::hex(&<sha2::Sha256 as sha2::Digest>::digest(&bytes)),
        bytes: bytes.len() as u64,
    };
    let method = format!(
        "per-token KL divergence of every rung measured in llama.cpp against the GGUF BF16's base logits (the values \
         file); each mean with a chunk-clustered interval (the chunk is the sampled unit: cluster-robust standard \
         error, Student's t on chunks − 1 degrees of freedom) at {confidence}; each rung against the next larger \
         one by the mean of their per-token differences on the same tokens, with the same interval; \
         docs/statistics.md"
    );
    Some((Paired { method, confidence, values, means, pairs }, bytes))
}

/// Each level's interval and paired figures for the gates, or why it has none.
pub(super) fn figures(paired: Option<&Paired>, m: &mut crate::gates::Measured) {
    use crate::gates::Figure;
    for (level, f) in &mut m.levels {
        let mean = paired.and_then(|p| p.means.iter().find(|r| &r.file_type == level));
        let why = "not measured: no KL divergence of this level in llama.cpp".to_string();
        f.set(Figure::KldMeanLow, mean.map(|r| r.kld.low).ok_or_else(|| why.clone()));
        f.set(Figure::KldMeanHigh, mean.map(|r| r.kld.high).ok_or_else(|| why.clone()));
        let pair = paired.and_then(|p| p.pairs.iter().find(|c| &c.smaller == level));
        let none = if mean.is_some() { "no larger rung measured on the same tokens".to_string() } else { why };
        let next = pair.and_then(|c| paired.and_then(|p| p.means.iter().find(|r| r.file_type == c.larger)));
        f.set(Figure::NextKldMean, next.map(|r| r.kld.mean).ok_or_else(|| none.clone()));
        f.set(Figure::PairedNextDiff, pair.map(|c| c.diff.mean).ok_or_else(|| none.clone()));
        f.set(Figure::PairedNextLow, pair.map(|c| c.diff.low).ok_or_else(|| none.clone()));
        f.set(Figure::PairedNextHigh, pair.map(|c| c.diff.high).ok_or_else(|| none.clone()));
    }
}

/// The values file: a safetensors file with one F32 tensor `kld/FILE_TYPE` per rung (by size), each its per-token
/// values in chunk order, and metadata `format`, `chunks` and `chunk_tokens` (JSON arrays: the chunk indices and
/// each one's token count), `tokens_sha256` (the evaluation text's tokens) and `ctx`.
fn values_file(rel: &Release, rungs: &[(&Artifact, Vec<&ChunkStats>, &[ChunkStats])]) -> Vec<u8> {
    let descs: Vec<StTensorDesc> = rungs
        .iter()
        .map(|(a, list, _)| StTensorDesc {
            name: format!("kld/{}", a.file_type),
            dtype: Dtype::F32,
            shape: vec![list.iter().map(|c| c.kld_values.len() as u64).sum()],
        })
        .collect();
    let first = rungs.first().map(|r| r.1.as_slice()).unwrap_or_default();
    let json = |v: Vec<u64>| serde_json::to_string(&v).expect("numbers serialize");
    let plan = rel.result(&crate::kinds::Kld::Plan.into()).and_then(quantfarm_proto::TaskResult::kld_plan);
    let metadata = vec![
        ("format".to_string(), VALUES_FORMAT.to_string()),
        ("chunks".to_string(), json(first.iter().map(|c| u64::from(c.chunk)).collect())),
        ("chunk_tokens".to_string(), json(first.iter().map(|c| c.kld_values.len() as u64).collect())),
        ("tokens_sha256".to_string(), plan.map(|p| p.tokens_sha256.clone()).unwrap_or_default()),
        ("ctx".to_string(), rel.spec.evaluation.as_ref().map_or(0, |e| e.ctx).to_string()),
    ];
    let mut out = encode_header(&descs, &metadata);
    for (_, list, _) in rungs {
        for c in list {
            for v in &c.kld_values {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    out
}
