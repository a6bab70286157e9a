//! The scheduler's state machine against a real SQLite journal: capability matching, retries with backoff, the
//! attempt limit, input failures, lease expiry, duplicate completions, and resuming after a restart.

use std::time::Duration;

use quantfarm_coordinator::graph::TaskKey;
use quantfarm_coordinator::journal::Journal;
use quantfarm_coordinator::sched::{Sched, SchedConfig};
use quantfarm_proto::{self as pb, complete_request::Outcome, task_result, FailureKind, ReleaseState};
use quantfarm_tensors::Location;

fn noop_yaml(n: u32) -> String {
    format!("name: bench\nsource: unused\noutputs:\n  noop: {{tasks: {n}, sleep_ms: 0}}\n")
}

fn cfg() -> SchedConfig {
    SchedConfig {
        lease: Duration::from_millis(200),
        heartbeat: Duration::from_millis(50),
        max_attempts: 3,
        backoff: Duration::from_millis(20),
    }
}

fn open(dir: &std::path::Path) -> Sched {
    let journal = Journal::open(&dir.join("journal.sqlite")).unwrap();
    Sched::open(journal, Location::local(dir.join("store")), cfg()).unwrap()
}

fn worker(s: &mut Sched, kinds: &[&str]) -> String {
    s.register(pb::WorkerInfo {
        name: "w".into(),
        slots: 4,
        task_kinds: kinds.iter().map(|k| k.to_string()).collect(),
        ..Default::default()
    })
}

fn ok(l: &pb::Lease, worker: &str) -> pb::CompleteRequest {
    pb::CompleteRequest {
        worker_id: worker.into(),
        lease_id: l.lease_id.clone(),
        release_id: l.release_id.clone(),
        task_id: l.task_id.clone(),
        duration_ms: 1,
        outcome: Some(Outcome::Result(pb::TaskResult { kind: Some(task_result::Kind::Noop(pb::NoopResult {})) })),
    }
}

fn fail(l: &pb::Lease, worker: &str, kind: FailureKind, msg: &str) -> pb::CompleteRequest {
    pb::CompleteRequest {
        outcome: Some(Outcome::Failure(pb::TaskFailure { kind: kind as i32, message: msg.into() })),
        ..ok(l, worker)
    }
}

fn state(s: &Sched, id: &str) -> ReleaseState {
    s.release(id).unwrap().state
}

#[test]
fn leases_by_capability_and_finishes_through_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let id = s.submit(&noop_yaml(3), "r.yaml", "").unwrap();
    let planner = worker(&mut s, &["plan"]);
    assert!(s.lease(&planner, 4).unwrap().0.is_empty(), "a worker without the noop kind got a noop task");
    let w = worker(&mut s, &["noop"]);
    let (leases, _) = s.lease(&w, 2).unwrap();
    assert_eq!(leases.len(), 2, "leases up to the free slots");
    let (more, _) = s.lease(&w, 4).unwrap();
    assert_eq!(more.len(), 1);
    for l in leases.iter().chain(&more) {
        assert!(s.complete(ok(l, &w)).unwrap());
    }
    assert_eq!(s.reports.len(), 1, "the report task is the coordinator's own, due now");
    assert_eq!(state(&s, &id), ReleaseState::Running);
    s.report_done(&id, Ok(("{}".into(), "x/report.json".into(), true))).unwrap();
    assert_eq!(state(&s, &id), ReleaseState::Released);
}

#[test]
fn transient_failures_back_off_then_fail_the_release_after_the_attempt_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let id = s.submit(&noop_yaml(1), "r.yaml", "").unwrap();
    let w = worker(&mut s, &["noop"]);
    for attempt in 1..=3 {
        let (leases, wake) = s.lease(&w, 1).unwrap();
        if leases.is_empty() {
            let wake = wake.expect("a backed-off task says when it is ready");
            std::thread::sleep(wake.saturating_duration_since(std::time::Instant::now()) + Duration::from_millis(2));
        }
        let (leases, _) = if leases.is_empty() { s.lease(&w, 1).unwrap() } else { (leases, None) };
        assert_eq!(leases.len(), 1);
        assert_eq!(leases[0].attempt, attempt);
        s.complete(fail(&leases[0], &w, FailureKind::Transient, &format!("disk full #{attempt}"))).unwrap();
        if attempt < 3 {
            // Backed off: not leasable at once.
            assert!(s.lease(&w, 1).unwrap().0.is_empty());
        }
    }
    assert_eq!(state(&s, &id), ReleaseState::Failed);
    let err = s.release(&id).unwrap().error.clone().unwrap();
    assert!(err.contains("noop/0") && err.contains("3 attempts") && err.contains("disk full #3"), "{err}");
}

#[test]
fn an_input_failure_fails_the_release_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let id = s.submit(&noop_yaml(2), "r.yaml", "").unwrap();
    let w = worker(&mut s, &["noop"]);
    let (leases, _) = s.lease(&w, 1).unwrap();
    s.complete(fail(&leases[0], &w, FailureKind::Input, "model.safetensors: tensor x: bad shape")).unwrap();
    assert_eq!(state(&s, &id), ReleaseState::Failed);
    assert!(s.release(&id).unwrap().error.as_ref().unwrap().contains("bad shape"));
    assert!(s.lease(&w, 4).unwrap().0.is_empty(), "a failed release leases nothing");
}

#[test]
fn expired_leases_are_retried_and_a_late_result_is_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let id = s.submit(&noop_yaml(1), "r.yaml", "").unwrap();
    let w1 = worker(&mut s, &["noop"]);
    let w2 = worker(&mut s, &["noop"]);
    let (first, _) = s.lease(&w1, 1).unwrap();
    // A heartbeat keeps it alive…
    std::thread::sleep(Duration::from_millis(120));
    let (revoked, _) = s.heartbeat(&w1, &[first[0].lease_id.clone()]);
    assert!(revoked.is_empty());
    std::thread::sleep(Duration::from_millis(120));
    s.expire().unwrap();
    assert!(s.lease(&w2, 1).unwrap().0.is_empty(), "still leased after a heartbeat");
    // …silence expires it.
    std::thread::sleep(Duration::from_millis(250));
    s.expire().unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let (second, _) = s.lease(&w2, 1).unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].attempt, 2);
    let (revoked, _) = s.heartbeat(&w1, &[first[0].lease_id.clone()]);
    assert_eq!(revoked, vec![first[0].lease_id.clone()], "the old lease is revoked");
    // The first worker finishes anyway: accepted once (outputs are content-addressed), the second is not needed.
    assert!(s.complete(ok(&first[0], &w1)).unwrap());
    assert!(!s.complete(ok(&second[0], &w2)).unwrap());
    assert_eq!(s.reports.len(), 1);
    let _ = id;
}

#[test]
fn a_restarted_scheduler_resumes_from_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let (id, held, w) = {
        let mut s = open(dir.path());
        let id = s.submit(&noop_yaml(3), "r.yaml", "").unwrap();
        let w = worker(&mut s, &["noop"]);
        let (leases, _) = s.lease(&w, 2).unwrap();
        s.complete(ok(&leases[0], &w)).unwrap();
        (id, leases[1].clone(), w)
    };
    let mut s = open(dir.path());
    let rel = s.release(&id).unwrap();
    assert_eq!(rel.state, ReleaseState::Running);
    let done = rel.tasks.iter().filter(|t| t.result.is_some()).count();
    assert_eq!(done, 1);
    // The worker is unknown to the new process: it is told to register again, and its lease lives on.
    let (revoked, reregister) = s.heartbeat(&w, std::slice::from_ref(&held.lease_id));
    assert!(reregister && revoked.is_empty());
    let w2 = worker(&mut s, &["noop"]);
    let (rest, _) = s.lease(&w2, 4).unwrap();
    assert_eq!(rest.len(), 1, "only the never-leased task is ready");
    assert!(s.complete(ok(&held, &w)).unwrap());
    assert!(s.complete(ok(&rest[0], &w2)).unwrap());
    assert_eq!(s.reports.len(), 1);
    assert!(s.release(&id).unwrap().index.contains_key(&TaskKey::Report));
}

#[test]
fn bad_specs_are_refused_with_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let e =
        s.submit("name: x\nsource: y\noutputs:\n  gguf:\n    quants: [Q8_0]\n  onnx: {opset: 17}\n", "rel.yaml", "");
    let msg = e.unwrap_err().to_string();
    assert!(msg.contains("rel.yaml") && msg.contains("onnx") && msg.contains("line 6"), "{msg}");
}
