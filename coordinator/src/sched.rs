//! The scheduler: every release's tasks and their states, the ready queue ordered by critical path, leases with
//! deadlines, retries with backoff, and the journal write that goes with each change. Pure state transitions
//! under one lock; the gRPC layer (`server`) waits and wakes around it.
//!
//! Time is an input: every transition that sets or checks a deadline takes `now`, so the scheduler reads no clock
//! of its own and its tests move time forward instead of sleeping.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use prost::Message;
use quantfarm_proto::{self as pb, FailureKind, ReleaseState};
use quantfarm_store::Location;

use crate::affinity::Holdings;
use crate::graph::{self, Ctx, EvalInputs, TaskDef, TaskKey};
use crate::journal::{Batch, Journal, JournalError, ReleaseRow, TaskRow, OUTPUTS_VERSION};
use crate::metrics::History;
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

#[derive(Clone, Debug, PartialEq)]
pub enum TState {
    Blocked,
    Ready,
    Leased {
        lease_id: String,
        worker: String,
        deadline: Instant,
    },
    /// The report task: the coordinator itself is making the release's report (no worker, no deadline).
    Reporting,
    Done,
}

impl TState {
    /// A journal row's state back ([`TState::name`]'s inverse). A lease from before a restart lives on until
    /// `deadline` when the row names its lease and worker (its worker may still finish it), else the task is ready
    /// again; a name this version never writes is an error.
    pub fn from_journal(name: &str, lease: Option<(&str, &str)>, deadline: Instant) -> Result<TState, String> {
        Ok(match name {
            "blocked" => TState::Blocked,
            "ready" => TState::Ready,
            "reporting" => TState::Reporting,
            "done" => TState::Done,
            "leased" => match lease {
                Some((lease_id, worker)) => {
                    TState::Leased { lease_id: lease_id.to_string(), worker: worker.to_string(), deadline }
                }
                None => TState::Ready,
            },
            other => return Err(format!("unknown task state {other:?}")),
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            TState::Blocked => "blocked",
            TState::Ready => "ready",
            TState::Leased { .. } => "leased",
            TState::Reporting => "reporting",
            TState::Done => "done",
        }
    }
}

pub struct TaskRec {
    pub key: TaskKey,
    pub id: String,
    /// Index into the release's `stage_names` (progress counting without a string per task per event).
    pub stage: usize,
    pub deps: Vec<usize>,
    pub dependents: Vec<usize>,
    pub waiting: usize,
    pub priority: u64,
    pub state: TState,
    pub attempts: u32,
    pub not_before: Option<Instant>,
    pub task: Option<pb::Task>,
    pub result: Option<pb::TaskResult>,
    pub error: Option<String>,
    pub worker: Option<String>,
    pub duration_ms: u64,
    /// The part of `duration_ms` its worker spent fetching inputs (in memory only: 0 after a restart).
    pub fetch_ms: u64,
    /// Workers this task failed on (since the coordinator started): a retry goes to another worker that offers its
    /// kind while one is alive, so one bad machine (a full disk, a broken runtime) cannot use up every try.
    pub failed_on: Vec<String>,
    /// The farm-made files it reads, with their recorded digests (set when it becomes ready; see `graph::inputs`).
    pub inputs: Vec<pb::InputFile>,
    /// When a lease call first saw it ready (the start of its bounded wait for a worker holding its inputs).
    pub ready_since: Option<Instant>,
}

impl TaskRec {
    fn row(&self, tasks: &[TaskRec]) -> TaskRow {
        let (lease_id, worker) = match &self.state {
            TState::Leased { lease_id, worker, .. } => (Some(lease_id.clone()), Some(worker.clone())),
            _ => (None, self.worker.clone()),
        };
        TaskRow {
            id: self.id.clone(),
            deps: self.deps.iter().map(|&d| tasks[d].id.clone()).collect(),
            priority: self.priority,
            state: self.state.name().into(),
            attempts: self.attempts,
            lease_id,
            worker,
            task: self.task.as_ref().map(|t| t.encode_to_vec()),
            result: self.result.as_ref().map(|r| r.encode_to_vec()),
            error: self.error.clone(),
            duration_ms: self.duration_ms,
        }
    }
}

pub struct Release {
    pub id: String,
    pub yaml: String,
    pub file_name: String,
    pub base: String,
    pub spec: ReleaseSpec,
    pub source: String,
    /// The importance matrix's location, or its calibration text's when the farm computes it ("" for none).
    pub imatrix: String,
    /// The adapter's location ("" for none).
    pub adapter: String,
    /// The evaluation's input files.
    pub eval: EvalInputs,
    pub state: ReleaseState,
    pub tasks: Vec<TaskRec>,
    pub index: HashMap<TaskKey, usize>,
    pub stage_names: Vec<String>,
    pub error: Option<String>,
    pub report_json: Option<String>,
    pub report_url: Option<String>,
    pub created_ms: i64,
    pub finished_ms: Option<i64>,
}

impl Release {
    pub fn ctx<'a>(&'a self, store: &'a Location) -> Ctx<'a> {
        Ctx {
            spec: &self.spec,
            source: &self.source,
            imatrix: &self.imatrix,
            adapter: &self.adapter,
            eval: &self.eval,
            store,
        }
    }

    /// The outputs of the tasks that took more than one try: a writer of one of them may have been killed mid-write
    /// (a lease that expires counts as a try, and the journal keeps the count across restarts). Swept, as of `now`,
    /// before the report says the release's files are all there.
    pub fn retried_outputs(&self, now: Instant) -> Vec<Sweep> {
        self.tasks
            .iter()
            .filter(|t| t.attempts > 1)
            .filter_map(|t| t.task.as_ref().and_then(graph::written_url))
            .map(|url| Sweep { url: url.to_string(), died: now })
            .collect()
    }

    /// The shortest time a finished task of the same kind as `key` (`TaskKey`'s variant) took in this release, its
    /// fetching left out, in seconds (none yet: `None`).
    pub fn fastest(&self, key: &TaskKey) -> Option<f64> {
        let kind = std::mem::discriminant(key);
        self.tasks
            .iter()
            .filter(|t| t.state == TState::Done && t.result.is_some() && std::mem::discriminant(&t.key) == kind)
            .map(|t| t.duration_ms.saturating_sub(t.fetch_ms) as f64 / 1000.0)
            .reduce(f64::min)
    }

    /// The release's critical path as it stands: the highest priority among its unfinished tasks.
    pub fn critical(&self) -> u64 {
        self.tasks.iter().filter(|t| t.state != TState::Done).map(|t| t.priority).max().unwrap_or(0)
    }

    pub fn result(&self, key: &TaskKey) -> Option<&pb::TaskResult> {
        self.index.get(key).and_then(|&i| self.tasks[i].result.as_ref())
    }

    /// Per-stage counts for progress displays, in first-appearance order.
    pub fn stages(&self) -> Vec<pb::StageProgress> {
        let mut out: Vec<pb::StageProgress> =
            self.stage_names.iter().map(|s| pb::StageProgress { stage: s.clone(), ..Default::default() }).collect();
        for t in &self.tasks {
            let p = &mut out[t.stage];
            p.total += 1;
            match t.state {
                TState::Done => p.done += 1,
                TState::Leased { .. } | TState::Reporting => p.running += 1,
                _ => {}
            }
        }
        out
    }

    /// The index of `key`'s stage, adding the stage when it is new.
    fn stage_of(&mut self, key: &TaskKey) -> usize {
        let name = key.stage();
        match self.stage_names.iter().position(|s| *s == name) {
            Some(i) => i,
            None => {
                self.stage_names.push(name);
                self.stage_names.len() - 1
            }
        }
    }

    pub fn event(&self, message: String) -> pb::ReleaseEvent {
        pb::ReleaseEvent {
            release_id: self.id.clone(),
            state: self.state as i32,
            stages: self.stages(),
            message,
            error: self.error.clone().unwrap_or_default(),
            report_url: self.report_url.clone().unwrap_or_default(),
        }
    }

    fn finished(&self) -> bool {
        self.state != ReleaseState::Running
    }
}

/// A ready task in the queue: highest priority first, then by release slot and task index.
type QueueEntry = (Reverse<u64>, usize, usize);

/// The releases in memory, by a slot number that stays theirs (the ready queue and the leases name them by it); a
/// finished release's slot is emptied when it is evicted, never reused.
#[derive(Default)]
pub struct Slots(Vec<Option<Release>>);

impl Slots {
    /// The slot the next release gets.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    fn push(&mut self, r: Release) {
        self.0.push(Some(r));
    }

    /// The releases in memory.
    pub fn iter(&self) -> impl Iterator<Item = &Release> {
        self.0.iter().flatten()
    }

    fn take(&mut self, ri: usize) -> Option<Release> {
        self.0.get_mut(ri).and_then(Option::take)
    }
}

impl std::ops::Index<usize> for Slots {
    type Output = Release;
    fn index(&self, ri: usize) -> &Release {
        self.0[ri].as_ref().expect("a release slot in use")
    }
}

impl std::ops::IndexMut<usize> for Slots {
    fn index_mut(&mut self, ri: usize) -> &mut Release {
        self.0[ri].as_mut().expect("a release slot in use")
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

pub struct Sched {
    pub cfg: SchedConfig,
    pub store: Location,
    journal: Journal,
    /// The releases in memory: those running, and those finished since the server last evicted them
    /// ([`Sched::evict_finished`]). Finished releases live in the journal ([`Sched::summary`]).
    pub releases: Slots,
    by_id: HashMap<String, usize>,
    /// Releases by state (the stored `ReleaseState` number), all history included.
    release_counts: BTreeMap<i32, u64>,
    /// What the evicted releases add to the metrics (since the coordinator started).
    pub history: History,
    ready: BTreeSet<QueueEntry>,
    leases: HashMap<String, (usize, usize)>,
    pub workers: HashMap<String, WorkerRec>,
    /// Events produced by the last transitions, for the server to broadcast.
    pub events: Vec<pb::ReleaseEvent>,
    /// Reports to produce.
    pub reports: Vec<ReportJob>,
    /// Staging of dead writers to sweep.
    pub sweeps: Vec<Sweep>,
    /// A task became ready since the server last looked (it wakes waiting leases).
    pub ready_changed: bool,
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
    let Some(e) = &spec.evaluation else { return EvalInputs::default() };
    let resolve = |v: &Option<String>| v.as_deref().map_or_else(String::new, |v| resolve_source(v, base));
    EvalInputs { text: resolve(&e.text), prompts: resolve(&e.prompts), probes: resolve(&e.probes) }
}

/// The imatrix file, or the text the farm computes it from, resolved ("" for none).
fn imatrix_location(spec: &ReleaseSpec, base: &str) -> String {
    match spec.imatrix() {
        None => String::new(),
        Some(ImatrixSource::File(p) | ImatrixSource::Text { text: p, .. }) => resolve_source(p, base),
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
            events: Vec::new(),
            reports: Vec::new(),
            sweeps: Vec::new(),
            ready_changed: false,
            unserved: HashMap::new(),
        };
        for (rel, tasks) in rows {
            s.restore(rel, tasks, now)?;
        }
        Ok(s)
    }

    fn restore(&mut self, row: ReleaseRow, rows: Vec<TaskRow>, now: Instant) -> Result<(), SchedError> {
        let spec = ReleaseSpec::parse(&row.yaml, &row.file_name)?;
        let source = source_location(&spec.source, &row.base, &self.store)?;
        let imatrix = imatrix_location(&spec, &row.base);
        let adapter = spec.adapter.as_deref().map_or_else(String::new, |a| resolve_source(a, &row.base));
        let eval = eval_inputs(&spec, &row.base);
        let state = ReleaseState::try_from(row.state).unwrap_or(ReleaseState::Failed);
        let ri = self.releases.len();
        let mut rel = Release {
            id: row.id.clone(),
            yaml: row.yaml,
            file_name: row.file_name,
            base: row.base,
            spec,
            source,
            imatrix,
            adapter,
            eval,
            state,
            tasks: Vec::new(),
            index: HashMap::new(),
            stage_names: Vec::new(),
            error: row.error,
            report_json: row.report_json,
            report_url: row.report_url,
            created_ms: row.created_ms,
            finished_ms: row.finished_ms,
        };
        let deadline = now + self.cfg.lease;
        for r in &rows {
            let key = TaskKey::parse(&r.id)
                .ok_or_else(|| SchedError::NoTask { release: row.id.clone(), task: r.id.clone() })?;
            let corrupt = |msg: String| SchedError::Corrupt { release: row.id.clone(), task: r.id.clone(), msg };
            let lease = r.lease_id.as_deref().zip(r.worker.as_deref());
            let state = TState::from_journal(&r.state, lease, deadline).map_err(corrupt)?;
            let task = r.task.as_deref().map(pb::Task::decode).transpose();
            let task = task.map_err(|e| corrupt(format!("its task message does not decode: {e}")))?;
            let result = r.result.as_deref().map(pb::TaskResult::decode).transpose();
            let result = result.map_err(|e| corrupt(format!("its result does not decode: {e}")))?;
            rel.index.insert(key.clone(), rel.tasks.len());
            let stage = rel.stage_of(&key);
            rel.tasks.push(TaskRec {
                key,
                stage,
                id: r.id.clone(),
                deps: Vec::new(),
                dependents: Vec::new(),
                waiting: 0,
                priority: r.priority,
                state,
                attempts: r.attempts,
                not_before: None,
                task,
                result,
                error: r.error.clone(),
                worker: r.worker.clone(),
                duration_ms: r.duration_ms,
                fetch_ms: 0,
                failed_on: Vec::new(),
                inputs: Vec::new(),
                ready_since: None,
            });
        }
        for (i, r) in rows.iter().enumerate() {
            for d in &r.deps {
                let key =
                    TaskKey::parse(d).ok_or_else(|| SchedError::NoTask { release: row.id.clone(), task: d.clone() })?;
                let di = *rel
                    .index
                    .get(&key)
                    .ok_or_else(|| SchedError::NoTask { release: row.id.clone(), task: d.clone() })?;
                rel.tasks[i].deps.push(di);
                rel.tasks[di].dependents.push(i);
                if rel.tasks[di].state != TState::Done {
                    rel.tasks[i].waiting += 1;
                }
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
        let source = source_location(&spec.source, base, &self.store)?;
        let imatrix = imatrix_location(&spec, base);
        let adapter = spec.adapter.as_deref().map_or_else(String::new, |a| resolve_source(a, base));
        let eval = eval_inputs(&spec, base);
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
        self.releases.push(Release {
            id: id.clone(),
            yaml: row.yaml.clone(),
            file_name: row.file_name.clone(),
            base: row.base.clone(),
            spec,
            source,
            imatrix,
            adapter,
            eval,
            state: ReleaseState::Running,
            tasks: Vec::new(),
            index: HashMap::new(),
            stage_names: Vec::new(),
            error: None,
            report_json: None,
            report_url: None,
            created_ms: row.created_ms,
            finished_ms: None,
        });
        self.by_id.insert(id.clone(), ri);
        let defs = {
            let rel = &self.releases[ri];
            graph::initial(&rel.ctx(&self.store))
        };
        self.journal.batch(|b| b.insert_release(&row))?;
        *self.release_counts.entry(ReleaseState::Running as i32).or_default() += 1;
        self.add_tasks(ri, defs)?;
        let ev = self.releases[ri].event(format!("release {id} submitted"));
        self.events.push(ev);
        Ok(id)
    }

    /// Adds tasks to a release (journalled in one transaction) and readies those with no open dependency.
    fn add_tasks(&mut self, ri: usize, defs: Vec<TaskDef>) -> Result<(), SchedError> {
        let prio = graph::priorities(&defs);
        let rel = &mut self.releases[ri];
        let first_new = rel.tasks.len();
        for d in &defs {
            rel.index.insert(d.key.clone(), rel.tasks.len());
            let stage = rel.stage_of(&d.key);
            rel.tasks.push(TaskRec {
                stage,
                id: d.key.to_string(),
                key: d.key.clone(),
                deps: Vec::new(),
                dependents: Vec::new(),
                waiting: 0,
                priority: prio.get(&d.key).copied().unwrap_or(d.cost),
                state: TState::Blocked,
                attempts: 0,
                not_before: None,
                task: None,
                result: None,
                error: None,
                worker: None,
                duration_ms: 0,
                fetch_ms: 0,
                failed_on: Vec::new(),
                inputs: Vec::new(),
                ready_since: None,
            });
        }
        for (k, d) in defs.iter().enumerate() {
            let i = first_new + k;
            for dep in &d.deps {
                let di = rel.index[dep];
                rel.tasks[i].deps.push(di);
                rel.tasks[di].dependents.push(i);
                if rel.tasks[di].state != TState::Done {
                    rel.tasks[i].waiting += 1;
                }
            }
        }
        let rel = &self.releases[ri];
        let rows: Vec<TaskRow> = rel.tasks[first_new..].iter().map(|t| t.row(&rel.tasks)).collect();
        let id = rel.id.clone();
        self.journal.batch(|b| {
            for (k, r) in rows.iter().enumerate() {
                b.insert_task(&id, first_new + k, r)?;
            }
            Ok(())
        })?;
        for i in first_new..self.releases[ri].tasks.len() {
            if self.releases[ri].tasks[i].waiting == 0 {
                self.ready_up(ri, i)?;
            }
        }
        Ok(())
    }

    /// Makes an existing task also wait for `deps` (tasks of the same release), journalled.
    fn add_deps(&mut self, ri: usize, key: &TaskKey, deps: &[TaskKey]) -> Result<(), SchedError> {
        let rel = &mut self.releases[ri];
        let Some(&ti) = rel.index.get(key) else {
            return Err(SchedError::NoTask { release: rel.id.clone(), task: key.to_string() });
        };
        for dep in deps {
            let di = *rel
                .index
                .get(dep)
                .ok_or_else(|| SchedError::NoTask { release: rel.id.clone(), task: dep.to_string() })?;
            rel.tasks[ti].deps.push(di);
            rel.tasks[di].dependents.push(ti);
            if rel.tasks[di].state != TState::Done {
                rel.tasks[ti].waiting += 1;
            }
        }
        self.journal_task(ri, ti)
    }

    /// A task whose dependencies are all done: build its message and queue it (or queue the report).
    fn ready_up(&mut self, ri: usize, ti: usize) -> Result<(), SchedError> {
        let rel = &self.releases[ri];
        let key = rel.tasks[ti].key.clone();
        if key == TaskKey::Report {
            let t = &mut self.releases[ri].tasks[ti];
            t.state = TState::Reporting;
            t.attempts += 1;
            self.journal_task(ri, ti)?;
            self.reports.push(ReportJob { release_id: self.releases[ri].id.clone() });
            return Ok(());
        }
        let built = {
            let ctx = rel.ctx(&self.store);
            let results = |k: &TaskKey| rel.result(k);
            graph::build(&ctx, &key, &results)
        };
        match built {
            Ok(task) => {
                let t = &mut self.releases[ri].tasks[ti];
                t.task = Some(task);
                t.state = TState::Ready;
                self.journal_task(ri, ti)?;
                self.make_ready(ri, ti);
            }
            Err(e) => self.fail_release(ri, format!("task {key}: cannot be built: {e}"))?,
        }
        Ok(())
    }

    fn make_ready(&mut self, ri: usize, ti: usize) {
        self.ready_changed = true;
        let inputs = self.inputs_of(self.releases[ri].tasks[ti].task.as_ref());
        self.releases[ri].tasks[ti].inputs = inputs;
        self.ready.insert((Reverse(self.releases[ri].tasks[ti].priority), ri, ti));
    }

    /// The digest and size recorded for the output at `url` (a journal lookup; an unreadable journal is logged and
    /// reads as unknown).
    fn output(&self, url: &str) -> Option<(String, u64)> {
        self.journal.output(url).unwrap_or_else(|e| {
            tracing::error!("{e}");
            None
        })
    }

    /// The farm-made files `task` reads whose digests the farm recorded.
    fn inputs_of(&self, task: Option<&pb::Task>) -> Vec<pb::InputFile> {
        let Some(task) = task else { return Vec::new() };
        graph::input_urls(task)
            .into_iter()
            .filter_map(|url| {
                let (sha256, bytes) = self.output(&url)?;
                Some(pb::InputFile { url, sha256, bytes })
            })
            .collect()
    }

    fn journal_task(&mut self, ri: usize, ti: usize) -> Result<(), SchedError> {
        let rel = &self.releases[ri];
        let row = rel.tasks[ti].row(&rel.tasks);
        let id = rel.id.clone();
        self.journal.batch(|b| b.update_task(&id, &row))?;
        Ok(())
    }

    pub fn register(&mut self, info: pb::WorkerInfo, now: Instant) -> String {
        let id = format!("{}-{}", if info.name.is_empty() { "worker" } else { &info.name }, random_hex(4));
        let kinds = info.task_kinds.iter().filter_map(|k| pb::WorkerKind::parse(k)).collect();
        self.workers.insert(id.clone(), WorkerRec { info, kinds, last_seen: now, bytes_read: 0, bytes_written: 0 });
        id
    }

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
        let kinds = w.kinds.clone();
        let runtimes: Vec<String> = w.info.runtimes.clone();
        let want = slots.max(1) as usize;
        // (queue position, bytes held): every candidate of the priorities scanned until `want` were found.
        let mut cands: Vec<(QueueEntry, u64)> = Vec::new();
        let mut next_wake: Option<Instant> = None;
        let mut first_seen = Vec::new();
        let mut critical: HashMap<usize, u64> = HashMap::new();
        // Per input set (its first file's digest): tasks left to their holders in this scan so far.
        let mut queued: HashMap<&str, u32> = HashMap::new();
        let mut run_s: HashMap<(usize, std::mem::Discriminant<TaskKey>), Option<f64>> = HashMap::new();
        for &(prio, ri, ti) in self.ready.iter() {
            if cands.len() >= want && cands.last().is_some_and(|c| c.0 .0 != prio) {
                break;
            }
            let t = &self.releases[ri].tasks[ti];
            let Some(kind) = t.key.worker_kind() else { continue };
            if !kinds.contains(&kind) {
                continue;
            }
            if t.key.runtime().is_some_and(|rt| !runtimes.iter().any(|r| r == rt)) {
                continue;
            }
            if let Some(nb) = t.not_before {
                if nb > now {
                    next_wake = Some(next_wake.map_or(nb, |w: Instant| w.min(nb)));
                    continue;
                }
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
            let run_s =
                *run_s.entry((ri, std::mem::discriminant(&t.key))).or_insert_with(|| self.releases[ri].fastest(&t.key));
            if let Some(until) = self.waits_for_holder(t, kind, worker_id, held, critical, ahead, run_s, now) {
                next_wake = Some(next_wake.map_or(until, |w: Instant| w.min(until)));
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
        let picked: Vec<QueueEntry> = cands.into_iter().take(want).map(|c| c.0).collect();
        let mut out = Vec::with_capacity(picked.len());
        let lease_ms = self.cfg.lease.as_millis() as u32;
        let mut rows = Vec::with_capacity(picked.len());
        for (prio, ri, ti) in picked {
            self.ready.remove(&(prio, ri, ti));
            let lease_id = random_hex(12);
            let known = {
                let t = &self.releases[ri].tasks[ti];
                t.task.as_ref().and_then(graph::output_url).and_then(|u| self.output(u)).map(|k| k.0)
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
            self.events.push(ev);
        }
        Ok(Leases { leases: out, next_wake })
    }

    /// Until when `t` waits for a live worker that holds more of its inputs than `worker` (which holds `held` bytes of
    /// them), or `None` when the asking worker should take it (see [`Sched::lease`]).
    #[allow(clippy::too_many_arguments)]
    fn waits_for_holder(
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
    fn another_worker_for(&self, t: &TaskRec, kind: pb::WorkerKind, now: Instant) -> bool {
        self.workers.iter().any(|(id, w)| !t.failed_on.contains(id) && self.can_take(w, kind, t.key.runtime(), now))
    }

    /// Whether worker `w` is live (seen within two lease periods) and offers `kind` and `runtime`.
    fn can_take(&self, w: &WorkerRec, kind: pb::WorkerKind, runtime: Option<&str>, now: Instant) -> bool {
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
                        self.events.push(ev);
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
                if needs.keys().any(|(_, rt)| *rt == Some(crate::graph::MLX_LM_RUNTIME)) {
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
                self.events.push(ev);
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
            self.events.push(ev);
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
    fn check_output(&self, result: &pb::TaskResult) -> Result<(), String> {
        let Some(a) = result.artifact() else { return Ok(()) };
        match self.output(&a.url).map(|o| o.0) {
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
    fn remake_corrupt(&mut self, ri: usize, ti: usize, url: &str, msg: String, now: Instant) -> Result<(), SchedError> {
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
            self.releases[ri].tasks[pi].dependents.push(ti);
            self.releases[ri].tasks[ti].deps.push(pi);
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
        self.events.push(ev);
        Ok(())
    }

    fn end_lease(&mut self, ri: usize, ti: usize) {
        if let TState::Leased { lease_id, .. } = &self.releases[ri].tasks[ti].state {
            self.leases.remove(lease_id);
        }
        self.ready.remove(&(Reverse(self.releases[ri].tasks[ti].priority), ri, ti));
    }

    fn finish_task(
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
                Some(r) => graph::grows(&rel.ctx(&self.store), &t.key, r, &results),
                None => Ok(graph::Growth::default()),
            }
        };
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
        for d in dependents {
            let t = &mut self.releases[ri].tasks[d];
            t.waiting = t.waiting.saturating_sub(1);
            if t.waiting == 0 && t.state == TState::Blocked && self.releases[ri].state == ReleaseState::Running {
                self.ready_up(ri, d)?;
            }
        }
        let rel = &self.releases[ri];
        let ev = rel.event(format!("{} done on {worker} in {:.1} s", rel.tasks[ti].id, duration_ms as f64 / 1000.0));
        self.events.push(ev);
        Ok(())
    }

    fn fail_task(
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
        self.events.push(ev);
        Ok(())
    }

    /// Ends a release for good with `error`: its leases are revoked, nothing else runs.
    pub fn fail_release(&mut self, ri: usize, error: String) -> Result<(), SchedError> {
        tracing::error!(release = %self.releases[ri].id, "release failed: {error}");
        self.end_release(ri, ReleaseState::Failed, Some(error), None, None)
    }

    fn end_release(
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
        self.events.push(ev);
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
                if let Some(&ti) = self.releases[ri].index.get(&TaskKey::Report) {
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
                self.sweeps.push(Sweep { url: url.to_string(), died: now });
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

/// The worker name recorded for tasks the coordinator runs itself.
pub const COORDINATOR: &str = "coordinator";

/// A result must have the shape its task's message asks for (a plan for a plan, an artifact for a conversion, …).
fn check_shape(t: &TaskRec, r: &pb::TaskResult) -> Result<(), String> {
    let want = t.task.as_ref().and_then(|m| m.kind.as_ref()).map(pb::task::Kind::result_shape);
    let got = r.kind.as_ref().map(pb::task_result::Kind::shape);
    match (want, got) {
        (Some(w), Some(g)) if w == g => Ok(()),
        _ => Err(format!("task {} got a result of the wrong kind ({got:?}, expected {want:?})", t.key)),
    }
}
