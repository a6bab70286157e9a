//! The scheduler: every release's tasks and their states, the ready queue ordered by critical path, leases with
//! deadlines, retries with backoff, and the journal write that goes with each change. Pure state transitions
//! under one lock; the gRPC layer (`server`) waits and wakes around it.
//!
//! Time is an input: every transition that sets or checks a deadline takes `now`, and the times a release records
//! come from [`SchedConfig::wall_clock`], so the scheduler reads no clock of its own and its tests move time
//! forward instead of sleeping.
//!
//! - this module: the configuration, the scheduler's state, opening it from the journal, submitting a release;
//! - [`release`]: a release's tasks and their states, progress by stage, the release slots;
//! - `wiring`: tasks added with their dependencies, made ready when the last one is done, journaled;
//! - `workers`: registration, liveness, holdings, heartbeats, tasks no live worker can take;
//! - `lease`: placement of ready tasks on a worker, lease expiry and hand-back;
//! - `outcome`: results and failures, corrupt inputs made again, a release's end.

mod lease;
mod outcome;
mod release;
mod tally;
mod wiring;
mod workers;

use release::QueueEntry;
pub use release::{Release, Slots, TState, TaskRec};
pub use tally::History;
pub(crate) use tally::BUCKETS;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use prost::Message;
use quantfarm_proto::{self as pb, FailureKind, ReleaseState};
use quantfarm_store::Location;

use crate::affinity::Holdings;
use crate::graph::{self, Ctx, EvalInputs};
use crate::journal::{Batch, Journal, JournalError, ReleaseRow, TaskRow, OUTPUTS_VERSION};
use crate::kinds::{self, TaskDef, TaskKey};
use crate::spec::{ImatrixSource, ReleaseSpec};

#[derive(Clone, Debug)]
pub struct SchedConfig {
    pub lease: Duration,
    pub heartbeat: Duration,
    /// Tries per task (leases that expired count) before the release fails with the task's last error.
    pub max_attempts: u32,
    /// First retry delay; doubled per attempt, capped at a minute.
    pub backoff: Duration,
    /// The rate (bytes per second) at which a worker is expected to fetch inputs from the store: a ready task waits
    /// for a worker that holds more of its inputs for at most twice the time the asking worker would take to fetch
    /// what it lacks at this rate (see [`Sched::lease`]).
    pub fetch_rate: u64,
    /// Milliseconds since the Unix epoch, for the times a release records (created, finished, its report's): the
    /// one wall clock the scheduler and its server read, given like every instant so that tests can set it.
    pub wall_clock: fn() -> i64,
}

/// The system's wall clock, in milliseconds since the Unix epoch ([`SchedConfig::wall_clock`]'s default).
pub fn system_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            lease: Duration::from_secs(30),
            heartbeat: Duration::from_secs(5),
            max_attempts: 4,
            backoff: Duration::from_millis(500),
            fetch_rate: 100_000_000,
            wall_clock: system_ms,
        }
    }
}

/// What is known of a release, in memory or from the journal.
pub struct Summary {
    pub state: ReleaseState,
    pub report_json: Option<String>,
    pub report_url: Option<String>,
    /// Its state and progress as an event.
    pub event: pb::ReleaseEvent,
}

#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("{0}")]
    Spec(#[from] crate::spec::SpecError),
    #[error("no release {0:?}")]
    NoRelease(String),
    #[error("source: {0}")]
    Source(String),
    #[error("unknown worker {0:?} (the coordinator restarted or forgot it): register again")]
    UnknownWorker(String),
    #[error("release {release}: no task {task:?}")]
    NoTask { release: String, task: String },
    /// A journal row this coordinator cannot read back.
    #[error("journal: release {release}, task {task:?}: {msg}")]
    Corrupt { release: String, task: String, msg: String },
}

pub struct WorkerRec {
    pub info: pb::WorkerInfo,
    /// The kinds it runs (its advertised names parsed; names this coordinator does not know are left out).
    pub kinds: Vec<pb::WorkerKind>,
    pub last_seen: Instant,
    /// The worker's own byte counts, as it last reported them (lease and heartbeat requests).
    pub bytes_read: u64,
    pub bytes_written: u64,
}

impl WorkerRec {
    /// Whether the worker counts as alive: seen within two lease periods (the one definition, for placement and
    /// for the metrics page).
    pub fn is_live(&self, now: Instant, lease: Duration) -> bool {
        now.duration_since(self.last_seen) < lease * 2
    }
}

/// What [`Sched::lease`] gave a worker.
#[derive(Debug, Default)]
pub struct Leases {
    pub leases: Vec<pb::Lease>,
    /// When none could be given: when the first backed-off task the worker could run becomes ready.
    pub next_wake: Option<Instant>,
}

/// What [`Sched::heartbeat`] answers.
#[derive(Debug, Default)]
pub struct Heartbeat {
    /// The leases given that are no longer held (the worker must stop their tasks).
    pub revoked: Vec<String>,
    /// The coordinator does not know the worker (it restarted): the worker registers again.
    pub unknown_worker: bool,
}

/// A published report, for [`Sched::report_done`].
#[derive(Debug, Clone)]
pub struct Published {
    /// The signed report, as published.
    pub json: String,
    /// Where it was published.
    pub url: String,
    /// Whether every gate passed (the release is `released`, else `gate_failed`).
    pub passed: bool,
}

/// Staging to sweep (`quantfarm_store::staging::sweep`): what a writer of output `url` whose lease died at `died`
/// may have left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sweep {
    pub url: String,
    pub died: Instant,
}

/// A report the coordinator must now produce (the release's report task became ready).
#[derive(Debug, Clone)]
pub struct ReportJob {
    pub release_id: String,
}

/// What transitions ask of the world beyond the scheduler's state, gathered until the server takes them: the
/// scheduler itself does no I/O.
#[derive(Debug, Default)]
pub struct Effects {
    /// Events to broadcast to the release's watchers.
    pub events: Vec<pb::ReleaseEvent>,
    /// Reports to make (the coordinator's own task).
    pub reports: Vec<ReportJob>,
    /// Staging of dead writers to sweep.
    pub sweeps: Vec<Sweep>,
    /// A task became ready (it wakes waiting leases).
    pub ready_changed: bool,
}

pub struct Sched {
    cfg: SchedConfig,
    store: Location,
    journal: Journal,
    /// The releases in memory: those running, and those finished since the server last evicted them
    /// ([`Sched::evict_finished`]). Finished releases live in the journal ([`Sched::summary`]).
    releases: Slots,
    by_id: HashMap<String, usize>,
    /// Releases by state (the stored `ReleaseState` number), all history included.
    release_counts: BTreeMap<i32, u64>,
    /// What the evicted releases add to the metrics (since the coordinator started).
    history: History,
    ready: BTreeSet<QueueEntry>,
    leases: HashMap<String, (usize, usize)>,
    workers: HashMap<String, WorkerRec>,
    /// What the transitions since the server last took them ask of the world ([`Sched::take_effects`]).
    effects: Effects,
    // The sha256 recorded for every output URL a task made (all releases) is the journal's `outputs` table
    // ([`Sched::output`]). Outputs are content-addressed, so a URL has one right content: a task that makes it again
    // must give the same digest, and a worker that finds it stored with another digest knows the stored copy is
    // corrupt.
    /// What each worker holds in its local cache (and is fetching), for leases that follow the data.
    holdings: Holdings,
    /// Per running release whose ready tasks no live worker can take: since when, and what was last said about it.
    unserved: HashMap<String, (Instant, String)>,
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut b);
    quantfarm_store::hex(&b)
}

/// Where a release's source is: a synthetic model (`synthetic:NAME`) lives in the store under its versioned name;
/// anything else is resolved against the submitter's folder.
pub fn source_location(source: &str, base: &str, store: &Location) -> Result<String, SchedError> {
    match graph::synthetic_name(source) {
        Some(Ok(versioned)) => store
            .child(&format!("sources/synthetic/{versioned}"))
            .map(|l| l.to_string())
            .map_err(|e| SchedError::Source(e.to_string())),
        Some(Err(e)) => Err(SchedError::Source(e)),
        None => Ok(resolve_source(source, base)),
    }
}

fn eval_inputs(spec: &ReleaseSpec, base: &str) -> EvalInputs {
    let resolve = |v: &Option<String>| v.as_deref().map(|v| resolve_source(v, base));
    let search_text = resolve(&spec.search_settings().text);
    let Some(e) = &spec.evaluation else { return EvalInputs { search_text, ..EvalInputs::default() } };
    EvalInputs {
        search_text,
        text: resolve(&e.text),
        prompts: resolve(&e.prompts),
        probes: resolve(&e.probes),
        choices: resolve(&e.choices),
        third_party: e.third_party().map(|u| resolve_source(u, base)).collect(),
    }
}

/// The imatrix file, or the text the farm computes it from, resolved.
fn imatrix_location(spec: &ReleaseSpec, base: &str) -> Option<String> {
    match spec.imatrix()? {
        ImatrixSource::File(p) | ImatrixSource::Text { text: p, .. } => Some(resolve_source(p, base)),
    }
}

/// Resolves a path against the submitter's folder: URLs and absolute paths as they are.
pub fn resolve_source(source: &str, base: &str) -> String {
    if source.contains("://") || std::path::Path::new(source).is_absolute() || base.is_empty() {
        return source.to_string();
    }
    if base.contains("://") {
        return format!("{}/{}", base.trim_end_matches('/'), source.trim_start_matches("./"));
    }
    std::path::Path::new(base).join(source).display().to_string()
}

impl Sched {
    /// Whether the journal answers (for the health check).
    pub fn journal_ok(&self) -> Result<(), String> {
        self.journal.ping().map_err(|e| e.to_string())
    }

    /// Opens the journal and resumes every release it holds; leases that were held live on until `now` plus a
    /// lease period.
    pub fn open(mut journal: Journal, store: Location, cfg: SchedConfig, now: Instant) -> Result<Sched, SchedError> {
        if journal.user_version()? < OUTPUTS_VERSION {
            // A journal from before the outputs table: record what its tasks made, once.
            let mut made = Vec::new();
            journal.for_each_result(|b| {
                if let Some(a) = pb::TaskResult::decode(b).ok().as_ref().and_then(pb::TaskResult::artifact) {
                    made.push((a.url.clone(), a.sha256.clone(), a.bytes));
                }
            })?;
            journal.batch(|b| made.iter().try_for_each(|(u, h, n)| b.record_output(u, h, *n)))?;
            journal.set_user_version(OUTPUTS_VERSION)?;
        }
        let release_counts = journal.release_counts()?.into_iter().collect();
        let rows = journal.load()?;
        let mut s = Sched {
            cfg,
            store,
            journal,
            releases: Slots::default(),
            by_id: HashMap::new(),
            release_counts,
            history: History::default(),
            ready: BTreeSet::new(),
            leases: HashMap::new(),
            holdings: Holdings::default(),
            workers: HashMap::new(),
            effects: Effects::default(),
            unserved: HashMap::new(),
        };
        for (rel, tasks) in rows {
            s.restore(rel, tasks, now)?;
        }
        Ok(s)
    }

    fn restore(&mut self, row: ReleaseRow, rows: Vec<TaskRow>, now: Instant) -> Result<(), SchedError> {
        let spec = ReleaseSpec::parse(&row.yaml, &row.file_name)?;
        let ri = self.releases.len();
        let mut rel = Release::from_row(row, spec, &self.store)?;
        let deadline = now + self.cfg.lease;
        let release_id = rel.id.clone();
        let no_task = |task: &str| SchedError::NoTask { release: release_id.clone(), task: task.to_string() };
        let mut restored = Vec::with_capacity(rows.len());
        for r in &rows {
            let key = TaskKey::parse(&r.id).ok_or_else(|| no_task(&r.id))?;
            let corrupt = |msg: String| SchedError::Corrupt { release: release_id.clone(), task: r.id.clone(), msg };
            let lease = r.lease_id.as_deref().zip(r.worker.as_deref());
            let state = TState::from_journal(&r.state, lease, deadline).map_err(corrupt)?;
            let task = r.task.as_deref().map(pb::Task::decode).transpose();
            let task = task.map_err(|e| corrupt(format!("its task message does not decode: {e}")))?;
            let result = r.result.as_deref().map(pb::TaskResult::decode).transpose();
            let result = result.map_err(|e| corrupt(format!("its result does not decode: {e}")))?;
            let mut t = TaskRec::new(key, r.priority);
            t.id = r.id.clone();
            t.state = state;
            t.attempts = r.attempts;
            t.task = task;
            t.result = result;
            t.error = r.error.clone();
            t.worker = r.worker.clone();
            t.duration_ms = r.duration_ms;
            restored.push(t);
        }
        for t in restored {
            rel.push_task(t);
        }
        for (i, r) in rows.iter().enumerate() {
            for d in &r.deps {
                let key = TaskKey::parse(d).ok_or_else(|| no_task(d))?;
                let di = rel.task_index(&key)?;
                rel.wire(i, di);
            }
        }
        let running = rel.state == ReleaseState::Running;
        self.by_id.insert(rel.id.clone(), ri);
        self.releases.push(rel);
        if running {
            for ti in 0..self.releases[ri].tasks.len() {
                let t = &self.releases[ri].tasks[ti];
                match &t.state {
                    TState::Ready => self.make_ready(ri, ti),
                    // The report was being made when the coordinator stopped: make it again. (Journals written
                    // before the `reporting` state recorded it as a lease to the coordinator.)
                    TState::Reporting => {
                        self.releases[ri].tasks[ti].state = TState::Blocked;
                        self.ready_up(ri, ti)?;
                    }
                    TState::Leased { worker, .. } if worker == COORDINATOR => {
                        self.releases[ri].tasks[ti].state = TState::Blocked;
                        self.ready_up(ri, ti)?;
                    }
                    TState::Leased { lease_id, .. } => {
                        self.leases.insert(lease_id.clone(), (ri, ti));
                    }
                    TState::Blocked if t.waiting == 0 => {
                        // Its last dependency finished just before the stop, before the task was made ready.
                        self.ready_up(ri, ti)?;
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// A release in memory (running, or finished and not yet evicted).
    pub fn release(&self, id: &str) -> Result<&Release, SchedError> {
        self.by_id.get(id).map(|&i| &self.releases[i]).ok_or_else(|| SchedError::NoRelease(id.into()))
    }

    /// A release's state, report and progress: from memory, or for a finished release from the journal.
    pub fn summary(&self, id: &str) -> Result<Summary, SchedError> {
        if let Ok(r) = self.release(id) {
            return Ok(Summary {
                state: r.state,
                report_json: r.report_json.clone(),
                report_url: r.report_url.clone(),
                event: r.event("snapshot".into()),
            });
        }
        let row = self.journal.release_row(id)?.ok_or_else(|| SchedError::NoRelease(id.into()))?;
        let state = ReleaseState::try_from(row.state).unwrap_or(ReleaseState::Failed);
        // Progress by stage, as `Release::stages` counts it, from the tasks' stored states.
        let mut stages: Vec<pb::StageProgress> = Vec::new();
        for (task, st) in self.journal.task_states(id)? {
            let Some(key) = TaskKey::parse(&task) else { continue };
            let name = key.stage();
            let i = match stages.iter().position(|p| p.stage == name) {
                Some(i) => i,
                None => {
                    stages.push(pb::StageProgress { stage: name, ..Default::default() });
                    stages.len() - 1
                }
            };
            stages[i].total += 1;
            if st == TState::Done.name() {
                stages[i].done += 1;
            }
        }
        let event = pb::ReleaseEvent {
            release_id: row.id.clone(),
            state: state as i32,
            stages,
            message: "snapshot".into(),
            error: row.error.clone().unwrap_or_default(),
            report_url: row.report_url.clone().unwrap_or_default(),
        };
        Ok(Summary { state, report_json: row.report_json, report_url: row.report_url, event })
    }

    /// Releases by state (the stored `ReleaseState` number), the journal's whole history.
    pub fn release_counts(&self) -> &BTreeMap<i32, u64> {
        &self.release_counts
    }

    /// What the transitions since the last call ask of the world (events, reports, sweeps, woken leases), taken.
    pub fn take_effects(&mut self) -> Effects {
        std::mem::take(&mut self.effects)
    }

    /// What the transitions since [`Sched::take_effects`] ask of the world, left in place.
    pub fn effects(&self) -> &Effects {
        &self.effects
    }

    pub fn cfg(&self) -> &SchedConfig {
        &self.cfg
    }

    /// The store the releases' outputs go to.
    pub fn store(&self) -> &Location {
        &self.store
    }

    /// The releases in memory: those running, and those finished since the server last evicted them.
    pub fn releases(&self) -> &Slots {
        &self.releases
    }

    /// What the evicted releases add to the metrics (since the coordinator started).
    pub fn history(&self) -> &History {
        &self.history
    }

    /// The workers known since the coordinator started, by id.
    pub fn workers(&self) -> &HashMap<String, WorkerRec> {
        &self.workers
    }

    /// Lets the finished releases go from memory (their figures join `history`); the journal keeps them, and
    /// [`Sched::summary`] reads them from there. Called by the server once their events are out.
    pub fn evict_finished(&mut self) {
        let done: Vec<(String, usize)> = self
            .by_id
            .iter()
            .filter(|(_, &ri)| self.releases[ri].finished())
            .map(|(id, &ri)| (id.clone(), ri))
            .collect();
        for (id, ri) in done {
            self.by_id.remove(&id);
            self.unserved.remove(&id);
            if let Some(rel) = self.releases.take(ri) {
                self.history.add(&rel);
            }
        }
    }

    /// Accepts a release: parses its spec and creates its first tasks.
    pub fn submit(&mut self, yaml: &str, file_name: &str, base: &str) -> Result<String, SchedError> {
        let spec = ReleaseSpec::parse(yaml, file_name)?;
        let mut id = format!("{}-{}", spec.name, &random_hex(4));
        while self.by_id.contains_key(&id) || self.journal.release_exists(&id)? {
            id = format!("{}-{}", spec.name, &random_hex(4));
        }
        let row = ReleaseRow {
            id: id.clone(),
            yaml: yaml.to_string(),
            file_name: file_name.to_string(),
            base: base.to_string(),
            state: ReleaseState::Running as i32,
            error: None,
            report_json: None,
            report_url: None,
            created_ms: (self.cfg.wall_clock)(),
            finished_ms: None,
        };
        let ri = self.releases.len();
        self.releases.push(Release::from_row(row.clone(), spec, &self.store)?);
        self.by_id.insert(id.clone(), ri);
        let defs = {
            let rel = &self.releases[ri];
            kinds::initial(&rel.ctx(&self.store))
        };
        self.journal.batch(|b| b.insert_release(&row))?;
        *self.release_counts.entry(ReleaseState::Running as i32).or_default() += 1;
        self.add_tasks(ri, defs)?;
        let ev = self.releases[ri].event(format!("release {id} submitted"));
        self.effects.events.push(ev);
        Ok(id)
    }
}

/// The worker name recorded for tasks the coordinator runs itself.
pub const COORDINATOR: &str = "coordinator";
