//! Outcomes: a task's result checked and recorded (or its failure retried with backoff), corrupt inputs made
//! again, a release ended by its last task, a failure, a cancel or its published report.

use super::*;

impl Sched {
    /// Records a task's outcome at `now` (a failure's retry backs off from it). Returns false when it was not
    /// needed (already done, or the release is over).
    pub fn complete(&mut self, req: pb::CompleteRequest, now: Instant) -> Result<bool, SchedError> {
        let ri = *self.by_id.get(&req.release_id).ok_or_else(|| SchedError::NoRelease(req.release_id.clone()))?;
        let key = TaskKey::parse(&req.task_id)
            .ok_or_else(|| SchedError::NoTask { release: req.release_id.clone(), task: req.task_id.clone() })?;
        let ti = *self.releases[ri]
            .index
            .get(&key)
            .ok_or_else(|| SchedError::NoTask { release: req.release_id.clone(), task: req.task_id.clone() })?;
        if self.releases[ri].finished() || self.releases[ri].tasks[ti].state == TState::Done {
            self.leases.remove(&req.lease_id);
            return Ok(false);
        }
        // Only the lease the task is under now may end it. A lease that expired (its worker stopped heartbeating)
        // was already counted as failed and the task handed on: that worker's late outcome is discarded.
        let current = matches!(&self.releases[ri].tasks[ti].state,
            TState::Leased { lease_id, .. } if *lease_id == req.lease_id);
        if !current {
            let rel = &self.releases[ri];
            let msg = format!(
                "{}: discarded a late outcome from worker {} (lease {} is no longer held; the task is {})",
                req.task_id,
                req.worker_id,
                req.lease_id,
                rel.tasks[ti].state.name()
            );
            tracing::warn!(release = %rel.id, "{msg}");
            let ev = rel.event(msg);
            self.effects.events.push(ev);
            return Ok(false);
        }
        self.end_lease(ri, ti);
        let worker = req.worker_id.clone();
        match req.outcome {
            Some(pb::complete_request::Outcome::Result(result)) => {
                let shape = check_shape(&self.releases[ri].tasks[ti], &result);
                if let Err(e) = shape.and_then(|()| self.check_output(&result)) {
                    self.releases[ri].tasks[ti].failed_on.push(worker.clone());
                    self.fail_task(ri, ti, FailureKind::Internal, format!("worker {worker}: {e}"), now)?;
                    return Ok(true);
                }
                self.finish_task(ri, ti, result, worker, req.duration_ms)?;
                self.releases[ri].tasks[ti].fetch_ms = req.fetch_ms.min(req.duration_ms);
            }
            Some(pb::complete_request::Outcome::Failure(f)) => {
                let kind = FailureKind::try_from(f.kind).unwrap_or(FailureKind::Internal);
                let msg = format!("{} (worker {worker})", f.message);
                if kind == FailureKind::Corrupt {
                    return self.remake_corrupt(ri, ti, &f.corrupt_url, msg, now).map(|()| true);
                }
                self.releases[ri].tasks[ti].failed_on.push(worker);
                self.fail_task(ri, ti, kind, msg, now)?;
            }
            None => self.fail_task(ri, ti, FailureKind::Internal, format!("worker {worker} sent no outcome"), now)?,
        }
        Ok(true)
    }

    /// A made output must have the digest recorded when its URL was made before (content addressing: one URL, one
    /// content); another means a task that is not deterministic, or an output changed while the task ran.
    pub(super) fn check_output(&self, result: &pb::TaskResult) -> Result<(), String> {
        let Some(a) = result.artifact() else { return Ok(()) };
        match self.output(&a.url).map(|o| o.sha256) {
            Some(known) if known != a.sha256 => Err(format!(
                "{} has sha256 {}, but it was made before with sha256 {known}: the output is not reproducible",
                a.url, a.sha256
            )),
            _ => Ok(()),
        }
    }

    /// Task `ti` found input `url` corrupt in the store. The task of this release that made `url` makes it again
    /// (its worker sees the recorded digest and replaces the stored copy); `ti`, and any other dependent not yet
    /// leased, waits for it again. Neither uses up a try of `ti`. An input no task of the release made (the source,
    /// a given file) cannot be made again: the release fails.
    pub(super) fn remake_corrupt(
        &mut self,
        ri: usize,
        ti: usize,
        url: &str,
        msg: String,
        now: Instant,
    ) -> Result<(), SchedError> {
        let rel = &self.releases[ri];
        let producer = rel.tasks.iter().position(|t| {
            t.state == TState::Done
                && t.result.as_ref().and_then(pb::TaskResult::artifact).is_some_and(|a| a.url == url)
        });
        let Some(pi) = producer else {
            return self.fail_task(ri, ti, FailureKind::Input, msg, now);
        };
        let id = rel.tasks[ti].id.clone();
        let pid = rel.tasks[pi].id.clone();
        tracing::warn!(release = %rel.id, task = %id, "{msg}: {pid} makes it again");
        // The producer runs again; its result stays until the new one replaces it (same digest, or the
        // reproducibility check fails the task).
        {
            let p = &mut self.releases[ri].tasks[pi];
            p.state = TState::Ready;
            p.not_before = None;
        }
        self.journal_task(ri, pi)?;
        self.make_ready(ri, pi);
        if !self.releases[ri].tasks[pi].dependents.contains(&ti) {
            // It read the output without depending on its task (not a graph this planner makes): it does now.
            self.releases[ri].link(ti, pi);
        }
        // Dependents that have not started wait for it again; the failed task gives its try back.
        for d in self.releases[ri].tasks[pi].dependents.clone() {
            let state = self.releases[ri].tasks[d].state.clone();
            let waits = match state {
                TState::Blocked => true,
                TState::Ready => {
                    self.ready.remove(&(Reverse(self.releases[ri].tasks[d].priority), ri, d));
                    true
                }
                TState::Leased { .. } if d == ti => true,
                _ => false,
            };
            if waits {
                let t = &mut self.releases[ri].tasks[d];
                if t.state != TState::Blocked {
                    t.state = TState::Blocked;
                    t.waiting = 0;
                }
                t.waiting += 1;
                if d == ti {
                    t.attempts = t.attempts.saturating_sub(1);
                    t.error = Some(msg.clone());
                }
                self.journal_task(ri, d)?;
            }
        }
        let ev = self.releases[ri].event(format!("{id}: {msg}; {pid} makes it again"));
        self.effects.events.push(ev);
        Ok(())
    }

    pub(super) fn end_lease(&mut self, ri: usize, ti: usize) {
        if let TState::Leased { lease_id, .. } = &self.releases[ri].tasks[ti].state {
            self.leases.remove(lease_id);
        }
        self.ready.remove(&(Reverse(self.releases[ri].tasks[ti].priority), ri, ti));
    }

    pub(super) fn finish_task(
        &mut self,
        ri: usize,
        ti: usize,
        result: pb::TaskResult,
        worker: String,
        duration_ms: u64,
    ) -> Result<(), SchedError> {
        if let Some(a) = result.artifact() {
            self.journal.batch(|b| b.record_output(&a.url, &a.sha256, a.bytes))?;
        }
        {
            let t = &mut self.releases[ri].tasks[ti];
            t.state = TState::Done;
            t.result = Some(result);
            t.worker = Some(worker.clone());
            t.duration_ms = duration_ms;
            t.error = None;
        }
        self.journal_task(ri, ti)?;
        let growth = {
            let rel = &self.releases[ri];
            let results = |k: &TaskKey| rel.result(k);
            let t = &rel.tasks[ti];
            match &t.result {
                Some(r) => kinds::grows(&rel.ctx(&self.store), &t.key, r, &results),
                None => Ok(kinds::Growth::default()),
            }
        };
        // Tasks the growth adds never counted this (done) task among their open dependencies.
        let grown_from = self.releases[ri].tasks.len();
        match growth {
            Err(e) => return self.fail_release(ri, e),
            Ok(g) => {
                self.add_tasks(ri, g.tasks)?;
                // Before this task's dependents are released.
                for (waiter, on) in g.waits {
                    self.add_deps(ri, &waiter, &on)?;
                }
            }
        }
        let dependents = self.releases[ri].tasks[ti].dependents.clone();
        for d in dependents.into_iter().filter(|&d| d < grown_from) {
            let t = &mut self.releases[ri].tasks[d];
            t.waiting = t.waiting.saturating_sub(1);
            if t.waiting == 0 && t.state == TState::Blocked && self.releases[ri].state == ReleaseState::Running {
                self.ready_up(ri, d)?;
            }
        }
        let rel = &self.releases[ri];
        let ev = rel.event(format!("{} done on {worker} in {:.1} s", rel.tasks[ti].id, duration_ms as f64 / 1000.0));
        self.effects.events.push(ev);
        Ok(())
    }

    pub(super) fn fail_task(
        &mut self,
        ri: usize,
        ti: usize,
        kind: FailureKind,
        msg: String,
        now: Instant,
    ) -> Result<(), SchedError> {
        let id = self.releases[ri].tasks[ti].id.clone();
        let attempts = self.releases[ri].tasks[ti].attempts;
        tracing::warn!(release = %self.releases[ri].id, task = %id, attempt = attempts, "task failed: {msg}");
        let retry = match kind {
            FailureKind::Input => false,
            // A revoked lease is not the task's fault: it does not use up a try.
            FailureKind::Cancelled => {
                self.releases[ri].tasks[ti].attempts = attempts.saturating_sub(1);
                true
            }
            _ => attempts < self.cfg.max_attempts,
        };
        if !retry {
            let what = if kind == FailureKind::Input {
                format!("task {id} failed: {msg}")
            } else {
                format!("task {id} failed after {attempts} attempts; last error: {msg}")
            };
            self.releases[ri].tasks[ti].error = Some(msg);
            return self.fail_release(ri, what);
        }
        let delay =
            self.cfg.backoff.saturating_mul(1 << attempts.saturating_sub(1).min(7)).min(Duration::from_secs(60));
        let t = &mut self.releases[ri].tasks[ti];
        t.state = TState::Ready;
        t.error = Some(msg.clone());
        t.not_before = Some(now + delay);
        self.journal_task(ri, ti)?;
        self.make_ready(ri, ti);
        let ev = self.releases[ri].event(format!("{id} failed, retrying in {:.1} s: {msg}", delay.as_secs_f64()));
        self.effects.events.push(ev);
        Ok(())
    }

    /// Ends a release for good with `error`: its leases are revoked, nothing else runs.
    pub fn fail_release(&mut self, ri: usize, error: String) -> Result<(), SchedError> {
        tracing::error!(release = %self.releases[ri].id, "release failed: {error}");
        self.end_release(ri, ReleaseState::Failed, Some(error), None, None)
    }

    pub(super) fn end_release(
        &mut self,
        ri: usize,
        state: ReleaseState,
        error: Option<String>,
        report_json: Option<String>,
        report_url: Option<String>,
    ) -> Result<(), SchedError> {
        let n = self.releases[ri].tasks.len();
        for ti in 0..n {
            self.end_lease(ri, ti);
        }
        let rel = &mut self.releases[ri];
        for (st, d) in [(rel.state as i32, -1i64), (state as i32, 1)] {
            let n = self.release_counts.entry(st).or_default();
            *n = n.saturating_add_signed(d);
        }
        rel.state = state;
        rel.error = error;
        rel.report_json = report_json;
        rel.report_url = report_url;
        rel.finished_ms = Some((self.cfg.wall_clock)());
        let (id, st, err, rj, ru, fm) = (
            rel.id.clone(),
            rel.state as i32,
            rel.error.clone(),
            rel.report_json.clone(),
            rel.report_url.clone(),
            rel.finished_ms.unwrap_or(0),
        );
        self.journal.batch(|b: &Batch| b.finish_release(&id, st, err.as_deref(), rj.as_deref(), ru.as_deref(), fm))?;
        let ev = self.releases[ri].event(format!("release {id}: {}", state.as_str_name()));
        self.effects.events.push(ev);
        Ok(())
    }

    /// The coordinator finished the report task: published, or why not.
    pub fn report_done(&mut self, release_id: &str, outcome: Result<Published, String>) -> Result<(), SchedError> {
        let ri = *self.by_id.get(release_id).ok_or_else(|| SchedError::NoRelease(release_id.into()))?;
        if self.releases[ri].finished() {
            return Ok(());
        }
        match outcome {
            Ok(Published { json, url, passed }) => {
                if let Some(&ti) = self.releases[ri].index.get(&TaskKey::REPORT) {
                    let t = &mut self.releases[ri].tasks[ti];
                    t.state = TState::Done;
                    t.worker = Some(COORDINATOR.into());
                    self.journal_task(ri, ti)?;
                }
                let state = if passed { ReleaseState::Released } else { ReleaseState::GateFailed };
                self.end_release(ri, state, None, Some(json), Some(url))
            }
            Err(e) => self.fail_release(ri, format!("report: {e}")),
        }
    }

    pub fn cancel(&mut self, release_id: &str) -> Result<ReleaseState, SchedError> {
        let Some(&ri) = self.by_id.get(release_id) else {
            // Finished and evicted: it stays as it ended.
            return Ok(self.summary(release_id)?.state);
        };
        if !self.releases[ri].finished() {
            self.end_release(ri, ReleaseState::Cancelled, Some("cancelled".into()), None, None)?;
        }
        Ok(self.releases[ri].state)
    }
}

/// A result must have the shape its task's message asks for (a plan for a plan, an artifact for a conversion, …).
fn check_shape(t: &TaskRec, r: &pb::TaskResult) -> Result<(), String> {
    let want = t.task.as_ref().and_then(|m| m.kind.as_ref()).map(pb::task::Kind::result_shape);
    let got = r.kind.as_ref().map(pb::task_result::Kind::shape);
    match (want, got) {
        (Some(w), Some(g)) if w == g => Ok(()),
        _ => Err(format!("task {} got a result of the wrong kind ({got:?}, expected {want:?})", t.key)),
    }
}
