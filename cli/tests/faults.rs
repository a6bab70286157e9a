//! The fault suite: the farm as users run it (a real S3 server, `quantfarm coordinator` and `quantfarm worker`
//! processes) under the failures of a real farm, each compared with an undisturbed run of the same releases:
//!
//! - workers killed (SIGKILL) at random points over 8 releases (20 under `scripts/test --long`), and the
//!   coordinator killed and restarted among them;
//! - a worker that stops heartbeating but goes on and reports late (its outcome is discarded);
//! - the S3 server killed and restarted during a multipart upload;
//! - a worker whose scratch disk is full (a tmpfs of 64 KiB in its own mount namespace);
//! - artifacts corrupted in the store (detected by the recorded sha256, made again).
//!
//! For each: releases complete, artifacts are byte-identical to the undisturbed run, nothing partial is ever listed
//! in the bucket, no task is lost or completed twice with different outputs, and no secret (the farm token, the S3
//! keys) appears in any log, report, CLI output or stored object.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;
use quantfarm_e2e::s3::{S3Server, ACCESS_KEY, SECRET_KEY};
use serde_json::Value;

/// How many releases the chaos run makes: 8, or 20 with QUANTFARM_LONG set (`scripts/test --long`). Either way at
/// least 10 workers are killed, 5 of them mid-task, and the coordinator is restarted twice before the last release
/// is submitted; the long run spreads more faults over more releases.
fn chaos_releases() -> usize {
    if std::env::var_os("QUANTFARM_LONG").is_some() {
        20
    } else {
        8
    }
}

/// The README's example release (the synthetic tiny Llama, GGUF in two split files, Q8_0 and Q4_0, every level
/// measured: KLD, greedy agreement, probes) named `NAME` with artifact prefix `PREFIX`, in `dir` beside the files
/// its evaluation reads.
fn tiny_release(dir: &Path, name: &str, prefix: &str) -> PathBuf {
    let examples = quantfarm_e2e::repo_root().join("examples");
    std::fs::create_dir_all(dir.join("texts")).unwrap();
    for f in ["texts/mill.txt", "prompts-20.json", "probes-tiny.yaml"] {
        std::fs::copy(examples.join(f), dir.join(f)).unwrap();
    }
    let yaml = std::fs::read_to_string(examples.join("tiny-llama.yaml")).unwrap();
    assert!(yaml.contains("name: tiny-llama\n") && yaml.contains("prefix: TinyLlama\n"), "the example changed");
    let yaml = yaml
        .replace("name: tiny-llama\n", &format!("name: {name}\n"))
        .replace("prefix: TinyLlama\n", &format!("prefix: {prefix}\n"));
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    path
}

/// Release `i` of the fault run: the tiny Llama in two GGUF split files, Q8_0 and Q4_0, each verified and measured
/// (KL divergence on 4 chunks of 128 tokens in 2 decode groups; no probes, so the verdict is `gate_failed`, the same
/// in every run): 20 tasks and the report, of every farm kind but the evaluation's greedy and probe runs.
fn fault_release(dir: &Path, i: usize) -> PathBuf {
    std::fs::create_dir_all(dir.join("texts")).unwrap();
    let text = quantfarm_e2e::repo_root().join("examples/texts/mill.txt");
    std::fs::copy(text, dir.join("texts/mill.txt")).unwrap();
    let yaml = format!(
        "name: chaos-{i:02}\nsource: synthetic:tiny-llama\noutputs:\n  gguf:\n    prefix: Chaos{i:02}\n    split: \
         {{max_tensors: 12}}\n    quants: [Q8_0, Q4_0]\nevaluation:\n  text: texts/mill.txt\n  ctx: 128\n  batch: 256\n  \
         chunks: 4\n"
    );
    let path = dir.join(format!("chaos-{i:02}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    path
}

/// A small deterministic generator (xorshift64*), so a failing run can be replayed with its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo))
    }
}

/// What must not change between an undisturbed and a disturbed run of a release: its artifacts (files, sha256,
/// bytes, types and every measurement), its gates and its verdict. URLs are compared by file name: the folders are
/// content-addressed over the source's identity in its store, which differs between stores.
fn fingerprint(report: &Value) -> Value {
    fn names(v: &mut Value) {
        match v {
            Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    match x {
                        Value::String(u) if k == "url" => *u = u.rsplit('/').next().unwrap_or_default().to_string(),
                        _ => names(x),
                    }
                }
            }
            Value::Array(a) => a.iter_mut().for_each(names),
            _ => {}
        }
    }
    let mut keep = serde_json::json!({
        "artifacts": report["artifacts"],
        "gates": report["gates"],
        "verdict": report["verdict"],
    });
    names(&mut keep);
    keep
}

/// Asserts two fingerprints are equal, naming only the paths where they differ.
fn assert_same(got: &Value, want: &Value, what: &str) {
    fn diff(a: &Value, b: &Value, path: String, out: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                for k in x.keys().chain(y.keys()).collect::<BTreeSet<_>>() {
                    diff(
                        &x.get(k).cloned().unwrap_or(Value::Null),
                        &y.get(k).cloned().unwrap_or(Value::Null),
                        format!("{path}.{k}"),
                        out,
                    );
                }
            }
            (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
                for (i, (p, q)) in x.iter().zip(y).enumerate() {
                    diff(p, q, format!("{path}[{i}]"), out);
                }
            }
            _ if a != b => out.push(format!("{path}: {a} != {b}")),
            _ => {}
        }
    }
    let mut out = Vec::new();
    diff(got, want, String::new(), &mut out);
    assert!(out.is_empty(), "{what}: differs from the undisturbed run:\n{}", out.join("\n"));
}

/// The ids of a report's tasks.
fn task_ids(report: &Value) -> BTreeSet<String> {
    report["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_string()).collect()
}

/// Reads a release's signed report from the bucket.
fn report_of(rt: &tokio::runtime::Runtime, s3: &S3Server, summary: &Value) -> Value {
    let url = summary["report_url"].as_str().unwrap_or_else(|| panic!("no report: {summary:#}"));
    serde_json::from_slice(&read_object(rt, url, s3)).unwrap()
}

/// `submit`, then `watch --json`: the release's summary.
fn submit_and_watch(farm: &Farm, spec: &Path, outputs: &mut Vec<Output>) -> Value {
    let out = farm.cli(&["submit", spec.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "submit: {}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    outputs.push(out);
    watch(farm, &id, outputs)
}

fn watch(farm: &Farm, id: &str, outputs: &mut Vec<Output>) -> Value {
    let out = farm.cli(&["watch", id, "--json"]);
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "watch {id}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let s = summary(&out);
    outputs.push(out);
    s
}

/// The tasks a worker's log shows started and not (yet) finished.
fn running_tasks(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let task = |l: &str| l.split("task=").nth(1).and_then(|t| t.split_whitespace().next()).map(str::to_string);
    let mut open: Vec<String> = Vec::new();
    for l in text.lines() {
        if l.contains(" started") {
            open.extend(task(l));
        } else if l.contains("done in") || l.contains("failed:") || l.contains("stopping") {
            if let Some(t) = task(l) {
                open.retain(|o| *o != t);
            }
        }
    }
    open
}

/// Asserts that no secret appears in any file under `dirs` (logs, journals, specs, scratch) or in any object of
/// the S3 server's buckets under `s3_root` (its own bookkeeping, the dot-files of s3s-fs that record each upload's
/// owner key, is the server's state, not an output), or in any captured CLI output. Returns the files searched.
fn assert_no_secrets(dirs: &[&Path], s3_root: &Path, outputs: &[Output], secrets: &[&str]) -> usize {
    fn walk(dir: &Path, skip_dot: bool, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if skip_dot && e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            if p.is_dir() {
                walk(&p, skip_dot, out);
            } else if p.is_file() {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    for d in dirs {
        walk(d, false, &mut files);
    }
    walk(s3_root, true, &mut files);
    let contains = |hay: &[u8], needle: &str| hay.windows(needle.len()).any(|w| w == needle.as_bytes());
    for f in &files {
        let bytes = std::fs::read(f).unwrap_or_default();
        for s in secrets {
            assert!(!contains(&bytes, s), "{} contains the secret {s:?}", f.display());
        }
    }
    for o in outputs {
        for s in secrets {
            assert!(
                !contains(&o.stdout, s) && !contains(&o.stderr, s),
                "a CLI output contains the secret {s:?}:\n{}\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
    files.len()
}

#[test]
fn releases_survive_workers_killed_at_random_points_and_coordinator_restarts() {
    let releases = chaos_releases();
    let seed = std::env::var("QUANTFARM_FAULT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_f00d_u64);
    eprintln!("fault seed {seed:#x} (QUANTFARM_FAULT_SEED replays it)");
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    let rt = rt();
    let key = keygen(tmp.path());
    let specs: Vec<PathBuf> = (0..releases).map(|i| fault_release(&tmp.path().join("specs"), i)).collect();
    let mut outputs = Vec::new();

    // --- Undisturbed: the releases on a farm of 3 workers. ------------------------------------------------------
    let calm = Farm::new(&s3, &tmp.path().join("calm"), "calm", &key);
    let expected: BTreeMap<String, (Value, BTreeSet<String>)> = {
        let _coord = calm.coordinator();
        let _workers: Vec<_> = (1..=3).map(|i| calm.worker(&format!("w{i}"), TOKEN)).collect();
        let ids: Vec<String> = specs
            .iter()
            .map(|spec| {
                let out = calm.cli(&["submit", spec.to_str().unwrap()]);
                assert_eq!(out.status.code(), Some(0), "submit: {}", String::from_utf8_lossy(&out.stderr));
                String::from_utf8_lossy(&out.stdout).trim().to_string()
            })
            .collect();
        ids.iter()
            .map(|id| {
                let s = watch(&calm, id, &mut outputs);
                let report = report_of(&rt, &s3, &s);
                (report["release"]["name"].as_str().unwrap().to_string(), (fingerprint(&report), task_ids(&report)))
            })
            .collect()
    };
    assert_eq!(expected.len(), releases);
    for (name, (fp, tasks)) in &expected {
        assert_eq!(fp["verdict"], "gate_failed", "{name}: {fp:#}");
        assert_eq!(tasks.len(), 20, "{name}: {tasks:?}");
    }

    // --- Disturbed: releases submitted one after another while workers and the coordinator are killed. ------------
    let dir = tmp.path().join("chaos");
    let farm = Farm::new(&s3, &dir, "chaos", &key);
    let watcher = BucketWatch::start(&s3, "chaos");
    let mut rng = Rng(seed);
    // Every kill of a busy worker costs its task a try (an expired lease counts: a task that keeps killing its
    // worker, as the OOM killer would, must end). The suite kills often, so it allows more tries than the default 4.
    let coordinator = || farm.coordinator_with(&["--max-attempts", "12"]);
    let mut coord = Some(coordinator());
    let mut next_name = 1;
    let mut workers: Vec<(Proc, PathBuf)> = Vec::new();
    for _ in 0..3 {
        workers.push(farm.worker(&format!("w{next_name}"), TOKEN));
        next_name += 1;
    }
    let (mut kills, mut mid_task, mut restarts) = (0, Vec::new(), 0);
    let mut ids: Vec<String> = Vec::new();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(600);
    let mut next_submit = start;
    let mut next_fault = start + rng.ms(200, 600);
    let done = |ids: &[String]| {
        let listed = list_bucket(&rt, &s3, "chaos");
        ids.iter().filter(|id| listed.contains_key(&format!("store/releases/{id}/report.json"))).count()
    };
    loop {
        let now = Instant::now();
        assert!(now < deadline, "the releases did not finish within 10 min ({} of {releases} done)", done(&ids));
        // The last release waits until enough faults have landed, so that a fast machine cannot finish first.
        let enough = kills >= 10 && mid_task.len() >= 5 && restarts >= 2;
        if (ids.len() + 1 < releases || enough) && ids.len() < releases && now >= next_submit && coord.is_some() {
            let out = farm.cli(&["submit", specs[ids.len()].to_str().unwrap()]);
            if out.status.code() == Some(0) {
                ids.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
                next_submit = now + rng.ms(200, 900);
            }
            outputs.push(out);
        }
        if now >= next_fault {
            let spacing = (releases / 5).max(1);
            if coord.is_some() && restarts < 3 && ids.len() >= spacing * (restarts + 1) && rng.below(5) == 0 {
                // The coordinator dies (SIGKILL) and comes back on the same journal after a while.
                let mut c = coord.take().unwrap();
                c.0.kill().unwrap();
                c.0.wait().unwrap();
                std::thread::sleep(rng.ms(100, 1500));
                coord = Some(coordinator());
                restarts += 1;
            } else {
                // A worker dies (SIGKILL), preferably one in the middle of a task; a new one takes its place.
                let until = Instant::now() + Duration::from_millis(400);
                let victim = loop {
                    let busy: Vec<usize> =
                        (0..workers.len()).filter(|&i| !running_tasks(&workers[i].1).is_empty()).collect();
                    if !busy.is_empty() {
                        break busy[rng.below(busy.len() as u64) as usize];
                    }
                    if Instant::now() >= until {
                        break rng.below(workers.len() as u64) as usize;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                };
                let (mut p, log) = workers.remove(victim);
                p.0.kill().unwrap();
                p.0.wait().unwrap();
                kills += 1;
                mid_task.extend(running_tasks(&log));
                workers.push(farm.worker(&format!("w{next_name}"), TOKEN));
                next_name += 1;
            }
            next_fault = Instant::now() + rng.ms(800, 2400);
        }
        if ids.len() == releases && done(&ids) == releases {
            break;
        }
        if let Some(line) = farm.coordinator_logs().lines().find(|l| l.contains("release failed")) {
            panic!("a release failed under the faults: {line}");
        }
        std::thread::sleep(Duration::from_millis(15));
    }
    let elapsed = start.elapsed();
    let fin = list_bucket(&rt, &s3, "chaos");
    let listed = watcher.check(&fin);
    eprintln!(
        "{releases} releases in {:.1} s: {kills} workers killed ({} in the middle of a task: {:?}), the coordinator \
         restarted {restarts} times; {listed} objects listed during the run, none partial",
        elapsed.as_secs_f64(),
        mid_task.len(),
        mid_task
    );
    assert!(kills >= 10 && mid_task.len() >= 5 && restarts >= 2, "too few faults to mean anything");
    let killed_kinds: BTreeSet<&str> = mid_task.iter().map(|t| t.split('/').next().unwrap_or_default()).collect();
    eprintln!("kinds of the tasks killed mid-way: {killed_kinds:?}");

    // Every release: the same artifacts, measurements, gates and verdict as undisturbed, and every task there.
    let mut retried = 0;
    for id in &ids {
        let s = watch(&farm, id, &mut outputs);
        let report = report_of(&rt, &s3, &s);
        let name = report["release"]["name"].as_str().unwrap().to_string();
        let (fp, tasks) = &expected[&name];
        assert_same(&fingerprint(&report), fp, &name);
        assert_eq!(&task_ids(&report), tasks, "{name}: not the same tasks as the undisturbed run");
        retried += report["tasks"].as_array().unwrap().iter().filter(|t| t["attempts"].as_u64() > Some(1)).count();
    }
    assert!(retried > 0, "no task was retried: the faults did not land");
    // What the killed workers had staged is gone now that the releases have ended: no staging marker in the bucket,
    // and no incomplete upload in s3s-fs's own folder (`.upload-UUID.json`, parts `.upload_id-UUID.part-N`).
    let staged: Vec<String> = s3
        .files()
        .into_iter()
        .filter(|f| {
            let name = f.rsplit('/').next().unwrap_or(f);
            quantfarm_store::staging::is_staging(name) || f.starts_with(".upload-") || f.starts_with(".upload_id-")
        })
        .collect();
    assert!(staged.is_empty(), "staging left in the store after the releases ended: {staged:?}");
    // No output was ever reported with two digests, and no release failed.
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        assert!(
            !text.contains("not reproducible"),
            "{}: an output was made twice with different bytes",
            e.path().display()
        );
        assert!(!text.contains("release failed"), "{}: a release failed:\n{text}", e.path().display());
    }
    eprintln!("{retried} tasks were retried");
    drop(workers);
    drop(coord);

    // No secret in anything the runs wrote: logs, journals, the bucket's objects, the CLI's outputs.
    let searched = assert_no_secrets(&[tmp.path()], &s3.root, &outputs, &[TOKEN, ACCESS_KEY, SECRET_KEY]);
    eprintln!("{searched} files and {} CLI outputs searched for the token and the S3 keys", outputs.len());
}

#[test]
fn a_worker_that_stops_heartbeating_has_its_late_outcome_discarded() {
    use quantfarm_proto as pb;
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    let rt = rt();
    let key = keygen(tmp.path());
    let farm = Farm::new(&s3, tmp.path(), "late", &key);
    let spec = tiny_release(&tmp.path().join("spec"), "late", "Late");
    let _coord = farm.coordinator();

    // The stale worker: it registers, takes a GGUF task, and then falls silent (no heartbeat) — as a machine that
    // froze, or lost its link to the coordinator but not to the store.
    let _in_runtime = rt.enter();
    let mut client = quantfarm_worker::connect(&farm.url(), Some(TOKEN), None).unwrap();
    let info = pb::WorkerInfo { name: "stale".into(), slots: 2, task_kinds: vec!["gguf".into()], ..Default::default() };
    let register = pb::RegisterRequest { protocol_version: pb::PROTOCOL_VERSION, worker: Some(info) };
    let stale = rt.block_on(client.register(register)).unwrap().into_inner().worker_id;
    let (_w1, w1_log) = farm.worker("w1", TOKEN);
    let out = farm.cli(&["submit", spec.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    let lease = loop {
        assert!(Instant::now() < deadline, "the stale worker got no GGUF task within 2 min");
        let req = pb::LeaseRequest { worker_id: stale.clone(), free_slots: 2, wait_ms: 5000, ..Default::default() };
        let leases = rt.block_on(client.lease(req)).unwrap().into_inner().leases;
        if let Some(l) = leases.into_iter().next() {
            break l;
        }
    };
    assert!(lease.task_id.starts_with("gguf/"), "{}", lease.task_id);
    let output = match lease.task.as_ref().and_then(|t| t.kind.as_ref()) {
        Some(pb::task::Kind::Gguf(g)) => g.output.clone(),
        other => panic!("not a GGUF task: {other:?}"),
    };
    // Silence past the lease (2 s): the task goes to w1.
    let started = regex::Regex::new(&format!("started task={}", regex::escape(&lease.task_id))).unwrap();
    let taken = wait_log(&w1_log, &started, Duration::from_secs(30));
    assert!(taken.is_some(), "w1 never started {} after the lease expired", lease.task_id);
    // Now the stale worker reports, late, a result with other bytes than the real ones.
    let forged = pb::Artifact { url: output.clone(), sha256: "0".repeat(64), bytes: 1, types: vec![] };
    let late = pb::CompleteRequest {
        worker_id: stale.clone(),
        lease_id: lease.lease_id.clone(),
        release_id: id.clone(),
        task_id: lease.task_id.clone(),
        duration_ms: 1,
        outcome: Some(pb::complete_request::Outcome::Result(pb::TaskResult {
            kind: Some(pb::task_result::Kind::Artifact(pb::ArtifactResult {
                artifact: Some(forged),
                cache_hit: false,
                experts: vec![],
            })),
        })),
        fetch_ms: 0,
    };
    rt.block_on(client.complete(late)).unwrap();
    let hb = pb::HeartbeatRequest {
        worker_id: stale.clone(),
        lease_ids: vec![lease.lease_id.clone()],
        ..Default::default()
    };
    let revoked = rt.block_on(client.heartbeat(hb)).unwrap().into_inner().revoked;
    assert_eq!(revoked, vec![lease.lease_id.clone()], "the stale lease is not revoked");

    let mut outputs = Vec::new();
    let s = watch(&farm, &id, &mut outputs);
    assert_eq!(s["state"], "released", "{s:#}");
    let report = report_of(&rt, &s3, &s);
    let t = report["tasks"].as_array().unwrap().iter().find(|t| t["id"] == lease.task_id.as_str()).unwrap();
    assert!(t["worker"].as_str().unwrap().starts_with("w1"), "{t}");
    assert!(t["attempts"].as_u64().unwrap() >= 2, "{t}");
    let files: Vec<&Value> =
        report["artifacts"].as_array().unwrap().iter().flat_map(|a| a["files"].as_array().unwrap()).collect();
    let file = files.iter().find(|f| f["url"] == output.as_str()).expect("the task's output is an artifact");
    assert_ne!(file["sha256"], "0".repeat(64), "the late, forged result was taken");
    let stored = read_object(&rt, &output, &s3);
    assert_eq!(file["sha256"].as_str().unwrap(), hex(&<sha2::Sha256 as sha2::Digest>::digest(&stored)));
    let log = farm.coordinator_logs();
    assert!(
        log.contains(&format!("{}: discarded a late outcome from worker {stale}", lease.task_id)),
        "the coordinator does not say it discarded the late outcome:\n{log}"
    );
}

#[test]
fn the_s3_server_restarted_during_a_multipart_upload_loses_nothing() {
    let hf = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    s3.upload(&hf, "models", "smollm2-hf");
    let rt = rt();
    let key = keygen(tmp.path());
    let spec = tmp.path().join("release.yaml");
    std::fs::write(
        &spec,
        "name: smollm2-135m\nsource: s3://models/smollm2-hf\noutputs:\n  gguf: {prefix: SmolLM2-135M}\n",
    )
    .unwrap();
    let before: BTreeSet<String> = s3.files().into_iter().collect();
    let farm = Farm::new(&s3, tmp.path(), "s3crash", &key);
    let _coord = farm.coordinator();
    let (_worker, w_log) = farm.worker("w1", TOKEN);
    let watcher = BucketWatch::start(&s3, "s3crash");
    let out = farm.cli(&["submit", spec.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // Wait until the BF16 file's multipart upload has parts on the server: new files that are no object of the
    // bucket (s3s-fs keeps an upload's parts beside the objects until it is completed).
    let deadline = Instant::now() + Duration::from_secs(300);
    let staged = loop {
        assert!(Instant::now() < deadline, "no multipart upload was seen on the server");
        let listed = list_bucket(&rt, &s3, "s3crash");
        let staged: Vec<String> = s3
            .files()
            .into_iter()
            .filter(|f| !before.contains(f) && !listed.keys().any(|k| f.ends_with(k.as_str())))
            .collect();
        if staged.len() >= 2 {
            break staged;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("upload in flight ({staged:?}): the S3 server is killed and restarted");
    s3.crash_and_restart(Duration::from_secs(2));
    let mut outputs = vec![out];
    let s = watch(&farm, &id, &mut outputs);
    let fin = list_bucket(&rt, &s3, "s3crash");
    let listed = watcher.check(&fin);
    assert!(listed > 0);
    let report = report_of(&rt, &s3, &s);
    // The verify task made the file again, undisturbed, and compared bytes.
    let reproducible = report["gates"].as_array().unwrap().iter().find(|g| g["name"] == "reproducible").unwrap();
    assert_eq!(reproducible["passed"], true, "{reproducible:#}");
    let url = report["artifacts"][0]["files"][0]["url"].as_str().unwrap();
    let (bucket, k) = url.strip_prefix("s3://").unwrap().split_once('/').unwrap();
    assert_eq!(
        tensor_hashes(&rt, &s3.location(bucket, k)),
        manifest("smollm2-hf-bf16.json"),
        "BF16 tensors differ from convert_hf_to_gguf.py's"
    );
    let warnings: Vec<String> =
        std::fs::read_to_string(&w_log).unwrap().lines().filter(|l| l.contains("WARN")).map(str::to_string).collect();
    eprintln!("the worker's warnings:\n{}", warnings.join("\n"));
}

#[test]
fn a_worker_with_a_full_scratch_disk_hands_its_tasks_to_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    let rt = rt();
    let key = keygen(tmp.path());
    let spec = tiny_release(&tmp.path().join("spec"), "fulldisk", "FullDisk");
    let mut outputs = Vec::new();

    // Undisturbed: `quantfarm run` of the same release.
    let calm = Command::new(bin())
        .arg("run")
        .arg(&spec)
        .arg("--store")
        .arg(tmp.path().join("calm"))
        .arg("--json")
        .env("QUANTFARM_KEY_FILE", &key)
        .output()
        .unwrap();
    assert_eq!(calm.status.code(), Some(0), "{}", String::from_utf8_lossy(&calm.stderr));
    let calm_report: Value =
        serde_json::from_slice(&std::fs::read(summary(&calm)["report_url"].as_str().unwrap()).unwrap()).unwrap();

    let farm = Farm::new(&s3, tmp.path(), "full", &key);
    let _coord = farm.coordinator();
    // The full worker's scratch is a 64 KiB tmpfs mounted in a mount namespace of its own (so nothing else sees
    // it, and no root is needed where user namespaces are allowed).
    let scratch = tmp.path().join("full-scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let mount = "mount -t tmpfs -o size=64k quantfarm-full \"$0\" && exec \"$@\"";
    let probe = Command::new("unshare").args(["-m", "true"]).output();
    let userns: &[&str] = if probe.is_ok_and(|o| o.status.success()) { &["-m"] } else { &["-Urm"] };
    let mut wrap: Vec<&OsStr> = vec![OsStr::new("unshare")];
    wrap.extend(userns.iter().map(OsStr::new));
    wrap.extend([OsStr::new("sh"), OsStr::new("-c"), OsStr::new(mount), scratch.as_os_str()]);
    let (full, full_log) = farm.worker_with("full", TOKEN, &scratch, &wrap);
    let (_ok, _) = farm.worker("ok", TOKEN);
    let s = submit_and_watch(&farm, &spec, &mut outputs);
    let report = report_of(&rt, &s3, &s);
    assert_same(&fingerprint(&report), &fingerprint(&calm_report), "the release");
    let log = std::fs::read_to_string(&full_log).unwrap();
    assert!(
        log.contains("No space left on device") && log.contains(scratch.to_str().unwrap()),
        "the full worker's log does not say its disk is full, naming the folder:\n{log}"
    );
    let failed_over: Vec<&Value> = report["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["attempts"].as_u64() > Some(1) && t["worker"].as_str().is_some_and(|w| w.starts_with("ok")))
        .collect();
    assert!(!failed_over.is_empty(), "no task failed over from the full worker");
    // Nothing is left on the full disk (seen through the worker's own mount namespace) but the folder the running
    // worker holds, with its lock file in it.
    let ns_scratch = PathBuf::from(format!("/proc/{}/root", full.0.id())).join(scratch.strip_prefix("/").unwrap());
    let mut left: Vec<PathBuf> = Vec::new();
    for e in std::fs::read_dir(&ns_scratch).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default() {
        let inside: Vec<String> = std::fs::read_dir(e.path())
            .map(|d| d.flatten().map(|f| f.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        if !(e.path().is_dir() && inside == [".lock"]) {
            left.push(e.path());
        }
    }
    assert!(left.is_empty(), "the full worker left {left:?} in its scratch");
    eprintln!("{} tasks failed over from the full worker", failed_over.len());
}

#[test]
fn corrupted_artifacts_are_detected_by_their_checksum_and_made_again() {
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    let rt = rt();
    let key = keygen(tmp.path());
    let spec = tiny_release(&tmp.path().join("spec"), "corrupt", "Corrupt");
    let farm = Farm::new(&s3, tmp.path(), "rot", &key);
    let _coord = farm.coordinator();
    let (_w1, log1) = farm.worker("w1", TOKEN);
    let (_w2, log2) = farm.worker("w2", TOKEN);
    let mut outputs = Vec::new();
    let first = submit_and_watch(&farm, &spec, &mut outputs);
    let report1 = report_of(&rt, &s3, &first);
    assert_eq!(report1["verdict"], "released");

    // Bit rot: one byte flipped in a BF16 split file, a Q8_0 file and a KLD base-logits part, in place.
    let mut corrupted = Vec::new();
    for pattern in ["-BF16-00001-of-00002.gguf", "-Q8_0-00002-of-00002.gguf", "kld-base-00000"] {
        let f = s3.files().into_iter().find(|f| f.starts_with("rot/") && f.contains(pattern)).unwrap();
        let path = s3.root.join(&f);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x40;
        std::fs::write(&path, bytes).unwrap();
        corrupted.push(f);
    }
    let second = submit_and_watch(&farm, &spec, &mut outputs);
    let report2 = report_of(&rt, &s3, &second);
    assert_same(&fingerprint(&report2), &fingerprint(&report1), "the second run");
    let logs = std::fs::read_to_string(&log1).unwrap() + &std::fs::read_to_string(&log2).unwrap();
    for f in &corrupted {
        let name = f.rsplit('/').next().unwrap();
        assert!(
            logs.lines().any(|l| l.contains("the stored output is corrupt") && l.contains(name)),
            "no worker found {name} corrupt:\n{logs}"
        );
    }
    // The store holds the right bytes again.
    for a in report2["artifacts"].as_array().unwrap() {
        for file in a["files"].as_array().unwrap() {
            let bytes = read_object(&rt, file["url"].as_str().unwrap(), &s3);
            let sha = hex(&<sha2::Sha256 as sha2::Digest>::digest(&bytes));
            assert_eq!(sha, file["sha256"].as_str().unwrap(), "{}", file["url"]);
        }
    }
}
