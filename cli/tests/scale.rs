//! The workers' local cache and the leases that follow it, as users run them: a real S3 server (s3s-fs), one
//! `quantfarm coordinator` and three `quantfarm worker` processes, the SmolLM2 ladder of 4 levels measured by KL
//! divergence, greedy agreement and probes. The same release runs twice, on workers without and with
//! `--cache-size`: the store's bytes read (the workers' counters, from the coordinator's `/metrics`) fall at least
//! 3-fold, and every artifact and figure is the same. Before the second run, every worker's cache holds corrupted
//! copies of two of the files it will read: each is found by its digest and fetched again, never used.
//!
//! About 5 minutes on 2 cores: behind `QUANTFARM_LONG` (`scripts/test --long`).

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use common::*;
use quantfarm_e2e::s3::S3Server;
use serde_json::Value;

/// The sum over workers of a per-worker counter on the metrics page.
fn sum_metric(page: &str, metric: &str) -> u64 {
    page.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// What one run gives: the summary, the report, the store bytes the workers read, their logs.
struct Run {
    summary: Value,
    report: Value,
    bytes_read: u64,
    logs: String,
}

fn run(s3: &S3Server, dir: &Path, bucket: &str, key: &Path, release: &Path, cache: bool) -> Run {
    let farm = Farm::new(s3, dir, bucket, key);
    let metrics = format!("127.0.0.1:{}", free_port());
    let _coord = farm.coordinator_with(&["--metrics", &metrics]);
    let workers: Vec<_> = (1..=3)
        .map(|i| {
            let name = format!("w{i}");
            let cache_dir = dir.join(format!("cache-{name}"));
            let extra: Vec<&OsStr> = if cache {
                vec![OsStr::new("--cache-size"), OsStr::new("2GiB"), OsStr::new("--cache-dir"), cache_dir.as_os_str()]
            } else {
                vec![]
            };
            farm.worker_args(&name, &extra)
        })
        .collect();
    let out = farm.cli(&["submit", release.to_str().unwrap(), "--watch", "--json"]);
    let summary = summary(&out);
    assert!(
        summary["state"] == "released" || summary["state"] == "gate_failed",
        "{summary:#}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The workers report their counters with each lease request and heartbeat: wait for a heartbeat after the end.
    std::thread::sleep(Duration::from_millis(1500));
    let page = quantfarm_e2e::http_get(&metrics, "/metrics");
    let bytes_read = sum_metric(&page, "quantfarm_worker_bytes_read_total");
    let rt = rt();
    let report: Value = serde_json::from_slice(&read_object(&rt, summary["report_url"].as_str().unwrap(), s3)).unwrap();
    // Stop the workers (their caches' summaries are logged as they go), then read their logs.
    let logs: Vec<_> = workers.iter().map(|w| w.1.clone()).collect();
    drop(workers);
    let logs = logs.iter().map(|p| std::fs::read_to_string(p).unwrap_or_default()).collect::<Vec<_>>().join("\n");
    Run { summary, report, bytes_read, logs }
}

/// Each artifact's files (name, sha256), verification and figures, as the report gives them.
fn figures(report: &Value) -> Vec<Value> {
    report["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let files: Vec<Value> = a["files"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    let name = f["url"].as_str().unwrap().rsplit('/').next().unwrap().to_string();
                    serde_json::json!([name, f["sha256"]])
                })
                .collect();
            serde_json::json!({
                "name": a["name"], "files": files, "verified": a["verified"],
                "kld": a["kld"], "greedy": a["greedy"], "probes": a["probes"],
            })
        })
        .collect()
}

#[test]
fn the_worker_cache_cuts_store_reads_threefold_with_the_same_artifacts_and_figures() {
    if quantfarm_e2e::skip_unless_long("the_worker_cache_cuts_store_reads", "two farm runs, about 6 minutes") {
        return;
    }
    let _cpu = quantfarm_e2e::cpu_bound();
    let hf = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    s3.upload(&hf, "models", "smollm2-hf");
    let key = keygen(tmp.path());
    let prompts = quantfarm_e2e::prompts(4, tmp.path());
    let text = quantfarm_e2e::fixtures_dir().join("texts/gpl3.txt");
    let probes = quantfarm_e2e::repo_root().join("examples/probes-smollm2.yaml");
    let release = tmp.path().join("release.yaml");
    std::fs::write(
        &release,
        format!(
            "name: smollm2-ladder\nsource: s3://models/smollm2-hf\noutputs:\n  gguf:\n    prefix: SmolLM2-135M\n    \
             quants: [Q8_0, Q6_K, Q4_K_M, Q4_0]\nevaluation:\n  text: {}\n  ctx: 512\n  batch: 512\n  chunks: 6\n  \
             prompts: {}\n  max_tokens: 16\n  probes: {}\n",
            text.display(),
            prompts.display(),
            probes.display()
        ),
    )
    .unwrap();

    let plain = run(&s3, &tmp.path().join("plain"), "plain", &key, &release, false);
    let plain_figures = figures(&plain.report);
    assert_eq!(plain_figures.len(), 5, "BF16 and 4 levels: {plain_figures:#?}");
    for f in &plain_figures[1..] {
        assert!(f["kld"].is_object() && f["greedy"].is_object() && f["probes"].is_object(), "{f:#}");
    }

    // Every worker's cache starts with corrupted copies (right names and sizes, wrong bytes) of the BF16 file and of
    // Q4_K_M's, as a disk fault would leave them.
    let file = |ty: &str| {
        let a = plain.report["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == ty).unwrap().clone();
        (a["files"][0]["sha256"].as_str().unwrap().to_string(), a["files"][0]["bytes"].as_u64().unwrap())
    };
    let cached = tmp.path().join("cached");
    for i in 1..=3 {
        let dir = cached.join(format!("cache-w{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        for ty in ["BF16", "Q4_K_M"] {
            let (sha, bytes) = file(ty);
            std::fs::write(dir.join(&sha), vec![0x5a; bytes as usize]).unwrap();
        }
    }
    let with_cache = run(&s3, &cached, "cached", &key, &release, true);

    // Same artifacts, same verification, same figures.
    assert_eq!(artifact_files(&with_cache.summary), artifact_files(&plain.summary));
    assert_eq!(figures(&with_cache.report), plain_figures);
    assert_eq!(with_cache.summary["state"], plain.summary["state"]);

    // The corrupted entries were found and fetched again, never used (the figures above are the undisturbed
    // run's): each worker that was leased a task reading one says so.
    let refetched = with_cache.logs.matches("cache entry changed on disk").count();
    assert!(refetched >= 2, "no corrupted cache entry was found:\n{}", with_cache.logs);

    // The store's bytes read: at least 3-fold fewer with the cache.
    eprintln!(
        "store bytes read by the workers: {} without the cache, {} with it ({:.1}x fewer); {refetched} corrupted \
         entries refetched",
        plain.bytes_read,
        with_cache.bytes_read,
        plain.bytes_read as f64 / with_cache.bytes_read.max(1) as f64
    );
    assert!(plain.bytes_read > 0 && with_cache.bytes_read > 0);
    assert!(
        plain.bytes_read >= 3 * with_cache.bytes_read,
        "without the cache {} bytes, with it {}: less than 3-fold",
        plain.bytes_read,
        with_cache.bytes_read
    );
}
