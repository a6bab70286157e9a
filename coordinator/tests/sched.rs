//! The scheduler's state machine against a real SQLite journal: capability matching, retries with backoff, the
//! attempt limit, input failures, lease expiry (a late outcome is discarded), retries on another worker, corrupt
//! inputs made again, outputs that must be reproducible, and resuming after a restart.

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
fn expired_leases_are_retried_and_a_late_result_is_discarded() {
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
    // The first worker finishes anyway: its outcome is discarded (a failure as much as a result), the task stays
    // with the second worker, and only the second worker's result ends it.
    assert!(!s.complete(ok(&first[0], &w1)).unwrap(), "a late result was taken");
    assert!(!s.complete(fail(&first[0], &w1, FailureKind::Input, "late")).unwrap(), "a late failure was taken");
    assert_eq!(state(&s, &id), ReleaseState::Running);
    let t = &s.release(&id).unwrap().tasks[0];
    assert!(t.result.is_none() && t.state.name() == "leased", "{:?}", t.state);
    assert!(s.events.iter().any(|e| e.message.contains("discarded a late outcome")), "no event says so");
    assert!(s.complete(ok(&second[0], &w2)).unwrap());
    assert_eq!(s.reports.len(), 1);
}

#[test]
fn a_task_that_failed_on_a_worker_is_retried_on_another_while_one_is_alive() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let _id = s.submit(&noop_yaml(1), "r.yaml", "").unwrap();
    let w1 = worker(&mut s, &["noop"]);
    let w2 = worker(&mut s, &["noop"]);
    let (l, _) = s.lease(&w1, 1).unwrap();
    s.complete(fail(&l[0], &w1, FailureKind::Transient, "scratch: No space left on device")).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    assert!(s.lease(&w1, 1).unwrap().0.is_empty(), "the retry went back to the worker it failed on");
    let (l, _) = s.lease(&w2, 1).unwrap();
    assert_eq!(l.len(), 1, "the other worker did not get the retry");
    s.complete(fail(&l[0], &w2, FailureKind::Transient, "again")).unwrap();
    // Both failed: with no other worker, the first one may try again.
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(s.lease(&w1, 1).unwrap().0.len(), 1);
}

/// A release `plan → gguf/0 → {quantize/Q8_0/0, verify/gguf/0}` driven by hand: the plan's result is made up
/// (one tensor, one file), so each task can be completed with a chosen digest.
fn gguf_release(s: &mut Sched, w: &str) -> (String, pb::Lease) {
    let id = s.submit("name: t\nsource: model\noutputs:\n  gguf: {quants: [Q8_0]}\n", "r.yaml", "/tmp").unwrap();
    let (plan, _) = s.lease(w, 1).unwrap();
    let result = pb::PlanResult {
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
        }],
        shards: vec![pb::ShardRange { start: 0, end: 1 }],
        imatrix_sha256: String::new(),
    };
    let done = pb::CompleteRequest {
        outcome: Some(Outcome::Result(pb::TaskResult { kind: Some(task_result::Kind::Plan(result)) })),
        ..ok(&plan[0], w)
    };
    assert!(s.complete(done).unwrap());
    let (gguf, _) = s.lease(w, 1).unwrap();
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
    let r = pb::ArtifactResult { artifact: Some(artifact), cache_hit: false };
    pb::CompleteRequest {
        outcome: Some(Outcome::Result(pb::TaskResult { kind: Some(task_result::Kind::Artifact(r)) })),
        ..ok(l, w)
    }
}

#[test]
fn a_corrupt_input_has_its_producer_make_it_again_then_its_reader_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let w = worker(&mut s, &["plan", "gguf", "quantize", "verify"]);
    let (id, gguf) = gguf_release(&mut s, &w);
    assert_eq!(gguf.task.as_ref().unwrap().known_output_sha256, "", "never made: nothing is known");
    assert!(s.complete(made(&gguf, &w, "aaaa")).unwrap());
    // A worker that only verifies takes the verify; the quantize has not started.
    let wv = worker(&mut s, &["verify"]);
    let (ready, _) = s.lease(&wv, 1).unwrap();
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
    assert!(s.complete(corrupt).unwrap());
    assert_eq!(state(&s, &id), ReleaseState::Running, "{:?}", s.release(&id).unwrap().error);
    // The producer is leased again, with the digest it recorded; its readers (the verify, and the quantize that
    // had not started) wait for it.
    let (again, _) = s.lease(&w, 4).unwrap();
    let ids: Vec<&str> = again.iter().map(|l| l.task_id.as_str()).collect();
    assert_eq!(ids, ["gguf/0"], "only the producer runs now");
    assert_eq!(again[0].task.as_ref().unwrap().known_output_sha256, "aaaa");
    // Made again with other bytes: not reproducible, refused, retried.
    assert!(s.complete(made(&again[0], &w, "bbbb")).unwrap());
    let err = s.release(&id).unwrap().tasks.iter().find(|t| t.id == "gguf/0").unwrap().error.clone().unwrap();
    assert!(err.contains("not reproducible") && err.contains("aaaa") && err.contains("bbbb"), "{err}");
    std::thread::sleep(Duration::from_millis(60));
    let (third, _) = s.lease(&w, 4).unwrap();
    assert_eq!(third.len(), 1);
    assert!(s.complete(made(&third[0], &w, "aaaa")).unwrap());
    let (readers, _) = s.lease(&w, 4).unwrap();
    let mut ids: Vec<(&str, u32)> = readers.iter().map(|l| (l.task_id.as_str(), l.attempt)).collect();
    ids.sort();
    assert_eq!(ids, [("quantize/Q8_0/0", 1), ("verify/gguf/0", 1)], "the corrupt input used up the verify's try");
}

#[test]
fn a_corrupt_input_no_task_made_fails_the_release_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let w = worker(&mut s, &["plan", "gguf", "quantize", "verify"]);
    let (id, gguf) = gguf_release(&mut s, &w);
    let corrupt = pb::CompleteRequest {
        outcome: Some(Outcome::Failure(pb::TaskFailure {
            kind: FailureKind::Corrupt as i32,
            message: "/tmp/model/model.safetensors: corrupt".into(),
            corrupt_url: "/tmp/model/model.safetensors".into(),
        })),
        ..ok(&gguf, &w)
    };
    assert!(s.complete(corrupt).unwrap());
    assert_eq!(state(&s, &id), ReleaseState::Failed);
    assert!(s.release(&id).unwrap().error.as_ref().unwrap().contains("model.safetensors: corrupt"));
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
