//! The tally of a release's tasks the metrics page adds up (by state, bytes written, run times by kind), kept for
//! releases evicted from memory since the coordinator started.

use quantfarm_proto::task_result;

use super::{Release, TState};

/// Upper bounds of the task-duration histogram, in seconds.
pub(crate) const BUCKETS: [f64; 12] = [0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0];

/// Tasks by state, artifact bytes written and run times by kind: over the releases in memory, plus
/// [`History`] for those evicted since the coordinator started (what the metrics page adds up).
#[derive(Clone, Default)]
pub struct History {
    pub(crate) tasks: std::collections::BTreeMap<&'static str, u64>,
    pub(crate) written: u64,
    pub(crate) durations: std::collections::BTreeMap<String, ([u64; BUCKETS.len()], u64, f64)>,
}

impl History {
    /// Adds a release's tasks.
    pub fn add(&mut self, r: &Release) {
        for t in &r.tasks {
            *self.tasks.entry(t.state.name()).or_default() += 1;
            if let Some(task_result::Kind::Artifact(a)) = t.result.as_ref().and_then(|r| r.kind.as_ref()) {
                if !a.cache_hit {
                    self.written += a.artifact.as_ref().map_or(0, |a| a.bytes);
                }
            }
            if matches!(t.state, TState::Done) && t.result.is_some() {
                let secs = t.duration_ms as f64 / 1000.0;
                let e = self.durations.entry(t.key.family().to_string()).or_insert(([0; BUCKETS.len()], 0, 0.0));
                for (i, b) in BUCKETS.iter().enumerate() {
                    if secs <= *b {
                        e.0[i] += 1;
                    }
                }
                e.1 += 1;
                e.2 += secs;
            }
        }
    }
}
