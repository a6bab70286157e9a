//! What users see of a release (issue 7's acceptance): a tuned SmolLM2 — the real model with a synthetic PEFT LoRA on
//! its attention (llama.cpp cannot apply an embedding LoRA to a tied model, which the merge check needs) — released
//! as a ladder of GGUF Q8_0, Q6_K, Q4_K_M, Q2_K and MLX 4-bit by `quantfarm run` with two workers. Every artifact has
//! its figures, every gate prints its inputs, and the verdict follows the gates; the report validates against
//! docs/report.schema.json (checked by `jsonschema`), its signature and its DSSE envelope verify (the envelope also
//! by securesystemslib, DSSE's reference implementation) and fail after one flipped byte; report.html loads in
//! headless Chromium with no console error and no request, and its screenshot is kept; the model card names every
//! file with its sha256. A release with `evaluation.skip: [Q4_0]` (the README's tiny example) fails, naming Q4_0.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine as _;
use serde_json::Value;

const LADDER: [&str; 5] = ["Q8_0", "Q6_K", "Q4_K_M", "Q2_K", "MLX-4bit"];

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_quantfarm")
}

fn text() -> PathBuf {
    quantfarm_e2e::fixtures_dir().join("texts/gpl3.txt")
}

fn run(release: &Path, store: &Path, key: &Path) -> Output {
    Command::new(bin())
        .arg("run")
        .arg(release)
        .args(["--workers", "2", "--json", "--store"])
        .arg(store)
        .env("QUANTFARM_KEY_FILE", key)
        .env("QUANTFARM_LLAMA_BIN", quantfarm_e2e::llama_bin())
        .output()
        .unwrap()
}

fn summary(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_else(|| panic!("no output:\n{}", String::from_utf8_lossy(&out.stderr)));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}\n{}", String::from_utf8_lossy(&out.stderr)))
}

/// Probes the tuned model answers within their cap at full precision (its random LoRA makes it talkative: the
/// examples' 48-token suite is all truncated on it). Three of four pass on the reference within 96 tokens, as within
/// 256, and each level's passed/failed/truncated counts are the same at both caps; the fourth runs to the cap on
/// every model, so the cap is what the probe tasks cost.
const PROBES: &str = "name: tuned-smollm2\ndefaults: {max_tokens: 96, thinking: false, repeats: 1}\nprobes:\n\
  - {name: capital-of-france, prompt: What is the capital of France?, expect: {contains: Paris}}\n\
  - {name: sky-colour, prompt: 'What colour is the sky on a clear day? Answer in one word.', expect: {regex: '(?i)blue'}}\n\
  - {name: greeting, prompt: Say hello., expect: {regex: '(?i)hello|hi'}}\n\
  - {name: romeo, prompt: Who wrote Romeo and Juliet?, expect: {contains: Shakespeare}}\n";

/// Greedy agreement (each rung and the merge check) on the first 8 prompts, 16 tokens each: every figure the test
/// reads is there, and each prompt costs a decode per model.
const PROMPTS: usize = 8;

fn release_yaml(hf: &Path, adapter: &Path, prompts: &Path, probes: &Path) -> String {
    format!(
        "name: smollm2-tuned\nsource: {}\nadapter: {}\nbase_name: HuggingFaceTB/SmolLM2-135M-Instruct\n\
         outputs:\n  gguf:\n    prefix: SmolLM2-135M-tuned\n    quants: [Q8_0, Q6_K, Q4_K_M, Q2_K]\n  mlx: {{bits: [4]}}\n\
         evaluation:\n  text: {}\n  ctx: 512\n  chunks: 4\n  prompts: {}\n  max_tokens: 16\n  probes: {}\n  mlx_lm: false\n\
         card: {{license: apache-2.0}}\n\
         gates:\n  - {{name: q8-close, check: 'q8_0.kld.mean <= 0.01'}}\n",
        hf.display(),
        adapter.display(),
        text().display(),
        prompts.display(),
        probes.display(),
    )
}

/// `quantfarm report verify FILE --pubkey KEY`'s exit status and output.
fn verify(file: &Path, pubkey: &Path) -> (i32, String) {
    let out = Command::new(bin())
        .args([OsStr::new("report"), OsStr::new("verify"), file.as_os_str()])
        .arg("--pubkey")
        .arg(pubkey)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

fn python(script: &str, args: &[&OsStr]) -> (i32, String) {
    let py = quantfarm_e2e::check_tools().join("venv-check/bin/python");
    let path = quantfarm_e2e::repo_root().join("tests/py").join(script);
    let out = Command::new(py).arg(&path).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
    )
}

/// The schema is strict (no member it does not name), so a member the report's types add and the schema lacks fails
/// here: `docs/report.example.json` is the coordinator's sample report with every member (a unit test keeps it equal
/// to the types' serialization), and the fixture a report published before the types.
#[test]
fn the_schema_names_every_member_of_the_report_types() {
    let root = quantfarm_e2e::repo_root();
    let schema = root.join("docs/report.schema.json");
    for doc in ["docs/report.example.json", "coordinator/tests/fixtures/report-tiny-llama/report.json"] {
        let (rc, msg) = python("check_schema.py", &[schema.as_os_str(), root.join(doc).as_os_str()]);
        assert_eq!(rc, 0, "{doc} against docs/report.schema.json:\n{msg}");
    }
}

#[test]
fn a_tuned_smollm2_ladder_is_gated_signed_and_shown() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    let adapter = quantfarm_e2e::lora_adapter("peft-attn", &hf, tmp.path());
    let key = tmp.path().join("farm.key");
    assert!(Command::new(bin()).arg("keygen").arg(&key).output().unwrap().status.success());
    let pubkey = tmp.path().join("farm.key.pub");
    let store = tmp.path().join("data");
    let release = tmp.path().join("release.yaml");
    let probes = tmp.path().join("probes.yaml");
    std::fs::write(&probes, PROBES).unwrap();
    let prompts = quantfarm_e2e::prompts(PROMPTS, tmp.path());
    std::fs::write(&release, release_yaml(&hf, &adapter, &prompts, &probes)).unwrap();

    let out = run(&release, &store, &key);
    let sum = summary(&out);
    let gates =
        sum["gates"].as_array().unwrap_or_else(|| panic!("{sum:#}\n{}", String::from_utf8_lossy(&out.stderr))).clone();
    let all_pass = gates.iter().all(|g| g["passed"] == true);
    // The verdict and the exit status follow the gates.
    assert_eq!(sum["state"], if all_pass { "released" } else { "gate_failed" }, "{sum:#}");
    assert_eq!(out.status.code(), Some(if all_pass { 0 } else { 1 }), "{}", String::from_utf8_lossy(&out.stderr));
    for g in &gates {
        eprintln!("gate {} {}: {} — {}", g["name"], g["level"], g["passed"], g["detail"]);
        assert!(g["inputs"].as_object().is_some_and(|i| !i.is_empty()), "a gate without inputs: {g:#}");
        assert!(g["check"].is_string() && g["detail"].is_string() && g["passed"].is_boolean(), "{g:#}");
    }

    // Every rung has its figures, and its three per-level gates.
    let artifacts = sum["artifacts"].as_array().unwrap();
    for level in LADDER {
        let a = artifacts.iter().find(|a| a["file_type"] == level).unwrap_or_else(|| panic!("no {level}: {sum:#}"));
        let k = &a["kld"];
        assert!(k["mean_kld"].as_f64().is_some_and(|m| m > 0.0), "{level}: {k:#}");
        assert_eq!(k["n_chunks"], 4, "{level}: {k:#}");
        assert_eq!(a["greedy"]["n"], PROMPTS, "{level}: {a:#}");
        let p = &a["probes"];
        let runs = ["passed", "failed", "truncated"].iter().map(|k| p[*k].as_u64().unwrap()).sum::<u64>();
        assert_eq!(runs, 4, "{level}: every probe ran once: {p:#}");
        assert_eq!(a["verified"], true, "{level}");
        for name in ["measured", "kld", "probes"] {
            let g = gates.iter().find(|g| g["name"] == name && g["level"] == level);
            assert!(g.is_some(), "no {name} gate for {level}");
        }
        let measured = gates.iter().find(|g| g["name"] == "measured" && g["level"] == level).unwrap();
        assert_eq!(measured["passed"], true, "{measured:#}");
        eprintln!(
            "{level}: {} bytes, mean KLD {:.6} ± {:.6}, same top {:.2} %, greedy {}/{PROMPTS}, probes {}",
            a["bytes"],
            k["mean_kld"].as_f64().unwrap(),
            k["mean_kld_unc"].as_f64().unwrap(),
            k["same_top_p"].as_f64().unwrap(),
            a["greedy"]["identical"],
            a["probes"]["mean_score"]
        );
    }
    // The KLD gates' inputs are the artifacts' figures; the merge check measured link 1.
    let q4 = artifacts.iter().find(|a| a["file_type"] == "Q4_K_M").unwrap();
    let g = gates.iter().find(|g| g["name"] == "kld" && g["level"] == "Q4_K_M").unwrap();
    assert_eq!(g["inputs"]["kld.mean"], q4["kld"]["mean_kld"], "{g:#}");
    assert_eq!(g["threshold"], 0.1, "the default limit for Q4_K_M: {g:#}");
    let merge = gates.iter().find(|g| g["name"] == "merge").expect("the default merge gate (an adapter)");
    assert_eq!(merge["passed"], true, "{merge:#}");
    assert_eq!(sum["merge_check"]["greedy"]["identical"], PROMPTS, "{:#}", sum["merge_check"]);
    // The identity chain names the adapter by content: each of its files with its sha256.
    let report = sum_report(Path::new(sum["report_url"].as_str().unwrap()));
    let adapter_files = report["adapter"]["files"].as_array().unwrap_or_else(|| panic!("{:#}", report["adapter"]));
    let weights =
        adapter_files.iter().find(|f| f["url"].as_str().unwrap().ends_with("adapter_model.safetensors")).unwrap();
    let sum_out = Command::new("sha256sum").arg(adapter.join("adapter_model.safetensors")).output().unwrap();
    let want = String::from_utf8_lossy(&sum_out.stdout).split_whitespace().next().unwrap_or("").to_string();
    assert_eq!(weights["sha256"].as_str(), Some(want.as_str()), "{weights:#}");

    // report.json: valid against the published schema; its signature and its envelope verify against the farm's key.
    let report_path = PathBuf::from(sum["report_url"].as_str().unwrap());
    let dir = report_path.parent().unwrap().to_path_buf();
    let schema = quantfarm_e2e::repo_root().join("docs/report.schema.json");
    let (rc, msg) = python("check_schema.py", &[schema.as_os_str(), report_path.as_os_str()]);
    assert_eq!(rc, 0, "report.json against docs/report.schema.json:\n{msg}");
    // The paired comparisons: every figure recomputed with NumPy (and mpmath's Student t) from the per-token values
    // file published beside report.json; each rung measured in llama.cpp is in it, each against the next larger.
    let oracle = Command::new(quantfarm_e2e::convert_python())
        .arg(quantfarm_e2e::repo_root().join("tests/py/paired_oracle.py"))
        .arg(&report_path)
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&oracle.stdout), String::from_utf8_lossy(&oracle.stderr));
    assert!(oracle.status.success(), "paired_oracle.py:\n{said}");
    let measured = artifacts.iter().filter(|a| a["kld"]["mean_kld"].is_number()).count();
    assert!(said.contains(&format!("{measured} rungs, {} pairs compared, 0 problems", measured - 1)), "{said}");
    eprintln!("{said}");
    let envelope = dir.join("report.intoto.json");
    for f in [&report_path, &envelope] {
        let (rc, msg) = verify(f, &pubkey);
        assert_eq!(rc, 0, "{msg}");
        assert!(msg.contains("authorship and integrity"), "{msg}");
    }
    let public = std::fs::read_to_string(&pubkey).unwrap();
    let (rc, msg) = python("verify_dsse.py", &[envelope.as_os_str(), OsStr::new(public.trim())]);
    assert_eq!(rc, 0, "securesystemslib: {msg}");
    let n_files: usize = artifacts.iter().map(|a| a["files"].as_array().unwrap().len()).sum();
    assert!(msg.contains(&format!("\"subjects\": {n_files}")), "every artifact file is a subject ({n_files}): {msg}");

    // One flipped byte: a digit of a figure in report.json, a byte of the statement inside the envelope.
    let bytes = std::fs::read(&report_path).unwrap();
    let at = bytes.windows(13).position(|w| w == b"\"mean_kld\":0.").unwrap() + 13;
    let mut flipped = bytes.clone();
    flipped[at] = b'0' + (flipped[at] - b'0' + 1) % 10;
    let tampered = tmp.path().join("tampered.json");
    std::fs::write(&tampered, &flipped).unwrap();
    let (rc, msg) = verify(&tampered, &pubkey);
    assert_eq!(rc, 1, "a flipped byte in report.json verified:\n{msg}");
    let mut env: Value = serde_json::from_slice(&std::fs::read(&envelope).unwrap()).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut payload = b64.decode(env["payload"].as_str().unwrap()).unwrap();
    let at = payload.windows(9).position(|w| w == b"\"verdict\"").unwrap() + 11;
    payload[at] ^= 0x01;
    env["payload"] = Value::String(b64.encode(&payload));
    let tampered_env = tmp.path().join("tampered.intoto.json");
    std::fs::write(&tampered_env, serde_json::to_vec(&env).unwrap()).unwrap();
    let (rc, msg) = verify(&tampered_env, &pubkey);
    assert_eq!(rc, 1, "a flipped byte in the DSSE payload verified:\n{msg}");
    let (rc, msg) = python("verify_dsse.py", &[tampered_env.as_os_str(), OsStr::new(public.trim())]);
    assert_eq!(rc, 1, "securesystemslib accepted a flipped payload: {msg}");

    // report.html in headless Chromium: no console error, no page error, nothing fetched; a screenshot.
    let tools = quantfarm_e2e::check_tools();
    let shots = quantfarm_e2e::cache_dir().join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join("smollm2-tuned-report.png");
    let page = Command::new("node")
        .arg(quantfarm_e2e::repo_root().join("tests/js/render-page.mjs"))
        .arg(dir.join("report.html"))
        .arg(&shot)
        .env("PLAYWRIGHT_CORE", tools.join("node-check"))
        .output()
        .unwrap();
    let page_out = String::from_utf8_lossy(&page.stdout);
    assert_eq!(page.status.code(), Some(0), "{page_out}\n{}", String::from_utf8_lossy(&page.stderr));
    let loaded: Value = serde_json::from_str(page_out.trim()).unwrap();
    assert_eq!(loaded["svgs"], 5, "ladder, percentiles, same-top-p, greedy, probes: {loaded}");
    assert!(std::fs::metadata(&shot).unwrap().len() > 20_000, "a real screenshot");
    eprintln!("report.html screenshot: {}", shot.display());

    // The model card: front matter, every file with its sha256; report.md has the gate table.
    let card = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(
        card.starts_with("---\nlicense: \"apache-2.0\"\nbase_model: \"HuggingFaceTB/SmolLM2-135M-Instruct\"\n"),
        "{card}"
    );
    for a in artifacts {
        for f in a["files"].as_array().unwrap() {
            assert!(card.contains(f["sha256"].as_str().unwrap()), "{} not in the card", f["url"]);
        }
    }
    let text_sha = &sum_report(&report_path)["evaluation"]["text_sha256"];
    assert!(card.contains(text_sha.as_str().unwrap()), "the dataset's checksum");
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert_eq!(md.matches("| measured |").count(), LADDER.len(), "{md}");

    // A release with a level skipped: it is made, not measured, and the release fails naming it. The README's tiny
    // example shows it: the `measured` gate reads the report, whatever the model.
    let examples = quantfarm_e2e::repo_root().join("examples");
    let tiny_dir = tmp.path().join("tiny");
    std::fs::create_dir_all(tiny_dir.join("texts")).unwrap();
    for f in ["texts/mill.txt", "prompts-20.json", "probes-tiny.yaml"] {
        std::fs::copy(examples.join(f), tiny_dir.join(f)).unwrap();
    }
    let tiny = std::fs::read_to_string(examples.join("tiny-llama.yaml")).unwrap();
    assert!(tiny.contains("\nevaluation:\n"), "the example changed: {tiny}");
    let skipped = tiny_dir.join("skip.yaml");
    std::fs::write(&skipped, tiny.replace("\nevaluation:\n", "\nevaluation:\n  skip: [Q4_0]\n")).unwrap();
    let out = run(&skipped, &tiny_dir.join("data"), &key);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let sum = summary(&out);
    assert_eq!(sum["state"], "gate_failed");
    let failed: Vec<&Value> = sum["gates"].as_array().unwrap().iter().filter(|g| g["passed"] == false).collect();
    let m = failed.iter().find(|g| g["name"] == "measured").unwrap_or_else(|| panic!("{failed:#?}"));
    assert_eq!(m["level"], "Q4_0", "{m:#}");
    let detail = m["detail"].as_str().unwrap();
    assert!(detail.starts_with("Q4_0: not measured") && detail.contains("evaluation.skip"), "{detail}");
    let q4 = sum["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == "Q4_0").unwrap();
    assert!(q4["kld"].is_null() && q4["verified"] == true, "made and verified, not measured: {q4:#}");
}

/// The README's tiny example in `dir` (its release file, texts, prompts, probes and the project's question set) and
/// a farm key there: (the key's path, the release file's text).
fn tiny_example(dir: &Path) -> (PathBuf, String) {
    let examples = quantfarm_e2e::repo_root().join("examples");
    std::fs::create_dir_all(dir.join("texts")).unwrap();
    for f in ["tiny-llama.yaml", "texts/mill.txt", "prompts-20.json", "probes-tiny.yaml", "choice-basics.yaml"] {
        std::fs::copy(examples.join(f), dir.join(f)).unwrap();
    }
    let key = dir.join("farm.key");
    assert!(Command::new(bin()).arg("keygen").arg(&key).output().unwrap().status.success());
    (key, std::fs::read_to_string(dir.join("tiny-llama.yaml")).unwrap())
}

/// `quantfarm report diff` of two releases of the README's tiny model that differ in one rung only (a recipe's
/// `ffn_down` type): that rung, and only it, changed (its files, its tensor types, its KL divergence paired token by
/// token, recomputed by NumPy from the two published values files); every other rung the same bytes with a ΔKLD of 0
/// on every token; the markdown and HTML say so.
#[test]
fn a_release_diff_shows_exactly_the_rung_that_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let (key, tiny) = tiny_example(tmp.path());
    let quants = "    quants: [Q8_0, Q4_0]\n";
    assert!(tiny.contains(quants), "the example changed: {tiny}");
    // Both in one store: the new release names the old one in `evaluation.compare_with`.
    let report_of = |name: &str, ffn_down: &str, compare_with: &str| -> (PathBuf, String) {
        let spec = tmp.path().join(format!("{name}.yaml"));
        let rung =
            format!("    quants: [Q8_0, Q4_0, {{name: Q4_X, base: Q4_0, tensor_types: {{ffn_down: {ffn_down}}}}}]\n");
        let yaml = tiny.replace(quants, &rung).replace("\nevaluation:\n", &format!("\nevaluation:\n{compare_with}"));
        std::fs::write(&spec, yaml).unwrap();
        let out = run(&spec, &tmp.path().join("data"), &key);
        let sum = summary(&out);
        assert_eq!(sum["state"], "released", "{sum:#}");
        (PathBuf::from(sum["report_url"].as_str().unwrap()), sum["release_id"].as_str().unwrap().to_string())
    };
    let (old, old_id) = report_of("old", "Q8_0", "");
    let (new, _) = report_of("new", "Q5_0", &format!("  compare_with: releases/{old_id}\n"));
    let (json, html) = (tmp.path().join("diff.json"), tmp.path().join("diff.html"));
    let out = Command::new(bin())
        .args([OsStr::new("report"), OsStr::new("diff"), old.as_os_str(), new.as_os_str()])
        .arg("--json")
        .arg(&json)
        .arg("--html")
        .arg(&html)
        .output()
        .unwrap();
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{md}{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{md}");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!((d["paired"].as_bool(), d["same_reference"].as_bool()), (Some(true), Some(true)), "{d:#}");
    let rungs = d["rungs"].as_array().unwrap();
    let changed: Vec<&str> =
        rungs.iter().filter(|r| r["changed"] == true).map(|r| r["file_type"].as_str().unwrap()).collect();
    assert_eq!(changed, ["Q4_X"], "{d:#}");
    for r in rungs {
        let ty = r["file_type"].as_str().unwrap();
        assert_eq!(r["presence"], "both", "{r:#}");
        if ty == "Q4_X" {
            assert!(r["files_changed"] == true && !r["types"].as_array().unwrap().is_empty(), "{r:#}");
            assert!(r["delta"]["mean"].as_f64().is_some_and(|m| m != 0.0), "{r:#}");
        } else {
            assert!(r["files_changed"] == false && r["types"].as_array().unwrap().is_empty(), "{r:#}");
            if ty != "BF16" {
                let zero = ["mean", "low", "high"].iter().all(|k| r["delta"][*k].as_f64() == Some(0.0));
                assert!(zero, "{ty}: the same bytes on the same base logits: {r:#}");
            }
        }
    }
    assert!(md.contains("Changed: Q4_X.") && md.contains("| Q8\\_0 (unchanged) | same bytes |"), "{md}");
    assert!(std::fs::read_to_string(&html).unwrap().contains("<td>Q4_X (changed)</td>"));
    // The new report holds the same diff (made by the coordinator from the old report in its store and the new
    // report's values in memory), and its views show it.
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&new).unwrap()).unwrap();
    // (As the types read them: the canonical JSON writes 0.0 as 0.)
    let as_diff = |v: &Value| serde_json::from_value::<quantfarm_report::diff::ReleaseDiff>(v.clone()).unwrap();
    assert_eq!(as_diff(&report["comparison"]), as_diff(&d), "the report's comparison is `report diff`'s");
    let report_md = std::fs::read_to_string(new.with_file_name("report.md")).unwrap();
    assert!(report_md.contains(&format!("## Since tiny-llama ({old_id})")) && report_md.contains("Changed: Q4_X."));
    // The paired ΔKLD of every rung, recomputed with NumPy from the two releases' values files.
    let oracle = Command::new(quantfarm_e2e::convert_python())
        .arg(quantfarm_e2e::repo_root().join("tests/py/paired_oracle.py"))
        .args([OsStr::new("--diff"), old.as_os_str(), new.as_os_str(), json.as_os_str()])
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&oracle.stdout), String::from_utf8_lossy(&oracle.stderr));
    assert!(oracle.status.success() && said.contains("3 rungs paired, 0 problems"), "{said}");
}

/// `evaluation.choices` in a release of the README's tiny model: every rung and the reference scored, each task's
/// right or wrong exactly as `llama-perplexity --multiple-choice` scores the same GGUF file on the same tasks (its
/// running accuracy after each task), the answers changed against the reference's in the report and its views,
/// and `measured` requiring them.
#[test]
fn a_release_scores_its_multiple_choice_tasks_as_llama_perplexity() {
    let tmp = tempfile::tempdir().unwrap();
    let (key, tiny) = tiny_example(tmp.path());
    let spec = tmp.path().join("choices.yaml");
    std::fs::write(&spec, tiny.replace("\nevaluation:\n", "\nevaluation:\n  choices: choice-basics.yaml\n")).unwrap();
    let sum = summary(&run(&spec, &tmp.path().join("data"), &key));
    assert_eq!(sum["state"], "released", "{sum:#}");
    let report_path = PathBuf::from(sum["report_url"].as_str().unwrap());
    let report = sum_report(&report_path);
    // The task file llama-perplexity reads: the same question set, packed.
    let packed = tmp.path().join("basics.bin");
    let pack = Command::new(bin())
        .args([OsStr::new("choice"), OsStr::new("pack"), tmp.path().join("choice-basics.yaml").as_os_str()])
        .arg(&packed)
        .output()
        .unwrap();
    assert!(pack.status.success(), "{}", String::from_utf8_lossy(&pack.stderr));
    let tasks = report["tasks"].as_array().unwrap();
    let mut scored = 0;
    for t in tasks.iter().filter(|t| t["id"].as_str().is_some_and(|id| id.starts_with("choice/"))) {
        let model = t["inputs"]["model"].as_str().unwrap();
        let ours: Vec<bool> = t["outputs"]["correct"].as_array().unwrap().iter().map(|c| c == true).collect();
        let args = [OsStr::new("-m"), OsStr::new(model), OsStr::new("-bf"), packed.as_os_str()];
        let more = ["--multiple-choice", "-t", "2"].map(OsStr::new);
        let all: Vec<&OsStr> = args.iter().chain(&more).copied().collect();
        let text = quantfarm_e2e::llama_perplexity_output(&all, |t| t.contains("Random chance:"));
        // Its running accuracy after task i (percent): task i was right when the count of right answers rose.
        let mut theirs = Vec::new();
        let mut before = 0i64;
        for l in text.lines() {
            let f: Vec<&str> = l.trim().split('\t').collect();
            if let [i, acc] = f[..] {
                if let (Ok(i), Ok(acc)) = (i.parse::<i64>(), acc.parse::<f64>()) {
                    let right = (acc * i as f64 / 100.0).round() as i64;
                    theirs.push(right > before);
                    before = right;
                }
            }
        }
        // Every task it printed (its last lines can be lost at exit: `llama_perplexity_output`), most of them at least.
        assert!(theirs.len() >= 16, "{}: llama-perplexity printed {} task lines:\n{text}", t["id"], theirs.len());
        assert_eq!(ours[..theirs.len()], theirs[..], "{}: each task right or wrong as llama-perplexity", t["id"]);
        scored += 1;
    }
    assert_eq!(scored, 3, "the reference, Q8_0 and Q4_0");
    let q4 = sum["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == "Q4_0").unwrap();
    let c = &q4["choices"];
    assert!(c["changed"].is_array() && c["n_tasks"] == 32, "{c:#}");
    let measured = sum["gates"].as_array().unwrap().iter().find(|g| g["name"] == "measured").unwrap();
    assert!(measured["inputs"]["choice.accuracy"].is_number(), "{measured:#}");
    let md = std::fs::read_to_string(report_path.with_file_name("report.md")).unwrap();
    assert!(md.contains("## Multiple choice") && md.contains("| TinyLlama-Q4\\_0 |"), "{md}");
}

/// A GGUF made outside the farm (llama-quantize's own Q5_0 of the farm's BF16, as a publisher's file would be), named
/// in `evaluation.peers`: scored against the farm's base logits with the figures `llama-perplexity --kl-divergence`
/// prints for it on the same text and chunks, described (sha256, size, types) and set beside the farm's rung of
/// nearest size with a paired difference.
#[test]
fn a_third_party_gguf_is_scored_on_the_farms_scale() {
    let tmp = tempfile::tempdir().unwrap();
    let (key, tiny) = tiny_example(tmp.path());
    let first = summary(&run(&tmp.path().join("tiny-llama.yaml"), &tmp.path().join("data"), &key));
    assert_eq!(first["state"], "released", "{first:#}");
    let bf16 = first["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == "BF16").unwrap();
    let bf16 = PathBuf::from(bf16["files"][0]["url"].as_str().unwrap());
    let llama = quantfarm_e2e::llama_bin();
    let elsewhere = tmp.path().join("elsewhere-Q5_0.gguf");
    let q = Command::new(llama.join("llama-quantize")).arg(&bf16).arg(&elsewhere).arg("Q5_0").output().unwrap();
    assert!(q.status.success(), "llama-quantize: {}", String::from_utf8_lossy(&q.stderr));
    let spec = tmp.path().join("third-party.yaml");
    let peers = format!("\nevaluation:\n  peers: [{}]\n", elsewhere.display());
    std::fs::write(&spec, tiny.replace("\nevaluation:\n", &peers)).unwrap();
    let sum = summary(&run(&spec, &tmp.path().join("data"), &key));
    assert_eq!(sum["state"], "released", "{sum:#}");
    let report = sum_report(Path::new(sum["report_url"].as_str().unwrap()));
    let t = &report["third_party"][0];
    assert_eq!(t["file"]["bytes"], std::fs::metadata(&elsewhere).unwrap().len(), "{t:#}");
    let sha = Command::new("sha256sum").arg(&elsewhere).output().unwrap();
    let sha = String::from_utf8_lossy(&sha.stdout).split_whitespace().next().unwrap_or_default().to_string();
    assert_eq!(t["file"]["sha256"].as_str(), Some(sha.as_str()), "{t:#}");
    assert!(t["type_mix"].as_array().unwrap().iter().any(|m| m["type"] == "Q5_0"), "{t:#}");
    assert!(t["nearest"].is_string() && t["paired"]["mean"].is_number(), "{t:#}");
    // llama-perplexity on the same file, text and chunking (-c 128, -b 2048: the example's evaluation).
    let base = tmp.path().join("base.kld");
    let text = tmp.path().join("texts/mill.txt");
    let chunking = ["-c", "128", "-b", "2048", "-t", "2"];
    let b = Command::new(llama.join("llama-perplexity"))
        .arg("-m")
        .arg(&bf16)
        .arg("-f")
        .arg(&text)
        .args(chunking)
        .arg("--kl-divergence-base")
        .arg(&base)
        .output()
        .unwrap();
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    let mut args = vec![OsStr::new("-m"), elsewhere.as_os_str()];
    args.extend(chunking.map(OsStr::new));
    args.extend([OsStr::new("--kl-divergence-base"), base.as_os_str(), OsStr::new("--kl-divergence")]);
    let printed = quantfarm_e2e::llama_perplexity_output(&args, |t| t.contains("Same top p:"));
    let figure = |label: &str| -> f64 {
        // The figure's own line: the label, then (after spaces) its colon.
        let own = |l: &&str| l.split_once(label).is_some_and(|(_, rest)| rest.trim_start().starts_with(':'));
        let line = printed.lines().find(own).unwrap_or_else(|| panic!("no {label}: {printed}"));
        let after = line.split(':').nth(1).unwrap_or_default();
        after.split_whitespace().next().unwrap_or_default().parse().unwrap_or_else(|_| panic!("{line}"))
    };
    let k = &t["kld"];
    for (label, ours, digits) in [
        ("Mean    KLD", k["mean_kld"].as_f64().unwrap(), 6),
        ("Same top p", k["same_top_p"].as_f64().unwrap(), 3),
        ("Mean PPL(Q)", k["mean_ppl_q"].as_f64().unwrap(), 6),
    ] {
        assert_eq!(format!("{ours:.digits$}"), format!("{:.digits$}", figure(label)), "{label}: {printed}");
    }
}

/// `evaluation.stop` on the README's tiny model over 24 chunks of 128 tokens (one chunk per task): the same verdict
/// and gates as the same release measured whole; each rung either stopped early, measured on fewer chunks with an
/// interval that holds its full-text mean (the whole release's figure), or, when a gate reads a figure only the whole
/// text gives (a percentile), complete with exactly the whole release's figures; no `kld` task exists for a chunk a
/// rung never reached, and base logits only for chunks some rung reached.
#[test]
fn a_stopped_rung_keeps_its_verdict_and_measures_less() {
    let tmp = tempfile::tempdir().unwrap();
    let (key, tiny) = tiny_example(tmp.path());
    let examples = quantfarm_e2e::repo_root().join("examples");
    std::fs::copy(examples.join("texts/python-reference.txt"), tmp.path().join("texts/python-reference.txt")).unwrap();
    let eval = "  text: texts/mill.txt     # KL divergence on this text, chunks of 128 tokens\n  ctx: 128\n";
    assert!(tiny.contains(eval), "the example changed: {tiny}");
    let release = |name: &str, stop: &str, gate: &str| -> (Value, PathBuf) {
        let spec = tmp.path().join(format!("{name}.yaml"));
        let text = format!("  text: texts/python-reference.txt\n  ctx: 128\n  batch: 128\n  chunks: 24\n{stop}");
        let yaml = tiny.replace(eval, &text).replace("name: tiny-llama", &format!("name: {name}"));
        std::fs::write(&spec, yaml.replace("\ngates:\n", &format!("\ngates:\n{gate}"))).unwrap();
        let sum = summary(&run(&spec, &tmp.path().join("data"), &key));
        assert_eq!(sum["state"], "released", "{sum:#}");
        let path = PathBuf::from(sum["report_url"].as_str().unwrap());
        (sum_report(&path), path)
    };
    let (whole, _) = release("whole", "", "");
    let (stopped, stopped_path) = release("stopped", "  stop: {confidence: 0.99}\n", "");
    assert!(whole.get("sequential").is_none(), "no section without evaluation.stop");
    let verdicts = |r: &Value| -> Vec<(String, String, bool)> {
        let gates = r["gates"].as_array().unwrap().iter();
        gates.map(|g| (g["name"].to_string(), g["level"].to_string(), g["passed"] == true)).collect()
    };
    assert_eq!(verdicts(&whole), verdicts(&stopped), "the same gates, the same verdicts");
    let kld = |r: &Value, ty: &str| -> Value {
        let a = r["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == ty).unwrap();
        a["kld"].clone()
    };
    let ids: Vec<String> =
        stopped["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_string()).collect();
    let seq = &stopped["sequential"];
    assert_eq!(seq["chunks_per_group"], 1, "{seq:#}");
    let mut early = 0;
    let mut reached = 0;
    for r in seq["rungs"].as_array().unwrap() {
        let ty = r["file_type"].as_str().unwrap();
        let (chunks, of) = (r["chunks"].as_u64().unwrap(), r["of_chunks"].as_u64().unwrap());
        assert_eq!(of, 24, "{r:#}");
        let full = kld(&whole, ty)["mean_kld"].as_f64().unwrap();
        let part = kld(&stopped, ty);
        assert_eq!(part["n_chunks"].as_u64(), Some(chunks), "{ty}: the figures are the measured chunks' ({part:#})");
        assert_eq!(ids.iter().filter(|i| i.starts_with(&format!("kld/{ty}/"))).count() as u64, chunks, "{ty}");
        reached = reached.max(chunks);
        match r["stopped"].as_str() {
            Some("decided") => {
                early += 1;
                assert!(chunks < of, "{r:#}");
                let (low, high) = (r["low"].as_f64().unwrap(), r["high"].as_f64().unwrap());
                assert!(
                    low <= full && full <= high,
                    "{ty}: the interval [{low}, {high}] misses the whole text's {full}"
                );
                assert_eq!(part["mean_kld"].as_f64(), r["mean"].as_f64(), "{r:#}");
                let thresholds = r["thresholds"].as_array().unwrap();
                assert!(
                    !thresholds.is_empty()
                        && thresholds.iter().all(|t| {
                            let t = t.as_f64().unwrap();
                            t < low || t > high
                        }),
                    "{r:#}"
                );
            }
            Some("complete") => {
                assert_eq!(chunks, of, "{r:#}");
                assert_eq!(part, kld(&whole, ty), "{ty}: measured whole, exactly the whole release's figures");
            }
            other => panic!("{ty}: stopped {other:?}: {r:#}"),
        }
    }
    assert!(early > 0, "some rung stops early on this text: {seq:#}");
    let bases = ids.iter().filter(|i| i.starts_with("kld-base/")).count() as u64;
    assert!(bases == reached && reached < 24, "base logits exactly for the {reached} chunks some rung reached");
    // A gate on a figure only the whole text gives (a percentile): that rung is measured whole, with exactly the
    // whole release's figures, and the report says why.
    let gate = "  - {name: q4-tail, check: \"q4_0.kld.p99 <= 10\"}\n";
    let (tailed, _) = release("tailed", "  stop: {confidence: 0.99}\n", gate);
    let rung = |r: &Value, ty: &str| -> Value {
        r["sequential"]["rungs"].as_array().unwrap().iter().find(|x| x["file_type"] == ty).unwrap().clone()
    };
    let q4 = rung(&tailed, "Q4_0");
    assert_eq!((q4["stopped"].as_str(), q4["chunks"].as_u64()), (Some("complete"), Some(24)), "{q4:#}");
    assert!(q4["note"].as_str().is_some_and(|n| n.contains("q4-tail") && n.contains("kld.p99")), "{q4:#}");
    assert_eq!(kld(&tailed, "Q4_0"), kld(&whole, "Q4_0"), "measured whole: exactly the whole release's figures");
    assert_eq!(rung(&tailed, "Q8_0")["stopped"], "decided");
    // The views say it.
    let md = std::fs::read_to_string(stopped_path.with_file_name("report.md")).unwrap();
    assert!(md.contains("## Sequential measurement"), "{md}");
}

fn sum_report(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The i-quant ladder through the farm (issue 25): SmolLM2 with an importance matrix the farm computes, the rungs
/// Q4_K_M, IQ4_XS, IQ3_M, IQ3_XXS, IQ2_M and a named recipe, each verified, measured (KL divergence, probes) and
/// byte for byte the file `llama-quantize` makes from the farm's GGUF BF16 with the farm's imatrix (and, for the
/// recipe, its flags); the recipe is in the report and the model card; the ladder chart joins the GGUF rungs in order
/// of size. Minutes on 2 cores, so only with QUANTFARM_LONG (`scripts/test --long`); the default run makes a recipe
/// through the farm in cli/tests/farm.rs.
#[test]
fn an_i_quant_ladder_with_a_recipe_and_a_farm_imatrix_is_measured_and_equals_llama_quantize() {
    if quantfarm_e2e::skip_unless_long("an_i_quant_ladder_with_a_recipe", "the i-quant farm ladder takes minutes") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let hf = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    let key = tmp.path().join("farm.key");
    assert!(Command::new(bin()).arg("keygen").arg(&key).output().unwrap().status.success());
    let probes = tmp.path().join("probes.yaml");
    std::fs::write(&probes, PROBES).unwrap();
    let release = tmp.path().join("release.yaml");
    let recipe = r#"{name: Q3_K_XL, base: IQ3_XXS, tensor_types: {'blk\.(0|1|2)\.ffn_down': q6_k, attn_v: q8_0}, token_embedding_type: q8_0}"#;
    std::fs::write(
        &release,
        format!(
            "name: smollm2-iq\nsource: {}\noutputs:\n  gguf:\n    prefix: SmolLM2-135M\n    \
             quants: [Q4_K_M, IQ4_XS, IQ3_M, IQ3_XXS, IQ2_M, {recipe}]\n    \
             imatrix: {{text: {}, chunks: 16}}\n\
             evaluation:\n  text: {}\n  chunks: 4\n  probes: {}\n  max_tokens: 16\n\
             card: {{license: apache-2.0}}\n",
            hf.display(),
            text().display(),
            text().display(),
            probes.display(),
        ),
    )
    .unwrap();
    let out = run(&release, &tmp.path().join("data"), &key);
    let sum = summary(&out);
    let artifacts = sum["artifacts"].as_array().unwrap_or_else(|| panic!("{sum:#}"));
    let find = |ty: &str| artifacts.iter().find(|a| a["file_type"] == ty).unwrap_or_else(|| panic!("no {ty}: {sum:#}"));
    let bf16 = find("BF16")["files"][0]["url"].as_str().unwrap().to_string();
    let gates = sum["gates"].as_array().unwrap();
    let im = &find("Q4_K_M")["imatrix"];
    assert_eq!(im["from"], "computed", "{im}");
    let im_path = PathBuf::from(im["url"].as_str().unwrap());
    let bin_dir = quantfarm_e2e::llama_bin();
    let rungs: [(&str, Vec<&str>); 6] = [
        ("Q4_K_M", vec!["Q4_K_M"]),
        ("IQ4_XS", vec!["IQ4_XS"]),
        ("IQ3_M", vec!["IQ3_M"]),
        ("IQ3_XXS", vec!["IQ3_XXS"]),
        ("IQ2_M", vec!["IQ2_M"]),
        (
            "Q3_K_XL",
            vec![
                "--tensor-type",
                r"blk\.(0|1|2)\.ffn_down=Q6_K",
                "--tensor-type",
                "attn_v=Q8_0",
                "--token-embedding-type",
                "Q8_0",
                "IQ3_XXS",
            ],
        ),
    ];
    for (level, args) in &rungs {
        let a = find(level);
        let k = &a["kld"];
        assert!(k["mean_kld"].as_f64().is_some_and(|m| m > 0.0), "{level}: {k:#}");
        assert_eq!(a["verified"], true, "{level}");
        let measured = gates.iter().find(|g| g["name"] == "measured" && g["level"] == *level).unwrap();
        assert_eq!(measured["passed"], true, "{measured:#}");
        assert!(gates.iter().any(|g| g["name"] == "kld" && g["level"] == *level), "no kld gate for {level}");
        // llama-quantize on the farm's BF16 with the farm's imatrix, named as the farm records it (its file name).
        let theirs = tmp.path().join(format!("theirs-{level}.gguf"));
        let (flags, ftype) = args.split_at(args.len() - 1);
        let q = Command::new(bin_dir.join("llama-quantize"))
            .env("LD_LIBRARY_PATH", &bin_dir)
            .current_dir(im_path.parent().unwrap())
            .arg("--imatrix")
            .arg(im_path.file_name().unwrap())
            .args(flags)
            .arg(&bf16)
            .arg(&theirs)
            .args([ftype[0], "2"])
            .output()
            .unwrap();
        assert!(q.status.success(), "llama-quantize {level}: {}", String::from_utf8_lossy(&q.stderr));
        let ours = &a["files"][0];
        let sha = quantfarm_store::hex(&<sha2::Sha256 as sha2::Digest>::digest(std::fs::read(&theirs).unwrap()));
        assert_eq!(
            ours["sha256"].as_str(),
            Some(sha.as_str()),
            "{level}: the farm's file differs from llama-quantize's"
        );
        eprintln!(
            "{level}: {} bytes, {} bits/weight, mean KLD {:.4} ± {:.4}, sha256 {sha}",
            a["bytes"],
            a["bits_per_weight"],
            k["mean_kld"].as_f64().unwrap(),
            k["mean_kld_unc"].as_f64().unwrap()
        );
    }
    // The recipe is recorded with its definition; a plain file type has none; its KLD limit is its base's.
    let r = &find("Q3_K_XL")["recipe"];
    assert_eq!(r["base"], "IQ3_XXS", "{r:#}");
    assert_eq!(r["tensor_types"], serde_json::json!([r"blk\.(0|1|2)\.ffn_down=Q6_K", "attn_v=Q8_0"]), "{r:#}");
    assert!(find("IQ2_M").get("recipe").is_none());
    let g = gates.iter().find(|g| g["name"] == "kld" && g["level"] == "Q3_K_XL").unwrap();
    let base = gates.iter().find(|g| g["name"] == "kld" && g["level"] == "IQ3_XXS").unwrap();
    assert_eq!(g["threshold"], base["threshold"], "{g:#}");
    let report_path = PathBuf::from(sum["report_url"].as_str().unwrap());
    let dir = report_path.parent().unwrap().to_path_buf();
    let schema = quantfarm_e2e::repo_root().join("docs/report.schema.json");
    let (rc, msg) = python("check_schema.py", &[schema.as_os_str(), report_path.as_os_str()]);
    assert_eq!(rc, 0, "report.json against docs/report.schema.json:\n{msg}");
    let card = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(card.contains("`Q3_K_XL` is a recipe, made as `llama-quantize --tensor-type"), "{card}");
    // The ladder chart: one line through the six GGUF rungs, left to right by size.
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    let at = html.find("<g class=\"ladder\">").expect("the ladder line");
    let points = &html[at..];
    let points = &points[points.find("points=\"").unwrap() + 8..];
    let xs: Vec<f64> =
        points[..points.find('"').unwrap()].split(' ').map(|p| p.split(',').next().unwrap().parse().unwrap()).collect();
    assert_eq!(xs.len(), rungs.len(), "{xs:?}");
    assert!(xs.windows(2).all(|w| w[0] <= w[1]), "in order of size: {xs:?}");
}

/// Link 1 as the method states it, in the library the adapter was trained with: a PEFT adapter on SmolLM2's
/// attention and on its tied embeddings (which llama.cpp cannot apply at run time), checked by the farm in
/// transformers (the base with the adapter unmerged, and the merge, both in f32), with the release's own `merge` gate
/// on that figure. The oracle: PEFT and transformers' own `generate` on the same prompts, outside the farm, agree on
/// every continuation, and the base alone on none (so the check can fail). Long: a transformers helper per task.
#[test]
fn a_peft_adapter_is_checked_unmerged_in_transformers() {
    if quantfarm_e2e::skip_unless_long(
        "a_peft_adapter_is_checked_unmerged_in_transformers",
        "six model loads in transformers",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let hf = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    let adapter = quantfarm_e2e::lora_adapter("peft", &hf, tmp.path());
    let prompts = quantfarm_e2e::prompts(4, tmp.path());
    let release = tmp.path().join("release.yaml");
    std::fs::write(
        &release,
        format!(
            "name: smollm2-peft\nsource: {}\nadapter: {}\nbase_name: HuggingFaceTB/SmolLM2-135M-Instruct\n\
             outputs:\n  gguf: {{quants: []}}\nevaluation:\n  prompts: {}\n  max_tokens: 16\n  prompt_shares: 1\n  \
             transformers: true\ngates:\n  - {{name: merge, check: 'merge.transformers.greedy.agree >= 1'}}\n",
            hf.display(),
            adapter.display(),
            prompts.display()
        ),
    )
    .unwrap();
    // The workers run transformers in llm-compressor's pinned environment (torch, transformers, PEFT).
    let tf_python = quantfarm_e2e::llm_compressor_python();
    let env = [("QUANTFARM_TRANSFORMERS_PYTHON", tf_python.as_os_str())];
    let out = quantfarm_e2e::farm_run_output_env(Path::new(bin()), &release, 2, tmp.path(), &env);
    let sum = summary(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(sum["state"], "released", "{sum:#}\n{stderr}");
    let gate = |name: &str| sum["gates"].as_array().unwrap().iter().find(|g| g["name"] == name).cloned();
    let merge = gate("merge").unwrap_or_else(|| panic!("{sum:#}"));
    assert_eq!(merge["inputs"]["merge.transformers.greedy.agree"], 1.0, "{merge:#}");
    // The release's own `merge` gate replaced the default (llama.cpp's check cannot run on a tied embedding's LoRA);
    // the default `merge-transformers` gate applies beside it.
    assert_eq!(gate("merge-transformers").unwrap_or_else(|| panic!("{sum:#}"))["passed"], true);
    let report_path = Path::new(sum["report_url"].as_str().unwrap());
    let report = sum_report(report_path);
    // The report, the pair's records included, is valid against the published (strict) schema.
    let schema = quantfarm_e2e::repo_root().join("docs/report.schema.json");
    let (rc, msg) = python("check_schema.py", &[schema.as_os_str(), report_path.as_os_str()]);
    assert_eq!(rc, 0, "{msg}");
    let error = report["merge_check"]["error"].as_str().unwrap_or_else(|| panic!("{:#}", report["merge_check"]));
    assert!(error.contains("merge check in transformers measures it"), "{error}");
    let tf = &report["transformers"];
    let (a, m) = (&tf["adapter"], &tf["merged_f32"]);
    assert_eq!((a["dtype"].as_str(), m["dtype"].as_str()), (Some("float32"), Some("float32")), "{tf:#}");
    assert!(a["load_error"].is_null() && m["load_error"].is_null(), "{tf:#}");
    assert_eq!((m["greedy"]["n"].as_u64(), m["greedy"]["identical"].as_u64()), (Some(4), Some(4)), "{m:#}");
    assert_eq!(a["greedy"]["n"], 4, "the adapter's continuations, shown against llama.cpp's: {a:#}");
    assert!(a["kld"].is_null() && m["kld"].is_null(), "the pair is compared by greedy continuations only: {tf:#}");
    assert!(tf["runtimes"][0]["peft"].as_str().is_some_and(|v| !v.is_empty()), "{tf:#}");
    let merged = tf["model"].as_str().unwrap();
    let o = Command::new(&tf_python)
        .arg(quantfarm_e2e::repo_root().join("tests/py/peft_greedy_oracle.py"))
        .args([hf.as_os_str(), adapter.as_os_str(), OsStr::new(merged), prompts.as_os_str(), OsStr::new("16")])
        .output()
        .unwrap();
    assert!(o.status.success(), "the oracle: {}", String::from_utf8_lossy(&o.stderr));
    let want: Value = serde_json::from_slice(&o.stdout).unwrap();
    eprintln!("PEFT and generate outside the farm: {want}");
    assert_eq!((want["n"].as_u64(), want["adapter_identical"].as_u64()), (Some(4), Some(4)), "{want}");
    assert!(want["base_identical"].as_u64() < Some(4), "the adapter changes no continuation: {want}");
    // The views show the pair.
    let md = std::fs::read_to_string(sum["report_url"].as_str().unwrap().replace("report.json", "report.md")).unwrap();
    assert!(md.contains("| base + adapter (PEFT, unmerged) in f32 |") && md.contains("| BF16 in f32 |"), "{md}");
}
