//! mlx-lm as a worker runtime (issue 26): the worker's client (`quantfarm_worker::mlx_lm`) driving the helper
//! `worker/mlx/quantfarm_mlx.py` in the peers' Python (mlx 0.32.4 CPU build, mlx-lm 0.32.2), checked against mlx-lm
//! run directly (`tests/py/mlx_lm_oracle.py`) on the synthesized tiny Llama: the handshake's versions, the logits
//! of a forward pass bit for bit, greedy continuations token for token, a checkpoint mlx-lm cannot load refused as an
//! input failure with mlx-lm's own message, a dead helper reported as such.

use std::path::{Path, PathBuf};

use quantfarm_e2e::{peers_python, run_py};
use quantfarm_store::Location;
use quantfarm_worker::mlx_lm::{self, MlxLm};
use serde_json::Value;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// The tiny Llama as an HF checkpoint (bf16), which mlx-lm loads.
fn tiny_hf(dir: &Path) -> PathBuf {
    let hf = dir.join("tiny-hf");
    rt().block_on(quantfarm_tensors::synthetic::write_tiny_llama(&Location::local(&hf))).unwrap();
    hf
}

/// Token ids of the tiny vocabulary (267 ids), a BOS first.
const TOKENS: [u32; 24] =
    [1, 5, 9, 33, 70, 100, 2, 8, 150, 151, 152, 3, 260, 266, 40, 41, 42, 7, 7, 7, 99, 120, 200, 4];

#[test]
fn the_helper_shakes_hands_with_the_installed_versions() {
    let tmp = tempfile::tempdir().unwrap();
    let oracle: Value = serde_json::from_str(&run_py("mlx_lm_oracle.py", &["versions".as_ref()])).unwrap();
    let blocking = mlx_lm::handshake(&peers_python(), tmp.path()).unwrap();
    assert_eq!(blocking.mlx, oracle["mlx"].as_str().unwrap());
    assert_eq!(blocking.mlx_lm, oracle["mlx_lm"].as_str().unwrap());
    // The peers' build is mlx's CPU wheel.
    assert_eq!(blocking.device, "cpu");
    // The workers of one `quantfarm run` shake hands at the same moment, writing the helper into the same folder.
    let fresh = tmp.path().join("fresh");
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let dir = fresh.clone();
            std::thread::spawn(move || mlx_lm::handshake(&peers_python(), &dir))
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap().unwrap(), blocking);
    }
    let helper = rt().block_on(MlxLm::start(&peers_python(), tmp.path())).unwrap();
    assert_eq!(helper.versions, blocking);
    rt().block_on(helper.stop());
    // A Python without mlx: no handshake, said as a start failure.
    let system = Path::new("/usr/bin/python3");
    let has_mlx = std::process::Command::new(system).args(["-c", "import mlx"]).status().is_ok_and(|s| s.success());
    if has_mlx {
        eprintln!("SKIP the no-mlx handshake case: /usr/bin/python3 imports mlx on this machine");
    } else {
        let e = mlx_lm::handshake(system, tmp.path()).unwrap_err();
        assert!(matches!(e, mlx_lm::Error::Start { .. }), "{e}");
    }
}

#[test]
fn the_helpers_logits_and_greedy_continuations_are_mlx_lms() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tiny_hf(tmp.path());
    let (ours, first) = (tmp.path().join("ours.f32"), 8);
    let rt = rt();
    let mut helper = rt.block_on(MlxLm::start(&peers_python(), tmp.path())).unwrap();
    let loaded = rt.block_on(helper.load(&hf, true)).unwrap();
    assert_eq!(loaded, mlx_lm::Loaded { quantized: false, upcast: false, vocab: Some(267) });
    let rows = rt.block_on(helper.logits(&TOKENS, first, &ours)).unwrap();
    assert_eq!(rows, mlx_lm::LogitRows { rows: (TOKENS.len() - first) as u32, vocab: 267 });

    // The oracle: mlx_lm.load and one forward pass, in another process.
    let theirs = tmp.path().join("theirs.f32");
    let mut args: Vec<String> = vec!["logits".into(), hf.display().to_string(), theirs.display().to_string()];
    args.push(first.to_string());
    args.extend(TOKENS.iter().map(u32::to_string));
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    run_py("mlx_lm_oracle.py", &args);
    let (a, b) = (std::fs::read(&ours).unwrap(), std::fs::read(&theirs).unwrap());
    assert_eq!(a.len(), (TOKENS.len() - first) * 267 * 4);
    assert!(a == b, "the helper's logits differ from mlx-lm's own forward pass");

    // Greedy: the same ids as mlx_lm.stream_generate (greedy sampler) up to its end-of-sequence id.
    for prompt in [&TOKENS[..4], &TOKENS[..11], &TOKENS[..]] {
        // No stop list: the tokenizer's end-of-sequence ids, as mlx_lm.generate stops.
        let got = rt.block_on(helper.greedy(prompt, 24, None)).unwrap();
        let mut args: Vec<String> = vec!["generate".into(), hf.display().to_string(), "24".into()];
        args.extend(prompt.iter().map(u32::to_string));
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        let want_text: Value = serde_json::from_str(&run_py("mlx_lm_oracle.py", &args)).unwrap();
        let want: Vec<u32> =
            want_text["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
        // The helper ends a continuation with its end-of-sequence id, as llama.cpp's end with theirs; mlx_lm's
        // generator stops before it.
        let eos: Vec<u32> = want_text["eos"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
        let mut got_tokens = got.tokens.clone();
        if got_tokens.last().is_some_and(|t| eos.contains(t)) {
            got_tokens.pop();
        } else {
            assert_eq!(got_tokens.len(), 24, "prompt {prompt:?}: neither an end id nor the token cap: {got_tokens:?}");
        }
        assert_eq!(got_tokens, want, "prompt {prompt:?}");
        let text = rt.block_on(helper.decode(&[&got_tokens])).unwrap();
        assert_eq!(text, [want_text["text"].as_str().unwrap()], "prompt {prompt:?}");
        assert_eq!(got.margins.len(), got.tokens.len());
        assert!(got.margins.iter().all(|m| *m >= 0.0), "{:?}", got.margins);
    }
    rt.block_on(helper.stop());
}

#[test]
fn a_checkpoint_mlx_lm_cannot_load_is_an_input_failure_with_mlx_lms_message() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tiny_hf(tmp.path());
    let broken = tmp.path().join("broken-mlx-4bit");
    run_py("mlx_lm_oracle.py", &["break-lm-head".as_ref(), hf.as_os_str(), broken.as_os_str()]);
    let rt = rt();
    let mut helper = rt.block_on(MlxLm::start(&peers_python(), tmp.path())).unwrap();
    let e = rt.block_on(helper.load(&broken, true)).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, mlx_lm::Error::Input { .. }), "{e}");
    assert!(msg.contains(&broken.display().to_string()) && msg.contains("lm_head"), "{msg}");
    // The helper is still there for the next request: a missing model is refused the same way.
    let e = rt.block_on(helper.load(&tmp.path().join("nowhere"), false)).unwrap_err();
    assert!(matches!(e, mlx_lm::Error::Input { .. }) && e.to_string().contains("nowhere"), "{e}");
    // Nothing loaded: asking for logits is refused, not crashed.
    let e = rt.block_on(helper.logits(&TOKENS, 0, &tmp.path().join("x.f32"))).unwrap_err();
    assert!(matches!(e, mlx_lm::Error::Input { .. }), "{e}");
    rt.block_on(helper.stop());
}

#[test]
fn a_helper_killed_under_a_task_is_reported_dead() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tiny_hf(tmp.path());
    let rt = rt();
    let mut helper = rt.block_on(MlxLm::start(&peers_python(), tmp.path())).unwrap();
    rt.block_on(helper.load(&hf, false)).unwrap();
    let pid = helper.pid().unwrap();
    let killed = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(killed.success());
    let e = rt.block_on(helper.greedy(&TOKENS[..4], 8, Some(&[2]))).unwrap_err();
    assert!(matches!(e, mlx_lm::Error::Died { .. }), "{e}");
}

/// The cross-runtime KLD's pieces, on SmolLM2-135M (the tiny Llama's outputs are nearly uniform, so its KLD is too
/// small to check anything): llama.cpp's base logits of the GGUF bf16 (`quantfarm kld --save-base`, one chunk of 64
/// tokens of the GPL-3 text), mlx-lm's logits of the same weights (the HF checkpoint) on the same token ids
/// (`kld::chunk_input`: the ids as tokenized, BOS as llama-perplexity decodes them), scored by `kld::score_rows`;
/// NumPy computes the same chunk statistics in float64 from the base file and the helper's rows. quantfarm scores as
/// llama-perplexity does (f32 terms around an f32 log-normalizer, summed in f64), so the sums agree within what f32
/// rounding allows (a relative 1e-5 plus 2e-6 per position), not to the bit; a misaligned position or token would be
/// off by orders more. The counts and the same-top-token count agree exactly.
#[test]
fn mlx_lm_logits_are_scored_against_llama_cpps_base_as_numpy_scores_them() {
    use quantfarm_eval::kld::{base_file::BaseFile, chunk_input, score_rows};
    let tmp = tempfile::tempdir().unwrap();
    let models = quantfarm_e2e::smollm2_derived();
    let (hf, gguf) = (models.join("smollm2-hf"), models.join("smollm2-bf16.gguf"));
    let base = tmp.path().join("base.logits");
    let text = quantfarm_e2e::fixtures_dir().join("texts/gpl3.txt");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quantfarm"))
        .args(["kld", "--threads", "2", "--ctx", "64", "--chunks", "1", "--reference"])
        .args([&gguf, Path::new("--text"), &text, Path::new("--save-base"), &base])
        .output()
        .unwrap();
    assert!(out.status.success(), "quantfarm kld --save-base: {}", String::from_utf8_lossy(&out.stderr));
    let model =
        quantfarm_eval::Model::load(&gguf, &quantfarm_eval::LoadOptions { threads: 2, ..Default::default() }).unwrap();
    let bos = model.add_bos().then(|| model.bos());
    let mut file = BaseFile::open(&base).unwrap();
    let rt = rt();
    let mut helper = rt.block_on(MlxLm::start(&peers_python(), tmp.path())).unwrap();
    rt.block_on(helper.load(&hf, true)).unwrap();
    for chunk in 0..file.header.n_chunk() {
        let (tokens, first) = chunk_input(&file.header, chunk, bos).unwrap();
        let ids: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
        let rows_file = tmp.path().join(format!("mlx-{chunk}.f32"));
        rt.block_on(helper.logits(&ids, first, &rows_file)).unwrap();
        let rows: Vec<f32> = std::fs::read(&rows_file)
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let records = file.records(chunk).unwrap();
        let ours = score_rows(&file.header, chunk, &rows, &records).unwrap();
        let numpy: Value = serde_json::from_str(&run_py(
            "kld_numpy.py",
            &[base.as_os_str(), chunk.to_string().as_ref(), rows_file.as_os_str()],
        ))
        .unwrap();
        eprintln!("chunk {chunk}: quantfarm {ours:?}\nnumpy {numpy}");
        assert_eq!(ours.count, numpy["count"].as_u64().unwrap());
        assert_eq!(ours.n_same_top, numpy["n_same_top"].as_u64().unwrap());
        for (name, value) in [("sum_kld", ours.sum_kld), ("sum_nll", ours.sum_nll), ("sum_nll_base", ours.sum_nll_base)]
        {
            let want = numpy[name].as_f64().unwrap();
            // Per position, llama-perplexity's f32 log-normalizer and f32 terms differ from f64 by < 5e-7.
            let tolerance = 1e-5 * want.abs() + 2e-6 * ours.count as f64;
            assert!((value - want).abs() <= tolerance, "chunk {chunk} {name}: {value} vs {want}");
        }
    }
    rt.block_on(helper.stop());
}

/// A farm release with an MLX rung runs the source's bf16 weights and the rung in mlx-lm on workers that have it
/// (the peers' Python): the report's cross-runtime section holds link 2 (mlx-lm bf16 against llama.cpp's GGUF BF16
/// on every prompt and chunk), the rung's greedy agreement in mlx-lm and its cross-runtime KLD on the same chunks,
/// the versions the handshake gave, and whether the rung was upcast; the gates read those figures. The tiny Llama's
/// weights are random, so its near-uniform outputs make greedy continuations part at near-ties: the greedy gate is
/// relaxed here (SmolLM2's figures are the acceptance run's), while the bf16 weights' KLD across runtimes must be
/// near zero. Two more rungs, mlx-lm's mixed recipe mixed_4_6 and the floating-point mode mxfp4, are made, verified
/// and measured in both runtimes too.
#[test]
fn a_release_runs_its_bf16_weights_and_mlx_rung_in_mlx_lm() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let tmp = tempfile::tempdir().unwrap();
    let examples = quantfarm_e2e::repo_root().join("examples");
    let release = tmp.path().join("release.yaml");
    std::fs::write(
        &release,
        format!(
            "name: tiny-mlx\nsource: synthetic:tiny-llama\noutputs:\n  gguf: {{quants: [Q8_0]}}\n  mlx: {{bits: [4], recipes: [mixed_4_6], modes: [mxfp4]}}\n\
             evaluation:\n  text: {}\n  ctx: 128\n  chunks: 3\n  batch: 256\n  prompts: {}\n  max_tokens: 8\n\
             \x20 probes: {}\n  context: 256\n\
             gates:\n  - {{name: probes, levels: all, check: 'probe.truncated <= 4'}}\n\
             \x20 - {{name: cross-runtime-greedy, check: 'cross_runtime.greedy.agree >= 0'}}\n",
            examples.join("texts/mill.txt").display(),
            examples.join("prompts-20.json").display(),
            examples.join("probes-tiny.yaml").display(),
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quantfarm"))
        .arg("run")
        .arg(&release)
        .args(["--workers", "2", "--store"])
        .arg(tmp.path().join("data"))
        .env("QUANTFARM_KEY_FILE", tmp.path().join("k"))
        .env("QUANTFARM_PYTHON", peers_python())
        .env("QUANTFARM_LOG", "warn")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let report = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("signed report: "))
        .unwrap_or_else(|| panic!("no report:\n{stdout}\n{stderr}"));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    let c = &r["cross_runtime"];
    eprintln!("{c:#}");
    let oracle: Value = serde_json::from_str(&run_py("mlx_lm_oracle.py", &["versions".as_ref()])).unwrap();
    assert_eq!(c["runtimes"][0]["mlx"], oracle["mlx"], "{c:#}");
    assert_eq!(c["runtimes"][0]["mlx_lm"], oracle["mlx_lm"], "{c:#}");
    assert_eq!(c["runtimes"][0]["device"], "cpu");
    let n_chunks = r["evaluation"]["n_chunks"].as_u64().unwrap();
    assert_eq!(n_chunks, 3);
    // Link 2: every prompt and chunk, the bf16 weights as stored.
    let bf16 = &c["bf16"];
    assert_eq!(bf16["file_type"], "BF16");
    assert_eq!((bf16["quantized"].as_bool(), bf16["upcast"].as_bool()), (Some(false), Some(false)));
    assert_eq!(bf16["greedy"]["n"], 20, "{bf16:#}");
    assert_eq!(bf16["greedy"]["complete"], true, "{bf16:#}");
    assert_eq!(bf16["kld"]["n_chunks"], n_chunks, "{bf16:#}");
    let bf16_kld = bf16["kld"]["mean_kld"].as_f64().unwrap();
    // The rung: quantized, upcast on the CPU build, on the same prompts and chunks.
    let rung = &c["rungs"][0];
    assert_eq!(rung["file_type"], "MLX-4bit");
    assert_eq!((rung["quantized"].as_bool(), rung["upcast"].as_bool()), (Some(true), Some(true)));
    assert_eq!(rung["greedy"]["n"], 20, "{rung:#}");
    assert_eq!(rung["kld"]["n_chunks"], n_chunks, "{rung:#}");
    let rung_kld = rung["kld"]["mean_kld"].as_f64().unwrap();
    assert!(bf16_kld.abs() < 1e-4 && rung_kld > bf16_kld, "bf16 {bf16_kld}, MLX-4bit {rung_kld}");
    // The rung in mlx-lm and through its exact conversion in llama.cpp lose about the same.
    let artifact = r["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == "MLX-4bit").unwrap();
    let llama_kld = artifact["kld"]["mean_kld"].as_f64().unwrap();
    assert!((rung_kld - llama_kld).abs() <= 0.2 * llama_kld, "mlx-lm {rung_kld}, llama.cpp {llama_kld}");
    let gate = |name: &str, level: Option<&str>| {
        r["gates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == name && g["level"].as_str() == level)
            .unwrap_or_else(|| panic!("no gate {name} {level:?}: {:#}", r["gates"]))
            .clone()
    };
    let kld_gate = gate("cross-runtime-kld", None);
    assert_eq!(kld_gate["passed"], true, "{kld_gate:#}");
    assert_eq!(kld_gate["inputs"]["cross_runtime.kld.mean"], bf16["kld"]["mean_kld"]);
    let measured = gate("measured", Some("MLX-4bit"));
    assert_eq!(measured["inputs"]["mlx_lm.kld.mean"], rung["kld"]["mean_kld"], "{measured:#}");
    // The probe suite (2 probes, 2 repeats) on mlx_lm.server, for the bf16 weights and the rung.
    for s in [bf16, rung] {
        let p = &s["probes"];
        let answered = p["passed"].as_u64().unwrap() + p["failed"].as_u64().unwrap() + p["truncated"].as_u64().unwrap();
        assert_eq!(answered, 4, "{p:#}");
    }
    assert_eq!(measured["inputs"]["mlx_lm.probe.truncated"], rung["probes"]["truncated"], "{measured:#}");
    // The recipe's rung: verified, and measured in mlx-lm and through its exact conversion in llama.cpp alike.
    let mixed = &c["rungs"][1];
    assert_eq!(mixed["file_type"], "MLX-mixed_4_6", "{c:#}");
    assert_eq!((mixed["greedy"]["n"].as_u64(), mixed["kld"]["n_chunks"].as_u64()), (Some(20), Some(n_chunks)));
    let artifact = r["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == "MLX-mixed_4_6").unwrap();
    assert_eq!(artifact["verified"], true, "{artifact:#}");
    let (in_mlx_lm, in_llama) =
        (mixed["kld"]["mean_kld"].as_f64().unwrap(), artifact["kld"]["mean_kld"].as_f64().unwrap());
    assert!((in_mlx_lm - in_llama).abs() <= 0.2 * in_llama, "MLX-mixed_4_6: mlx-lm {in_mlx_lm}, llama.cpp {in_llama}");
    assert_eq!(gate("measured", Some("MLX-mixed_4_6"))["passed"], true);
    // A floating-point mode's rung (mxfp4: uint8 scales, no biases), alike.
    let fp = &c["rungs"][2];
    assert_eq!(fp["file_type"], "MLX-mxfp4", "{c:#}");
    assert_eq!((fp["greedy"]["n"].as_u64(), fp["kld"]["n_chunks"].as_u64()), (Some(20), Some(n_chunks)));
    let artifact = r["artifacts"].as_array().unwrap().iter().find(|a| a["file_type"] == "MLX-mxfp4").unwrap();
    assert_eq!(artifact["verified"], true, "{artifact:#}");
    let (in_mlx_lm, in_llama) =
        (fp["kld"]["mean_kld"].as_f64().unwrap(), artifact["kld"]["mean_kld"].as_f64().unwrap());
    assert!((in_mlx_lm - in_llama).abs() <= 0.2 * in_llama, "MLX-mxfp4: mlx-lm {in_mlx_lm}, llama.cpp {in_llama}");
    assert_eq!(gate("measured", Some("MLX-mxfp4"))["passed"], true);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    for view in ["report.html", "report.md"] {
        let text = std::fs::read_to_string(Path::new(report).with_file_name(view)).unwrap();
        assert!(text.contains("Cross-runtime check (link 2)") && text.contains("MLX-4bit"), "{view}");
    }
}

/// `quantfarm run`'s workers are the only ones, so a release whose MLX rungs are to be measured in mlx-lm (the
/// default) on a machine where no worker can run mlx-lm is refused at once, naming the key and what is missing,
/// rather than left waiting for a worker that never comes.
#[test]
fn a_local_release_needing_mlx_lm_without_it_is_refused_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let examples = quantfarm_e2e::repo_root().join("examples");
    let release = tmp.path().join("release.yaml");
    std::fs::write(
        &release,
        format!(
            "name: no-mlx\nsource: synthetic:tiny-llama\noutputs:\n  gguf: {{quants: [Q8_0]}}\n  mlx: {{bits: [4]}}\n\
             evaluation:\n  text: {}\n  ctx: 128\n  chunks: 1\n",
            examples.join("texts/mill.txt").display(),
        ),
    )
    .unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_quantfarm"));
    let env = [("QUANTFARM_PYTHON", std::ffi::OsStr::new("/bin/false"))];
    let out = quantfarm_e2e::farm_run_output_env(bin, &release, 1, tmp.path(), &env);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("evaluation.mlx_lm") && said.contains("no local worker can run"), "{said}");
    assert!(!tmp.path().join("data/artifacts").exists(), "something was made");
}

/// A checkpoint mlx-lm cannot load (a 4-bit one whose lm_head lost its scales, the seeds' crash) is not a task
/// failure: each mlx-lm task answers with mlx-lm's own message naming the folder, so the release goes on and the
/// report shows the rung as not measured (its `measured` gate fails with the message: the coordinator's unit test
/// `a_rung_mlx_lm_cannot_load_is_not_measured`).
#[test]
fn a_checkpoint_mlx_lm_cannot_load_is_answered_with_mlx_lms_message() {
    use quantfarm_proto::{self as pb, task, task_result};
    let tmp = tempfile::tempdir().unwrap();
    let hf = tiny_hf(tmp.path());
    let broken = tmp.path().join("broken-mlx-4bit");
    run_py("mlx_lm_oracle.py", &["break-lm-head".as_ref(), hf.as_os_str(), broken.as_os_str()]);
    // The worker's tasks find the helper's Python the way a worker does.
    std::env::set_var("QUANTFARM_PYTHON", peers_python());
    let env = quantfarm_worker::Env {
        budget: 64 << 20,
        scratch: tmp.path().join("scratch"),
        threads: 2,
        ..Default::default()
    };
    std::fs::create_dir_all(&env.scratch).unwrap();
    let model = broken.display().to_string();
    let probes = quantfarm_e2e::repo_root().join("examples/probes-tiny.yaml").display().to_string();
    let reference =
        pb::GreedyContinuation { index: 0, prompt_tokens: vec![1, 5, 9], tokens: vec![7], margins: vec![0.5] };
    for kind in [
        task::Kind::MlxLmGreedy(pb::MlxLmGreedyTask {
            model: model.clone(),
            reference: vec![reference],
            max_tokens: 4,
            keep_continuations: true,
        }),
        task::Kind::MlxLmProbe(pb::MlxLmProbeTask { model: model.clone(), suite: probes }),
    ] {
        let t = pb::Task { kind: Some(kind), ..Default::default() };
        let r = rt().block_on(quantfarm_worker::exec::run(&t, &env)).unwrap_or_else(|f| panic!("{}", f.message));
        let run = match r.kind {
            Some(task_result::Kind::Greedy(g)) => {
                assert!(g.agreements.is_empty() && g.continuations.is_empty());
                g.mlx_lm
            }
            Some(task_result::Kind::Probe(p)) => {
                assert_eq!(p.passed + p.failed + p.truncated, 0);
                p.mlx_lm
            }
            other => panic!("{other:?}"),
        };
        let e = run.unwrap().load_error;
        assert!(e.contains(&model) && e.contains("lm_head"), "{e}");
    }
}

/// A helper killed under an mlx-lm task (SIGKILL, as an out-of-memory kill would) fails that try as transient; the
/// coordinator gives the task to the other worker, and the release ends with every prompt compared. SmolLM2 (a task
/// of several seconds, so the kill lands inside one); behind QUANTFARM_LONG (`scripts/test --long`).
#[test]
fn a_helper_killed_mid_task_is_retried_on_another_worker() {
    if quantfarm_e2e::skip_unless_long("a_helper_killed_mid_task_is_retried_on_another_worker", "SmolLM2 in mlx-lm") {
        return;
    }
    let _cpu = quantfarm_e2e::cpu_bound();
    let tmp = tempfile::tempdir().unwrap();
    let hf = quantfarm_e2e::smollm2_derived().join("smollm2-hf");
    let prompts = quantfarm_e2e::prompts(4, tmp.path());
    let release = tmp.path().join("release.yaml");
    std::fs::write(
        &release,
        format!(
            "name: smollm2-kill\nsource: {}\noutputs:\n  gguf: {{quants: []}}\n  mlx: {{bits: [8]}}\n\
             evaluation:\n  prompts: {}\n  max_tokens: 32\n  skip: [MLX-8bit]\n",
            hf.display(),
            prompts.display()
        ),
    )
    .unwrap();
    let store = tmp.path().join("data");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_quantfarm"))
        .arg("run")
        .arg(&release)
        .args(["--workers", "2", "--store"])
        .arg(&store)
        .env("QUANTFARM_KEY_FILE", tmp.path().join("k"))
        .env("QUANTFARM_PYTHON", peers_python())
        .env("QUANTFARM_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The first helper that has run for a second under this store's scratch (the bf16 weights' greedy tasks are
    // the only mlx-lm tasks: MLX-8bit is skipped).
    let scratch = store.join("scratch").display().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    let killed = loop {
        assert!(std::time::Instant::now() < deadline, "no helper ran");
        let out =
            std::process::Command::new("pgrep").args(["-f", &format!("{scratch}.*quantfarm_mlx")]).output().unwrap();
        if let Some(pid) = String::from_utf8_lossy(&out.stdout).lines().next().map(str::to_string) {
            std::thread::sleep(std::time::Duration::from_secs(1));
            if std::process::Command::new("kill").args(["-9", &pid]).status().unwrap().success() {
                break pid;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let out = run.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("killed helper {killed}");
    let report = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("signed report: "))
        .unwrap_or_else(|| panic!("no report:\n{stdout}\n{stderr}"));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    let retried: Vec<&Value> = r["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["id"].as_str().unwrap().starts_with("mlx-lm/") && t["attempts"].as_u64().unwrap() > 1)
        .collect();
    assert_eq!(retried.len(), 1, "one mlx-lm task tried twice: {:#}", r["tasks"]);
    let greedy = &r["cross_runtime"]["bf16"]["greedy"];
    assert_eq!((greedy["n"].as_u64(), greedy["complete"].as_bool()), (Some(4), Some(true)), "{greedy:#}");
}
