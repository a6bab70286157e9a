//! The coordinator's gRPC server with real clients and a real worker (here, where both are linked; the coordinator's
//! own tests build no worker): TLS with a certificate, the token check, the protocol-version check, the refusal to
//! serve off loopback without a token, and a signed report at the end of a release.

use std::time::Duration;

use quantfarm_coordinator::sched::TState;
use quantfarm_coordinator::signing::{verify_report, SigningKey};
use quantfarm_coordinator::{Coordinator, CoordinatorConfig, SchedConfig, ServeError};
use quantfarm_proto::farm_client::FarmClient;
use quantfarm_proto::releases_client::ReleasesClient;
use quantfarm_proto::{self as pb, ReleaseState, PROTOCOL_VERSION};
use quantfarm_store::Location;
use quantfarm_worker::{AddToken, WorkerConfig};

const TOKEN: &str = "s3cr3t-token";

fn config(dir: &std::path::Path, key: SigningKey) -> CoordinatorConfig {
    CoordinatorConfig {
        journal: dir.join("journal.sqlite"),
        store: Location::local(dir.join("store")),
        sched: SchedConfig { lease: Duration::from_secs(5), ..Default::default() },
        token: Some(TOKEN.into()),
        key,
        tls: None,
    }
}

fn worker_cfg(url: &str, token: &str, ca: Option<Vec<u8>>, dir: &std::path::Path) -> WorkerConfig {
    WorkerConfig {
        coordinator: url.into(),
        token: Some(token.into()),
        name: "t".into(),
        slots: 2,
        cores: 2,
        memory_budget: 64 << 20,
        ca_cert: ca,
        scratch: dir.join("scratch"),
        patience: Duration::from_secs(10),
        cache_dir: dir.join("cache"),
        cache_size: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_over_tls_ends_with_a_signed_report() {
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert_pem, key_pem) = (cert.cert.pem(), cert.signing_key.serialize_pem());
    let key = SigningKey::generate().unwrap();
    let public = key.public();
    let cfg = config(dir.path(), key);
    let coord = Coordinator::open(&cfg).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://localhost:{}", listener.local_addr().unwrap().port());
    let tls = Some((cert_pem.clone().into_bytes(), key_pem.into_bytes()));
    tokio::spawn(coord.serve(listener, Some(TOKEN.into()), tls, std::future::pending()));

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let w = tokio::spawn(quantfarm_worker::run(
        worker_cfg(&url, TOKEN, Some(cert_pem.clone().into_bytes()), dir.path()),
        async {
            let _ = stop_rx.await;
        },
        std::future::pending(),
    ));
    let channel = quantfarm_worker::channel(&url, Some(cert_pem.as_bytes())).unwrap();
    let mut client = ReleasesClient::with_interceptor(channel, AddToken::new(Some(TOKEN)).unwrap());
    let yaml = "name: tls-smoke\nsource: unused\noutputs:\n  noop: {tasks: 5, sleep_ms: 10}\n";
    let id = client
        .submit(pb::SubmitRequest {
            protocol_version: PROTOCOL_VERSION,
            release_yaml: yaml.into(),
            base: String::new(),
            file_name: "release.yaml".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .release_id;
    let mut events = client.watch(pb::WatchRequest { release_id: id.clone() }).await.unwrap().into_inner();
    let mut last = None;
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(60), events.message()).await.unwrap().unwrap() {
        last = Some(ev);
    }
    let last = last.unwrap();
    assert_eq!(last.state, ReleaseState::Released as i32, "{last:?}");
    let report = client.get_report(pb::GetReportRequest { release_id: id.clone() }).await.unwrap().into_inner();
    let json: serde_json::Value = serde_json::from_str(&report.report_json).unwrap();
    let verified = verify_report(&json, Some(&public)).unwrap();
    assert!(verified.pinned);
    assert_eq!(json["tasks"].as_array().unwrap().len(), 5);
    // The report was also written to the store, byte for byte what the API returns.
    let stored = std::fs::read_to_string(dir.path().join(format!("store/releases/{id}/report.json"))).unwrap();
    assert_eq!(stored, report.report_json);
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(20), w).await.unwrap().unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_and_old_protocols_are_refused_with_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let coord = Coordinator::open(&config(dir.path(), SigningKey::generate().unwrap())).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    tokio::spawn(coord.serve(listener, Some(TOKEN.into()), None, std::future::pending()));

    let info = pb::WorkerInfo { name: "old".into(), slots: 1, task_kinds: vec!["noop".into()], ..Default::default() };
    let channel = quantfarm_worker::channel(&url, None).unwrap();
    let mut client = FarmClient::with_interceptor(channel.clone(), AddToken::new(Some(TOKEN)).unwrap());
    let e = client.register(pb::RegisterRequest { protocol_version: 0, worker: Some(info.clone()) }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("protocol 0") && e.message().contains("upgrade"), "{}", e.message());
    client
        .register(pb::RegisterRequest { protocol_version: PROTOCOL_VERSION, worker: Some(info.clone()) })
        .await
        .unwrap();

    let mut intruder = FarmClient::with_interceptor(channel.clone(), AddToken::new(Some("guess")).unwrap());
    let e = intruder
        .register(pb::RegisterRequest { protocol_version: PROTOCOL_VERSION, worker: Some(info) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let mut anon = ReleasesClient::new(channel);
    let e = anon.get_report(pb::GetReportRequest { release_id: "x".into() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "the Releases service is guarded too");

    // The worker loop gives up at once on a refusal and says why.
    let e = quantfarm_worker::run(
        worker_cfg(&url, "guess", None, dir.path()),
        std::future::pending(),
        std::future::pending(),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("token"), "{e}");
}

#[tokio::test]
async fn off_loopback_a_token_is_required() {
    let dir = tempfile::tempdir().unwrap();
    let coord = Coordinator::open(&config(dir.path(), SigningKey::generate().unwrap())).unwrap();
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let e = coord.serve(listener, None, None, std::future::pending()).await.unwrap_err();
    assert!(matches!(e, ServeError::NoToken(_)), "{e}");
    assert!(e.to_string().contains("token"));
}

/// A coordinator with a long history stays small: 10,000 finished releases in its journal are not loaded (start-up
/// resumes only unfinished ones), a release that finishes leaves memory, and every one of them is still there for
/// `watch` (its final state and progress) and `GetReport`, read from the journal; the metrics count them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_releases_live_in_the_journal_not_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), SigningKey::generate().unwrap());
    quantfarm_coordinator::history::fill(&cfg.journal, 10_000, 2_000).unwrap();
    let coord = Coordinator::open(&cfg).unwrap();
    assert!(coord.with_sched(|s| s.releases().is_empty()), "finished releases were loaded at start-up");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let c2 = coord.clone();
    tokio::spawn(coord.serve(listener, Some(TOKEN.into()), None, std::future::pending()));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let w = tokio::spawn(quantfarm_worker::run(
        worker_cfg(&url, TOKEN, None, dir.path()),
        async {
            let _ = stop_rx.await;
        },
        std::future::pending(),
    ));
    let channel = quantfarm_worker::channel(&url, None).unwrap();
    let mut client = ReleasesClient::with_interceptor(channel, AddToken::new(Some(TOKEN)).unwrap());

    // A new release runs to its end, then leaves memory.
    let yaml = "name: new\nsource: unused\noutputs:\n  noop: {tasks: 3, sleep_ms: 10}\n";
    let req = pb::SubmitRequest {
        protocol_version: PROTOCOL_VERSION,
        release_yaml: yaml.into(),
        base: String::new(),
        file_name: "release.yaml".into(),
    };
    let id = client.submit(req).await.unwrap().into_inner().release_id;
    let mut events = client.watch(pb::WatchRequest { release_id: id.clone() }).await.unwrap().into_inner();
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(60), events.message()).await.unwrap().unwrap() {
        if ev.state != ReleaseState::Running as i32 {
            assert_eq!(ev.state, ReleaseState::Released as i32, "{ev:?}");
        }
    }
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(20), w).await.unwrap().unwrap().unwrap();
    assert!(c2.with_sched(|s| s.releases().is_empty()), "the finished release stayed in memory");

    // The one just finished and the oldest of the history: watch gives the final state and the progress by stage,
    // GetReport the report.
    for (rid, tasks) in [(id.clone(), 4), (quantfarm_coordinator::history::release_id(0), 14)] {
        let mut events = client.watch(pb::WatchRequest { release_id: rid.clone() }).await.unwrap().into_inner();
        let ev = events.message().await.unwrap().expect("a snapshot");
        assert_eq!(ev.state, ReleaseState::Released as i32, "{ev:?}");
        assert_eq!(
            ev.stages.iter().map(|p| (p.done, p.total)).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1)),
            (tasks, tasks)
        );
        assert!(events.message().await.unwrap().is_none(), "a finished release's watch ends with its snapshot");
        let report = client.get_report(pb::GetReportRequest { release_id: rid.clone() }).await.unwrap().into_inner();
        assert_eq!(report.state, ReleaseState::Released as i32);
        let json: serde_json::Value = serde_json::from_str(&report.report_json).unwrap();
        assert_eq!(json["release"]["id"], rid.as_str(), "{json}");
        assert!(report.report_url.ends_with(&format!("releases/{rid}/report.json")), "{}", report.report_url);
    }
    let e = client.get_report(pb::GetReportRequest { release_id: "nope".into() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let page = c2.with_sched(|s| quantfarm_coordinator::metrics::render(s, std::time::Instant::now()));
    assert!(page.lines().any(|l| l == "quantfarm_releases{state=\"released\"} 10001"), "{page}");
    assert!(page.lines().any(|l| l == "quantfarm_tasks{state=\"done\"} 4"), "{page}");
}

/// A worker told to stop now whose coordinator is gone does not wait out its patience (300 s here) to report an
/// outcome nobody can take: it tries once and exits (the coordinator, when it comes back, runs the task again once
/// the lease expires). `quantfarm run` stopped its local workers and coordinator together, and each release could
/// end with a worker retrying its last outcome against the closed port for 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopping_now_does_not_wait_for_a_gone_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    let coord = Coordinator::open(&config(dir.path(), SigningKey::generate().unwrap())).unwrap();
    let c2 = coord.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let (down_tx, down_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(coord.serve(listener, Some(TOKEN.into()), None, async {
        let _ = down_rx.await;
    }));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let cfg = WorkerConfig { patience: Duration::from_secs(300), ..worker_cfg(&url, TOKEN, None, dir.path()) };
    let w = tokio::spawn(quantfarm_worker::run(cfg, stopped(stop_rx.clone()), stopped(stop_rx)));
    let channel = quantfarm_worker::channel(&url, None).unwrap();
    let mut client = ReleasesClient::with_interceptor(channel, AddToken::new(Some(TOKEN)).unwrap());
    let req = pb::SubmitRequest {
        protocol_version: PROTOCOL_VERSION,
        release_yaml: "name: slow\nsource: unused\noutputs:\n  noop: {tasks: 1, sleep_ms: 2000}\n".into(),
        base: String::new(),
        file_name: "release.yaml".into(),
    };
    client.submit(req).await.unwrap();
    // The coordinator goes away while the task runs; the worker then holds an outcome it cannot deliver.
    let t0 = std::time::Instant::now();
    while !c2
        .with_sched(|s| s.releases().iter().any(|r| r.tasks.iter().any(|t| matches!(t.state, TState::Leased { .. }))))
    {
        assert!(t0.elapsed() < Duration::from_secs(30), "the task was never leased");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = down_tx.send(());
    tokio::time::timeout(Duration::from_secs(30), server).await.unwrap().unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let t1 = std::time::Instant::now();
    let _ = stop_tx.send(true);
    tokio::time::timeout(Duration::from_secs(20), w)
        .await
        .expect("the worker waited for the gone coordinator instead of stopping")
        .unwrap()
        .unwrap();
    eprintln!("stopped in {:?}", t1.elapsed());
}
