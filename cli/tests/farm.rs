//! The farm end to end, as users run it: a real S3 server (s3s-fs), one `quantfarm coordinator` process and three
//! `quantfarm worker` processes, a release of the real SmolLM2 HF checkpoint (uploaded to the bucket) with GGUF
//! BF16 in 3 split files and Q8_0. Checked against the real tools' outputs: convert_hf_to_gguf.py's tensors
//! (`smollm2-hf-bf16.json`), llama-quantize's Q8_0 (`smollm2-q8_0.json`), llama-completion loading the split.
//! Then the same release again with a worker killed (SIGKILL) in the middle of a task and the coordinator killed
//! and restarted: same artifact bytes, and no partial object ever listed in the bucket.

mod common;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use quantfarm_e2e::s3::S3Server;
use quantfarm_store::Location;
use quantfarm_tensors::TensorSource;
use serde_json::Value;
use sha2::{Digest, Sha256};
const RELEASE: &str = "name: smollm2-135m
source: s3://models/smollm2-hf
outputs:
  gguf:
    prefix: SmolLM2-135M
    split: {max_tensors: 100}
    quants: [Q8_0]
";

#[test]
fn farm_release_of_smollm2_over_s3_survives_a_killed_worker_and_a_coordinator_restart() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let hf = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    s3.upload(&hf, "models", "smollm2-hf");
    let rt = rt();
    let key = keygen(tmp.path());
    std::fs::write(tmp.path().join("release.yaml"), RELEASE).unwrap();
    let release = tmp.path().join("release.yaml");
    let release = release.to_str().unwrap();

    // --- Run 1, undisturbed. -----------------------------------------------------------------------------------
    let farm = Farm::new(&s3, &tmp.path().join("run1"), "farm1", &key);
    let _coord = farm.coordinator();
    let _workers: Vec<_> = (1..=3).map(|i| farm.worker(&format!("w{i}"), TOKEN)).collect();

    // A worker with the wrong token is refused, with a message that says why.
    let (mut bad, bad_log) = farm.worker("intruder", "not-the-token");
    let status = bad.0.wait().unwrap();
    assert_eq!(status.code(), Some(2));
    let msg = std::fs::read_to_string(&bad_log).unwrap();
    assert!(msg.contains("token"), "refusal message: {msg}");

    let watch = BucketWatch::start(&s3, "farm1");
    let out = farm.cli(&["submit", release, "--watch", "--json"]);
    // The release has no evaluation section: every artifact is made, verified and signed, but Q8_0 was not
    // measured, so the built-in `measured` gate fails it and `submit --watch` exits 1 (a gate failed).
    assert_eq!(
        out.status.code(),
        Some(1),
        "submit:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let sum1 = summary(&out);
    assert_eq!(sum1["state"], "gate_failed", "{sum1:#}");
    let failed: Vec<&Value> = sum1["gates"].as_array().unwrap().iter().filter(|g| g["passed"] == false).collect();
    assert!(
        failed.iter().any(|g| g["name"] == "measured"
            && g["level"] == "Q8_0"
            && g["detail"].as_str().unwrap().contains("no evaluation.text")),
        "{failed:#?}"
    );
    let final1 = list_bucket(&rt, &s3, "farm1");
    assert_eq!(final1.len(), 11, "6 artifact files, the report, its envelope and 3 views: {final1:?}");
    let listed = watch.check(&final1);
    assert!(listed > 0, "the bucket watch saw nothing during the run");

    // The report verifies against the farm's public key; a tampered copy does not.
    let report_url = sum1["report_url"].as_str().unwrap();
    let report_bytes = read_object(&rt, report_url, &s3);
    let report_path = tmp.path().join("report.json");
    std::fs::write(&report_path, &report_bytes).unwrap();
    let pubkey = format!("{}.pub", key.display());
    let v =
        Command::new(bin()).args(["report", "verify"]).arg(&report_path).args(["--pubkey", &pubkey]).output().unwrap();
    assert_eq!(
        v.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr)
    );
    let mut report: Value = serde_json::from_slice(&report_bytes).unwrap();
    assert_eq!(report["verdict"], "gate_failed");
    assert!(report["tasks"].as_array().unwrap().len() >= 13);
    let sha = report["artifacts"][0]["files"][0]["sha256"].as_str().unwrap().to_string();
    report["artifacts"][0]["files"][0]["sha256"] =
        Value::String(sha.replacen(&sha[..1], if &sha[..1] == "0" { "1" } else { "0" }, 1));
    let tampered = tmp.path().join("tampered.json");
    std::fs::write(&tampered, serde_json::to_vec_pretty(&report).unwrap()).unwrap();
    let v = Command::new(bin()).args(["report", "verify"]).arg(&tampered).output().unwrap();
    assert_eq!(v.status.code(), Some(1), "a tampered report must fail verification");

    // The artifacts: 3 BF16 split files equal to convert_hf_to_gguf.py's tensors, 3 Q8_0 files equal to
    // llama-quantize's.
    let files = artifact_files(&sum1);
    assert_eq!(files.len(), 6, "{files:?}");
    let urls: Vec<String> = sum1["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["files"][0]["url"].as_str().unwrap().to_string())
        .collect();
    assert!(urls[0].ends_with("SmolLM2-135M-BF16-00001-of-00003.gguf"), "{urls:?}");
    assert!(urls[1].ends_with("SmolLM2-135M-Q8_0-00001-of-00003.gguf"), "{urls:?}");
    let loc = |url: &str| {
        let (bucket, key) = url.strip_prefix("s3://").unwrap().split_once('/').unwrap();
        s3.location(bucket, key)
    };
    assert_eq!(
        tensor_hashes(&rt, &loc(&urls[0])),
        manifest("smollm2-hf-bf16.json"),
        "BF16 tensors differ from convert_hf_to_gguf.py's"
    );
    assert_eq!(
        tensor_hashes(&rt, &loc(&urls[1])),
        manifest("smollm2-q8_0.json"),
        "Q8_0 tensors differ from llama-quantize's"
    );

    // llama.cpp loads the split BF16 model and generates.
    let local = tmp.path().join("bf16");
    std::fs::create_dir_all(&local).unwrap();
    let folder = &urls[0][..urls[0].rfind('/').unwrap()];
    let cp = Command::new(bin()).args(["cp", folder]).arg(&local).envs(s3.env()).output().unwrap();
    assert!(cp.status.success(), "{}", String::from_utf8_lossy(&cp.stderr));
    let prompt = "The capital of France is";
    let split = local.join("SmolLM2-135M-BF16-00001-of-00003.gguf");
    let text = quantfarm_e2e::llama_generate(&split, prompt, 8, 2, &["-c", "256"]);
    assert!(text.contains(prompt) && text.len() > prompt.len() + 3, "llama-completion on the split GGUF:\n{text}");

    // --- Run 2: a worker killed mid-task, the coordinator killed and restarted. ----------------------------------
    let farm2 = Farm::new(&s3, &tmp.path().join("run2"), "farm2", &key);
    let mut coord2 = farm2.coordinator();
    let mut workers2: Vec<_> = (1..=3).map(|i| farm2.worker(&format!("w{i}"), TOKEN)).collect();
    let watch = BucketWatch::start(&s3, "farm2");
    let out = farm2.cli(&["submit", release]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // Kill the first worker that starts a quantize task, while it runs.
    let started = regex::Regex::new(r"started task=quantize/\S+").unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    let victim = loop {
        assert!(Instant::now() < deadline, "no worker started a quantize task");
        if let Some(i) =
            workers2.iter().position(|(_, log)| started.is_match(&std::fs::read_to_string(log).unwrap_or_default()))
        {
            break i;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let victim_log = workers2[victim].1.clone();
    let task = wait_log(&victim_log, &started, Duration::from_secs(1)).unwrap();
    let (mut killed, _) = workers2.remove(victim);
    killed.0.kill().unwrap(); // SIGKILL
    killed.0.wait().unwrap();
    let log = std::fs::read_to_string(&victim_log).unwrap();
    let task_id = task.trim_start_matches("started task=");
    assert!(
        !log.lines().any(|l| l.contains("done in") && l.contains(&format!("task={task_id}"))),
        "the victim had already finished {task_id}:\n{log}"
    );
    std::thread::sleep(Duration::from_millis(300));
    coord2.0.kill().unwrap(); // SIGKILL the coordinator too
    coord2.0.wait().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let _coord2b = farm2.coordinator();
    let out = farm2.cli(&["watch", &id, "--json"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "watch after restart:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let sum2 = summary(&out);
    let final2 = list_bucket(&rt, &s3, "farm2");
    assert_eq!(final2.len(), 11, "6 artifact files, the report, its envelope and 3 views: {final2:?}");
    let listed = watch.check(&final2);
    assert!(listed > 0, "the bucket watch saw nothing during the run");
    assert_eq!(artifact_files(&sum2), files, "artifacts differ between the undisturbed and the disturbed run");
    // The killed task was retried: the report shows a second attempt for it.
    let report2: Value = serde_json::from_slice(&read_object(&rt, sum2["report_url"].as_str().unwrap(), &s3)).unwrap();
    let t = report2["tasks"].as_array().unwrap().iter().find(|t| t["id"] == task_id).unwrap();
    assert!(t["attempts"].as_u64().unwrap() >= 2, "{t}");
    assert_ne!(t["worker"].as_str().unwrap(), format!("w{}", victim + 1));
}

#[test]
fn a_worker_drains_on_sigterm_and_another_finishes_the_release() {
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    let key = keygen(tmp.path());
    let farm = Farm::new(&s3, tmp.path(), "drain", &key);
    let _coord = farm.coordinator();
    let (mut w1, log1) = farm.worker("w1", TOKEN);
    let release = tmp.path().join("noop.yaml");
    std::fs::write(&release, "name: drain\nsource: unused\noutputs:\n  noop: {tasks: 2, sleep_ms: 2500}\n").unwrap();
    let out = farm.cli(&["submit", release.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let started = regex::Regex::new(r"started task=noop/\d").unwrap();
    let task = wait_log(&log1, &started, Duration::from_secs(60)).expect("w1 started a task");
    let task_id = task.trim_start_matches("started task=").to_string();
    let kill = Command::new("kill").args(["-TERM", &w1.0.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let status = w1.0.wait().unwrap();
    assert_eq!(status.code(), Some(0), "a draining worker exits cleanly:\n{}", std::fs::read_to_string(&log1).unwrap());
    let log = std::fs::read_to_string(&log1).unwrap();
    assert!(
        log.lines().any(|l| l.contains("done in") && l.contains(&format!("task={task_id}"))),
        "w1 finished {task_id}:\n{log}"
    );
    assert_eq!(started.find_iter(&log).count(), 1, "a draining worker takes no new task:\n{log}");
    // A second worker finishes the release.
    let (_w2, _) = farm.worker("w2", TOKEN);
    let out = farm.cli(&["watch", &id, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let rt = rt();
    let report: Value =
        serde_json::from_slice(&read_object(&rt, summary(&out)["report_url"].as_str().unwrap(), &s3)).unwrap();
    let t = report["tasks"].as_array().unwrap().iter().find(|t| t["id"] == task_id.as_str()).unwrap();
    assert_eq!(t["attempts"], 1, "{t}");
    assert!(t["worker"].as_str().unwrap().starts_with("w1"), "{t}");
}

/// Failures by meaning: a source that is not in the bucket is an input failure. Its task fails once, naming the
/// object, and the release fails at once; no retry is spent on it (a transient failure would be tried
/// `--max-attempts` times, with backoff, and its message would say after how many).
#[test]
fn a_missing_s3_object_fails_its_task_once_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3Server::start();
    std::fs::create_dir_all(s3.root.join("models")).unwrap();
    let key = keygen(tmp.path());
    let farm = Farm::new(&s3, tmp.path(), "missing", &key);
    let _coord = farm.coordinator();
    let (_w, log) = farm.worker("w1", TOKEN);
    let release = tmp.path().join("missing.yaml");
    let source = "s3://models/no-such-model/model.safetensors";
    std::fs::write(&release, format!("name: missing\nsource: {source}\noutputs:\n  gguf: {{quants: [Q8_0]}}\n"))
        .unwrap();
    let out = farm.cli(&["submit", release.to_str().unwrap(), "--watch", "--json"]);
    let sum = summary(&out);
    assert_eq!(sum["state"], "failed", "{sum:#}");
    let error = sum["error"].as_str().unwrap_or_else(|| panic!("no error: {sum:#}"));
    assert!(error.contains(source) && error.contains("not found"), "the error names the object: {error}");
    assert!(error.starts_with("task plan failed: ") && !error.contains("attempts"), "retried: {error}");
    let log = std::fs::read_to_string(&log).unwrap();
    let tries = log.lines().filter(|l| l.contains("started") && l.contains("task=plan")).count();
    assert_eq!(tries, 1, "the plan ran {tries} times:\n{log}");
}

#[test]
fn quantfarm_run_makes_the_readme_example_offline() {
    let tmp = tempfile::tempdir().unwrap();
    let example = quantfarm_e2e::repo_root().join("examples/tiny-llama.yaml");
    let key = tmp.path().join("k");
    let out = Command::new(bin())
        .arg("run")
        .arg(&example)
        .arg("--store")
        .arg(tmp.path().join("data"))
        .env("QUANTFARM_KEY_FILE", &key)
        .env("QUANTFARM_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stderr.contains("made a new signing key at"), "run says where the key is:\n{stderr}");
    assert!(
        stdout.contains("TinyLlama-BF16") && stdout.contains("TinyLlama-Q8_0") && stdout.contains("TinyLlama-Q4_0"),
        "{stdout}"
    );
    for gate in ["reproducible", "measured", "kld", "probes", "q8-near-exact"] {
        assert!(stdout.contains(&format!("gate {gate}: pass")), "{gate}: {stdout}");
    }
    let report = stdout.lines().find_map(|l| l.trim().strip_prefix("signed report: ")).unwrap().to_string();
    // `run` made the key on first use (no public key file): verify against the key recorded in the report, in
    // both forms.
    let envelope = Path::new(&report).with_file_name("report.intoto.json");
    for signed in [Path::new(&report), envelope.as_path()] {
        let v = Command::new(bin()).arg("report").arg("verify").arg(signed).output().unwrap();
        assert_eq!(v.status.code(), Some(0), "{}", String::from_utf8_lossy(&v.stderr));
        assert!(String::from_utf8_lossy(&v.stdout).contains("integrity only"));
    }
    for view in ["report.html", "report.md", "README.md"] {
        let text = std::fs::read_to_string(Path::new(&report).with_file_name(view)).unwrap();
        assert!(text.contains("TinyLlama-Q4"), "{view}: {text}");
    }
    // The synthetic source was written into the store, and a second run is all cache hits with the same bytes.
    assert!(tmp.path().join("data/sources/synthetic").is_dir());
    let again = Command::new(bin())
        .arg("run")
        .arg(&example)
        .arg("--store")
        .arg(tmp.path().join("data"))
        .env("QUANTFARM_KEY_FILE", &key)
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(0));
    let shas = |s: &str| -> BTreeSet<String> {
        s.lines().filter(|l| l.contains(".gguf")).map(|l| l.trim().to_string()).collect()
    };
    assert_eq!(shas(&String::from_utf8_lossy(&again.stdout)), shas(&stdout));
}

/// A release with an importance matrix file and a named recipe (a base file type with llama-quantize's
/// `--tensor-type`, `--token-embedding-type` flags): the Q4_K_M's tensors are llama-quantize's (the fixture's
/// manifest), and the recipe's file is, byte for byte, the one the real llama-quantize makes from the farm's BF16
/// with the same flags and imatrix.
#[test]
fn a_release_with_an_importance_matrix_matches_llama_quantize() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let tmp = tempfile::tempdir().unwrap();
    let hf = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    let imatrix = quantfarm_e2e::fixtures_dir().join("smollm2/imatrix-gpl3.gguf");
    let release = tmp.path().join("release.yaml");
    let recipe = r#"{name: Q4_K_R, base: Q4_K_M, tensor_types: ['blk\.[0-9]\.ffn_down=q8_0', 'attn_(q|k)=iq4_nl'], token_embedding_type: q8_0}"#;
    std::fs::write(
        &release,
        format!(
            "name: smollm2-imat\nsource: {}\noutputs:\n  gguf:\n    quants: [Q4_K_M, {recipe}]\n    imatrix: {{file: {}}}\n",
            hf.display(),
            imatrix.display()
        ),
    )
    .unwrap();
    let out = run_json(&release, tmp.path());
    // No evaluation: made and verified, but not measured, so not released (exit 1).
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let sum = summary(&out);
    let q4 = sum["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == "Q4_K_M").unwrap();
    let url = q4["files"][0]["url"].as_str().unwrap();
    let rt = rt();
    assert_eq!(
        tensor_hashes(&rt, &Location::local(url)),
        manifest("smollm2-imat-q4_k_m.json"),
        "imatrix Q4_K_M tensors differ from llama-quantize's"
    );
    // The quantize.imatrix.* keys are llama-quantize's (the file recorded by its name).
    let meta = rt.block_on(async { TensorSource::open(&Location::local(url)).await.unwrap().metadata() });
    assert_eq!(meta["quantize.imatrix.file"], "imatrix-gpl3.gguf");
    assert_eq!(meta["quantize.imatrix.dataset"], "gpl3.txt");

    // The recipe: the real llama-quantize, run where the imatrix is so that it records the same name.
    let recipe = sum["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == "Q4_K_R").unwrap();
    assert_eq!(recipe["verified"], true, "{recipe:#}");
    let args = recipe["recipe"]["llama_quantize_args"].as_array().unwrap_or_else(|| panic!("{recipe:#}"));
    let args: Vec<&str> = args.iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(
        args,
        [
            "--tensor-type",
            r"blk\.[0-9]\.ffn_down=Q8_0",
            "--tensor-type",
            "attn_(q|k)=IQ4_NL",
            "--token-embedding-type",
            "Q8_0",
            "Q4_K_M"
        ]
    );
    let bf16 = sum["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == "BF16").unwrap();
    let theirs = tmp.path().join("theirs.gguf");
    let bin = quantfarm_e2e::llama_bin();
    let (flags, ftype) = args.split_at(args.len() - 1);
    let q = Command::new(bin.join("llama-quantize"))
        .env("LD_LIBRARY_PATH", &bin)
        .current_dir(imatrix.parent().unwrap())
        .args(["--imatrix", "imatrix-gpl3.gguf"])
        .args(flags)
        .arg(bf16["files"][0]["url"].as_str().unwrap())
        .arg(&theirs)
        .args([ftype[0], "2"])
        .output()
        .unwrap();
    assert!(q.status.success(), "llama-quantize: {}", String::from_utf8_lossy(&q.stderr));
    let sha = hex(&Sha256::digest(std::fs::read(&theirs).unwrap()));
    assert_eq!(recipe["files"][0]["sha256"].as_str(), Some(sha.as_str()), "the recipe's file is not llama-quantize's");
}

/// A release that computes its importance matrix (`imatrix: {text: ...}`): one `imatrix/G` task per chunk group
/// on the workers, merged in chunk order. On 1 and on 3 workers the file is the same bytes, and the same bytes as
/// `quantfarm imatrix` writes in one process; the Q4_K_M made with it is the one `quantfarm quantize --imatrix`
/// makes with that file, and the report names the imatrix, its text and chunks beside the quant. The text's first 6
/// chunks (a group of 4 and a last one of 2, so two `imatrix/G` parts) show the split and the merge; the imatrix's arithmetic over a
/// whole text is checked against llama-imatrix in cli/tests/imatrix.rs. The run on one worker only with
/// QUANTFARM_LONG (`scripts/test --long`): the default run compares the three workers' file with the one process's.
#[test]
fn a_release_computes_its_importance_matrix_the_same_on_1_and_3_workers() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let tmp = tempfile::tempdir().unwrap();
    let hf = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    std::fs::copy(quantfarm_e2e::fixtures_dir().join("texts/gpl3.txt"), tmp.path().join("gpl3.txt")).unwrap();
    let release = tmp.path().join("release.yaml");
    std::fs::write(
        &release,
        format!(
            "name: smollm2-imat\nsource: {}\noutputs:\n  gguf:\n    quants: [Q4_K_M]\n    imatrix: {{text: gpl3.txt, chunks: 6}}\n",
            hf.display()
        ),
    )
    .unwrap();
    let mut runs = Vec::new();
    let long = std::env::var_os("QUANTFARM_LONG").is_some();
    if !long {
        eprintln!("SKIP the 1-worker release: set QUANTFARM_LONG=1 (scripts/test --long) to run it");
    }
    for &workers in if long { &[1, 3][..] } else { &[3][..] } {
        let dir = tmp.path().join(format!("w{workers}"));
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new(bin())
            .arg("run")
            .arg(&release)
            .args(["--workers", &workers.to_string(), "--json", "--store"])
            .arg(dir.join("data"))
            .env("QUANTFARM_KEY_FILE", dir.join("k"))
            .output()
            .unwrap();
        // No evaluation: made and verified, but not measured, so not released (exit 1).
        assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
        let sum = summary(&out);
        let q4 = sum["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == "Q4_K_M").unwrap().clone();
        let im = q4["imatrix"].clone();
        assert_eq!(im["from"], "computed", "{im}");
        assert_eq!((im["chunks"].as_u64(), im["ctx"].as_u64()), (Some(6), Some(512)), "{im}");
        assert!(im["text"].as_str().unwrap().ends_with("gpl3.txt") && im["text_sha256"].as_str().unwrap().len() == 64);
        let bytes = std::fs::read(im["url"].as_str().unwrap()).unwrap();
        assert_eq!(im["sha256"].as_str().unwrap(), hex(&Sha256::digest(&bytes)));
        runs.push((bytes, q4));
    }
    if let [one, three] = &runs[..] {
        assert!(one.0 == three.0, "the imatrix differs between 1 and 3 workers");
        assert_eq!(one.1["files"][0]["sha256"], three.1["files"][0]["sha256"], "the Q4_K_M differs on 1 and 3 workers");
    }
    // One process, same text name: the same bytes.
    let bf16 = quantfarm_e2e::smollm2_derived().join("smollm2-bf16.gguf");
    let local = tmp.path().join("local.gguf");
    let out = Command::new(bin())
        .args(["imatrix", "--model"])
        .arg(&bf16)
        .args(["--text", "gpl3.txt", "--chunks", "6", "--threads", "2", "-o"])
        .arg(&local)
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read(&local).unwrap() == runs[0].0, "the farm's imatrix differs from quantfarm imatrix's");
    let q = tmp.path().join("q4.gguf");
    let out = Command::new(bin())
        .arg("quantize")
        .arg(&bf16)
        .arg(&q)
        .arg("Q4_K_M")
        .arg("--imatrix")
        .arg(&local)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rt = rt();
    let farm_q4 = runs[0].1["files"][0]["url"].as_str().unwrap().to_string();
    assert_eq!(tensor_hashes(&rt, &Location::local(&farm_q4)), tensor_hashes(&rt, &Location::local(&q)));
}

/// A release with an adapter: the farm merges it (one task per safetensors file, one for the side files, each
/// recomputed by a verify task), converts and quantizes the merged checkpoint to GGUF and to MLX 4-bit. The merged
/// file is the bytes `quantfarm merge` writes, and `verify` finds every output identical to its recomputation.
#[test]
fn a_release_with_an_adapter_merges_then_makes_gguf_and_mlx() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let tmp = tempfile::tempdir().unwrap();
    let hf = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    let adapter = quantfarm_e2e::lora_adapter("peft", &hf, tmp.path());
    let release = tmp.path().join("release.yaml");
    std::fs::write(
        &release,
        format!(
            "name: smollm2-tuned\nsource: {}\nadapter: {}\nbase_name: HuggingFaceTB/SmolLM2-135M-Instruct\n\
             outputs:\n  gguf:\n    quants: [Q8_0]\n  mlx:\n    bits: [4]\n",
            hf.display(),
            adapter.display()
        ),
    )
    .unwrap();
    let out = run_json(&release, tmp.path());
    // No evaluation: made and verified, but neither level is measured, so not released (exit 1).
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let sum = summary(&out);
    let artifacts = sum["artifacts"].as_array().unwrap();
    let kinds: Vec<(&str, &str)> =
        artifacts.iter().map(|a| (a["container"].as_str().unwrap(), a["file_type"].as_str().unwrap())).collect();
    assert_eq!(kinds, [("hf", "merged"), ("gguf", "BF16"), ("gguf", "Q8_0"), ("mlx", "MLX-4bit")], "{sum:#}");
    for a in artifacts {
        assert_eq!(a["verified"], true, "{a:#}");
    }
    let url = |ty: &str| {
        let a = artifacts.iter().find(|a| a["file_type"] == ty).unwrap();
        PathBuf::from(a["files"][0]["url"].as_str().unwrap())
    };
    // The merged checkpoint: the file `quantfarm merge` writes; its side files beside it.
    let merged_file = url("merged");
    let merged = merged_file.parent().unwrap().to_path_buf();
    let local = tmp.path().join("merged-locally");
    let m = Command::new(bin())
        .args([OsStr::new("merge"), hf.as_os_str(), adapter.as_os_str(), local.as_os_str()])
        .args(["--base-name", "HuggingFaceTB/SmolLM2-135M-Instruct"])
        .output()
        .unwrap();
    assert!(m.status.success(), "{}", String::from_utf8_lossy(&m.stderr));
    for name in ["model.safetensors", "config.json", "tokenizer.json"] {
        assert_eq!(std::fs::read(merged.join(name)).unwrap(), std::fs::read(local.join(name)).unwrap(), "{name}");
    }
    // Every output, recomputed from its input by `verify`.
    let base_name = "HuggingFaceTB/SmolLM2-135M-Instruct";
    quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(&hf, &merged, Some((&adapter, base_name))));
    quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(&merged, &url("BF16"), None));
    let mlx = url("MLX-4bit");
    assert!(mlx.join("config.json").is_file(), "{}", mlx.display());
    quantfarm_e2e::assert_verified_identical(&quantfarm_e2e::verify(&merged, &mlx, None));
    let mlx_artifact = artifacts.iter().find(|a| a["file_type"] == "MLX-4bit").unwrap();
    assert!(mlx_artifact["bits_per_weight"].as_f64().unwrap() > 4.0, "{mlx_artifact:#}");
}
