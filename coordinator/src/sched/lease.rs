//! Placement: which ready tasks a worker gets (capability, critical path, the bounded wait for a worker holding
//! their inputs), and leases ending by expiry or by being handed back.

use super::*;

impl Sched {
    /// Leases up to `slots` ready tasks the worker can run at `now`: the leases and, when none could be given, when a
    /// backed-off task becomes ready (for the caller's wait).
    ///
    /// Which tasks, in order:
    /// 1. **Critical path first**: the ready queue's order (a task's cost plus its longest chain of dependents).
    /// 2. **Then the data**: among tasks of one priority, the one whose inputs the worker holds the most bytes of
    ///    (its cache's report plus what its leased tasks are fetching, [`Holdings`]).
    /// 3. **A bounded wait for the data**: a task another live worker holds more of is left for that worker, counted
    ///    from when the task was first seen ready, for at most the longer of
    ///    - twice the time this worker would take to fetch what it lacks (`SchedConfig::fetch_rate`): a holder busy
    ///      with a task that fetched the same inputs frees up within about one fetch, and
    ///    - the task's slack: how far its priority (its chain of work to the report, in bytes) is below the release's
    ///      critical path (the highest priority of its unfinished tasks), at the same rate. Waiting within the slack
    ///      does not lengthen the release; past the bound the critical path wins and the task goes to whoever asks.
    ///
    ///    And not at all when the holders' queue takes longer than a fetch and than the slack: the tasks with the
    ///    same inputs already waiting for them, each taking as long as the fastest finished task of the kind (one
    ///    that found its inputs), shared among the holders. Slow tasks on the critical path (a large model decoding
    ///    slowly) spread over more workers; fast ones, and those with slack, queue behind the ones that hold the
    ///    data.
    ///
    ///    Tasks that read nothing the farm made (plans, conversions from the source) never wait.
    pub fn lease(&mut self, worker_id: &str, slots: u32, now: Instant) -> Result<Leases, SchedError> {
        let w = self.workers.get_mut(worker_id).ok_or_else(|| SchedError::UnknownWorker(worker_id.into()))?;
        w.last_seen = now;
        let (picked, next_wake) = self.pick(worker_id, slots.max(1) as usize, now);
        let leases = self.grant(worker_id, picked, now)?;
        Ok(Leases { leases, next_wake })
    }

    /// The ready tasks `worker_id` gets, at most `want` of them in the order [`Sched::lease`] says; and, for the
    /// caller's wait, the earliest time a task passed over now (backed off, or left to a holder) may be taken.
    fn pick(&mut self, worker_id: &str, want: usize, now: Instant) -> (Vec<QueueEntry>, Option<Instant>) {
        let Some(w) = self.workers.get(worker_id) else { return (Vec::new(), None) };
        let (kinds, runtimes) = (w.kinds.clone(), w.info.runtimes.clone());
        // (queue position, bytes held): every candidate of the priorities scanned until `want` were found.
        let mut cands: Vec<(QueueEntry, u64)> = Vec::new();
        let mut next_wake: Option<Instant> = None;
        let mut wake_at = |at: Instant| next_wake = Some(next_wake.map_or(at, |w: Instant| w.min(at)));
        let mut first_seen = Vec::new();
        let mut critical: HashMap<usize, u64> = HashMap::new();
        // Per input set (its first file's digest): tasks left to their holders in this scan so far.
        let mut queued: HashMap<&str, u32> = HashMap::new();
        let mut run_s: HashMap<(usize, (&'static str, u64)), Option<f64>> = HashMap::new();
        for &(prio, ri, ti) in self.ready.iter() {
            if cands.len() >= want && cands.last().is_some_and(|c| c.0 .0 != prio) {
                break;
            }
            let t = &self.releases[ri].tasks[ti];
            let Some(kind) = t.key.worker_kind().filter(|k| kinds.contains(k)) else { continue };
            if t.key.runtime().is_some_and(|rt| !runtimes.iter().any(|r| r == rt)) {
                continue;
            }
            if let Some(nb) = t.not_before.filter(|&nb| nb > now) {
                wake_at(nb);
                continue;
            }
            if t.failed_on.iter().any(|w| w == worker_id) && self.another_worker_for(t, kind, now) {
                continue;
            }
            if t.ready_since.is_none() {
                first_seen.push((ri, ti));
            }
            let held = self.holdings.held(worker_id, &t.inputs);
            let critical = *critical.entry(ri).or_insert_with(|| self.releases[ri].critical());
            let family = t.inputs.first().map(|i| i.sha256.as_str()).unwrap_or_default();
            let ahead = queued.get(family).copied().unwrap_or(0);
            let run_s = *run_s.entry((ri, t.key.sort())).or_insert_with(|| self.releases[ri].fastest(&t.key));
            if let Some(until) = self.waits_for_holder(t, kind, worker_id, held, critical, ahead, run_s, now) {
                wake_at(until);
                *queued.entry(family).or_default() += 1;
                continue;
            }
            cands.push(((prio, ri, ti), held));
        }
        for (ri, ti) in first_seen {
            self.releases[ri].tasks[ti].ready_since = Some(now);
        }
        // Within one priority the worker's held bytes decide (stable: otherwise the queue's order).
        cands.sort_by(|a, b| a.0 .0.cmp(&b.0 .0).then(b.1.cmp(&a.1)));
        (cands.into_iter().take(want).map(|c| c.0).collect(), next_wake)
    }

    /// Leases the `picked` tasks to `worker_id`: each leased with its output's known digest and its inputs, its
    /// inputs counted as the worker's holdings, journaled in one transaction, and said in an event.
    fn grant(&mut self, worker_id: &str, picked: Vec<QueueEntry>, now: Instant) -> Result<Vec<pb::Lease>, SchedError> {
        let mut out = Vec::with_capacity(picked.len());
        let lease_ms = self.cfg.lease.as_millis() as u32;
        let mut rows = Vec::with_capacity(picked.len());
        for (prio, ri, ti) in picked {
            self.ready.remove(&(prio, ri, ti));
            let lease_id = random_hex(12);
            let known = {
                let t = &self.releases[ri].tasks[ti];
                t.task.as_ref().and_then(graph::output_url).and_then(|u| self.output(u)).map(|k| k.sha256)
            };
            let rel = &mut self.releases[ri];
            let t = &mut rel.tasks[ti];
            t.state = TState::Leased {
                lease_id: lease_id.clone(),
                worker: worker_id.to_string(),
                deadline: now + self.cfg.lease,
            };
            t.attempts += 1;
            t.not_before = None;
            self.leases.insert(lease_id.clone(), (ri, ti));
            let mut task = t.task.clone();
            if let Some(task) = task.as_mut() {
                task.known_output_sha256 = known.unwrap_or_default();
                task.inputs = t.inputs.clone();
            }
            let cache = self.workers.get(worker_id).map_or(0, |w| w.info.cache_bytes);
            let kept: Vec<pb::InputFile> = t.inputs.iter().filter(|i| i.bytes <= cache).cloned().collect();
            self.holdings.add(worker_id, &kept, now);
            out.push(pb::Lease {
                lease_id,
                release_id: rel.id.clone(),
                task_id: t.id.clone(),
                attempt: t.attempts,
                lease_ms,
                task,
            });
            rows.push((rel.id.clone(), rel.tasks[ti].row(&rel.tasks)));
        }
        if !rows.is_empty() {
            self.journal.batch(|b| {
                for (id, r) in &rows {
                    b.update_task(id, r)?;
                }
                Ok(())
            })?;
        }
        for l in &out {
            let ri = self.by_id[&l.release_id];
            let ev = self.releases[ri].event(format!("{} started on {worker_id}", l.task_id));
            self.effects.events.push(ev);
        }
        Ok(out)
    }

    /// Until when `t` waits for a live worker that holds more of its inputs than `worker` (which holds `held` bytes of
    /// them), or `None` when the asking worker should take it (see [`Sched::lease`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn waits_for_holder(
        &self,
        t: &TaskRec,
        kind: pb::WorkerKind,
        worker: &str,
        held: u64,
        critical: u64,
        ahead: u32,
        run_s: Option<f64>,
        now: Instant,
    ) -> Option<Instant> {
        if t.inputs.is_empty() || self.holdings.is_empty() {
            return None;
        }
        let missing = t.inputs.iter().map(|i| i.bytes).sum::<u64>().saturating_sub(held);
        if missing == 0 {
            return None;
        }
        // The better holders (more bytes of the inputs than the asking worker), and since when the best one holds
        // them: a holder still fetching them is counted from when it began.
        let better: Vec<(u64, Option<Instant>)> = self
            .holdings
            .holders(&t.inputs)
            .into_iter()
            .filter(|&h| {
                h != worker
                    && !t.failed_on.iter().any(|f| f == h)
                    && self.workers.get(h).is_some_and(|w| self.can_take(w, kind, t.key.runtime(), now))
            })
            .map(|h| (self.holdings.held(h, &t.inputs), self.holdings.fetching_since(h)))
            .filter(|&(h_held, _)| h_held > held)
            .collect();
        let (_, since) = better.iter().copied().max_by_key(|&(h_held, since)| (h_held, Reverse(since)))?;
        let rate = self.cfg.fetch_rate.max(1) as f64;
        let fetch_s = missing as f64 / rate;
        let slack_s = critical.saturating_sub(t.priority) as f64 / rate;
        // The holders' queue: `ahead` tasks with the same inputs already wait for them, each taking about `run_s`
        // (the shortest this release's tasks of the kind took: one that found its inputs). When working through
        // that queue takes longer than fetching and than the task's slack, fetching wins.
        if let Some(d) = run_s {
            if f64::from(ahead + 1) * d / better.len() as f64 >= fetch_s.max(slack_s) {
                return None;
            }
        }
        let start = t.ready_since.unwrap_or(now).max(since.unwrap_or(now).min(now));
        let until = start + Duration::from_secs_f64((2.0 * fetch_s).max(slack_s));
        (until > now).then_some(until)
    }

    /// Expires the leases whose deadline passed by `now` (their worker stopped heartbeating): each counts as a failed
    /// attempt.
    pub fn expire(&mut self, now: Instant) -> Result<(), SchedError> {
        let expired: Vec<(usize, usize, String)> = self
            .leases
            .values()
            .filter_map(|&(ri, ti)| match &self.releases[ri].tasks[ti].state {
                TState::Leased { deadline, worker, .. } if *deadline < now => Some((ri, ti, worker.clone())),
                _ => None,
            })
            .collect();
        for (ri, ti, worker) in expired {
            self.end_lease(ri, ti);
            // Its worker may have been killed mid-write.
            if let Some(url) = self.releases[ri].tasks[ti].task.as_ref().and_then(graph::written_url) {
                self.effects.sweeps.push(Sweep { url: url.to_string(), died: now });
            }
            self.releases[ri].tasks[ti].failed_on.push(worker.clone());
            let msg = format!("lease expired: worker {worker} stopped heartbeating");
            self.fail_task(ri, ti, FailureKind::Transient, msg, now)?;
        }
        Ok(())
    }

    /// Hands leases back: the tasks become ready again without using up a try.
    pub fn hand_back(&mut self, lease_ids: &[String]) -> Result<(), SchedError> {
        for l in lease_ids {
            if let Some(&(ri, ti)) = self.leases.get(l) {
                self.end_lease(ri, ti);
                let t = &mut self.releases[ri].tasks[ti];
                t.state = TState::Ready;
                t.attempts = t.attempts.saturating_sub(1);
                self.journal_task(ri, ti)?;
                self.make_ready(ri, ti);
            }
        }
        Ok(())
    }
}
