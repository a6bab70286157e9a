//! Which worker holds which inputs: the sha256s each worker's local cache reported (with its lease requests) plus
//! the inputs of the tasks it was leased since (it is fetching them), indexed both ways so that the scheduler can
//! ask "who else holds this task's inputs" without scanning every worker.
//!
//! The policy that uses it lives in `sched/lease.rs` (`Sched::lease`): among ready tasks of one priority a worker
//! gets the one whose inputs it holds the most bytes of, and a task waits a bounded time for a worker that holds
//! more of it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Instant;

use quantfarm_proto as pb;

#[derive(Default)]
pub struct Holdings {
    by_worker: HashMap<String, HashSet<String>>,
    by_sha: HashMap<String, BTreeSet<String>>,
    /// When each worker last began fetching inputs it did not hold (a lease added them).
    fetching_since: HashMap<String, Instant>,
}

impl Holdings {
    /// Replaces what `worker` holds with `shas` (its cache's report) plus `fetching` (its leased tasks' inputs).
    pub fn set<'a>(&mut self, worker: &str, shas: &[String], fetching: impl Iterator<Item = &'a str>) {
        let new: HashSet<String> = shas.iter().cloned().chain(fetching.map(str::to_string)).collect();
        if self.by_worker.get(worker) == Some(&new) {
            return;
        }
        self.forget(worker);
        for s in &new {
            self.by_sha.entry(s.clone()).or_default().insert(worker.to_string());
        }
        if !new.is_empty() {
            self.by_worker.insert(worker.to_string(), new);
        }
    }

    /// `worker` was leased a task reading `inputs` at `now`: it will hold them (as far as its cache keeps them).
    pub fn add(&mut self, worker: &str, inputs: &[pb::InputFile], now: Instant) {
        if inputs.is_empty() {
            return;
        }
        let held = self.by_worker.entry(worker.to_string()).or_default();
        for i in inputs {
            if held.insert(i.sha256.clone()) {
                self.by_sha.entry(i.sha256.clone()).or_default().insert(worker.to_string());
                self.fetching_since.insert(worker.to_string(), now);
            }
        }
    }

    /// When `worker` last began fetching inputs (none: it holds what it reported).
    pub fn fetching_since(&self, worker: &str) -> Option<Instant> {
        self.fetching_since.get(worker).copied()
    }

    /// Drops everything known about `worker`.
    pub fn forget(&mut self, worker: &str) {
        self.fetching_since.remove(worker);
        if let Some(old) = self.by_worker.remove(worker) {
            for s in old {
                if let Some(ws) = self.by_sha.get_mut(&s) {
                    ws.remove(worker);
                    if ws.is_empty() {
                        self.by_sha.remove(&s);
                    }
                }
            }
        }
    }

    /// Bytes of `inputs` that `worker` holds.
    pub fn held(&self, worker: &str, inputs: &[pb::InputFile]) -> u64 {
        match self.by_worker.get(worker) {
            Some(h) => inputs.iter().filter(|i| h.contains(&i.sha256)).map(|i| i.bytes).sum(),
            None => 0,
        }
    }

    /// The workers that hold any of `inputs`, each once.
    pub fn holders<'a>(&'a self, inputs: &'a [pb::InputFile]) -> BTreeSet<&'a str> {
        inputs.iter().filter_map(|i| self.by_sha.get(&i.sha256)).flatten().map(String::as_str).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.by_sha.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(sha: &str, bytes: u64) -> pb::InputFile {
        pb::InputFile { url: format!("s3://b/{sha}"), sha256: sha.into(), bytes }
    }

    #[test]
    fn reports_replace_and_leases_add() {
        let mut h = Holdings::default();
        let ins = [input("a", 10), input("b", 5)];
        h.set("w1", &["a".into()], std::iter::empty());
        let t0 = Instant::now();
        h.add("w2", &ins[1..], t0);
        assert_eq!(h.fetching_since("w2"), Some(t0));
        assert_eq!(h.fetching_since("w1"), None);
        assert_eq!(h.held("w1", &ins), 10);
        assert_eq!(h.held("w2", &ins), 5);
        assert_eq!(h.holders(&ins).into_iter().collect::<Vec<_>>(), ["w1", "w2"]);
        // w1's next report: its cache dropped "a"; it is fetching "b" for a task.
        h.set("w1", &[], ["b"].into_iter());
        assert_eq!(h.held("w1", &ins), 5);
        assert_eq!(h.holders(&ins[..1]).len(), 0);
        h.forget("w2");
        assert_eq!(h.holders(&ins).into_iter().collect::<Vec<_>>(), ["w1"]);
        h.forget("w1");
        assert!(h.is_empty());
    }
}
