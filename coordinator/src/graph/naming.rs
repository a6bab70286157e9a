//! Where outputs live: content-addressed folders named by the sha256 of everything the output depends on, so a task
//! run twice writes (or finds) the same object.

use quantfarm_ggml::split::split_file_name;
use quantfarm_proto as pb;
use quantfarm_store::Location;
use sha2::{Digest, Sha256};

use super::Ctx;

/// The output a task makes at a content-addressed URL, for the kinds that make one.
pub fn output_url(t: &pb::Task) -> Option<&str> {
    t.kind.as_ref()?.output()
}

/// Where a writer of `t` stages files (its output, or the synthetic model a plan writes): what to sweep when its
/// lease dies.
pub fn written_url(t: &pb::Task) -> Option<&str> {
    t.kind.as_ref()?.writes()
}

/// For `synthetic:NAME` sources: the versioned name of the built-in model, or why NAME is unknown.
pub fn synthetic_name(source: &str) -> Option<Result<&'static str, String>> {
    let name = source.strip_prefix("synthetic:")?;
    Some(pb::synthetic_model(name).ok_or_else(|| {
        let known: Vec<&str> = pb::SYNTHETIC_MODELS.iter().map(|(n, _)| *n).collect();
        format!("unknown synthetic model {name:?} (known: {})", known.join(", "))
    }))
}

/// Where an output lives: `artifacts/HASH/NAME` in the store, `HASH` the short sha256 of `identity` (everything
/// the output's bytes depend on, led by a versioned tag of the recipe), so a task made twice writes or finds the
/// same object. The one place that names an artifact.
pub(crate) fn artifact(ctx: &Ctx, identity: &[&str], name: &str) -> Result<Location, String> {
    let folder = short_hash(identity);
    ctx.store.child(&format!("artifacts/{folder}/{name}")).map_err(|e| e.to_string())
}

pub(crate) fn short_hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update(b"\n");
    }
    quantfarm_store::hex(&h.finalize()[..16])
}

pub(crate) fn split_text(rule: &Option<pb::SplitRule>) -> String {
    match rule.as_ref().and_then(|r| r.rule.as_ref()) {
        None => "one file".into(),
        Some(pb::split_rule::Rule::MaxTensors(n)) => format!("max_tensors {n}"),
        Some(pb::split_rule::Rule::MaxBytes(n)) => format!("max_bytes {n}"),
    }
}

pub(crate) fn file_name(prefix: &str, shard: u32, n: u32) -> String {
    if n == 1 {
        format!("{prefix}.gguf")
    } else {
        split_file_name(prefix, shard as u16, n as u16)
    }
}
