//! deploy/ is checked by the tools that judge such files, none of which needs a Docker engine, a cluster or a Mac
//! (none is reachable here): the compose file against the Compose Specification's schema (check-jsonschema's
//! vendored copy) and by docker-compose's own `config` (Debian's 1.29, which also checks interpolation); the
//! Kubernetes manifests against the 1.32 OpenAPI schemas, strictly (kubernetes-validate; `kubectl --dry-run=client`
//! needs an API server for discovery); the systemd unit by `systemd-analyze verify`; the launchd plist parsed as a
//! property list; the GitHub Actions workflow against SchemaStore's workflow schema. And the coordinator's metrics
//! and health endpoints answer while a release runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn deploy() -> PathBuf {
    quantfarm_e2e::repo_root().join("deploy")
}

fn tool(name: &str) -> PathBuf {
    quantfarm_e2e::check_tools().join("venv-check/bin").join(name)
}

/// check-jsonschema with one of its vendored schemas.
fn schema_check(schema: &str, file: &Path) -> (bool, String) {
    run(Command::new(tool("check-jsonschema")).args(["--builtin-schema", schema]).arg(file))
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn the_compose_file_is_valid() {
    let compose = deploy().join("compose/docker-compose.yml");
    let (ok, msg) = schema_check("vendor.compose-spec", &compose);
    assert!(ok, "against the Compose Specification: {msg}");
    // docker-compose resolves the .env interpolation and the secret file: give it both, in a copy of the folder.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(&compose, tmp.path().join("docker-compose.yml")).unwrap();
    std::fs::copy(deploy().join("compose/.env.example"), tmp.path().join(".env")).unwrap();
    std::fs::create_dir_all(tmp.path().join("secrets")).unwrap();
    std::fs::write(tmp.path().join("secrets/signing.key"), "x").unwrap();
    let dc = Path::new("/usr/bin/docker-compose");
    assert!(dc.exists(), "docker-compose is missing: scripts/install-check-tools installs Debian's");
    let (ok, msg) = run(Command::new(dc).arg("config").arg("-q").current_dir(tmp.path()));
    assert!(ok, "docker-compose config: {msg}");
    let (_, full) = run(Command::new(dc).arg("config").current_dir(tmp.path()));
    for service in ["minio:", "coordinator:", "worker-1:", "worker-2:"] {
        assert!(full.contains(service), "{service} missing:\n{full}");
    }
    // Without the .env, the required variables are named.
    std::fs::remove_file(tmp.path().join(".env")).unwrap();
    let (ok, msg) = run(Command::new(dc).arg("config").arg("-q").current_dir(tmp.path()));
    assert!(!ok && msg.contains("MINIO_ROOT_PASSWORD"), "{msg}");
}

#[test]
fn the_kubernetes_manifests_are_valid() {
    let dir = deploy().join("k8s");
    let kust = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let files: Vec<PathBuf> =
        kust.lines().filter_map(|l| l.trim().strip_prefix("- ")).map(|f| dir.join(f.trim())).collect();
    assert_eq!(files.len(), 3, "{kust}");
    let (ok, msg) = run(Command::new(tool("kubernetes-validate")).args(["--strict", "-k", "1.32.0"]).args(&files));
    assert!(ok && !msg.contains("ERROR"), "{msg}");
    for kind in ["statefulset/coordinator", "service/coordinator", "deployment/worker", "namespace/quantfarm"] {
        assert!(msg.contains(&format!("passed for resource {kind}")), "{kind} not checked:\n{msg}");
    }
    // The validator rejects what is wrong (so its passes mean something).
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.yaml");
    let text = std::fs::read_to_string(dir.join("workers.yaml")).unwrap();
    std::fs::write(&bad, text.replace("terminationGracePeriodSeconds", "terminationGracePeriod")).unwrap();
    let (ok, msg) = run(Command::new(tool("kubernetes-validate")).args(["--strict", "-k", "1.32.0"]).arg(&bad));
    assert!(!ok || msg.contains("ERROR"), "a misspelt field passed:\n{msg}");
}

/// The optional KEDA ScaledObject, against KEDA's own CRD schema (vendored, made strict), which must reject a
/// misspelt field; its query names the coordinator's ready-task metric (served: see the metrics test below).
#[test]
fn the_keda_scaled_object_is_valid() {
    let dir = deploy().join("k8s");
    let schema = dir.join("schemas/keda-scaledobject-v1alpha1.json");
    let so = dir.join("keda-scaledobject.yaml");
    let (ok, msg) = run(Command::new(tool("check-jsonschema")).arg("--schemafile").arg(&schema).arg(&so));
    assert!(ok, "against KEDA's ScaledObject schema: {msg}");
    let text = std::fs::read_to_string(&so).unwrap();
    assert!(text.contains("query: sum(quantfarm_ready_tasks{kind!=\"mlx-lm\"})"), "{text}");
    assert!(text.contains("name: worker") && text.contains("type: prometheus"), "{text}");
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.yaml");
    std::fs::write(&bad, text.replace("minReplicaCount", "minReplicas")).unwrap();
    let (ok, msg) = run(Command::new(tool("check-jsonschema")).arg("--schemafile").arg(&schema).arg(&bad));
    assert!(!ok && msg.contains("minReplicas"), "a misspelt field passed:\n{msg}");
}

#[test]
fn the_systemd_unit_and_the_launchd_plist_are_valid() {
    // systemd-analyze checks that ExecStart is executable: point it at the built binary, in a copy.
    let unit = std::fs::read_to_string(deploy().join("systemd/quantfarm-worker.service")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("quantfarm-worker.service");
    std::fs::write(&copy, unit.replace("/usr/local/bin/quantfarm", env!("CARGO_BIN_EXE_quantfarm"))).unwrap();
    let (ok, msg) = run(Command::new("systemd-analyze").arg("verify").arg(&copy));
    // It warns about what a container lacks (no running systemd); a unit error names the file.
    assert!(ok || !msg.contains("quantfarm-worker.service:"), "systemd-analyze verify: {msg}");
    assert!(!msg.contains("Unknown key") && !msg.contains("Invalid"), "systemd-analyze verify: {msg}");
    let (ok, msg) = run(Command::new("python3")
        .arg("-c")
        .arg(
            "import plistlib, sys\n\
         d = plistlib.load(open(sys.argv[1], 'rb'))\n\
         assert d['Label'] == 'dev.quantfarm.worker', d['Label']\n\
         assert d['ProgramArguments'][1] == 'worker', d['ProgramArguments']\n\
         assert isinstance(d['EnvironmentVariables'], dict) and 'QUANTFARM_TOKEN' in d['EnvironmentVariables']\n\
         assert isinstance(d['ExitTimeOut'], int)\n\
         print('ok')",
        )
        .arg(deploy().join("launchd/dev.quantfarm.worker.plist")));
    assert!(ok, "launchd plist: {msg}");
}

#[test]
fn the_ci_workflow_is_valid() {
    let wf = deploy().join("ci/release-ladder.yml");
    let (ok, msg) = schema_check("vendor.github-workflows", &wf);
    assert!(ok, "against SchemaStore's GitHub workflow schema: {msg}");
    let text = std::fs::read_to_string(&wf).unwrap();
    assert!(text.contains("--watch --json") && text.contains("report verify"), "the workflow submits and checks");
}

/// A GET on loopback, the whole response.

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn the_coordinator_serves_metrics_and_health() {
    let tmp = tempfile::tempdir().unwrap();
    let (grpc, metrics) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let key = tmp.path().join("k");
    assert!(Command::new(env!("CARGO_BIN_EXE_quantfarm")).arg("keygen").arg(&key).output().unwrap().status.success());
    let mut coord = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
        .args(["coordinator", "--listen", &grpc, "--metrics", &metrics, "--store"])
        .arg(tmp.path().join("store"))
        .arg("--key")
        .arg(&key)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&metrics).is_err() {
        assert!(Instant::now() < deadline, "the metrics port never opened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let health = quantfarm_e2e::http_get(&metrics, "/healthz");
    assert!(health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"), "{health}");
    // A release of noop tasks with a worker: the metrics count them.
    let release = tmp.path().join("r.yaml");
    std::fs::write(&release, "name: m\nsource: unused\noutputs:\n  noop: {tasks: 3, sleep_ms: 10}\n").unwrap();
    let url = format!("http://{grpc}");
    // Submitted before any worker runs: its 3 tasks wait, and the metric an autoscaler reads says so.
    let submitted = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
        .arg("submit")
        .arg(&release)
        .args(["--coordinator", &url])
        .output()
        .unwrap();
    assert!(submitted.status.success(), "{}", String::from_utf8_lossy(&submitted.stderr));
    let id = String::from_utf8_lossy(&submitted.stdout).trim().to_string();
    let waiting = quantfarm_e2e::http_get(&metrics, "/metrics");
    assert!(waiting.lines().any(|l| l == "quantfarm_ready_tasks{kind=\"noop\"} 3"), "{waiting}");
    assert!(waiting.lines().any(|l| l == "quantfarm_ready_tasks{kind=\"quantize\"} 0"), "{waiting}");
    let mut worker = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
        .args(["worker", "--coordinator", &url, "--name", "w1"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_quantfarm"))
        .args(["watch", &id])
        .args(["--coordinator", &url, "--json"])
        .output()
        .unwrap();
    let page = quantfarm_e2e::http_get(&metrics, "/metrics");
    let _ = worker.kill();
    let _ = coord.kill();
    let _ = (worker.wait(), coord.wait());
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(page.contains("content-type: text/plain; version=0.0.4"), "{page}");
    for line in [
        "quantfarm_tasks{state=\"done\"} 4", // the 3 noop tasks and the report
        "quantfarm_releases{state=\"released\"} 1",
        "quantfarm_workers 1",
        "quantfarm_workers_live 1",
        "quantfarm_task_duration_seconds_count{kind=\"noop\"} 3",
        "quantfarm_task_duration_seconds_bucket{kind=\"noop\",le=\"+Inf\"} 3",
        // Nothing is ready once the release is done; every worker kind is listed, for an autoscaler.
        "quantfarm_ready_tasks{kind=\"noop\"} 0",
        "quantfarm_ready_tasks{kind=\"quantize\"} 0",
        "quantfarm_ready_tasks{kind=\"mlx-lm\"} 0",
    ] {
        assert!(page.lines().any(|l| l == line), "no line {line:?} in:\n{page}");
    }
    assert!(page.contains("# TYPE quantfarm_task_duration_seconds histogram"), "{page}");
    // The worker's own byte counts (noop tasks move none).
    for metric in ["quantfarm_worker_bytes_read_total", "quantfarm_worker_bytes_written_total"] {
        assert!(page.lines().any(|l| l == format!("{metric}{{worker=\"w1\"}} 0")), "{metric}:\n{page}");
    }
}
