//! `quantfarm kld`, `kld-merge`, `greedy` and `probe` on the real SmolLM2-135M against the real llama.cpp tools:
//! the KL-divergence ladder against llama-perplexity's figures on the same chunks, base-logits files crossing
//! between the two tools, the merge check able to fail, and probes against a real llama-server on loopback.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use quantfarm_e2e::{fixtures_dir, llama_bin, smollm2_derived};
use serde_json::Value;

fn quantfarm(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quantfarm")).args(args).output().expect("run quantfarm")
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8")
}

fn text() -> PathBuf {
    fixtures_dir().join("texts/gpl3.txt")
}

fn bf16() -> PathBuf {
    smollm2_derived().join("smollm2-bf16.gguf")
}

/// The chunks every KLD comparison here runs on: the text's first 6 chunks of 512 tokens, decoded 2 at a time
/// (`-b 1024`), so 3 decode groups, one per share in the three-process merge below. Every figure is compared with
/// llama-perplexity run here on the same chunks, so fewer chunks than the text holds weaken nothing: the statistic is
/// checked, not the text's average.
const KLD_CHUNKS: &[&str] = &["--ctx", "512", "--batch", "1024", "--chunks", "6"];
const PERPLEXITY_CHUNKS: &[&str] = &["-c", "512", "-b", "1024", "--chunks", "6", "-t", "2"];

fn kld_json(base: &Path, model: &Path, extra: &[&str]) -> Value {
    let t = text();
    let mut args = vec![arg("kld"), arg("--model"), model.as_os_str(), arg("--base"), base.as_os_str(), arg("--text")];
    args.extend([t.as_os_str(), arg("--threads"), arg("2"), arg("--json")]);
    args.extend(KLD_CHUNKS.iter().chain(extra).map(|a| arg(a)));
    serde_json::from_str(&ok(quantfarm(&args), "quantfarm kld")).expect("kld --json prints JSON")
}

/// llama-perplexity's final figures on a base-logits file, parsed from what it prints.
fn llama_kld(base: &Path, model: &Path) -> (f64, f64, f64) {
    let out = Command::new(llama_bin().join("llama-perplexity"))
        .arg("-m")
        .arg(model)
        .arg("--kl-divergence-base")
        .arg(base)
        .arg("--kl-divergence")
        .args(PERPLEXITY_CHUNKS)
        .output()
        .expect("run llama-perplexity");
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "llama-perplexity failed:\n{all}");
    let find = |label: &str| -> f64 {
        let line = all.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("no {label:?} in\n{all}"));
        line[label.len()..]
            .trim_start_matches([' ', ':'])
            .split_whitespace()
            .next()
            .unwrap()
            .trim_end_matches('%')
            .parse()
            .unwrap()
    };
    (find("Mean    KLD"), find("Same top p"), find("Mean PPL(Q)"))
}

/// Mean KLD within ±10% (relative), same-top within 1 percentage point, PPL(Q) within 1%: the bands between two
/// builds of llama.cpp on one machine. The peer tools' ggml (0.25.3) and the runtime quantfarm links (0.26.0) have
/// different quantized kernels on some CPUs (Q4_K_M with AVX-512: mean KLD 0.063707 against 0.063525), so the
/// figures agree to these bands, not to the last digit, even on the same chunks.
fn assert_bands(what: &str, kld: f64, same_top: f64, ppl: f64, want: (f64, f64, f64)) {
    let (k, s, p) = want;
    eprintln!("{what}: mean KLD {kld:.6} vs {k:.6}, same top {same_top:.3}% vs {s:.3}%, PPL(Q) {ppl:.4} vs {p:.4}");
    assert!((kld - k).abs() <= 0.10 * k, "{what}: mean KLD {kld} is not within 10% of {k}");
    assert!((same_top - s).abs() <= 1.0, "{what}: same top {same_top}% is not within 1 point of {s}%");
    assert!((ppl - p).abs() <= 0.01 * p, "{what}: PPL(Q) {ppl} is not within 1% of {p}");
}

/// The ladder against llama-perplexity run here on the same chunks, base files crossing both ways, and chunk
/// statistics computed in three separate processes merging into exactly the one-process figures.
///
/// Three rungs span the range the statistic must hold over, from near-exact to heavily lossy (Q8_0's mean KLD is
/// about 0.001, Q4_K_M's 0.06, Q2_K's 0.4): the KLD code is the same for every level, and every rung's bytes are
/// checked against llama-quantize's in tests/tests/quantize_files.rs.
#[test]
fn kld_ladder_matches_llama_perplexity() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("ours.logits");
    // The base pass: the bf16 reference against itself.
    let mut args = vec![arg("kld"), arg("--reference")];
    let (b, t) = (bf16(), text());
    args.extend([b.as_os_str(), arg("--model"), b.as_os_str(), arg("--text"), t.as_os_str()]);
    args.extend([arg("--save-base"), ours.as_os_str(), arg("--threads"), arg("2"), arg("--json")]);
    args.extend(KLD_CHUNKS.iter().map(|a| arg(a)));
    let selfcheck: Value = serde_json::from_str(&ok(quantfarm(&args), "kld bf16 vs itself")).unwrap();
    assert_eq!(selfcheck["n_chunks"], 6);
    assert_eq!(selfcheck["n_tokens"], 6 * 255);
    assert!(selfcheck["mean_kld"].as_f64().unwrap() < 1e-4, "{selfcheck}");
    // Saving again refuses to replace the file.
    let again = quantfarm(&args);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));

    // Mismatches are errors naming the file and what differs, before anything is decoded.
    let model = bf16();
    let refused = |base: &Path, extra: &[&str], want: &str| {
        let mut args: Vec<&std::ffi::OsStr> =
            vec![arg("kld"), arg("--model"), model.as_os_str(), arg("--base"), base.as_os_str()];
        args.extend(extra.iter().map(|a| arg(a)));
        let out = quantfarm(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(base.to_str().unwrap()) && err.contains(want), "expected {want:?} in: {err}");
    };
    refused(&ours, &["--ctx", "256"], "--ctx: 256, but ");
    refused(&ours, &["--ctx", "256"], "was computed with a context of 512 tokens");
    let bytes = std::fs::read(&ours).unwrap();
    // A well-formed file of two chunks over a vocabulary one token larger than SmolLM2's.
    let other_vocab = dir.path().join("vocab.logits");
    let mut v = bytes[..20 + 4 * 2 * 512].to_vec();
    v[12..16].copy_from_slice(&49153i32.to_le_bytes());
    v[16..20].copy_from_slice(&2i32.to_le_bytes());
    v.resize(v.len() + 2 * 255 * (49154 + 4) * 2, 0);
    std::fs::write(&other_vocab, &v).unwrap();
    refused(&other_vocab, &[], "the base logits have a vocabulary of 49153 tokens, the model 49152");
    let truncated = dir.path().join("truncated.logits");
    std::fs::write(&truncated, &bytes[..bytes.len() - 1000]).unwrap();
    refused(&truncated, &[], "truncated or not a base-logits file");

    // llama-perplexity's own base file on the same chunks: same header and tokens, same size.
    let theirs = dir.path().join("theirs.logits");
    let out = Command::new(llama_bin().join("llama-perplexity"))
        .arg("-m")
        .arg(bf16())
        .arg("-f")
        .arg(text())
        .arg("--kl-divergence-base")
        .arg(&theirs)
        .args(PERPLEXITY_CHUNKS)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (a, b) = (std::fs::read(&ours).unwrap(), std::fs::read(&theirs).unwrap());
    assert_eq!(a.len(), b.len(), "base file sizes");
    let head = 20 + 4 * 6 * 512;
    assert_eq!(a[..head], b[..head], "header and tokens differ from llama-perplexity's");

    let figures = |j: &Value| {
        (j["mean_kld"].as_f64().unwrap(), j["same_top_p"].as_f64().unwrap(), j["mean_ppl_q"].as_f64().unwrap())
    };
    let mut rungs = Vec::new();
    // Q2_K, a third rung below the other two, only with QUANTFARM_LONG (`scripts/test --long`): two more decodes of
    // every chunk, for the ordering check below, which two rungs already make.
    let long = std::env::var_os("QUANTFARM_LONG").is_some();
    let levels: &[&str] = if long { &["Q8_0", "Q4_K_M", "Q2_K"] } else { &["Q8_0", "Q4_K_M"] };
    for &level in levels {
        let model = dir.path().join(format!("{level}.gguf"));
        ok(quantfarm(&[arg("quantize"), bf16().as_os_str(), model.as_os_str(), arg(level)]), "quantize");
        let j = kld_json(&ours, &model, &[]);
        let (k, s, p) = figures(&j);
        // Our base file, read by llama-perplexity, gives its figures for the level: both tools on the same logits.
        let live = llama_kld(&ours, &model);
        assert_bands(&format!("{level}, our base file, against llama-perplexity on it"), k, s, p, live);
        rungs.push((level, k));
        if level == "Q4_K_M" {
            // Their base file read by us: the same figures as from ours, within the bands.
            let (k2, s2, p2) = figures(&kld_json(&theirs, &model, &[]));
            assert_bands("Q4_K_M, llama-perplexity's base file", k2, s2, p2, live);
            // Three processes, one share of the chunk groups each (not all with the same thread count), merged:
            // exactly the one-process figures.
            let mut files = Vec::new();
            for k in 0..3 {
                let f = dir.path().join(format!("share{k}.jsonl"));
                let shard = format!("{k}/3");
                kld_share(&ours, &model, &shard, &f);
                files.push(f);
            }
            let mut args = vec![arg("kld-merge"), arg("--json")];
            args.extend(files.iter().map(|f| f.as_os_str()));
            let merged: Value = serde_json::from_str(&ok(quantfarm(&args), "kld-merge")).unwrap();
            assert_eq!(merged, j, "three shares merged differ from one run");
        }
    }
    // The ladder is ordered: each rung loses more than the one above it.
    assert!(rungs.windows(2).all(|w| w[0].1 < w[1].1), "{rungs:?}");
    // MLX checkpoints are measured through their exact dequantization on the same chunks in the farm test below
    // (MLX 8-bit: a lossy rung closer than Q4_K_M).
}

fn arg(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

fn kld_share(base: &Path, model: &Path, shard: &str, out: &Path) {
    let t = text();
    let args = [
        arg("kld"),
        arg("--model"),
        model.as_os_str(),
        arg("--base"),
        base.as_os_str(),
        arg("--text"),
        t.as_os_str(),
        arg("--threads"),
        arg(if shard == "1/3" { "1" } else { "2" }),
        arg("--shard"),
        arg(shard),
        arg("--chunk-stats"),
        out.as_os_str(),
    ];
    let args: Vec<&std::ffi::OsStr> = args.into_iter().chain(KLD_CHUNKS.iter().map(|a| arg(a))).collect();
    ok(quantfarm(&args), "kld --shard");
}

const RECORDED_BASE: &str = "HuggingFaceTB/SmolLM2-135M-Instruct";

/// The merge checks here run on the first 8 prompts, 16 tokens each: an exact merge agrees on every one, a wrong one
/// or the base without its adapter parts within the first tokens.
const MERGE_PROMPTS: usize = 8;

fn greedy_json(prompts: &Path, reference: &Path, lora: &Path, model: &Path) -> (Option<i32>, Value) {
    let out = quantfarm(&[
        arg("greedy"),
        arg("--reference"),
        reference.as_os_str(),
        arg("--reference-lora"),
        lora.as_os_str(),
        arg("--model"),
        model.as_os_str(),
        arg("--prompts"),
        prompts.as_os_str(),
        arg("--max-tokens"),
        arg("16"),
        arg("--threads"),
        arg("2"),
        arg("--json"),
    ]);
    let code = out.status.code();
    assert!(matches!(code, Some(0) | Some(1)), "greedy failed: {}", String::from_utf8_lossy(&out.stderr));
    (code, serde_json::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap())
}

/// Link 1, the merge check: the base with the adapter applied at run time (unmerged, llama.cpp's LoRA path)
/// against the merged checkpoint, greedy on 8 prompts. An exact merge agrees 8/8; a merge of an adapter with a
/// layout bug (every lora_A transposed in memory) does not.
///
/// The check runs in F32 (SmolLM2's bf16 weights widened exactly), so it tests the merge's arithmetic and nothing
/// else: a bf16 merged checkpoint also carries the cast's rounding, which flips greedy near-ties (reference margins
/// of 0.01–0.04 logits, 6 of 20 prompts here) and is measured like any other lossy step, by KL divergence.
#[test]
fn merge_check_passes_an_exact_merge_and_fails_a_wrong_one() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("base-f32");
    ok(
        quantfarm(&[
            arg("convert"),
            bf16().as_os_str(),
            hf.as_os_str(),
            arg("--to"),
            arg("hf"),
            arg("--outtype"),
            arg("f32"),
        ]),
        "convert to an F32 HF checkpoint",
    );
    let mut merged = Vec::new();
    for flaw in [None, Some("transposed-a")] {
        let name = flaw.unwrap_or("good");
        let adapter = dir.path().join(format!("{name}-adapter"));
        std::fs::create_dir_all(&adapter).unwrap();
        let expected = dir.path().join(format!("{name}-expected.safetensors"));
        quantfarm_e2e::lora_adapters("peft-attn", &hf, &adapter, &expected, flaw);
        let out = dir.path().join(format!("{name}-merged"));
        ok(
            quantfarm(&[
                arg("merge"),
                hf.as_os_str(),
                adapter.as_os_str(),
                out.as_os_str(),
                arg("--base-name"),
                arg(RECORDED_BASE),
            ]),
            "merge",
        );
        merged.push(out);
    }
    // What the user trained: the good adapter, as a GGUF LoRA for llama.cpp.
    let lora = dir.path().join("adapter.gguf");
    let good_adapter = dir.path().join("good-adapter");
    ok(
        quantfarm(&[
            arg("lora-gguf"),
            hf.as_os_str(),
            good_adapter.as_os_str(),
            lora.as_os_str(),
            arg("--base-name"),
            arg(RECORDED_BASE),
        ]),
        "lora-gguf",
    );
    // HF folders are evaluated through the exact conversion to GGUF (F32 here).
    let prompts = quantfarm_e2e::prompts(MERGE_PROMPTS, dir.path());
    let (code, good) = greedy_json(&prompts, &hf, &lora, &merged[0]);
    eprintln!(
        "exact merge: {}/{} identical, mean prefix {}",
        good["identical"], good["n"], good["mean_prefix_fraction"]
    );
    let n = MERGE_PROMPTS as u64;
    assert_eq!((good["identical"].as_u64(), good["n"].as_u64()), (Some(n), Some(n)), "{good:#}");
    assert_eq!(code, Some(0));
    let (code, bad) = greedy_json(&prompts, &hf, &lora, &merged[1]);
    let identical = bad["identical"].as_u64().unwrap();
    eprintln!("wrong merge: {identical}/{n} identical, mean prefix {}", bad["mean_prefix_fraction"]);
    assert!(identical < n, "a wrong merge agreed {n}/{n}: {bad:#}");
    assert_eq!(code, Some(1));
    let d = bad["prompts"].as_array().unwrap().iter().find(|p| p["identical"] == false).unwrap();
    assert!(d["first_difference"].as_u64().is_some() && d["reference_margin"].as_f64().is_some(), "{d:#}");
}

/// A llama-server on loopback, stopped when dropped.
struct Server(std::process::Child, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server(model: &Path, template: &Path) -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(llama_bin().join("llama-server"))
        .arg("-m")
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string(), "-t", "2", "-c", "4096", "--jinja"])
        .arg("--chat-template-file")
        .arg(template)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start llama-server");
    let server = Server(child, port);
    for _ in 0..600 {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            let _ = s.write_all(b"GET /health HTTP/1.0\r\n\r\n");
            let mut r = String::new();
            let _ = s.read_to_string(&mut r);
            if r.starts_with("HTTP/1.1 200") || r.starts_with("HTTP/1.0 200") {
                return server;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    panic!("llama-server did not become healthy on port {port}");
}

/// POSTs JSON to the server on loopback (HTTP/1.0, so the answer ends with the connection).
fn post_json(port: u16, path: &str, body: &Value) -> Value {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let body = body.to_string();
    write!(s, "POST {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        .unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    let (_, json) = r.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP body in {r:?}"));
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{path}: {e}: {json}"))
}

/// Link 4 on a real server: `enable_thinking` travels in `chat_template_kwargs` and the template honours it (the
/// thinking-off prompt carries Qwen3's empty think block, so it is longer, and no thinking shows in the content);
/// an answer cut by the token cap is reported truncated. Our rendering of the template equals llama-server's
/// (`/apply-template`). The same suite runs on the built-in runtime.
#[test]
fn probes_on_llama_server_honour_thinking_off_and_flag_truncation() {
    let dir = tempfile::tempdir().unwrap();
    // SmolLM2 speaks ChatML, as Qwen3 does: Qwen3's template (with its enable_thinking switch) fits it.
    let template = quantfarm_e2e::llama_src().join("models/templates/Qwen-Qwen3-0.6B.jinja");
    let server = start_server(&bf16(), &template);
    let suite = dir.path().join("suite.yaml");
    std::fs::write(
        &suite,
        "defaults: {max_tokens: 48}\nprobes:\n  - {name: off, prompt: What is the capital of France?, thinking: false, expect: {contains: Paris}}\n  - {name: on, prompt: What is the capital of France?, thinking: true, expect: {contains: Paris}}\n  - {name: cut, prompt: Write a long story about a dragon., max_tokens: 4, expect: {contains: dragon}}\n",
    )
    .unwrap();
    let url = format!("http://127.0.0.1:{}", server.1);
    // Our rendering of the template is llama-server's, kwargs included.
    let source = std::fs::read_to_string(&template).unwrap();
    let ours = quantfarm_eval::template::ChatTemplate::new("qwen3", &source, "<|im_start|>", "<|im_end|>").unwrap();
    for thinking in [false, true] {
        let messages = vec![
            quantfarm_eval::template::Message { role: "system".into(), content: "Be brief.".into() },
            quantfarm_eval::template::Message::user("What is the capital of France?"),
        ];
        let mut kwargs = serde_json::Map::new();
        kwargs.insert("enable_thinking".into(), thinking.into());
        let body = serde_json::json!({"messages": messages, "chat_template_kwargs": kwargs});
        let theirs = post_json(server.1, "/apply-template", &body);
        let rendered = ours.render(&messages, true, &kwargs).unwrap();
        assert_eq!(rendered, theirs["prompt"].as_str().unwrap(), "enable_thinking={thinking}");
    }
    let out =
        quantfarm(&[arg("probe"), arg("--suite"), suite.as_os_str(), arg("--endpoint"), arg(&url), arg("--json")]);
    assert!(matches!(out.status.code(), Some(0) | Some(1)), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap();
    eprintln!("{report:#}");
    let run = |name: &str| report["runs"].as_array().unwrap().iter().find(|r| r["probe"] == name).unwrap().clone();
    let (off, on, cut) = (run("off"), run("on"), run("cut"));
    assert_eq!(off["thinking_in_content"], false, "{off:#}");
    assert!(!off["answer"].as_str().unwrap().contains("<think>"));
    let (p_off, p_on) = (off["prompt_tokens"].as_u64().unwrap(), on["prompt_tokens"].as_u64().unwrap());
    assert!(p_off > p_on, "thinking off should add the empty think block to the prompt: {p_off} vs {p_on} tokens");
    assert_eq!(cut["outcome"], "truncated", "{cut:#}");
    assert_eq!(report["truncated"].as_u64(), Some(1));
    drop(server);

    // The built-in runtime, on SmolLM2's own template: the capped answer is truncated there too.
    let out = quantfarm(&[
        arg("probe"),
        arg("--suite"),
        suite.as_os_str(),
        arg("--model"),
        bf16().as_os_str(),
        arg("--threads"),
        arg("2"),
        arg("--json"),
    ]);
    assert!(matches!(out.status.code(), Some(0) | Some(1)), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap();
    let cut = report["runs"].as_array().unwrap().iter().find(|r| r["probe"] == "cut").unwrap();
    assert_eq!(cut["outcome"], "truncated", "{cut:#}");
    assert!(cut["prompt_tokens"].as_u64().is_some(), "{cut:#}");
}

/// Workers advertise the peer runtimes they find, so a release can ask for llama.cpp's, mlx-lm's or transformers'
/// own figures: transformers only where a Python was named for it whose helper answers the handshake.
#[test]
fn workers_advertise_the_peer_runtimes_they_find() {
    let (llmc, peers) = (quantfarm_e2e::llm_compressor_python(), quantfarm_e2e::peers_python());
    let found = quantfarm_worker::runtimes_in(&[llama_bin()], &peers, Some(&llmc));
    assert_eq!(found, ["llama-perplexity", "llama-server", "llama-completion", "mlx_lm", "transformers"]);
    let found = quantfarm_worker::runtimes_in(&[llama_bin()], &peers, None);
    assert_eq!(found, ["llama-perplexity", "llama-server", "llama-completion", "mlx_lm"]);
    let empty = tempfile::tempdir().unwrap();
    let python = empty.path().join("python3");
    let none = quantfarm_worker::runtimes_in(&[empty.path().to_path_buf()], &python, Some(&python));
    assert!(none.is_empty(), "{none:?}");
}

/// Evaluation as farm tasks: a release of the SmolLM2 HF checkpoint with Q8_0 and Q4_K_M and an `evaluation:`
/// section (text, prompts, probes), made by `quantfarm run` with 3 workers. The KLD chunk groups (6 chunks of 512
/// tokens, 2 per decode: 3 groups) are measured on all three workers and merged by the coordinator into
/// llama-perplexity's figures (those of llama-perplexity, asked for as a peer and run by a worker on the farm's own
/// files and chunks, within the bands; the reference's PPL to every printed digit), and into exactly what one
/// `quantfarm kld` process gives on the same files; the `kld_mean` gates follow the figures; greedy agreement (two
/// prompt shares per model) and probe results equal what `quantfarm greedy` and `quantfarm probe` give in one
/// process.
#[test]
fn farm_measures_kld_greedy_and_probes_on_three_workers() {
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let hf = smollm2_derived().join("smollm2-hf");
    // Greedy agreement on 8 prompts (two shares of 4 per model), compared prompt by prompt with one process.
    let prompts = quantfarm_e2e::prompts(8, dir.path());
    let release = dir.path().join("release.yaml");
    std::fs::write(
        &release,
        format!(
            "name: smollm2-kld\nsource: {}\noutputs:\n  gguf:\n    quants: [Q8_0, Q4_K_M]\n  mlx: {{bits: [8]}}\n\
             evaluation:\n  text: {}\n  ctx: 512\n  batch: 1024\n  chunks: 6\n  prompts: {}\n  max_tokens: 24\n  mlx_lm: false\n\
             \x20 probes: {}\n  peers: [llama-perplexity]\n\
             gates:\n  - {{name: q8-close, check: 'q8_0.kld.mean <= 0.01'}}\n\
             \x20 - {{name: q4-close, check: 'q4_k_m.kld.mean <= 0.01'}}\n\
             \x20 - {{name: q4-tail, check: 'q4_k_m.kld.p99 <= 10'}}\n",
            hf.display(),
            text().display(),
            prompts.display(),
            probes().display()
        ),
    )
    .unwrap();
    // Q4_K_M's mean KLD (about 0.06 on this text) is far above its gate's 0.01, Q8_0's (about 0.001) far below it:
    // the release runs to its end and the verdict is "gate failed".
    let sum = farm_run(dir.path(), &release, 3, 1);
    let artifact = |ty: &str| {
        sum["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["file_type"] == ty)
            .unwrap_or_else(|| panic!("{sum:#}"))
            .clone()
    };
    for ty in ["Q8_0", "Q4_K_M"] {
        let k = &artifact(ty)["kld"];
        let got =
            (k["mean_kld"].as_f64().unwrap(), k["same_top_p"].as_f64().unwrap(), k["mean_ppl_q"].as_f64().unwrap());
        assert_eq!(k["n_chunks"], 6, "{k:#}");
        // llama-perplexity itself, run by a worker on the same files and chunks (its own base run on the farm's
        // BF16). The reference's figures print the same; a quant level's are within the bands (assert_bands says
        // why), and the report says which figures print the same (`same_as_quantfarm`).
        let peer = &artifact(ty)["peers"]["llama-perplexity"];
        let f = |label: &str| peer["figures"][label].as_f64().unwrap_or_else(|| panic!("{label}: {peer:#}"));
        assert_eq!(peer["same_as_quantfarm"]["Mean PPL(base)"], true, "{ty}: {peer:#}");
        // Its figures are the statistics it prints, not its log's `label: value` lines.
        let labels = peer["figures"].as_object().unwrap_or_else(|| panic!("{peer:#}"));
        assert!(labels.keys().all(|l| !l.contains("kl_divergence")), "{ty}: log lines among the figures: {peer:#}");
        // And the report names its version as the tool says it.
        let version = Command::new(llama_bin().join("llama-perplexity")).arg("--version").output().unwrap();
        let said = String::from_utf8_lossy(&version.stdout).into_owned() + &String::from_utf8_lossy(&version.stderr);
        let v = peer["version"].as_str().unwrap_or_default();
        assert!(!v.is_empty() && said.contains(v), "{ty}: version {v:?}, the tool says {said:?}");
        let live = (f("Mean KLD"), f("Same top p"), f("Mean PPL(Q)"));
        assert_bands(&format!("farm {ty} vs llama-perplexity here"), got.0, got.1, got.2, live);
        eprintln!("{ty}: printed the same as llama-perplexity here: {}", peer["same_as_quantfarm"]);
    }
    // The MLX checkpoint, measured through its exact conversion in the same runtime, on the same chunks.
    let mlx = &artifact("MLX-8bit")["kld"];
    eprintln!("farm MLX-8bit: mean KLD {}, same top {} %", mlx["mean_kld"], mlx["same_top_p"]);
    assert_eq!(mlx["n_chunks"], 6, "{mlx:#}");
    let mlx_kld = mlx["mean_kld"].as_f64().unwrap();
    assert!(mlx_kld > 0.0 && mlx_kld < artifact("Q4_K_M")["kld"]["mean_kld"].as_f64().unwrap(), "{mlx:#}");
    assert_eq!(artifact("MLX-8bit")["greedy"]["n"], 8);
    let gate = |name: &str| sum["gates"].as_array().unwrap().iter().find(|g| g["name"] == name).unwrap().clone();
    assert_eq!(gate("reproducible")["passed"], true, "{sum:#}");
    assert_eq!(gate("q8-close")["passed"], true, "{sum:#}");
    let q4 = gate("q4-close");
    assert_eq!(q4["passed"], false, "{q4:#}");
    // The gate line shows the figure this run measured, as gate lines show numbers.
    let q4_kld = artifact("Q4_K_M")["kld"]["mean_kld"].as_f64().unwrap();
    let want = format!("q4_k_m.kld.mean = {} > 0.01", quantfarm_coordinator::gates::expr::fmt_num(q4_kld));
    assert_eq!(q4["detail"], want.as_str(), "{q4:#}");
    assert_eq!(q4["inputs"]["q4_k_m.kld.mean"].as_f64(), Some(q4_kld), "{q4:#}");
    assert_eq!(q4["threshold"], 0.01, "{q4:#}");
    // A percentile figure is measured too (the 99th, as llama-perplexity prints it).
    let tail = gate("q4-tail");
    assert_eq!(tail["passed"], true, "{tail:#}");
    assert!(tail["inputs"]["q4_k_m.kld.p99"].as_f64().is_some_and(|v| v > q4_kld), "{tail:#}");
    // Every level was measured (KLD and probes); the defaults' per-level KLD limits hold for all three.
    for g in sum["gates"].as_array().unwrap().iter().filter(|g| g["name"] == "measured" || g["name"] == "kld") {
        assert_eq!(g["passed"], true, "{g:#}");
    }

    // The chunk groups (3 of them: 1024/512 chunks each) were spread over the three workers.
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(sum["report_url"].as_str().unwrap()).unwrap()).unwrap();
    let workers: std::collections::BTreeSet<&str> = report["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["id"].as_str().unwrap().starts_with("kld"))
        .map(|t| t["worker"].as_str().unwrap())
        .collect();
    assert_eq!(workers.len(), 3, "the KLD tasks ran on {workers:?}");
    assert_eq!(report["evaluation"]["n_chunks"], 6, "{:#}", report["evaluation"]);

    // One process on the same files gives the same figures, all of them.
    let url = |ty: &str| PathBuf::from(artifact(ty)["files"][0]["url"].as_str().unwrap());
    let (reference, q4_k_m, t) = (url("BF16"), url("Q4_K_M"), text());
    let one: Value = serde_json::from_str(&ok(
        quantfarm(&[
            arg("kld"),
            arg("--reference"),
            reference.as_os_str(),
            arg("--model"),
            q4_k_m.as_os_str(),
            arg("--text"),
            t.as_os_str(),
            arg("--threads"),
            arg("2"),
            arg("--json"),
            arg("--ctx"),
            arg("512"),
            arg("--batch"),
            arg("1024"),
            arg("--chunks"),
            arg("6"),
        ]),
        "quantfarm kld",
    ))
    .unwrap();
    let farm = artifact("Q4_K_M")["kld"].clone();
    let (one, farm) = (one.as_object().unwrap(), farm.as_object().unwrap());
    let keys = |m: &serde_json::Map<String, Value>| m.keys().cloned().collect::<std::collections::BTreeSet<_>>();
    assert_eq!(keys(one), keys(farm));
    for (key, v) in one {
        // Compared as numbers: the signed report writes an integral float without its ".0".
        assert_eq!(v.as_f64(), farm[key].as_f64(), "{key}: one process and the farm's merge differ");
    }

    // Greedy agreement, two shares of the prompts per model, joined: the same as one `quantfarm greedy` process.
    let q8_0 = url("Q8_0");
    let (p, ctx) = (&prompts, arg("4096"));
    let out = quantfarm(&[
        arg("greedy"),
        arg("--reference"),
        reference.as_os_str(),
        arg("--model"),
        q8_0.as_os_str(),
        arg("--prompts"),
        p.as_os_str(),
        arg("--max-tokens"),
        arg("24"),
        arg("--ctx"),
        ctx,
        arg("--threads"),
        arg("2"),
        arg("--json"),
    ]);
    let one: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("greedy --json: {e}"));
    let farm = artifact("Q8_0")["greedy"].clone();
    eprintln!("farm Q8_0 greedy: {}/{} identical", farm["identical"], farm["n"]);
    assert_eq!((farm["n"].as_u64(), farm["complete"].as_bool()), (Some(8), Some(true)), "{farm:#}");
    assert_eq!(farm["identical"], one["identical"], "farm {farm:#}\none process {one:#}");
    let differ = |v: &Value, key: &str| -> Vec<(u64, u64)> {
        v[key]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["identical"] != true)
            .map(|p| (p["index"].as_u64().unwrap(), p["first_difference"].as_u64().unwrap()))
            .collect()
    };
    assert_eq!(differ(&farm, "disagreements"), differ(&one, "prompts"), "where the continuations part");

    // Probes: the reference and each model, each as one `quantfarm probe` process scores it.
    let suite = probes();
    for (ty, model) in [("BF16", &reference), ("Q8_0", &q8_0)] {
        let out = quantfarm(&[
            arg("probe"),
            arg("--suite"),
            suite.as_os_str(),
            arg("--model"),
            model.as_os_str(),
            arg("--threads"),
            arg("2"),
            arg("--json"),
        ]);
        let one: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("probe --json: {e}"));
        let farm = artifact(ty)["probes"].clone();
        eprintln!(
            "farm {ty} probes: {} passed, {} failed, {} truncated",
            farm["passed"], farm["failed"], farm["truncated"]
        );
        for key in ["passed", "failed", "truncated", "mean_score"] {
            assert_eq!(farm[key].as_f64(), one[key].as_f64(), "{ty} probes, {key}: farm {farm:#}");
        }
        assert!(farm["truncated"].as_u64().unwrap() >= 1, "the 8-token probe is cut off: {farm:#}");
    }
    assert!(artifact("Q4_K_M")["probes"]["delta_vs_reference"].is_number());
}

/// `quantfarm run RELEASE --workers N --json` with its store and signing key in `dir` (and the peer tools in reach);
/// asserts the exit status and returns the summary line.
fn farm_run(dir: &Path, release: &Path, workers: u32, want_status: i32) -> Value {
    let out = quantfarm_e2e::farm_run_output(Path::new(env!("CARGO_BIN_EXE_quantfarm")), release, workers, dir);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(want_status), "{stdout}\n{stderr}");
    serde_json::from_str(stdout.lines().last().expect("a summary line")).unwrap()
}

fn probes() -> PathBuf {
    quantfarm_e2e::repo_root().join("examples/probes-smollm2.yaml")
}

/// Link 1 on the farm: a release of SmolLM2 (bf16) with a PEFT adapter checks its merge. The workers write the
/// adapter as a GGUF LoRA, the base widened to F32 and the merge rounded to f32, then run the base with the LoRA
/// applied at run time against the merge on 8 prompts: an exact merge agrees 8/8, the gate passes, and one
/// `quantfarm greedy` process on the farm's files agrees. The same merge against the base without the adapter does
/// not agree, so the check sees the adapter (the CLI test above shows it failing a wrong merge). Long only: the
/// default run checks a merge on the farm in `release.rs`'s tuned ladder (8/8 on its merge gate) and fails a wrong
/// one above; this adds the one-process cross-check and the base without the adapter.
#[test]
fn farm_checks_the_merge_against_the_adapter_at_run_time() {
    if quantfarm_e2e::skip_unless_long(
        "farm_checks_the_merge_against_the_adapter_at_run_time",
        "the farm's merge check is run in release.rs's tuned ladder; this cross-check adds a minute",
    ) {
        return;
    }
    let _cpu = quantfarm_e2e::cpu_bound();
    let dir = tempfile::tempdir().unwrap();
    let hf = smollm2_derived().join("smollm2-hf");
    let adapter = quantfarm_e2e::lora_adapter("peft-attn", &hf, dir.path());
    let prompts = quantfarm_e2e::prompts(MERGE_PROMPTS, dir.path());
    let release = dir.path().join("release.yaml");
    std::fs::write(
        &release,
        format!(
            "name: smollm2-lora\nsource: {}\nadapter: {}\nbase_name: {RECORDED_BASE}\noutputs:\n  gguf: {{quants: []}}\n\
             evaluation:\n  prompts: {}\n  max_tokens: 16\n\
             gates:\n  - {{name: merge, check: 'merge.greedy.agree >= 1'}}\n",
            hf.display(),
            adapter.display(),
            prompts.display()
        ),
    )
    .unwrap();
    let sum = farm_run(dir.path(), &release, 2, 0);
    let check = &sum["merge_check"];
    let greedy = &check["greedy"];
    eprintln!(
        "farm merge check: {}/{} identical, mean prefix {}",
        greedy["identical"], greedy["n"], greedy["mean_prefix_fraction"]
    );
    let n = MERGE_PROMPTS as u64;
    assert_eq!((greedy["identical"].as_u64(), greedy["n"].as_u64()), (Some(n), Some(n)), "{check:#}");
    assert_eq!(greedy["complete"], true, "{check:#}");
    // The release's own `merge` gate replaced the default one (agree >= 0.9).
    let merge_gates: Vec<&Value> = sum["gates"].as_array().unwrap().iter().filter(|g| g["name"] == "merge").collect();
    assert_eq!(merge_gates.len(), 1, "{sum:#}");
    let gate = merge_gates[0];
    assert_eq!((gate["passed"].as_bool(), gate["source"].as_str()), (Some(true), Some("release")), "{gate:#}");
    assert_eq!(gate["detail"], "merge.greedy.agree = 1 >= 1", "{gate:#}");
    assert_eq!(gate["inputs"]["merge.greedy.agree"], 1.0, "{gate:#}");

    // The three inputs are separate files, and the reference side ran with the LoRA.
    let file = |part: &str| PathBuf::from(check[part]["url"].as_str().unwrap_or_else(|| panic!("{check:#}")));
    let (base, lora, merged) = (file("base"), file("lora"), file("merged"));
    for f in [&base, &lora, &merged] {
        assert!(f.is_file(), "{}", f.display());
    }
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(sum["report_url"].as_str().unwrap()).unwrap()).unwrap();
    let task = |id: &str| {
        report["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == id)
            .unwrap_or_else(|| panic!("no task {id}"))
            .clone()
    };
    assert_eq!(task("greedy/adapter/0")["inputs"]["lora"].as_str(), lora.to_str());
    assert_eq!(task("greedy/merged-f32/1")["inputs"]["lora"], "");
    assert_eq!(task("greedy/merged-f32/1")["inputs"]["model"].as_str(), merged.to_str());

    // One process on the farm's files: the same agreement.
    let greedy_one = |lora: Option<&Path>| -> Value {
        let p = &prompts;
        let mut args = vec![arg("greedy"), arg("--reference"), base.as_os_str(), arg("--model"), merged.as_os_str()];
        if let Some(l) = lora {
            args.extend([arg("--reference-lora"), l.as_os_str()]);
        }
        args.extend([arg("--prompts"), p.as_os_str(), arg("--max-tokens"), arg("16"), arg("--ctx"), arg("4096")]);
        args.extend([arg("--threads"), arg("2"), arg("--json")]);
        let out = quantfarm(&args);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("greedy --json: {e}: {}", String::from_utf8_lossy(&out.stderr)))
    };
    let one = greedy_one(Some(&lora));
    assert_eq!(one["identical"], n, "{one:#}");
    let without = greedy_one(None);
    let identical = without["identical"].as_u64().unwrap();
    eprintln!("the merge against the base without its adapter: {identical}/{n} identical");
    assert!(identical < n, "the merge behaves like the base without the adapter: {without:#}");
}

/// `quantfarm choice score` against `llama-perplexity --multiple-choice` on the same task file (the project's
/// question set, packed into llama-perplexity's binary format), for two rungs (BF16 and llama-quantize's Q4_1): the
/// same running accuracy after every task (so the same task right or wrong) and the same final figures.
#[test]
fn multiple_choice_scores_equal_llama_perplexity() {
    if quantfarm_e2e::skip_unless_long(
        "multiple_choice_scores_equal_llama_perplexity",
        "release.rs' a_release_scores_its_multiple_choice_tasks_as_llama_perplexity compares every task with \
         llama-perplexity on the tiny model in the suite; SmolLM2's two rungs (and their 64 decodes of real \
         answers) run here",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tasks = dir.path().join("basics.bin");
    let yaml = quantfarm_e2e::repo_root().join("examples/choice-basics.yaml");
    ok(quantfarm(&[arg("choice"), arg("pack"), yaml.as_os_str(), tasks.as_os_str()]), "choice pack");
    for model in [bf16(), smollm2_derived().join("SmolLM2-135M-Instruct.Q4_1.gguf")] {
        let ours = ok(
            quantfarm(&[arg("choice"), arg("score"), model.as_os_str(), tasks.as_os_str(), arg("--threads"), arg("2")]),
            "choice score",
        );
        // Its task lines go to stdout or stderr by build; its final lines carry a log prefix.
        let theirs = quantfarm_e2e::llama_perplexity_output(
            &[
                arg("-m"),
                model.as_os_str(),
                arg("-bf"),
                tasks.as_os_str(),
                arg("--multiple-choice"),
                arg("-t"),
                arg("2"),
            ],
            |t| t.contains("Random chance:"),
        );
        let lines = |text: &str| -> Vec<String> {
            text.lines()
                .filter_map(|l| {
                    let l = l.trim();
                    let task = l.split('\t').count() == 2 && l.split('\t').all(|f| f.parse::<f64>().is_ok());
                    let fin = ["Final result:", "Random chance:"].iter().find_map(|k| l.find(k).map(|i| &l[i..]));
                    if task {
                        Some(l.to_string())
                    } else {
                        fin.map(str::to_string)
                    }
                })
                .collect()
        };
        let (a, b) = (lines(&ours), lines(&theirs));
        assert_eq!(a.len(), 32 + 2, "{ours}");
        assert_eq!(a, b, "{}: quantfarm's lines against llama-perplexity's", model.display());
        eprintln!("{}: {}", model.display(), a[a.len() - 2]);
    }
}

/// Per-chunk (KLD sum, scored tokens) of `model` against `base` on gpl3.txt in chunks of `ctx` (`quantfarm kld
/// --chunk-stats`), quantizing the SmolLM2 BF16 to `level` first when `model` does not exist.
fn chunk_sums(dir: &Path, base: &Path, level: &str, ctx: &str) -> Vec<(f64, f64)> {
    let model = dir.join(format!("{level}.gguf"));
    if !model.exists() {
        ok(quantfarm(&[arg("quantize"), bf16().as_os_str(), model.as_os_str(), arg(level)]), "quantize");
    }
    let (t, stats) = (text(), dir.join(format!("{level}-{ctx}.jsonl")));
    let mut args = vec![arg("kld"), arg("--model"), model.as_os_str(), arg("--base"), base.as_os_str()];
    args.extend([arg("--text"), t.as_os_str(), arg("--chunk-stats"), stats.as_os_str()]);
    args.extend([arg("--ctx"), arg(ctx), arg("--batch"), arg(ctx), arg("--threads"), arg("2")]);
    ok(quantfarm(&args), "kld --chunk-stats");
    let mut chunks: Vec<(u64, f64, f64)> = std::fs::read_to_string(&stats)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["chunk"].as_u64().unwrap(), v["sum_kld"].as_f64().unwrap(), v["count"].as_f64().unwrap())
        })
        .collect();
    chunks.sort_by_key(|c| c.0);
    chunks.into_iter().map(|c| (c.1, c.2)).collect()
}

/// The sequential stop rule (`quantfarm_parity::sequential`, `evaluation.stop`) holds its stated confidence on real
/// per-chunk data: SmolLM2's llama-quantize ladder (Q8_0 … Q2_K) on gpl3.txt in the 14 chunks of 512 tokens the
/// default gate limits were measured on (units: one chunk), and Q8_0, Q4_0 and Q2_K in 59 chunks of 128 tokens
/// (units: groups of 4, as `batch: 512` decodes them, and single chunks). For each rung, 1,000 seeded orders per
/// threshold (its default limit, and half to 2.2 times its full-text mean, the hard cases near it included) and per
/// precision (± 5, 10, 20 %), at confidence 0.99 and 0.95: the runs stopped before the end whose interval misses the
/// full-text mean (llama-perplexity's figure), and those whose verdict differs from the full text's, are each at most
/// `1 − confidence` of the runs plus three binomial standard deviations. Prints how much of the text each case
/// measured.
#[test]
fn the_stop_rule_holds_its_confidence_on_real_per_chunk_data() {
    use quantfarm_parity::sequential::{unit_order, StopReason, StopRule};
    if quantfarm_e2e::skip_unless_long(
        "the_stop_rule_holds_its_confidence_on_real_per_chunk_data",
        "eleven KL-divergence passes over gpl3.txt (about 6 min on 2 cores), then the simulation",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let t = text();
    let mut sets: Vec<(String, f64, Vec<(f64, f64)>)> = Vec::new();
    for (ctx, levels) in [
        ("512", &["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K"][..]),
        ("128", &["Q8_0", "Q4_0", "Q2_K"][..]),
    ] {
        let base = dir.path().join(format!("base-{ctx}.bin"));
        let mut args = vec![arg("kld"), arg("--reference"), bf16().into_os_string().leak(), arg("--text")];
        args.extend([t.as_os_str(), arg("--save-base"), base.as_os_str(), arg("--ctx"), arg(ctx)]);
        args.extend([arg("--batch"), arg(ctx), arg("--threads"), arg("2")]);
        ok(quantfarm(&args), "base pass");
        for &level in levels {
            let chunks = chunk_sums(dir.path(), &base, level, ctx);
            let limit = quantfarm_report::gates::default_kld_max(level).unwrap();
            let per_unit: &[usize] = if ctx == "512" { &[1] } else { &[4, 1] };
            for &per in per_unit {
                let units: Vec<(f64, f64)> =
                    chunks.chunks(per).map(|g| (g.iter().map(|c| c.0).sum(), g.iter().map(|c| c.1).sum())).collect();
                sets.push((format!("{level} ctx {ctx}, units of {per}"), limit, units));
            }
        }
    }
    let runs = 1000u64;
    let mut report = Vec::new();
    for confidence in [0.99, 0.95] {
        let alpha = 1.0 - confidence;
        let allowed = runs as f64 * alpha + 3.0 * (runs as f64 * alpha * (1.0 - alpha)).sqrt();
        for (what, limit, units) in &sets {
            let mean = units.iter().map(|u| u.0).sum::<f64>() / units.iter().map(|u| u.1).sum::<f64>();
            let mut cases: Vec<(String, Vec<f64>, Option<f64>)> = vec![(format!("limit {limit}"), vec![*limit], None)];
            for x in [0.5, 0.75, 0.9, 1.1, 1.3, 1.6, 2.2] {
                cases.push((format!("{x}x mean"), vec![x * mean], None));
            }
            for p in [0.05, 0.1, 0.2] {
                cases.push((format!("precision {p}"), Vec::new(), Some(p)));
            }
            let mut line = format!("{confidence} {what}: mean {mean:.5};");
            for (label, thresholds, precision) in cases {
                let rule = StopRule { confidence, min_units: 4, spread: 0.3, precision };
                let first = rule.first_look(units.len());
                let (mut misses, mut wrong, mut measured) = (0u64, 0u64, 0usize);
                for seed in 0..runs {
                    let look = rule.run(units, &unit_order(units.len(), first, seed), &thresholds);
                    measured += look.measured;
                    if look.stop != Some(StopReason::Complete) {
                        misses += u64::from(!(look.low <= mean && mean <= look.high));
                        wrong += thresholds.iter().map(|&t| u64::from((look.mean > t) != (mean > t))).sum::<u64>();
                    }
                }
                let share = measured as f64 / (runs as f64 * units.len() as f64);
                line.push_str(&format!(" {label}: {share:.2} measured, {misses} missed, {wrong} wrong;"));
                assert!(
                    (misses as f64) <= allowed && (wrong as f64) <= allowed,
                    "{what}, {label} at {confidence}: {misses} intervals missed the mean, {wrong} wrong verdicts in \
                     {runs} runs (allowed {allowed:.1})\n{}",
                    report.join("\n")
                );
            }
            report.push(line);
        }
    }
    eprintln!("{}", report.join("\n"));
}
