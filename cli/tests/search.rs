//! Searched rungs (`{name, target_bpw}`, docs/search.md) through the real farm: the sensitivities measured by probes
//! on the workers and stored, the recipe chosen within the budget, made, verified and measured like any rung, the
//! report's `search` section (valid against the schema), the recipe reproduced byte for byte by llama-quantize, and a
//! second release of the same reference reusing the stored sensitivities without measuring anything again.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_quantfarm"))
}

fn check_schema(report: &Path) {
    let py = quantfarm_e2e::check_tools().join("venv-check/bin/python");
    let script = quantfarm_e2e::repo_root().join("tests/py/check_schema.py");
    let schema = quantfarm_e2e::repo_root().join("docs/report.schema.json");
    let out = Command::new(py).arg(script).args([schema.as_os_str(), report.as_os_str()]).output().unwrap();
    assert!(
        out.status.success(),
        "report.json against docs/report.schema.json:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The report of a release of `yaml` run in `dir` (its store under `dir/data`).
fn release(dir: &Path, name: &str, yaml: &str) -> Value {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, yaml.replace("NAME", name)).unwrap();
    let out = quantfarm_e2e::farm_run_output(&bin(), &path, 2, dir);
    let sum: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    let report = PathBuf::from(sum["report_url"].as_str().unwrap_or_else(|| panic!("no report: {sum:#}")));
    check_schema(&report);
    serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap()
}

/// A folder with the search's text (gpl3.txt, also the imatrix's) and the held-out evaluation text (held-out.txt).
fn texts() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(quantfarm_e2e::fixtures_dir().join("texts/gpl3.txt"), tmp.path().join("gpl3.txt")).unwrap();
    let held_out = quantfarm_e2e::repo_root().join("examples/texts/python-reference.txt");
    std::fs::copy(held_out, tmp.path().join("held-out.txt")).unwrap();
    tmp
}

fn artifact<'a>(report: &'a Value, file_type: &str) -> &'a Value {
    let all = report["artifacts"].as_array().unwrap();
    all.iter().find(|a| a["file_type"] == file_type).unwrap_or_else(|| panic!("no {file_type} artifact"))
}

fn point<'a>(report: &'a Value, name: &str) -> &'a Value {
    let all = report["search"]["frontier"].as_array().unwrap();
    all.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("{name} is not on the frontier"))
}

#[test]
fn a_searched_rung_is_chosen_made_reproduced_and_its_sensitivities_reused() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let tmp = texts();
    let dir = tmp.path();
    // The tiny model's rows are 64 wide: every k-quant falls back to a 32-block type, so Q4_K_M is ~6.3 bits per
    // weight. FIT is held to Q4_K_M's size, B55 to 5.5 bits per weight, OK to the smallest candidate recipe whose
    // 99.9 % KLD on the search text is at most 0.00005. The search measures on the imatrix's text; the rungs are
    // measured on another.
    let yaml = "name: NAME\nsource: synthetic:tiny-llama\noutputs:\n  gguf:\n    quants: [Q4_K_M, {name: FIT, \
                target_bpw: Q4_K_M}, {name: B55, target_bpw: 5.5}, {name: OK, kld: {metric: kld.p99_9, max: 0.00005}}]\n    \
                imatrix: {text: gpl3.txt, ctx: 128, chunks: 8}\n    search: {ctx: 128, chunks: 4, layers: 2}\n\
                evaluation: {text: held-out.txt, ctx: 128}\n";
    let first = release(dir, "tiny-search", yaml);
    let search = &first["search"];
    let sens = &search["sensitivity"];
    assert_eq!(sens["reused"], false, "{sens:#}");
    // 2 layers: output, token_embd and 7 roles × 2 ranges; on rows of 64 the candidates make 6 distinct types each.
    assert_eq!((sens["groups"].as_u64(), sens["probes"].as_u64()), (Some(16), Some(96)), "{sens:#}");
    let stored = std::fs::read(sens["url"].as_str().unwrap()).unwrap();
    assert_eq!(
        sens["sha256"].as_str().unwrap(),
        quantfarm_store::hex(&<sha2::Sha256 as sha2::Digest>::digest(&stored))
    );
    let stored: Value = serde_json::from_slice(&stored).unwrap();
    assert_eq!(stored["groups"].as_array().map(Vec::len), Some(16));

    // FIT within Q4_K_M's tensor bytes, and better than it on the held-out text, mean and tail.
    let (q4, fit) = (point(&first, "Q4_K_M"), point(&first, "FIT"));
    let rung = search["rungs"].as_array().unwrap().iter().find(|r| r["name"] == "FIT").unwrap();
    assert_eq!(rung["budget_bytes"], q4["bytes"], "{rung:#}");
    assert!(fit["bytes"].as_u64() <= q4["bytes"].as_u64() && fit["searched"] == true, "{fit:#} {q4:#}");
    assert_eq!(rung["bytes"], fit["bytes"], "the chosen recipe's bytes are the file's");
    for k in ["kld_mean", "kld_p99_9"] {
        assert!(fit[k].as_f64() < q4[k].as_f64(), "{k}: FIT {fit:#} against Q4_K_M {q4:#}");
    }
    // OK: the smallest of its candidates (smallest first, each measured on the search text) within the max.
    let ok = search["rungs"].as_array().unwrap().iter().find(|r| r["name"] == "OK").unwrap();
    let candidates = ok["candidates"].as_array().unwrap();
    let within = |c: &Value| c["measured"].as_f64().is_some_and(|m| m <= 0.00005);
    let at = candidates.iter().position(within).unwrap_or_else(|| panic!("no candidate within the max: {ok:#}"));
    assert!(at > 0, "the smallest candidate already meets the max: the check tests nothing: {ok:#}");
    assert!(candidates.windows(2).all(|w| w[0]["bytes"].as_u64() < w[1]["bytes"].as_u64()), "{ok:#}");
    assert_eq!(ok["bytes"], candidates[at]["bytes"], "{ok:#}");
    assert_eq!(point(&first, "OK")["bytes"], candidates[at]["bytes"], "the file is the chosen candidate's recipe");
    let b55 = point(&first, "B55");
    let elements: u64 =
        artifact(&first, "B55")["type_mix"].as_array().unwrap().iter().map(|t| t["elements"].as_u64().unwrap()).sum();
    assert!(b55["bytes"].as_u64().unwrap() * 8 <= elements * 55 / 10, "B55 over 5.5 bits per weight: {b55:#}");

    // The recipe is llama-quantize's: its command line makes the same bytes (run in the imatrix's folder, which
    // llama-quantize records by the name it is given).
    let made = artifact(&first, "FIT");
    let args: Vec<String> = made["recipe"]["llama_quantize_args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let bf16 = artifact(&first, "BF16")["files"][0]["url"].as_str().unwrap().to_string();
    let imatrix = PathBuf::from(made["imatrix"]["url"].as_str().unwrap());
    let theirs = dir.join("llama-FIT.gguf");
    let (flags, ftype) = args.split_at(args.len() - 1);
    let out = Command::new(quantfarm_e2e::llama_bin().join("llama-quantize"))
        .env("LD_LIBRARY_PATH", quantfarm_e2e::llama_bin())
        .current_dir(imatrix.parent().unwrap())
        .arg("--imatrix")
        .arg(imatrix.file_name().unwrap())
        .args(flags)
        .args([OsStr::new(&bf16), theirs.as_os_str(), OsStr::new(&ftype[0]), OsStr::new("2")])
        .output()
        .unwrap();
    assert!(out.status.success(), "llama-quantize {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let ours = std::fs::read(made["files"][0]["url"].as_str().unwrap()).unwrap();
    assert!(ours == std::fs::read(&theirs).unwrap(), "llama-quantize {} makes other bytes", args.join(" "));

    // A second release of the same reference and settings, named otherwise: the sensitivities are found, no probe
    // runs, and the same recipes are chosen (OK's candidates are measured again, on the stored base logits: a
    // cache hit each).
    let second = release(dir, "tiny-again", yaml);
    let sens2 = &second["search"]["sensitivity"];
    assert_eq!((sens2["reused"].as_bool(), &sens2["url"]), (Some(true), &sens["url"]), "{sens2:#}");
    let tasks = second["tasks"].as_array().unwrap();
    let probes: Vec<&str> =
        tasks.iter().filter_map(|t| t["id"].as_str()).filter(|id| id.starts_with("search/probe/")).collect();
    assert!(probes.is_empty(), "probed again: {probes:?}");
    for t in tasks.iter().filter(|t| t["id"].as_str().is_some_and(|id| id.starts_with("search/base/"))) {
        assert_eq!(t["outputs"]["cache_hit"], true, "{t:#}");
    }
    for rung in ["FIT", "B55", "OK"] {
        assert_eq!(artifact(&second, rung)["recipe"], artifact(&first, rung)["recipe"], "{rung}");
    }
}

/// Issue 40's acceptance, long tier (about 10 min on 2 cores): on SmolLM2-135M and on the tiny Qwen3.5-MoE (4
/// experts, made by transformers), in one release each with the importance matrix and the search measured on
/// gpl3.txt and every rung measured on held-out text (python-reference.txt): a rung held to Q4_K_M's size has a lower
/// mean and 99.9 % KLD than Q4_K_M, one held to IQ3_M's size than IQ3_M, each within its budget; and a rung held to
/// `kld.mean <= max` is the smallest of its measured candidates within it.
#[test]
fn searched_rungs_beat_llama_quantize_at_the_same_size_on_held_out_text() {
    if quantfarm_e2e::skip_unless_long(
        "searched_rungs_beat_llama_quantize_at_the_same_size_on_held_out_text",
        "two releases with ~100 and ~200 probes (about 10 min on 2 cores)",
    ) {
        return;
    }
    let _cpu = quantfarm_e2e::cpu_bound();
    let tmp = texts();
    let dir = tmp.path();
    let moe = dir.join("hf-moe");
    let tok = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    quantfarm_e2e::run_py_with(
        &quantfarm_e2e::convert_python(),
        "qwen35.py",
        &[OsStr::new("make"), OsStr::new("moe"), moe.as_os_str(), tok.as_os_str()],
    );
    for (name, source, ctx, search, max) in [
        ("smollm2", tok.clone(), 256, "{ctx: 256, batch: 1024, chunks: 4, layers: 2}", 0.05),
        ("moe", moe.clone(), 128, "{ctx: 128}", 0.01),
    ] {
        let yaml = format!(
            "name: NAME\nsource: {}\noutputs:\n  gguf:\n    quants: [Q4_K_M, IQ3_M, {{name: Q4_FIT, target_bpw: Q4_K_M}}, \
             {{name: IQ3_FIT, target_bpw: IQ3_M}}, {{name: OK, kld: {{metric: kld.mean, max: {max}}}}}]\n    \
             imatrix: {{text: gpl3.txt, ctx: {ctx}}}\n    search: {search}\nevaluation: {{text: held-out.txt, ctx: {ctx}}}\n",
            source.display()
        );
        let report = release(dir, name, &yaml);
        for (searched, standard) in [("Q4_FIT", "Q4_K_M"), ("IQ3_FIT", "IQ3_M")] {
            let (s, q) = (point(&report, searched), point(&report, standard));
            println!("{name}: {searched} {s} against {standard} {q}");
            assert!(s["bytes"].as_u64() <= q["bytes"].as_u64(), "{name}: {searched} is larger than {standard}");
            for k in ["kld_mean", "kld_p99_9"] {
                assert!(s[k].as_f64() < q[k].as_f64(), "{name}: {k} of {searched} {s} not below {standard}'s {q}");
            }
        }
        let ok = report["search"]["rungs"].as_array().unwrap().iter().find(|r| r["name"] == "OK").unwrap();
        let candidates = ok["candidates"].as_array().unwrap();
        let at = candidates
            .iter()
            .position(|c| c["measured"].as_f64().is_some_and(|m| m <= max))
            .unwrap_or_else(|| panic!("{name}: no candidate within {max}: {ok:#}"));
        assert!(at > 0, "{name}: the smallest candidate is within {max} already: the check tests nothing: {ok:#}");
        assert_eq!(point(&report, "OK")["bytes"], candidates[at]["bytes"], "{name}: {ok:#}");
        println!("{name}: OK is candidate {at} of {}: {:#}", candidates.len(), candidates[at]);
    }
}
