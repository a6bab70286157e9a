//! A release in memory: its tasks with their states and journal rows, its progress by stage, and the slots
//! the ready queue and the leases name releases by.

use super::*;

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
    /// A new task of `key`, blocked, of critical-path `priority`.
    pub(super) fn new(key: TaskKey, priority: u64) -> TaskRec {
        TaskRec {
            id: key.to_string(),
            key,
            stage: 0,
            deps: Vec::new(),
            dependents: Vec::new(),
            waiting: 0,
            priority,
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
        }
    }

    pub(super) fn row(&self, tasks: &[TaskRec]) -> TaskRow {
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
    /// The importance matrix's location, or its calibration text's when the farm computes it.
    pub imatrix: Option<String>,
    /// The adapter's location.
    pub adapter: Option<String>,
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
    /// The release of a journal row (as submitted or restored) and its parsed spec, its inputs resolved against
    /// the submitter's folder (`row.base`) and the store; no tasks yet.
    pub(super) fn from_row(row: ReleaseRow, spec: ReleaseSpec, store: &Location) -> Result<Release, SchedError> {
        let source = source_location(&spec.source, &row.base, store)?;
        let imatrix = imatrix_location(&spec, &row.base);
        let adapter = spec.adapter.as_deref().map(|a| resolve_source(a, &row.base));
        let eval = eval_inputs(&spec, &row.base);
        Ok(Release {
            id: row.id,
            yaml: row.yaml,
            file_name: row.file_name,
            base: row.base,
            spec,
            source,
            imatrix,
            adapter,
            eval,
            state: ReleaseState::try_from(row.state).unwrap_or(ReleaseState::Failed),
            tasks: Vec::new(),
            index: HashMap::new(),
            stage_names: Vec::new(),
            error: row.error,
            report_json: row.report_json,
            report_url: row.report_url,
            created_ms: row.created_ms,
            finished_ms: row.finished_ms,
        })
    }

    /// Adds a task (indexed by its key, its stage counted); returns its index.
    pub(super) fn push_task(&mut self, mut t: TaskRec) -> usize {
        let ti = self.tasks.len();
        t.stage = self.stage_of(&t.key);
        self.index.insert(t.key.clone(), ti);
        self.tasks.push(t);
        ti
    }

    /// The index of task `key`.
    pub(super) fn task_index(&self, key: &TaskKey) -> Result<usize, SchedError> {
        self.index
            .get(key)
            .copied()
            .ok_or_else(|| SchedError::NoTask { release: self.id.clone(), task: key.to_string() })
    }

    /// Task `ti` depends on task `di` (an edge both ways; its open count unchanged).
    pub(super) fn link(&mut self, ti: usize, di: usize) {
        self.tasks[ti].deps.push(di);
        self.tasks[di].dependents.push(ti);
    }

    /// Task `ti` waits for task `di`: the edge, and one more open dependency while `di` is not done. The one place
    /// a dependency is wired (new tasks, new waits, a restart); an edge that exists already is left as it is.
    pub(super) fn wire(&mut self, ti: usize, di: usize) {
        if self.tasks[ti].deps.contains(&di) {
            return;
        }
        self.link(ti, di);
        if self.tasks[di].state != TState::Done {
            self.tasks[ti].waiting += 1;
        }
    }

    pub fn ctx<'a>(&'a self, store: &'a Location) -> Ctx<'a> {
        Ctx {
            spec: &self.spec,
            source: &self.source,
            imatrix: self.imatrix.as_deref(),
            adapter: self.adapter.as_deref(),
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

    /// The shortest time a finished task of the same sort as `key` ([`TaskKey::sort`]) took in this release, its
    /// fetching left out, in seconds (none yet: `None`).
    pub fn fastest(&self, key: &TaskKey) -> Option<f64> {
        let sort = key.sort();
        self.tasks
            .iter()
            .filter(|t| t.state == TState::Done && t.result.is_some() && t.key.sort() == sort)
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
    pub(super) fn stage_of(&mut self, key: &TaskKey) -> usize {
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

    pub(super) fn finished(&self) -> bool {
        self.state != ReleaseState::Running
    }
}

/// A ready task in the queue: highest priority first, then by release slot and task index.
pub(super) type QueueEntry = (Reverse<u64>, usize, usize);

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

    pub(super) fn push(&mut self, r: Release) {
        self.0.push(Some(r));
    }

    /// The releases in memory.
    pub fn iter(&self) -> impl Iterator<Item = &Release> {
        self.0.iter().flatten()
    }

    pub(super) fn take(&mut self, ri: usize) -> Option<Release> {
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
