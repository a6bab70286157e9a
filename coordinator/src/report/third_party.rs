//! The report's `third_party` section: each GGUF file of `evaluation.peers` made elsewhere, merged from its chunk
//! groups like a rung (llama-perplexity's figures against the farm's base logits), with its file's identity and type
//! mix, and its paired difference with the farm's rung nearest in size.

use std::collections::BTreeMap;

use quantfarm_parity::paired::paired_kld;
use quantfarm_parity::{ChunkStats, KldSummary};

use super::build::{kld_record, merge_whole};
use super::model::*;
use crate::kinds::Folded;
use crate::sched::Release;

pub(super) fn records(
    rel: &Release,
    folded: &Folded,
    klds: &BTreeMap<String, Result<KldSummary, String>>,
    artifacts: &[Artifact],
) -> Vec<ThirdPartyRecord> {
    let confidence = rel.spec.evaluation.as_ref().map_or(0.95, |e| e.confidence);
    rel.eval
        .third_party
        .iter()
        .enumerate()
        .map(|(i, url)| {
            let acc = folded.third_party.get(&(i as u32));
            let chunks: &[ChunkStats] = acc.map_or(&[], |a| a.chunks.as_slice());
            let merged = merge_whole(rel, chunks);
            let file = acc.and_then(|a| a.file);
            let type_mix: Vec<TypeCount> = file
                .map(|f| {
                    f.types
                        .iter()
                        .map(|t| TypeCount {
                            ggml_type: t.ggml_type.clone(),
                            tensors: t.tensors,
                            elements: t.elements,
                            bytes: t.bytes,
                        })
                        .collect()
                })
                .unwrap_or_default();
            let elements: u64 = type_mix.iter().map(|t| t.elements).sum();
            let tensor_bytes: u64 = type_mix.iter().map(|t| t.bytes).sum();
            let bits_per_weight =
                (elements > 0).then(|| (tensor_bytes as f64 * 8.0 / elements as f64 * 10000.0).round() / 10000.0);
            // The farm's rung nearest in size, among those measured whole in llama.cpp.
            let bytes = file.map(|f| f.bytes);
            let nearest = bytes.and_then(|b| {
                artifacts
                    .iter()
                    .filter(|a| klds.get(&a.file_type).is_some_and(Result::is_ok))
                    .min_by_key(|a| (a.bytes.abs_diff(b), a.file_type.clone()))
            });
            let paired = match (&merged, nearest.and_then(|a| folded.kld.get(&a.file_type))) {
                (Ok(_), Some(theirs)) => paired_kld(chunks, theirs, confidence).ok(),
                _ => None,
            };
            ThirdPartyRecord {
                url: url.clone(),
                file: file.map(|f| FileRef { url: f.url.clone(), sha256: f.sha256.clone(), bytes: f.bytes }),
                type_mix,
                bits_per_weight,
                kld: kld_record(merged),
                nearest: nearest.map(|a| a.file_type.clone()),
                distinguishable: paired.as_ref().map(|p| p.excludes(0.0)),
                paired: paired.as_ref().map(Interval::from),
            }
        })
        .collect()
}
