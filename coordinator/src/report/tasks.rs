//! The report's `tasks`: each task's inputs and outputs as the report shows them (mirroring its protocol message,
//! minus what is too large to repeat: tensor lists, per-token values, continuations' tokens), and `timings`.

use std::collections::BTreeMap;

use quantfarm_proto::{task, task_result};
use serde_json::Value;

use super::model::{KindTiming, TaskRecord, Timings};
use crate::kinds::TaskKey;
use crate::sched::Release;

/// Every task but the report's own, in the release's order.
pub(super) fn records(rel: &Release) -> Vec<TaskRecord> {
    rel.tasks
        .iter()
        .filter(|t| t.key != TaskKey::REPORT)
        .map(|t| TaskRecord {
            id: t.id.clone(),
            worker: t.worker.clone(),
            attempts: t.attempts,
            duration_ms: t.duration_ms,
            inputs: t.task.as_ref().and_then(|t| t.kind.as_ref()).map_or(Value::Null, task::Kind::record),
            outputs: t.result.as_ref().and_then(|r| r.kind.as_ref()).map_or(Value::Null, task_result::Kind::record),
        })
        .collect()
}

/// Wall time of the release and the time its tasks ran, in all and by kind (`quantize`, `kld`, ...).
pub(super) fn timings(rel: &Release, now_ms: i64) -> Timings {
    let mut by_kind: BTreeMap<String, KindTiming> = BTreeMap::new();
    for t in rel.tasks.iter().filter(|t| t.result.is_some()) {
        let e = by_kind.entry(t.key.family().to_string()).or_insert(KindTiming { tasks: 0, total_ms: 0, max_ms: 0 });
        e.tasks += 1;
        e.total_ms += t.duration_ms;
        e.max_ms = e.max_ms.max(t.duration_ms);
    }
    Timings {
        created_ms: rel.created_ms,
        reported_ms: now_ms,
        wall_ms: (now_ms - rel.created_ms).max(0),
        task_ms: by_kind.values().map(|v| v.total_ms).sum(),
        by_kind,
    }
}
