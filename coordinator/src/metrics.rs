//! The coordinator's Prometheus metrics (text exposition format 0.0.4) and health check, served over plain HTTP
//! on their own address (`--metrics 127.0.0.1:9464`): `/metrics` and `/healthz`.
//!
//! Everything is computed from the scheduler's state when scraped — tasks by state, releases by state, workers
//! known and live, bytes of artifacts written, task durations by kind, ready tasks by worker kind — so there is no
//! second bookkeeping to drift from the journal's truth. Releases by state cover the journal's whole history; the
//! task figures cover the releases in memory and those finished since the coordinator started (`sched::tally`).

use std::fmt::Write as _;
use std::time::Instant;

use quantfarm_proto::ReleaseState;

use crate::sched::BUCKETS;
use crate::sched::{Sched, TState};
use crate::Coordinator;

/// A label value with the exposition format's escapes (backslash, quote, newline).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The metrics page for the scheduler's current state.
pub fn render(s: &Sched, now: Instant) -> String {
    let mut all = s.history().clone();
    for r in s.releases().iter() {
        all.add(r);
    }
    let mut tasks = all.tasks;
    for state in ["blocked", "ready", "leased", "done"] {
        tasks.entry(state).or_default();
    }
    let (written, durations) = (all.written, all.durations);
    let mut releases = std::collections::BTreeMap::<&str, u64>::new();
    for (&state, &n) in s.release_counts() {
        *releases.entry(ReleaseState::try_from(state).unwrap_or(ReleaseState::Unspecified).label()).or_default() += n;
    }
    // Every worker kind, with 0 when none waits: an autoscaler reads "no work" as well as "work".
    let mut ready = std::collections::BTreeMap::<&str, u64>::new();
    for k in quantfarm_proto::WorkerKind::ALL {
        ready.insert(k.name(), 0);
    }
    for t in s.releases().iter().flat_map(|r| r.tasks.iter()) {
        if let (TState::Ready, Some(k)) = (&t.state, t.key.worker_kind()) {
            *ready.entry(k.name()).or_default() += 1;
        }
    }
    let live = s.workers().values().filter(|w| w.is_live(now, s.cfg().lease)).count();
    let mut out = String::new();
    let _ = writeln!(out, "# HELP quantfarm_tasks Tasks of every release, by state.\n# TYPE quantfarm_tasks gauge");
    for (state, n) in &tasks {
        let _ = writeln!(out, "quantfarm_tasks{{state=\"{state}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP quantfarm_ready_tasks Tasks ready to run, by the worker kind that runs them (what an autoscaler \
         scales workers on: deploy/k8s/keda-scaledobject.yaml).\n# TYPE quantfarm_ready_tasks gauge"
    );
    for (kind, n) in &ready {
        let _ = writeln!(out, "quantfarm_ready_tasks{{kind=\"{kind}\"}} {n}");
    }
    let _ = writeln!(out, "# HELP quantfarm_releases Releases, by state.\n# TYPE quantfarm_releases gauge");
    for (state, n) in &releases {
        let _ = writeln!(out, "quantfarm_releases{{state=\"{state}\"}} {n}");
    }
    let _ = writeln!(
        out,
        "# HELP quantfarm_workers Workers that registered since the coordinator started.\n# TYPE quantfarm_workers gauge\nquantfarm_workers {}",
        s.workers().len()
    );
    let _ = writeln!(
        out,
        "# HELP quantfarm_workers_live Workers heard from within two lease periods.\n# TYPE quantfarm_workers_live gauge\nquantfarm_workers_live {live}"
    );
    let mut workers: Vec<_> = s.workers().values().collect();
    workers.sort_by(|a, b| a.info.name.cmp(&b.info.name));
    for (metric, help, get) in [
        ("quantfarm_worker_bytes_read_total", "Bytes a worker read from the object store since it started (tensors, headers, fetched files; local files, its cache included, are not counted).", (|w: &crate::sched::WorkerRec| w.bytes_read) as fn(&crate::sched::WorkerRec) -> u64),
        ("quantfarm_worker_bytes_written_total", "Bytes a worker wrote to the object store since it started.", |w| w.bytes_written),
    ] {
        let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} counter");
        for w in &workers {
            let _ = writeln!(out, "{metric}{{worker=\"{}\"}} {}", label(&w.info.name), get(w));
        }
    }
    let _ = writeln!(
        out,
        "# HELP quantfarm_artifact_bytes_written Bytes of artifacts the workers wrote (cache hits not counted).\n# TYPE quantfarm_artifact_bytes_written gauge\nquantfarm_artifact_bytes_written {written}"
    );
    let _ = writeln!(
        out,
        "# HELP quantfarm_task_duration_seconds Run time of finished tasks, by kind.\n# TYPE quantfarm_task_duration_seconds histogram"
    );
    for (kind, (buckets, count, sum)) in &durations {
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ =
                writeln!(out, "quantfarm_task_duration_seconds_bucket{{kind=\"{kind}\",le=\"{b}\"}} {}", buckets[i]);
        }
        let _ = writeln!(out, "quantfarm_task_duration_seconds_bucket{{kind=\"{kind}\",le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "quantfarm_task_duration_seconds_sum{{kind=\"{kind}\"}} {sum}");
        let _ = writeln!(out, "quantfarm_task_duration_seconds_count{{kind=\"{kind}\"}} {count}");
    }
    out
}

/// Serves `/metrics` and `/healthz` on `listener` until the process ends.
pub async fn serve(coord: Coordinator, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    use axum::http::{header, StatusCode};
    use axum::routing::get;
    let metrics = {
        let c = coord.clone();
        move || {
            let c = c.clone();
            async move {
                let body = c.with_sched(|s| render(s, Instant::now()));
                ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body)
            }
        }
    };
    let health = move || {
        let c = coord.clone();
        async move {
            // The scheduler answers (its lock is not wedged) and the journal is open.
            match c.with_sched(|s| s.journal_ok()) {
                Ok(()) => (StatusCode::OK, "ok\n".to_string()),
                Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("journal: {e}\n")),
            }
        }
    };
    let app = axum::Router::new().route("/metrics", get(metrics)).route("/healthz", get(health));
    axum::serve(listener, app).await
}
