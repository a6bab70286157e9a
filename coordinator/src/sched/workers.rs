//! The worker registry: registration, liveness, the inputs each worker holds, heartbeats, and the ready tasks no
//! live worker can take.

use super::*;

impl Sched {
    pub fn register(&mut self, info: pb::WorkerInfo, now: Instant) -> String {
        let id = format!("{}-{}", if info.name.is_empty() { "worker" } else { &info.name }, random_hex(4));
        let kinds = info.task_kinds.iter().filter_map(|k| pb::WorkerKind::parse(k)).collect();
        self.workers.insert(id.clone(), WorkerRec { info, kinds, last_seen: now, bytes_read: 0, bytes_written: 0 });
        id
    }

    /// What a worker's cache holds (the sha256s it reported with a lease request): replaces what was known, keeping
    /// the inputs of the tasks it is running (it may be fetching them).
    pub fn holdings(&mut self, worker_id: &str, shas: &[String]) {
        let Some(cache) = self.workers.get(worker_id).map(|w| w.info.cache_bytes) else { return };
        let fetching: Vec<String> = self
            .leases
            .values()
            .map(|&(ri, ti)| &self.releases[ri].tasks[ti])
            .filter(|t| matches!(&t.state, TState::Leased { worker, .. } if worker == worker_id))
            .flat_map(|t| t.inputs.iter().filter(|i| i.bytes <= cache).map(|i| i.sha256.clone()))
            .collect();
        self.holdings.set(worker_id, shas, fetching.iter().map(String::as_str));
    }

    /// Whether a live worker other than those `t` failed on offers `kind` (and `t`'s runtime), so that `t` can wait
    /// for it. Live: seen within two lease periods.
    pub(super) fn another_worker_for(&self, t: &TaskRec, kind: pb::WorkerKind, now: Instant) -> bool {
        self.workers.iter().any(|(id, w)| !t.failed_on.contains(id) && self.can_take(w, kind, t.key.runtime(), now))
    }

    /// Whether worker `w` is live (seen within two lease periods) and offers `kind` and `runtime`.
    pub(super) fn can_take(&self, w: &WorkerRec, kind: pb::WorkerKind, runtime: Option<&str>, now: Instant) -> bool {
        w.is_live(now, self.cfg.lease)
            && w.kinds.contains(&kind)
            && runtime.is_none_or(|rt| w.info.runtimes.iter().any(|r| r == rt))
    }

    /// Says which ready tasks of each running release no live worker can take — their kind, and the runtime they
    /// need (an mlx-lm task on a farm without mlx-lm) — once they have waited a lease period, and again whenever that
    /// changes; and that the wait is over. Called periodically (the server's expiry loop).
    pub fn note_unserved(&mut self, now: Instant) {
        let mut waiting: BTreeMap<usize, BTreeMap<(pb::WorkerKind, Option<&'static str>), usize>> = BTreeMap::new();
        for &(_, ri, ti) in &self.ready {
            let t = &self.releases[ri].tasks[ti];
            let Some(kind) = t.key.worker_kind() else { continue };
            let runtime = t.key.runtime();
            if !self.workers.values().any(|w| self.can_take(w, kind, runtime, now)) {
                *waiting.entry(ri).or_default().entry((kind, runtime)).or_default() += 1;
            }
        }
        let mut live: Vec<usize> = self.by_id.values().copied().collect();
        live.sort_unstable();
        for ri in live {
            let id = self.releases[ri].id.clone();
            let Some(needs) = waiting.get(&ri).filter(|_| !self.releases[ri].finished()) else {
                if let Some((_, said)) = self.unserved.remove(&id) {
                    if !said.is_empty() && !self.releases[ri].finished() {
                        let ev = self.releases[ri].event("a worker for the waiting tasks joined".into());
                        self.effects.events.push(ev);
                    }
                }
                continue;
            };
            let what: Vec<String> = needs
                .iter()
                .map(|((kind, runtime), n)| match runtime {
                    Some(rt) => format!("{n} of kind {kind} need the {rt} runtime"),
                    None => format!("{n} of kind {kind}"),
                })
                .collect();
            let msg = format!(
                "waiting: no live worker can take {} ready task(s): {}{}",
                needs.values().sum::<usize>(),
                what.join("; "),
                if needs.keys().any(|(_, rt)| *rt == Some(crate::kinds::MLX_LM_RUNTIME)) {
                    " (start a worker with QUANTFARM_PYTHON set to a Python with mlx-lm, e.g. \
                     scripts/install-mlx-runtime's; or set evaluation.mlx_lm: false)"
                } else {
                    ""
                }
            );
            let entry = self.unserved.entry(id).or_insert((now, String::new()));
            if now.duration_since(entry.0) >= self.cfg.lease && entry.1 != msg {
                entry.1 = msg.clone();
                tracing::warn!(release = %self.releases[ri].id, "{msg}");
                let ev = self.releases[ri].event(msg);
                self.effects.events.push(ev);
            }
        }
    }

    /// Records a worker's byte counts (they only grow: a late, reordered request cannot lower them).
    pub fn io_report(&mut self, worker_id: &str, bytes_read: u64, bytes_written: u64) {
        if let Some(w) = self.workers.get_mut(worker_id) {
            w.bytes_read = w.bytes_read.max(bytes_read);
            w.bytes_written = w.bytes_written.max(bytes_written);
        }
    }

    /// Extends the deadlines of the given leases to `now` plus a lease period.
    pub fn heartbeat(&mut self, worker_id: &str, lease_ids: &[String], now: Instant) -> Heartbeat {
        let known = match self.workers.get_mut(worker_id) {
            Some(w) => {
                w.last_seen = now;
                true
            }
            None => false,
        };
        let mut revoked = Vec::new();
        for l in lease_ids {
            match self.leases.get(l) {
                Some(&(ri, ti)) => {
                    if let TState::Leased { deadline, .. } = &mut self.releases[ri].tasks[ti].state {
                        *deadline = now + self.cfg.lease;
                    }
                }
                None => revoked.push(l.clone()),
            }
        }
        Heartbeat { revoked, unknown_worker: !known }
    }
}
