//! The scheduler's state machine against a real SQLite journal: capability matching, retries with backoff, the
//! attempt limit, input failures, lease expiry (a late outcome is discarded), retries on another worker, corrupt
//! inputs made again, outputs that must be reproducible, and resuming after a restart.
//!
//! Time is an input of every transition: the tests move a clock forward ([`Clock`]) instead of sleeping, so they
//! hold however busy the machine is.

use std::time::{Duration, Instant};

use quantfarm_coordinator::journal::Journal;
use quantfarm_coordinator::kinds::TaskKey;
use quantfarm_coordinator::sched::{Published, Sched, SchedConfig};
use quantfarm_proto::{self as pb, complete_request::Outcome, task_result, FailureKind, ReleaseState};
use quantfarm_store::Location;

fn noop_yaml(n: u32) -> String {
    format!("name: bench\nsource: unused\noutputs:\n  noop: {{tasks: {n}, sleep_ms: 0}}\n")
}

fn cfg() -> SchedConfig {
    SchedConfig {
        lease: Duration::from_millis(200),
        heartbeat: Duration::from_millis(50),
        max_attempts: 3,
        backoff: Duration::from_millis(20),
        ..SchedConfig::default()
    }
}

/// The scheduler's time in a test: starts at an arbitrary instant and moves only when the test says.
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn new() -> Clock {
        Clock(Instant::now())
    }

    fn now(&self) -> Instant {
        self.0
    }

    fn advance(&mut self, ms: u64) {
        self.0 += Duration::from_millis(ms);
    }
}

fn open(dir: &std::path::Path, clock: &Clock) -> Sched {
    let journal = Journal::open(&dir.join("journal.sqlite")).unwrap();
    Sched::open(journal, Location::local(dir.join("store")), cfg(), clock.now()).unwrap()
}

fn worker(s: &mut Sched, kinds: &[&str], clock: &Clock) -> String {
    let info = pb::WorkerInfo {
        name: "w".into(),
        slots: 4,
        task_kinds: kinds.iter().map(|k| k.to_string()).collect(),
        ..Default::default()
    };
    s.register(info, clock.now())
}

/// The leases `worker` gets for `slots` at the clock's time.
fn lease(s: &mut Sched, worker: &str, slots: u32, clock: &Clock) -> Vec<pb::Lease> {
    s.lease(worker, slots, clock.now()).unwrap().leases
}

fn ok(l: &pb::Lease, worker: &str) -> pb::CompleteRequest {
    pb::CompleteRequest {
        worker_id: worker.into(),
        lease_id: l.lease_id.clone(),
        release_id: l.release_id.clone(),
        task_id: l.task_id.clone(),
        duration_ms: 1,
        outcome: Some(Outcome::Result(pb::TaskResult { kind: Some(task_result::Kind::Noop(pb::NoopResult {})) })),
        fetch_ms: 0,
    }
}

fn fail(l: &pb::Lease, worker: &str, kind: FailureKind, msg: &str) -> pb::CompleteRequest {
    pb::CompleteRequest {
        outcome: Some(Outcome::Failure(pb::TaskFailure {
            kind: kind as i32,
            message: msg.into(),
            corrupt_url: String::new(),
        })),
        ..ok(l, worker)
    }
}

fn state(s: &Sched, id: &str) -> ReleaseState {
    s.release(id).unwrap().state
}

#[test]
fn leases_by_capability_and_finishes_through_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::new();
    let mut s = open(dir.path(), &clock);
    let id = s.submit(&noop_yaml(3), "r.yaml", "").unwrap();
    let planner = worker(&mut s, &["plan"], &clock);
    assert!(lease(&mut s, &planner, 4, &clock).is_empty(), "a worker without the noop kind got a noop task");
    let w = worker(&mut s, &["noop"], &clock);
    let leases = lease(&mut s, &w, 2, &clock);
    assert_eq!(leases.len(), 2, "leases up to the free slots");
    let more = lease(&mut s, &w, 4, &clock);
    assert_eq!(more.len(), 1);
    for l in leases.iter().chain(&more) {
        assert!(s.complete(ok(l, &w), clock.now()).unwrap());
    }
    assert_eq!(s.effects().reports.len(), 1, "the report task is the coordinator's own, due now");
    assert_eq!(state(&s, &id), ReleaseState::Running);
    let report = s.release(&id).unwrap().tasks.iter().find(|t| t.key == TaskKey::REPORT).unwrap();
    assert_eq!(report.state.name(), "reporting", "the report is a state of its own, not a lease");
    let published = Published { json: "{}".into(), url: "x/report.json".into(), passed: true };
    s.report_done(&id, Ok(published)).unwrap();
    assert_eq!(state(&s, &id), ReleaseState::Released);
}

#[test]
fn transient_failures_back_off_then_fail_the_release_after_the_attempt_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut clock = Clock::new();
    let mut s = open(dir.path(), &clock);
    let id = s.submit(&noop_yaml(1), "r.yaml", "").unwrap();
    let w = worker(&mut s, &["noop"], &clock);
    for attempt in 1..=3u32 {
        let leased = s.lease(&w, 1, clock.now()).unwrap();
        let leases = if leased.leases.is_empty() {
            let wake = leased.next_wake.expect("a backed-off task says when it is ready");
            // The backoff doubles: 20 ms before the second try, 40 ms before the third.
            assert_eq!(wake - clock.now(), cfg().backoff * (1 << (attempt - 2)), "try {attempt}");
            clock.0 = wake - Duration::from_millis(1);
            assert!(lease(&mut s, &w, 1, &clock).is_empty(), "leased before its backoff ended");
            clock.0 = wake;
            lease(&mut s, &w, 1, &clock)
        } else {
            leased.leases
        };
        assert_eq!(leases.len(), 1);
        assert_eq!(leases[0].attempt, attempt);
        let failed = fail(&leases[0], &w, FailureKind::Transient, &format!("disk full #{attempt}"));
        s.complete(failed, clock.now()).unwrap();
        if attempt < 3 {
            // Backed off: not leasable at once.
            assert!(lease(&mut s, &w, 1, &clock).is_empty());
        }
    }
    assert_eq!(state(&s, &id), ReleaseState::Failed);
    let err = s.release(&id).unwrap().error.clone().unwrap();
    assert!(err.contains("noop/0") && err.contains("3 attempts") && err.contains("disk full #3"), "{err}");
}

#[test]
fn an_input_failure_fails_the_release_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::new();
    let mut s = open(dir.path(), &clock);
    let id = s.submit(&noop_yaml(2), "r.yaml", "").unwrap();
    let w = worker(&mut s, &["noop"], &clock);
    let leases = lease(&mut s, &w, 1, &clock);
    let failed = fail(&leases[0], &w, FailureKind::Input, "model.safetensors: tensor x: bad shape");
    s.complete(failed, clock.now()).unwrap();
    assert_eq!(state(&s, &id), ReleaseState::Failed);
    assert!(s.release(&id).unwrap().error.as_ref().unwrap().contains("bad shape"));
    assert!(lease(&mut s, &w, 4, &clock).is_empty(), "a failed release leases nothing");
}

#[test]
fn expired_leases_are_retried_and_a_late_result_is_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let mut clock = Clock::new();
    let mut s = open(dir.path(), &clock);
    let id = s.submit(&noop_yaml(1), "r.yaml", "").unwrap();
    let w1 = worker(&mut s, &["noop"], &clock);
    let w2 = worker(&mut s, &["noop"], &clock);
    let first = lease(&mut s, &w1, 1, &clock);
    // A heartbeat keeps it alive past its first deadline (200 ms)…
    clock.advance(120);
    assert!(s.heartbeat(&w1, &[first[0].lease_id.clone()], clock.now()).revoked.is_empty());
    clock.advance(120);
    s.expire(clock.now()).unwrap();
    assert!(lease(&mut s, &w2, 1, &clock).is_empty(), "still leased after a heartbeat");
    // …up to its new deadline, 200 ms after the heartbeat; silence past it expires the lease.
    clock.advance(80);
    s.expire(clock.now()).unwrap();
    assert!(lease(&mut s, &w2, 1, &clock).is_empty(), "expired at its deadline, not after it");
    clock.advance(1);
    s.expire(clock.now()).unwrap();
    clock.advance(cfg().backoff.as_millis() as u64);
    let second = lease(&mut s, &w2, 1, &clock);
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].attempt, 2);
    let revoked = s.heartbeat(&w1, &[first[0].lease_id.clone()], clock.now()).revoked;
    assert_eq!(revoked, vec![first[0].lease_id.clone()], "the old lease is revoked");
    // The first worker finishes anyway: its outcome is discarded (a failure as much as a result), the task stays
    // with the second worker, and only the second worker's result ends it.
    assert!(!s.complete(ok(&first[0], &w1), clock.now()).unwrap(), "a late result was taken");
    let late = fail(&first[0], &w1, FailureKind::Input, "late");
    assert!(!s.complete(late, clock.now()).unwrap(), "a late failure was taken");
    assert_eq!(state(&s, &id), ReleaseState::Running);
    let t = &s.release(&id).unwrap().tasks[0];
    assert!(t.result.is_none() && t.state.name() == "leased", "{:?}", t.state);
    assert!(s.effects().events.iter().any(|e| e.message.contains("discarded a late outcome")), "no event says so");
    assert!(s.complete(ok(&second[0], &w2), clock.now()).unwrap());
    assert_eq!(s.effects().reports.len(), 1);
}

#[test]
fn a_task_that_failed_on_a_worker_is_retried_on_another_while_one_is_alive() {
    let dir = tempfile::tempdir().unwrap();
    let mut clock = Clock::new();
    let mut s = open(dir.path(), &clock);
    let _id = s.submit(&noop_yaml(1), "r.yaml", "").unwrap();
    let w1 = worker(&mut s, &["noop"], &clock);
    let w2 = worker(&mut s, &["noop"], &clock);
    let l = lease(&mut s, &w1, 1, &clock);
    s.complete(fail(&l[0], &w1, FailureKind::Transient, "scratch: No space left on device"), clock.now()).unwrap();
    clock.advance(30);
    assert!(lease(&mut s, &w1, 1, &clock).is_empty(), "the retry went back to the worker it failed on");
    let l = lease(&mut s, &w2, 1, &clock);
    assert_eq!(l.len(), 1, "the other worker did not get the retry");
    s.complete(fail(&l[0], &w2, FailureKind::Transient, "again"), clock.now()).unwrap();
    // Both failed: with no other worker, the first one may try again.
    clock.advance(60);
    assert_eq!(lease(&mut s, &w1, 1, &clock).len(), 1);
}

/// A made-up plan: one tensor, one file.
fn plan_result() -> pb::PlanResult {
    pb::PlanResult {
        architecture: "llama".into(),
        format: "safetensors".into(),
        plan_digest: "p".into(),
        source_identity: "s".into(),
        source_bytes: 1024,
        tensors: vec![pb::PlannedTensor {
            name: "token_embd.weight".into(),
            source: "model.embed_tokens.weight".into(),
            ggml_type: "BF16".into(),
            bytes: 1024,
            elements: 512,
            ne: vec![64, 8],
        }],
        shards: vec![pb::ShardRange { start: 0, end: 1 }],
        imatrix_sha256: String::new(),
    }
}

/// A release `plan → gguf/0 → {quantize/Q8_0/0, verify/gguf/0}` driven by hand: the plan's result is made up
/// (one tensor, one file), so each task can be completed with a chosen digest.
fn gguf_release(s: &mut Sched, w: &str, clock: &Clock) -> (String, pb::Lease) {
    let id = s.submit("name: t\nsource: model\noutputs:\n  gguf: {quants: [Q8_0]}\n", "r.yaml", "/tmp").unwrap();
    let plan = lease(s, w, 1, clock);
    let done = pb::CompleteRequest {
        outcome: Some(Outcome::Result(pb::TaskResult { kind: Some(task_result::Kind::Plan(plan_result())) })),
        ..ok(&plan[0], w)
    };
    assert!(s.complete(done, clock.now()).unwrap());
    let gguf = lease(s, w, 1, clock);
    assert_eq!(gguf[0].task_id, "gguf/0");
    (id, gguf[0].clone())
}

fn output(l: &pb::Lease) -> String {
    match l.task.as_ref().and_then(|t| t.kind.as_ref()) {
        Some(pb::task::Kind::Gguf(g)) => g.output.clone(),
        other => panic!("not a gguf task: {other:?}"),
    }
}

fn made(l: &pb::Lease, w: &str, sha256: &str) -> pb::CompleteRequest {
    let artifact = pb::Artifact { url: output(l), sha256: sha256.into(), bytes: 2048, types: vec![] };
    let r = pb::ArtifactResult { artifact: Some(artifact), cache_hit: false, experts: vec![] };
    pb::CompleteRequest {
        outcome: Some(Outcome::Result(pb::TaskResult { kind: Some(task_result::Kind::Artifact(r)) })),
        ..ok(l, w)
    }
}

#[test]
fn a_dead_lease_has_the_staging_of_its_output_swept_then_again_before_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let mut clock = Clock::new();
    let mut s = open(dir.path(), &clock);
    let w = worker(&mut s, &["plan", "gguf", "quantize", "verify"], &clock);
    let (id, gguf) = gguf_release(&mut s, &w, &clock);
    assert!(s.effects().sweeps.is_empty());
    // The worker is killed mid-write: its lease expires, and the output it was making is to be swept as of then.
    clock.advance(cfg().lease.as_millis() as u64 + 1);
    let died = clock.now();
    s.expire(died).unwrap();
    let sweeps = s.take_effects().sweeps;
    assert_eq!(sweeps.len(), 1, "{sweeps:?}");
    assert_eq!((sweeps[0].url.as_str(), sweeps[0].died), (output(&gguf).as_str(), died));
    // The task that took two tries is swept again before its release's report (the tries are journaled).
    clock.advance(cfg().backoff.as_millis() as u64);
    let again = lease(&mut s, &w, 1, &clock);
    assert_eq!(again[0].task_id, "gguf/0");
    let later = clock.now() + Duration::from_secs(1);
    let retried = s.release(&id).unwrap().retried_outputs(later);
    assert_eq!(retried.iter().map(|w| (w.url.clone(), w.died)).collect::<Vec<_>>(), vec![(output(&gguf), later)]);
}

#[test]
fn a_dead_plan_that_writes_the_synthetic_model_has_that_folder_swept() {
    // The plan of a `synthetic:` release writes the built-in model into the store (shared by every release that
    // names it): a worker killed mid-write leaves staging there, as it would beside an artifact.
    let dir = tempfile::tempdir().unwrap();
    let mut clock = Clock::new();
    let mut s = open(dir.path(), &clock);
    let w = worker(&mut s, &["plan"], &clock);
    let id = s.submit("name: t\nsource: synthetic:tiny-llama\noutputs:\n  gguf: {quants: [Q8_0]}\n", "r.yaml", "/tmp");
    let id = id.unwrap();
    let plan = lease(&mut s, &w, 1, &clock);
    let folder = match plan[0].task.as_ref().and_then(|t| t.kind.as_ref()) {
        Some(pb::task::Kind::Plan(p)) => {
            assert_eq!(p.synthetic, "tiny-llama");
            p.source.clone()
        }
        other => panic!("not a plan task: {other:?}"),
    };
    assert!(folder.contains("sources/synthetic/"), "{folder}");
    clock.advance(cfg().lease.as_millis() as u64 + 1);
    let died = clock.now();
    s.expire(died).unwrap();
    let sweeps = s.take_effects().sweeps;
    assert_eq!(sweeps.iter().map(|w| (w.url.clone(), w.died)).collect::<Vec<_>>(), vec![(folder.clone(), died)]);
    clock.advance(cfg().backoff.as_millis() as u64);
    assert_eq!(lease(&mut s, &w, 1, &clock)[0].task_id, "plan");
    let later = clock.now();
    let retried = s.release(&id).unwrap().retried_outputs(later);
    assert_eq!(retried.iter().map(|w| w.url.clone()).collect::<Vec<_>>(), vec![folder]);
}

#[test]
fn a_corrupt_input_has_its_producer_make_it_again_then_its_reader_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut clock = Clock::new();
    let mut s = open(dir.path(), &clock);
    let w = worker(&mut s, &["plan", "gguf", "quantize", "verify"], &clock);
    let (id, gguf) = gguf_release(&mut s, &w, &clock);
    assert_eq!(gguf.task.as_ref().unwrap().known_output_sha256, "", "never made: nothing is known");
    assert!(s.complete(made(&gguf, &w, "aaaa"), clock.now()).unwrap());
    // A worker that only verifies takes the verify; the quantize has not started.
    let wv = worker(&mut s, &["verify"], &clock);
    let ready = lease(&mut s, &wv, 1, &clock);
    let verify = ready.into_iter().find(|l| l.task_id == "verify/gguf/0").expect("the verify is leased");
    let url = output(&gguf);
    let corrupt = pb::CompleteRequest {
        outcome: Some(Outcome::Failure(pb::TaskFailure {
            kind: FailureKind::Corrupt as i32,
            message: format!("{url}: the stored object has sha256 ffff, its producer recorded aaaa: corrupt"),
            corrupt_url: url.clone(),
        })),
        ..ok(&verify, &wv)
    };
    assert!(s.complete(corrupt, clock.now()).unwrap());
    assert_eq!(state(&s, &id), ReleaseState::Running, "{:?}", s.release(&id).unwrap().error);
    // The producer is leased again, with the digest it recorded; its readers (the verify, and the quantize that
    // had not started) wait for it.
    let again = lease(&mut s, &w, 4, &clock);
    let ids: Vec<&str> = again.iter().map(|l| l.task_id.as_str()).collect();
    assert_eq!(ids, ["gguf/0"], "only the producer runs now");
    assert_eq!(again[0].task.as_ref().unwrap().known_output_sha256, "aaaa");
    // Made again with other bytes: not reproducible, refused, retried.
    assert!(s.complete(made(&again[0], &w, "bbbb"), clock.now()).unwrap());
    let err = s.release(&id).unwrap().tasks.iter().find(|t| t.id == "gguf/0").unwrap().error.clone().unwrap();
    assert!(err.contains("not reproducible") && err.contains("aaaa") && err.contains("bbbb"), "{err}");
    let wake = s.lease(&w, 4, clock.now()).unwrap().next_wake.expect("the retry backs off");
    clock.0 = wake;
    let third = lease(&mut s, &w, 4, &clock);
    assert_eq!(third.len(), 1);
    assert!(s.complete(made(&third[0], &w, "aaaa"), clock.now()).unwrap());
    let readers = lease(&mut s, &w, 4, &clock);
    let mut ids: Vec<(&str, u32)> = readers.iter().map(|l| (l.task_id.as_str(), l.attempt)).collect();
    ids.sort();
    assert_eq!(ids, [("quantize/Q8_0/0", 1), ("verify/gguf/0", 1)], "the corrupt input used up the verify's try");
}

#[test]
fn a_corrupt_input_no_task_made_fails_the_release_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::new();
    let mut s = open(dir.path(), &clock);
    let w = worker(&mut s, &["plan", "gguf", "quantize", "verify"], &clock);
    let (id, gguf) = gguf_release(&mut s, &w, &clock);
    let corrupt = pb::CompleteRequest {
        outcome: Some(Outcome::Failure(pb::TaskFailure {
            kind: FailureKind::Corrupt as i32,
            message: "/tmp/model/model.safetensors: corrupt".into(),
            corrupt_url: "/tmp/model/model.safetensors".into(),
        })),
        ..ok(&gguf, &w)
    };
    assert!(s.complete(corrupt, clock.now()).unwrap());
    assert_eq!(state(&s, &id), ReleaseState::Failed);
    assert!(s.release(&id).unwrap().error.as_ref().unwrap().contains("model.safetensors: corrupt"));
}

#[test]
fn a_restarted_scheduler_resumes_from_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::new();
    let (id, held, w) = {
        let mut s = open(dir.path(), &clock);
        let id = s.submit(&noop_yaml(3), "r.yaml", "").unwrap();
        let w = worker(&mut s, &["noop"], &clock);
        let leases = lease(&mut s, &w, 2, &clock);
        s.complete(ok(&leases[0], &w), clock.now()).unwrap();
        (id, leases[1].clone(), w)
    };
    let mut s = open(dir.path(), &clock);
    let rel = s.release(&id).unwrap();
    assert_eq!(rel.state, ReleaseState::Running);
    let done = rel.tasks.iter().filter(|t| t.result.is_some()).count();
    assert_eq!(done, 1);
    // The worker is unknown to the new process: it is told to register again, and its lease lives on.
    let beat = s.heartbeat(&w, std::slice::from_ref(&held.lease_id), clock.now());
    assert!(beat.unknown_worker && beat.revoked.is_empty());
    let w2 = worker(&mut s, &["noop"], &clock);
    let rest = lease(&mut s, &w2, 4, &clock);
    assert_eq!(rest.len(), 1, "only the never-leased task is ready");
    assert!(s.complete(ok(&held, &w), clock.now()).unwrap());
    assert!(s.complete(ok(&rest[0], &w2), clock.now()).unwrap());
    assert_eq!(s.effects().reports.len(), 1);
    assert!(s.release(&id).unwrap().index.contains_key(&TaskKey::REPORT));
}

/// A journal row the scheduler cannot read back (a state it never writes, a task message that does not decode) stops
/// the restart with an error naming the release and the task, instead of the task being taken as blocked or its
/// message dropped.
#[test]
fn a_corrupt_journal_row_is_refused_by_name() {
    let clock = Clock::new();
    for (column, value, says) in [
        ("state", rusqlite::types::Value::Text("leasd".into()), "unknown task state \"leasd\""),
        ("task", rusqlite::types::Value::Blob(vec![0xff, 0xff, 0xff]), "its task message does not decode"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let id = open(dir.path(), &clock).submit(&noop_yaml(2), "r.yaml", "").unwrap();
        let db = rusqlite::Connection::open(dir.path().join("journal.sqlite")).unwrap();
        let n = db
            .execute(&format!("UPDATE tasks SET {column} = ?1 WHERE release_id = ?2 AND id = 'noop/1'"), (&value, &id))
            .unwrap();
        assert_eq!(n, 1);
        drop(db);
        let journal = Journal::open(&dir.path().join("journal.sqlite")).unwrap();
        let Err(e) = Sched::open(journal, Location::local(dir.path().join("store")), cfg(), clock.now()) else {
            panic!("{column}: a corrupt row was read back");
        };
        let e = e.to_string();
        assert!(e.contains(&id) && e.contains("noop/1") && e.contains(says), "{e}");
    }
}

/// The times a release records come from the configured wall clock, like every instant the scheduler uses.
#[test]
fn a_release_records_the_configured_wall_clock() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::new();
    let journal = Journal::open(&dir.path().join("journal.sqlite")).unwrap();
    let cfg = SchedConfig { wall_clock: || 1_234_567, ..cfg() };
    let mut s = Sched::open(journal, Location::local(dir.path().join("store")), cfg, clock.now()).unwrap();
    let id = s.submit(&noop_yaml(1), "r.yaml", "").unwrap();
    assert_eq!(s.release(&id).unwrap().created_ms, 1_234_567);
}

#[test]
fn bad_specs_are_refused_with_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path(), &Clock::new());
    let e =
        s.submit("name: x\nsource: y\noutputs:\n  gguf:\n    quants: [Q8_0]\n  onnx: {opset: 17}\n", "rel.yaml", "");
    let msg = e.unwrap_err().to_string();
    assert!(msg.contains("rel.yaml") && msg.contains("onnx") && msg.contains("line 6"), "{msg}");
}

/// Ready tasks that no live worker can take are said once they have waited a lease period (not before: workers
/// register a moment after a local run starts), said again only when that changes, and the end of the wait is said
/// when a worker that can take them joins.
#[test]
fn a_release_whose_tasks_no_worker_can_take_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let mut clock = Clock::new();
    let mut s = open(dir.path(), &clock);
    let _plan_only = worker(&mut s, &["plan"], &clock);
    s.submit(&noop_yaml(2), "release.yaml", dir.path().to_str().unwrap()).unwrap();
    s.take_effects();
    s.note_unserved(clock.now());
    assert!(s.effects().events.is_empty(), "said before a lease period passed: {:?}", s.effects().events);
    clock.advance(250);
    s.note_unserved(clock.now());
    let said: Vec<String> = s.take_effects().events.into_iter().map(|e| e.message).collect();
    assert_eq!(said, ["waiting: no live worker can take 2 ready task(s): 2 of kind noop"]);
    clock.advance(100);
    s.note_unserved(clock.now());
    assert!(s.effects().events.is_empty(), "said twice: {:?}", s.effects().events);
    let w = worker(&mut s, &["noop"], &clock);
    s.note_unserved(clock.now());
    let said: Vec<String> = s.take_effects().events.into_iter().map(|e| e.message).collect();
    assert_eq!(said, ["a worker for the waiting tasks joined"]);
    assert_eq!(lease(&mut s, &w, 4, &clock).len(), 2);
}

/// mlx-lm tasks go only to workers that advertise the `mlx_lm` runtime (their helper answered its handshake), even
/// when another worker offers their kind; until one joins they wait, and the release says so.
#[test]
fn mlx_lm_tasks_go_only_to_workers_with_the_mlx_lm_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let mut clock = Clock::new();
    let mut s = open(dir.path(), &clock);
    let all = ["plan", "gguf", "quantize", "verify", "mlx", "kld", "greedy", "probe", "mlx-lm"];
    let plain = worker(&mut s, &all, &clock);
    let yaml =
        "name: t\nsource: model\noutputs:\n  gguf: {quants: []}\n  mlx: {bits: [4]}\nevaluation: {probes: p.yaml}\n";
    s.submit(yaml, "r.yaml", "/tmp").unwrap();
    let plan = lease(&mut s, &plain, 1, &clock);
    let done = pb::CompleteRequest {
        outcome: Some(Outcome::Result(pb::TaskResult { kind: Some(task_result::Kind::Plan(plan_result())) })),
        ..ok(&plan[0], &plain)
    };
    assert!(s.complete(done, clock.now()).unwrap());
    // The plain worker takes everything ready but the mlx-lm probe of the bf16 weights.
    let got: Vec<String> = lease(&mut s, &plain, 16, &clock).into_iter().map(|l| l.task_id).collect();
    assert!(!got.is_empty() && got.iter().all(|id| !id.starts_with("mlx-lm/")), "{got:?}");
    s.note_unserved(clock.now());
    clock.advance(250);
    s.take_effects();
    s.note_unserved(clock.now());
    let said: Vec<String> = s.take_effects().events.into_iter().map(|e| e.message).collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].contains("1 of kind mlx-lm need the mlx_lm runtime") && said[0].contains("QUANTFARM_PYTHON"),
        "{said:?}"
    );
    let info = pb::WorkerInfo {
        name: "mac".into(),
        slots: 4,
        task_kinds: vec!["mlx-lm".into()],
        runtimes: vec!["mlx_lm".into()],
        ..Default::default()
    };
    let mlx = s.register(info, clock.now());
    let got: Vec<String> = lease(&mut s, &mlx, 4, &clock).into_iter().map(|l| l.task_id).collect();
    assert_eq!(got, ["mlx-lm/probe/BF16"]);
}

fn cached_worker(s: &mut Sched, name: &str, cache_bytes: u64, clock: &Clock) -> String {
    let info = pb::WorkerInfo {
        name: name.into(),
        slots: 1,
        task_kinds: ["plan", "gguf", "quantize", "verify"].map(String::from).to_vec(),
        cache_bytes,
        ..Default::default()
    };
    s.register(info, clock.now())
}

/// Leases follow the data: a task whose input file a worker's cache holds goes to that worker, and another worker
/// asking meanwhile is told when the bounded wait ends; past it the task goes to whoever asks. Tasks that read no
/// farm-made file (the plan, the conversions) never wait, and a worker without a cache is no holder.
#[test]
fn leases_follow_the_data_within_a_bounded_wait() {
    let dir = tempfile::tempdir().unwrap();
    let mut clock = Clock::new();
    let journal = Journal::open(&dir.path().join("journal.sqlite")).unwrap();
    // 1,000 bytes/s: fetching the 2,048-byte file would take about 2 s.
    let slow = SchedConfig { fetch_rate: 1000, ..cfg() };
    let mut s = Sched::open(journal, Location::local(dir.path().join("store")), slow.clone(), clock.now()).unwrap();
    let a = cached_worker(&mut s, "a", 1 << 30, &clock);
    let b = cached_worker(&mut s, "b", 1 << 30, &clock);
    s.submit("name: t\nsource: model\noutputs:\n  gguf: {quants: [Q8_0, Q4_0]}\n", "r.yaml", "/tmp").unwrap();
    // The plan reads only the source: b takes it though it holds nothing.
    let plan = lease(&mut s, &b, 1, &clock);
    assert_eq!(plan[0].task_id, "plan");
    let done = pb::CompleteRequest {
        outcome: Some(Outcome::Result(pb::TaskResult { kind: Some(task_result::Kind::Plan(plan_result())) })),
        ..ok(&plan[0], &b)
    };
    assert!(s.complete(done, clock.now()).unwrap());
    let gguf = lease(&mut s, &b, 1, &clock);
    assert_eq!(gguf[0].task_id, "gguf/0");
    assert!(gguf[0].task.as_ref().unwrap().inputs.is_empty(), "a conversion reads no farm-made file");
    assert!(s.complete(made(&gguf[0], &b, "aaaa"), clock.now()).unwrap());
    // a's cache holds the BF16 file (it fetched it for another release, say); b's holds nothing.
    s.holdings(&a, &["aaaa".to_string()]);
    s.holdings(&b, &[]);
    let wait = s.lease(&b, 1, clock.now()).unwrap();
    assert!(wait.leases.is_empty(), "b took {:?} while a holds its input", wait.leases[0].task_id);
    let until = wait.next_wake.expect("b is told when the wait ends");
    assert!(until > clock.now() && until <= clock.now() + Duration::from_secs(60), "{until:?}");
    // a gets them, with the input's digest and size.
    let first = lease(&mut s, &a, 1, &clock);
    let inputs = &first[0].task.as_ref().unwrap().inputs;
    assert_eq!(inputs.len(), 1, "{inputs:?}");
    assert_eq!((inputs[0].sha256.as_str(), inputs[0].bytes), ("aaaa", 2048));
    assert_eq!(inputs[0].url, output(&gguf[0]));
    // Past the bound, b takes the next one and fetches.
    clock.0 = until;
    let late = lease(&mut s, &b, 1, &clock);
    assert_eq!(late.len(), 1, "the wait is bounded");
    assert_ne!(late[0].task_id, first[0].task_id);
    // b is fetching that file now: it holds it too, and the last task goes to whichever asks first.
    let last = lease(&mut s, &b, 1, &clock);
    assert_eq!(last.len(), 1);

    // A worker without a cache is never a holder: nothing waits for it.
    let dir2 = tempfile::tempdir().unwrap();
    let journal = Journal::open(&dir2.path().join("journal.sqlite")).unwrap();
    let mut s = Sched::open(journal, Location::local(dir2.path().join("store")), slow, clock.now()).unwrap();
    let c = cached_worker(&mut s, "c", 0, &clock);
    let d = cached_worker(&mut s, "d", 1 << 30, &clock);
    s.submit("name: t\nsource: model\noutputs:\n  gguf: {quants: [Q8_0, Q4_0]}\n", "r.yaml", "/tmp").unwrap();
    let plan = lease(&mut s, &c, 1, &clock);
    let done = pb::CompleteRequest {
        outcome: Some(Outcome::Result(pb::TaskResult { kind: Some(task_result::Kind::Plan(plan_result())) })),
        ..ok(&plan[0], &c)
    };
    assert!(s.complete(done, clock.now()).unwrap());
    let gguf = lease(&mut s, &c, 1, &clock);
    assert!(s.complete(made(&gguf[0], &c, "aaaa"), clock.now()).unwrap());
    assert_eq!(lease(&mut s, &c, 1, &clock).len(), 1);
    assert_eq!(lease(&mut s, &d, 1, &clock).len(), 1, "d waited for c, which keeps nothing");
}

/// A finished task's made-up result, by the message's kind: a file at the task's output, a verification that
/// matched, the evaluation text's plan (14 chunks, one per task), and per chunk group KL divergences of about
/// `kld(level)` nats per token.
fn result_for(l: &pb::Lease, kld: &dyn Fn(&str) -> f64) -> pb::TaskResult {
    use pb::task::Kind as K;
    let artifact = |url: &str| {
        let a = pb::Artifact { url: url.into(), sha256: "ab".repeat(32), bytes: 2048, types: vec![] };
        task_result::Kind::Artifact(pb::ArtifactResult { artifact: Some(a), cache_hit: false, experts: vec![] })
    };
    let kind = match l.task.as_ref().and_then(|t| t.kind.as_ref()) {
        Some(K::Plan(_)) => task_result::Kind::Plan(plan_result()),
        Some(K::Gguf(g)) => artifact(&g.output),
        Some(K::Quantize(q)) => artifact(&q.output),
        Some(K::KldBase(b)) => artifact(&b.output),
        Some(K::Verify(_)) => task_result::Kind::Verify(pb::VerifyResult { identical: true, ..Default::default() }),
        Some(K::KldPlan(_)) => task_result::Kind::KldPlan(pb::KldPlanResult {
            n_chunks: 14,
            n_seq: 1,
            n_vocab: 16,
            text_sha256: "cd".repeat(32),
            tokens_sha256: "ef".repeat(32),
            bos: Some(1),
        }),
        Some(K::Kld(k)) => {
            let level = l.task_id.split('/').nth(1).unwrap_or_default();
            // A little spread between chunks: ±5 % of the level's figure.
            let wobble = 1.0 + 0.05 * (f64::from(k.first_chunk % 3) - 1.0);
            let chunk = pb::KldChunkStats {
                chunk: k.first_chunk,
                count: 255,
                sum_kld: 255.0 * kld(level) * wobble,
                ..Default::default()
            };
            task_result::Kind::Kld(pb::KldResult { chunks: vec![chunk], ..Default::default() })
        }
        Some(K::SensitivityLookup(_)) => task_result::Kind::SensitivityLookup(pb::SensitivityLookupResult::default()),
        Some(K::SensitivityWrite(w)) => artifact(&w.output),
        Some(K::SensitivityProbe(p)) => {
            // A made-up cost by the type the probe's group is quantized to.
            let rule = p.quantize.as_ref().map(|q| q.tensor_types[0].clone()).unwrap_or_default();
            let ty = rule.rsplit('=').next().unwrap_or_default();
            let mean_kld = match ty {
                "Q4_0" => 0.05,
                "IQ4_NL" => 0.04,
                "Q4_1" => 0.02,
                "Q5_0" => 0.01,
                "Q5_1" => 0.008,
                _ => 0.001,
            };
            task_result::Kind::SensitivityProbe(pb::SensitivityProbeResult {
                chunks: 4,
                tokens: 1020,
                mean_kld,
                half_width: mean_kld / 20.0,
                model_bytes: 1024,
                seconds: 0.5,
                ..Default::default()
            })
        }
        other => panic!("{}: no made-up result for {other:?}", l.task_id),
    };
    pb::TaskResult { kind: Some(kind) }
}

/// A searched rung in the task graph: after the plan, the search text's plan and the lookup; with nothing stored,
/// the text's base logits and one probe per distinct candidate type of each tensor group, which start only once the
/// base logits are made (they were grown by the lookup's result, which they also wait for: that finished task must
/// not count as one they wait for); the searched rung's quantize tasks after `search/write`, with the recipe of the
/// least cost within the budget. A second release of the same reference finds the sensitivities stored: no probe
/// and no base logits, the same recipe.
#[test]
fn a_searched_rung_waits_for_its_probes_and_a_second_release_reuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::new();
    let mut s = open(dir.path(), &clock);
    let w = worker(&mut s, &["plan", "gguf", "quantize", "verify", "kld"], &clock);
    // One tensor of 64 × 8 BF16 values (512 elements): 5 bits per weight is a budget of 320 bytes, which Q4_0,
    // IQ4_NL (288) and Q4_1 (320) fit; Q4_1 costs least of them.
    let yaml = "name: t\nsource: model\noutputs:\n  gguf:\n    quants: [Q8_0, {name: FIT, target_bpw: 5}]\n    \
                search: {text: s.txt}\n";
    let run = |s: &mut Sched, found: Option<String>| -> (Vec<Vec<String>>, Vec<pb::Lease>) {
        s.submit(yaml, "r.yaml", "/tmp").unwrap();
        let mut batches = Vec::new();
        let mut all = Vec::new();
        for _ in 0..50 {
            let leases = lease(s, &w, 64, &clock);
            if leases.is_empty() {
                break;
            }
            batches.push(leases.iter().map(|l| l.task_id.clone()).collect());
            for l in &leases {
                let mut r = result_for(l, &|_| 0.01);
                if let (Some(json), Some(task_result::Kind::SensitivityLookup(found))) = (&found, r.kind.as_mut()) {
                    *found = pb::SensitivityLookupResult { found: true, json: json.clone(), sha256: "ab".repeat(32) };
                }
                let done = pb::CompleteRequest { outcome: Some(Outcome::Result(r)), ..ok(l, &w) };
                assert!(s.complete(done, clock.now()).unwrap(), "{}", l.task_id);
            }
            all.extend(leases);
        }
        (batches, all)
    };
    let (batches, leases) = run(&mut s, None);
    let batch_of = |prefix: &str| -> Vec<usize> {
        batches.iter().enumerate().filter(|(_, b)| b.iter().any(|t| t.starts_with(prefix))).map(|(i, _)| i).collect()
    };
    let (bases, probes) = (batch_of("search/base/"), batch_of("search/probe/"));
    let n_probes = batches.iter().flatten().filter(|t| t.starts_with("search/probe/")).count();
    assert_eq!(n_probes, 6, "Q4_0, Q5_0, Q5_1, Q8_0, Q4_1, IQ4_NL on rows of 64: {batches:?}");
    assert!(
        !bases.is_empty() && probes.iter().all(|p| bases.iter().all(|b| p > b)),
        "probes after the base logits: {batches:?}"
    );
    let (write, fit) = (batch_of("search/write"), batch_of("quantize/FIT/"));
    assert!(fit.iter().all(|f| write.iter().all(|w| f > w)), "the searched rung after its sensitivities: {batches:?}");
    let task = |id: &str| leases.iter().find(|l| l.task_id == id).and_then(|l| l.task.clone()).and_then(|t| t.kind);
    let Some(pb::task::Kind::Quantize(q)) = task("quantize/FIT/0") else { panic!("quantize/FIT/0: {batches:?}") };
    assert_eq!(
        (q.file_type.as_str(), q.tensor_types.clone()),
        ("Q8_0", vec!["^token_embd\\.weight$=Q4_1".to_string()])
    );
    let Some(pb::task::Kind::SensitivityWrite(written)) = task("search/write") else { panic!("search/write") };
    // Again, with the sensitivities stored.
    let (again, leases2) = run(&mut s, Some(written.json.clone()));
    let measured: Vec<&String> =
        again.iter().flatten().filter(|t| t.starts_with("search/probe/") || t.starts_with("search/base/")).collect();
    assert!(measured.is_empty(), "nothing measured again: {measured:?}");
    let q2 = leases2.iter().find(|l| l.task_id == "quantize/FIT/0").and_then(|l| l.task.clone()).and_then(|t| t.kind);
    let Some(pb::task::Kind::Quantize(q2)) = q2 else { panic!("quantize/FIT/0 again: {again:?}") };
    assert_eq!(q2.tensor_types, q.tensor_types, "the same recipe from the stored sensitivities");
}

/// `evaluation.stop` in the task graph: each rung's chunk groups enter one at a time after the first look's, and a
/// rung the rule decided gets no more; base logits are made only for the groups some rung reached. With Q8_0 at
/// half its default limit (0.01) and Q4_0 at 0.75 of its limit (0.4), Q8_0 stops at the first look (4 groups) and
/// Q4_0 two groups later, whatever the order; the report is then ready.
#[test]
fn a_stopped_rung_gets_no_more_chunk_groups() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::new();
    let mut s = open(dir.path(), &clock);
    let all = ["plan", "gguf", "quantize", "verify", "kld"];
    let w = worker(&mut s, &all, &clock);
    let yaml = "name: t\nsource: model\noutputs:\n  gguf: {quants: [Q8_0, Q4_0]}\n\
                evaluation: {text: t.txt, ctx: 512, batch: 512, stop: {confidence: 0.99}}\n";
    let id = s.submit(yaml, "r.yaml", "/tmp").unwrap();
    let kld = |level: &str| if level == "Q8_0" { 0.005 } else { 0.3 };
    let mut seen: Vec<String> = Vec::new();
    for _ in 0..100 {
        let leases = lease(&mut s, &w, 64, &clock);
        if leases.is_empty() {
            break;
        }
        for l in leases {
            seen.push(l.task_id.clone());
            let done = pb::CompleteRequest { outcome: Some(Outcome::Result(result_for(&l, &kld))), ..ok(&l, &w) };
            assert!(s.complete(done, clock.now()).unwrap(), "{}", l.task_id);
        }
    }
    let groups = |prefix: &str| -> Vec<u32> {
        let mut g: Vec<u32> = seen.iter().filter_map(|t| t.strip_prefix(prefix)).map(|g| g.parse().unwrap()).collect();
        g.sort_unstable();
        g
    };
    let (q8, q4, base) = (groups("kld/Q8_0/"), groups("kld/Q4_0/"), groups("kld-base/"));
    assert_eq!((q8.len(), q4.len()), (4, 6), "{seen:?}");
    assert!(q8.iter().all(|g| q4.contains(g)), "one order for every rung: {q8:?} {q4:?}");
    assert_eq!(base, q4, "base logits for the groups some rung reached, once each");
    let reports = s.take_effects().reports;
    assert!(reports.iter().any(|r| r.release_id == id), "the report is next: {seen:?}");
}
