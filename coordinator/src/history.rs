//! A journal with a long history, for the tests and `bench/coordinator-history`: `n` finished releases as a
//! coordinator that ran for months accumulates them, each with its tasks (stored messages and results) and its
//! signed report, written straight through the journal's own API in one transaction.
//!
//! The releases are a GGUF ladder of a two-file model (plan, conversion, quantization and verification of each
//! file, the report); every one finished `released`, with a report of about `report_bytes`.

use quantfarm_proto::{self as pb, task_result, ReleaseState};

use crate::journal::{Journal, JournalError, ReleaseRow, TaskRow, OUTPUTS_VERSION};

const YAML: &str =
    "name: history\nsource: model\noutputs:\n  gguf:\n    split: {max_tensors: 100}\n    quants: [Q8_0, Q4_K_M]\n";
const LEVELS: [&str; 2] = ["Q8_0", "Q4_K_M"];

/// The id of release number `i` of a history.
pub fn release_id(i: usize) -> String {
    format!("history-{i:08}")
}

fn artifact(url: String, i: usize) -> pb::Artifact {
    let sha = quantfarm_store::hex(&<sha2::Sha256 as sha2::Digest>::digest(url.as_bytes()));
    pb::Artifact { url, sha256: sha, bytes: (1 << 20) + (i % 7) as u64, types: vec![] }
}

fn result(a: &pb::Artifact) -> Vec<u8> {
    use prost::Message;
    let kind = task_result::Kind::Artifact(pb::ArtifactResult {
        artifact: Some(a.clone()),
        cache_hit: false,
        experts: vec![],
    });
    pb::TaskResult { kind: Some(kind) }.encode_to_vec()
}

/// Appends `n` finished releases to the journal at `path` (created if missing).
pub fn fill(path: &std::path::Path, n: usize, report_bytes: usize) -> Result<(), JournalError> {
    let mut journal = Journal::open(path)?;
    // A new journal is written as the coordinator writes one, outputs table included; an older one is filled in by
    // the coordinator when it opens it.
    let fresh = journal.release_counts()?.is_empty() && journal.user_version()? == 0;
    let filler = "x".repeat(report_bytes.saturating_sub(64));
    journal.batch(|b| {
        for i in 0..n {
            let id = release_id(i);
            let created_ms = 1_780_000_000_000 + i as i64 * 60_000;
            b.insert_release(&ReleaseRow {
                id: id.clone(),
                yaml: YAML.into(),
                file_name: "release.yaml".into(),
                base: "/srv/releases".into(),
                state: ReleaseState::Running as i32,
                error: None,
                report_json: None,
                report_url: None,
                created_ms,
                finished_ms: None,
            })?;
            let mut tasks: Vec<(String, Vec<String>, Option<pb::Artifact>)> = vec![("plan".into(), vec![], None)];
            let url = |name: &str| format!("s3://farm/store/artifacts/{i:08}/{name}");
            for shard in 0..2 {
                let file = format!("m-BF16-{:05}-of-00002.gguf", shard + 1);
                tasks.push((format!("gguf/{shard}"), vec!["plan".into()], Some(artifact(url(&file), i))));
                tasks.push((format!("verify/gguf/{shard}"), vec![format!("gguf/{shard}")], None));
                for level in LEVELS {
                    let file = format!("m-{level}-{:05}-of-00002.gguf", shard + 1);
                    let q = format!("quantize/{level}/{shard}");
                    tasks.push((q.clone(), vec![format!("gguf/{shard}")], Some(artifact(url(&file), i))));
                    tasks.push((format!("verify/{q}"), vec![q], None));
                }
            }
            let all: Vec<String> = tasks.iter().filter(|t| t.0.starts_with("verify/")).map(|t| t.0.clone()).collect();
            tasks.push(("report".into(), all, None));
            for (seq, (tid, deps, made)) in tasks.into_iter().enumerate() {
                if let Some(a) = &made {
                    b.record_output(&a.url, &a.sha256, a.bytes)?;
                }
                let row = TaskRow {
                    id: tid,
                    deps,
                    priority: 1,
                    state: "done".into(),
                    attempts: 1,
                    lease_id: None,
                    worker: Some(format!("worker-{}", i % 13)),
                    task: None,
                    result: made.as_ref().map(result),
                    error: None,
                    duration_ms: 1000 + (i % 997) as u64,
                };
                b.insert_task(&id, seq, &row)?;
                b.update_task(&id, &row)?;
            }
            let report =
                format!("{{\"release\":{{\"id\":\"{id}\"}},\"verdict\":\"released\",\"filler\":\"{filler}\"}}");
            let report_url = format!("s3://farm/store/releases/{id}/report.json");
            b.finish_release(
                &id,
                ReleaseState::Released as i32,
                None,
                Some(&report),
                Some(&report_url),
                created_ms + 600_000,
            )?;
        }
        Ok(())
    })?;
    if fresh {
        journal.set_user_version(OUTPUTS_VERSION)?;
    }
    Ok(())
}
