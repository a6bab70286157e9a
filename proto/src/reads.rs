//! What a task reads that the farm may have made: the files behind each input URL of its message, so the scheduler
//! can send their recorded digests with the lease (`Task.inputs`: the worker's cache is content-addressed by them,
//! and every fetch is checked against them) and lease the task to a worker that already holds them.
//!
//! A model input names a GGUF file (the first of a split set: all its files are read), a single file, or an MLX
//! checkpoint folder (recorded with its folder digest, `worker/src/outputs.rs::folder_digest`). Inputs the farm did
//! not make (the release's source, texts, prompt sets) have no recorded digest and are left out by the caller.

use crate::{self as pb, task, verify_task};
use quantfarm_ggml::split::{parse_split_file_name, split_file_name};

impl task::Kind {
    /// The URLs of the files this task reads that a task of the farm may have made, each once, in reading order.
    pub fn reads(&self) -> Vec<String> {
        input_urls(self)
    }
}

fn input_urls(kind: &task::Kind) -> Vec<String> {
    use task::Kind as K;
    let mut out = Vec::new();
    match kind {
        K::Quantize(q) => quantize_inputs(q, &mut out),
        K::Verify(v) => {
            match &v.what {
                Some(verify_task::What::Quantize(q)) => quantize_inputs(q, &mut out),
                // The source (the user's checkpoint or the merge's files): read by tensor, not as whole files.
                Some(
                    verify_task::What::Gguf(_)
                    | verify_task::What::Merge(_)
                    | verify_task::What::Mlx(_)
                    | verify_task::What::Vllm(_),
                )
                | None => {}
            }
            // The stored copy, unless an evaluation task checks it as it fetches it.
            if v.stored_checked_by.is_empty() {
                if let Some(o) = v.what.as_ref().and_then(stored_output) {
                    out.push(o.to_string());
                }
            }
        }
        K::KldPlan(k) => model_files(&k.reference, &mut out),
        K::KldBase(k) => model_files(&k.reference, &mut out),
        K::Imatrix(i) => model_files(&i.reference, &mut out),
        K::Kld(k) => {
            model_files(&k.model, &mut out);
            out.push(k.base.clone());
        }
        K::PeerKld(p) => {
            model_files(&p.model, &mut out);
            out.push(p.base.clone());
        }
        K::MlxLmKld(k) => {
            model_files(&k.model, &mut out);
            out.push(k.base.clone());
        }
        K::TransformersKld(k) => {
            model_files(&k.model, &mut out);
            if !k.adapter.is_empty() {
                model_files(&k.adapter, &mut out);
            }
            out.push(k.base.clone());
        }
        K::TransformersGreedy(g) => {
            model_files(&g.model, &mut out);
            if !g.adapter.is_empty() {
                model_files(&g.adapter, &mut out);
            }
        }
        K::TransformersProbe(p) => model_files(&p.model, &mut out),
        K::Greedy(g) => {
            model_files(&g.model, &mut out);
            if !g.lora.is_empty() {
                out.push(g.lora.clone());
            }
        }
        K::Probe(p) => model_files(&p.model, &mut out),
        K::Choice(c) => model_files(&c.model, &mut out),
        K::MlxLmGreedy(g) => model_files(&g.model, &mut out),
        K::MlxLmProbe(p) => model_files(&p.model, &mut out),
        K::ImatrixMerge(m) => out.extend(m.parts.iter().map(|a| a.url.clone())),
        K::SensitivityProbe(p) => {
            if let Some(q) = &p.quantize {
                // Every file of the reference: the probe is made whole on the worker.
                out.extend((0..q.n_shards.max(1)).map(|s| shard_file(&q.input, s, q.n_shards)));
                out.push(q.imatrix.clone());
            }
            out.extend(p.bases.iter().map(|a| a.url.clone()));
        }
        K::SensitivityLookup(_) | K::SensitivityWrite(_) => {}
        K::Plan(_)
        | K::Gguf(_)
        | K::Noop(_)
        | K::MergePlan(_)
        | K::Merge(_)
        | K::MergeCheck(_)
        | K::Mlx(_)
        | K::Vllm(_) => {}
    }
    out.retain(|u| !u.is_empty());
    let mut seen = std::collections::HashSet::new();
    out.retain(|u| seen.insert(u.clone()));
    out
}

/// The stored object a verify task compares with.
pub fn stored_output(w: &verify_task::What) -> Option<&str> {
    match w {
        verify_task::What::Gguf(g) => Some(&g.output),
        verify_task::What::Quantize(q) => Some(&q.output),
        verify_task::What::Merge(m) => Some(&m.output),
        verify_task::What::Mlx(m) => Some(&m.output),
        verify_task::What::Vllm(v) => Some(&v.output),
    }
}

/// A quantize task reads one file of its input set (and the importance matrix).
fn quantize_inputs(q: &pb::QuantizeTask, out: &mut Vec<String>) {
    out.push(shard_file(&q.input, q.shard, q.n_shards));
    out.push(q.imatrix.clone());
}

/// The URL of file `shard` of the split set whose first file is `first` (itself when there is one file).
pub fn shard_file(first: &str, shard: u32, n_shards: u32) -> String {
    let (dir, name) = first.rsplit_once('/').unwrap_or(("", first));
    match parse_split_file_name(name) {
        Some((prefix, _, count)) if n_shards > 1 && shard < u32::from(count) => {
            let file = split_file_name(prefix, shard as u16, count);
            if dir.is_empty() {
                file
            } else {
                format!("{dir}/{file}")
            }
        }
        _ => first.to_string(),
    }
}

/// Every file of the model at `url`: the split set a split file name belongs to, else the URL itself.
fn model_files(url: &str, out: &mut Vec<String>) {
    let (dir, name) = url.rsplit_once('/').unwrap_or(("", url));
    match parse_split_file_name(name) {
        Some((prefix, _, count)) => {
            for i in 0..count {
                let file = split_file_name(prefix, i, count);
                out.push(if dir.is_empty() { file } else { format!("{dir}/{file}") });
            }
        }
        None => out.push(url.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate as pb;

    #[test]
    fn a_split_model_is_all_its_files_and_a_quantize_task_one() {
        let first = "s3://b/artifacts/ab/m-00001-of-00003.gguf";
        let t = pb::Task {
            kind: Some(task::Kind::Kld(pb::KldTask {
                model: first.into(),
                base: "s3://b/artifacts/cd/base.kld".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        assert_eq!(
            t.kind.as_ref().unwrap().reads(),
            [
                "s3://b/artifacts/ab/m-00001-of-00003.gguf",
                "s3://b/artifacts/ab/m-00002-of-00003.gguf",
                "s3://b/artifacts/ab/m-00003-of-00003.gguf",
                "s3://b/artifacts/cd/base.kld"
            ]
        );
        let q = pb::QuantizeTask { input: first.into(), shard: 2, n_shards: 3, ..Default::default() };
        let t = pb::Task { kind: Some(task::Kind::Quantize(q.clone())), ..Default::default() };
        assert_eq!(t.kind.as_ref().unwrap().reads(), ["s3://b/artifacts/ab/m-00003-of-00003.gguf"]);
        // Its verify task reads the same file and the stored copy, unless an evaluation task checks that.
        let mut v = pb::VerifyTask {
            what: Some(verify_task::What::Quantize(pb::QuantizeTask { output: "s3://b/q/x.gguf".into(), ..q })),
            ..Default::default()
        };
        let t = pb::Task { kind: Some(task::Kind::Verify(v.clone())), ..Default::default() };
        assert_eq!(t.kind.as_ref().unwrap().reads(), ["s3://b/artifacts/ab/m-00003-of-00003.gguf", "s3://b/q/x.gguf"]);
        v.stored_checked_by = "kld/Q8_0/0".into();
        let t = pb::Task { kind: Some(task::Kind::Verify(v)), ..Default::default() };
        assert_eq!(t.kind.as_ref().unwrap().reads(), ["s3://b/artifacts/ab/m-00003-of-00003.gguf"]);
        // One file: itself.
        assert_eq!(shard_file("/s/m.gguf", 0, 1), "/s/m.gguf");
    }
}
