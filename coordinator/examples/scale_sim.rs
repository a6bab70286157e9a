//! A scale simulation of the farm: the real scheduler (`Sched`, its graph builder and its SQLite journal) runs one
//! release of a 70B Llama (8 quant levels, 40 KLD chunks) on simulated workers whose tasks take synthetic durations
//! from a bandwidth and compute model. Time is simulated; the scheduler's own work is real and timed. It prints the
//! task counts, bytes moved, the makespan and where the time goes, and what the journal had to absorb, for
//! `docs/scale.md`.
//!
//! ```sh
//! cargo run --release -p quantfarm-coordinator --example scale_sim -- [--workers 50] [--eval-workers 10]
//!     [--worker-gbps 1.0] [--eval-tok-s 400] [--cores 16] [--cache-gb 0]
//! ```
//!
//! With `SIM_TRACE=1` it prints every task that fetched from the store: when, where, what and how much.
//!
//! The model of a task (every figure a flag or a constant below, named where it comes from):
//! - a task streams its inputs from the store and its outputs to it at the worker's bandwidth, and computes at the
//!   same time: its duration is the larger of the I/O time and the compute time;
//! - GGUF conversion moves bytes only; quantization computes at the per-core rates `bench/quantize-vs-llama`
//!   measured for `quantfarm quantize` on SmolLM2 (single thread), times the worker's cores; a verify task
//!   recomputes its output and reads the stored copy;
//! - the farm-made files a task reads are the ones the scheduler lists in its lease (`Task.inputs`, with their
//!   sizes): a quantize task's BF16 file, a verify task's BF16 file and stored copy (unless an evaluation task
//!   checks that copy, `VerifyTask.stored_checked_by`), an evaluation task's whole model and base logits. Without a
//!   cache (`--cache-gb 0`) each task fetches them, as the worker does without `--cache-size`
//!   (`worker/src/fetch.rs`: fetched per task, removed with it). With `--cache-gb N` each worker keeps what it
//!   fetched in N GB, least recently used first out (`worker/src/cache.rs`), reports its holdings with each lease
//!   request, and fetches only what it lacks; the scheduler leases by them (`Sched::lease`);
//! - the KL-divergence plan fetches the whole reference, as the worker does (it needs only the vocabulary, but
//!   reads the model as llama.cpp loads it);
//! - an evaluation task decodes its chunk group at `--eval-tok-s` for the bf16 reference, proportionally faster
//!   for smaller models (decode is memory-bound).

use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use quantfarm_coordinator::graph;
use quantfarm_coordinator::journal::Journal;
use quantfarm_coordinator::kinds::{Gguf, Kld, KldBase, Quantize, TaskKey, Verify};
use quantfarm_coordinator::sched::{Sched, SchedConfig};
use quantfarm_proto::{self as pb, complete_request::Outcome, task, task_result};
use quantfarm_store::Location;

/// Llama-3.1-70B's shape.
const HIDDEN: u64 = 8192;
const LAYERS: u64 = 80;
const FF: u64 = 28672;
const VOCAB: u64 = 128_256;
const KV_ROWS: u64 = 1024; // 8 KV heads of 128
const SPLIT_BYTES: u64 = 5_000_000_000;
const CTX: u64 = 512;
const BATCH: u64 = 2048;
const CHUNKS: u64 = 40;
const LEVELS: [(&str, f64, f64); 8] = [
    // (file type, bits per weight of a Llama 70B file, MB/s of bf16 input per core)
    ("Q8_0", 8.50, 465.0),
    ("Q6_K", 6.56, 280.0),
    ("Q5_K_M", 5.70, 260.0),
    ("Q5_K_S", 5.52, 260.0),
    ("Q4_K_M", 4.89, 250.0),
    ("Q4_K_S", 4.58, 250.0),
    ("Q3_K_M", 3.91, 270.0),
    ("Q2_K", 3.35, 330.0),
];

struct Cfg {
    workers: usize,
    eval_workers: usize,
    worker_bps: f64,
    eval_tok_s: f64,
    cores: f64,
    /// Each worker's cache, in bytes (0: none).
    cache_bytes: f64,
}

fn parse_args() -> Cfg {
    let mut c =
        Cfg { workers: 50, eval_workers: 10, worker_bps: 1e9, eval_tok_s: 400.0, cores: 16.0, cache_bytes: 0.0 };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = || args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--workers" => c.workers = v().parse().expect("--workers N"),
            "--eval-workers" => c.eval_workers = v().parse().expect("--eval-workers N"),
            "--worker-gbps" => c.worker_bps = v().parse::<f64>().expect("--worker-gbps GB/s") * 1e9,
            "--eval-tok-s" => c.eval_tok_s = v().parse().expect("--eval-tok-s N"),
            "--cores" => c.cores = v().parse().expect("--cores N"),
            "--cache-gb" => c.cache_bytes = v().parse::<f64>().expect("--cache-gb GB") * 1e9,
            other => panic!("unknown argument {other:?}"),
        }
        i += 2;
    }
    assert!(c.eval_workers <= c.workers, "--eval-workers must be at most --workers");
    c
}

/// The GGUF tensor list of the model: (name, bf16 bytes; f32 norms).
fn tensors() -> Vec<(String, u64)> {
    let mut t = vec![("token_embd.weight".to_string(), VOCAB * HIDDEN * 2)];
    for l in 0..LAYERS {
        let b = |n: &str| format!("blk.{l}.{n}.weight");
        t.push((b("attn_norm"), HIDDEN * 4));
        t.push((b("attn_q"), HIDDEN * HIDDEN * 2));
        t.push((b("attn_k"), KV_ROWS * HIDDEN * 2));
        t.push((b("attn_v"), KV_ROWS * HIDDEN * 2));
        t.push((b("attn_output"), HIDDEN * HIDDEN * 2));
        t.push((b("ffn_norm"), HIDDEN * 4));
        t.push((b("ffn_gate"), FF * HIDDEN * 2));
        t.push((b("ffn_up"), FF * HIDDEN * 2));
        t.push((b("ffn_down"), HIDDEN * FF * 2));
    }
    t.push(("output_norm.weight".into(), HIDDEN * 4));
    t.push(("output.weight".into(), VOCAB * HIDDEN * 2));
    t
}

/// The plan a plan task would return: the tensors split as gguf-split splits by size.
fn plan(tensors: &[(String, u64)]) -> (pb::PlanResult, Vec<u64>) {
    let mut shards = Vec::new();
    let mut shard_bytes = Vec::new();
    let (mut start, mut acc) = (0u32, 0u64);
    for (i, (_, b)) in tensors.iter().enumerate() {
        if acc > 0 && acc + b > SPLIT_BYTES {
            shards.push(pb::ShardRange { start, end: i as u32 });
            shard_bytes.push(acc);
            start = i as u32;
            acc = 0;
        }
        acc += b;
    }
    shards.push(pb::ShardRange { start, end: tensors.len() as u32 });
    shard_bytes.push(acc);
    let planned = tensors
        .iter()
        .map(|(n, b)| pb::PlannedTensor {
            name: n.clone(),
            source: n.clone(),
            ggml_type: if n.ends_with("norm.weight") { "F32" } else { "BF16" }.into(),
            bytes: *b,
            elements: b / 2,
            ne: vec![b / 2],
        })
        .collect();
    let p = pb::PlanResult {
        architecture: "llama".into(),
        format: "safetensors".into(),
        plan_digest: "sim".into(),
        source_identity: "sim".into(),
        source_bytes: tensors.iter().map(|t| t.1).sum(),
        tensors: planned,
        shards,
        imatrix_sha256: String::new(),
    };
    (p, shard_bytes)
}

/// What one task moves and computes, in the model's terms: `read` is what it reads that the farm did not make (the
/// source), `fetched` the farm-made inputs it fetched from the store, `hits` those its cache had.
#[derive(Default, Clone, Copy)]
struct Work {
    read: f64,
    written: f64,
    fetched: f64,
    hits: f64,
    compute_s: f64,
}

struct Model<'a> {
    cfg: &'a Cfg,
    shard_bytes: &'a [u64],
    bf16_bytes: f64,
}

impl Model<'_> {
    fn level(name: &str) -> (f64, f64) {
        LEVELS.iter().find(|l| l.0 == name).map(|l| (l.1, l.2)).expect("a simulated level")
    }

    fn model_bytes(&self, target: &str) -> f64 {
        if target == "reference" {
            self.bf16_bytes
        } else {
            self.bf16_bytes * Model::level(target).0 / 16.0
        }
    }

    fn decode_s(&self, target: &str) -> f64 {
        let tokens = (BATCH / CTX * CTX) as f64;
        tokens / self.cfg.eval_tok_s * self.model_bytes(target) / self.bf16_bytes
    }

    /// The task's own work; its farm-made inputs are added from its lease.
    fn work(&self, key: &TaskKey, logits_group_bytes: f64) -> Work {
        let quant = |level: &str, shard: usize| {
            let b = self.shard_bytes[shard] as f64;
            let (bpw, rate) = Model::level(level);
            (b * bpw / 16.0, b / (rate * 1e6 * self.cfg.cores))
        };
        match key {
            &TaskKey::PLAN => Work { read: 1e6, ..Work::default() },
            TaskKey::Gguf(Gguf { shard }) => {
                let b = self.shard_bytes[*shard as usize] as f64;
                Work { read: b, written: b, ..Work::default() }
            }
            TaskKey::Quantize(Quantize { level, shard }) => {
                let (written, compute_s) = quant(&level.to_string(), *shard as usize);
                Work { written, compute_s, ..Work::default() }
            }
            TaskKey::Verify(Verify::Gguf { shard }) => {
                Work { read: self.shard_bytes[*shard as usize] as f64, ..Work::default() }
            }
            TaskKey::Verify(Verify::Quantize { level, shard }) => {
                Work { compute_s: quant(&level.to_string(), *shard as usize).1, ..Work::default() }
            }
            TaskKey::Kld(Kld::Plan) => Work { read: 20e6, compute_s: 5.0, ..Work::default() },
            TaskKey::KldBase(KldBase { .. }) => {
                Work { written: logits_group_bytes, compute_s: self.decode_s("reference"), ..Work::default() }
            }
            TaskKey::Kld(Kld::Measure { target, .. }) => {
                Work { compute_s: self.decode_s(&target.to_string()), ..Work::default() }
            }
            other => panic!("the simulation has no model of task {other}"),
        }
    }

    fn seconds(&self, w: &Work) -> f64 {
        ((w.read + w.written + w.fetched) / self.cfg.worker_bps).max(w.compute_s)
    }
}

/// A worker's cache: content-addressed entries, least recently used first out, never past its size.
#[derive(Default)]
struct Cache {
    entries: VecDeque<(String, f64)>,
    bytes: f64,
}

impl Cache {
    /// Serves `inputs` (fetching what is missing): (fetched bytes, bytes served from the cache).
    fn serve(&mut self, inputs: &[pb::InputFile], size: f64) -> (f64, f64) {
        let (mut fetched, mut hits) = (0.0, 0.0);
        for i in inputs {
            let bytes = i.bytes as f64;
            if let Some(p) = self.entries.iter().position(|e| e.0 == i.sha256) {
                let e = self.entries.remove(p).expect("present");
                self.entries.push_back(e);
                hits += bytes;
                continue;
            }
            fetched += bytes;
            if bytes > size {
                continue;
            }
            // Evict the least recently used entries that are not this task's inputs.
            while self.bytes + bytes > size {
                let Some(p) = self.entries.iter().position(|e| !inputs.iter().any(|i| i.sha256 == e.0)) else {
                    break;
                };
                let e = self.entries.remove(p).expect("present");
                self.bytes -= e.1;
            }
            if self.bytes + bytes <= size {
                self.entries.push_back((i.sha256.clone(), bytes));
                self.bytes += bytes;
            }
        }
        (fetched, hits)
    }

    fn holdings(&self) -> Vec<String> {
        self.entries.iter().map(|e| e.0.clone()).collect()
    }
}

/// The result a worker would send for the task: artifacts at the task's URL with a digest of it.
fn result_for(t: &pb::Task, key: &TaskKey, plan: &pb::PlanResult, bytes: f64) -> pb::TaskResult {
    let kind = match (key, t.kind.as_ref()) {
        (&TaskKey::PLAN, _) => task_result::Kind::Plan(plan.clone()),
        (TaskKey::Kld(Kld::Plan), _) => task_result::Kind::KldPlan(pb::KldPlanResult {
            n_chunks: CHUNKS as u32,
            n_seq: (BATCH / CTX) as u32,
            n_vocab: VOCAB as u32,
            text_sha256: "sim-text".into(),
            tokens_sha256: "sim-tokens".into(),
            bos: Some(1),
        }),
        (TaskKey::Kld(Kld::Measure { .. }), _) => task_result::Kind::Kld(pb::KldResult::default()),
        (_, Some(task::Kind::Verify(_))) => {
            task_result::Kind::Verify(pb::VerifyResult { identical: true, ..Default::default() })
        }
        _ => {
            let url = graph::output_url(t).expect("an artifact task has an output").to_string();
            let sha256 = quantfarm_store::hex(&<sha2::Sha256 as sha2::Digest>::digest(url.as_bytes()));
            let artifact = pb::Artifact { url, sha256, bytes: bytes as u64, types: vec![] };
            task_result::Kind::Artifact(pb::ArtifactResult {
                artifact: Some(artifact),
                cache_hit: false,
                experts: vec![],
            })
        }
    };
    pb::TaskResult { kind: Some(kind) }
}

/// A finishing task, ordered by its simulated end time (earliest first out of the max-heap).
struct Finish {
    at: f64,
    worker: usize,
    lease: pb::Lease,
    key: TaskKey,
    work: Work,
}

impl PartialEq for Finish {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at
    }
}
impl Eq for Finish {}
impl PartialOrd for Finish {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Finish {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.at.total_cmp(&self.at).then(o.worker.cmp(&self.worker))
    }
}

fn kind_of(key: &TaskKey) -> String {
    let id = key.to_string();
    let head = id.split('/').next().unwrap_or_default();
    match head {
        "verify" => format!("verify/{}", id.split('/').nth(1).unwrap_or_default()),
        _ if id.ends_with("/plan") => id,
        _ => head.to_string(),
    }
}

fn main() {
    let cfg = parse_args();
    let dir = tempfile::tempdir().expect("temp dir");
    let journal_path = dir.path().join("journal.sqlite");
    let journal = Journal::open(&journal_path).expect("journal");
    // The scheduler runs on simulated time (each transition is given its instant); leases never expire in it, as
    // workers that heartbeat would keep them.
    // The bounded wait for a worker holding a task's inputs assumes the workers' real fetch rate.
    let sched_cfg = SchedConfig {
        lease: Duration::from_secs(24 * 3600),
        fetch_rate: cfg.worker_bps as u64,
        ..SchedConfig::default()
    };
    let t0 = Instant::now();
    let at = |secs: f64| t0 + Duration::from_secs_f64(secs);
    // The store is S3 (nothing is ever read from it here): on a remote store an evaluation task's fetch checks the
    // stored copies of the GGUF files it reads, so their verify tasks do not read them again.
    quantfarm_store::s3::install_crypto_provider();
    let store = Location::parse("s3://sim-bucket/farm").expect("an S3 location (no request is made)");
    let mut s = Sched::open(journal, store, sched_cfg, t0).expect("scheduler");
    let levels: Vec<&str> = LEVELS.iter().map(|l| l.0).collect();
    let yaml = format!(
        "name: llama-70b\nsource: s3://models/llama-3.1-70b\noutputs:\n  gguf:\n    split: {{max_size: 5GB}}\n    \
         quants: [{}]\nevaluation:\n  text: wiki.test.raw\n  ctx: {CTX}\n  batch: {BATCH}\n  chunks: {CHUNKS}\n",
        levels.join(", ")
    );
    let tensors = tensors();
    let (plan, shard_bytes) = plan(&tensors);
    let bf16_bytes = tensors.iter().map(|t| t.1).sum::<u64>() as f64;
    // llama-perplexity's base logits: per chunk, the second half of its tokens, each n_vocab u16 log-probabilities
    // plus two floats (the part's layout; kld.rs).
    let logits_group_bytes = ((BATCH / CTX) * (CTX / 2) * (VOCAB * 2 + 8)) as f64;
    let model = Model { cfg: &cfg, shard_bytes: &shard_bytes, bf16_bytes };

    let kinds = |eval: bool| -> Vec<String> {
        if eval {
            vec!["kld".into()]
        } else {
            ["plan", "gguf", "quantize", "verify"].map(String::from).to_vec()
        }
    };
    let workers: Vec<String> = (0..cfg.workers)
        .map(|i| {
            let eval = i < cfg.eval_workers;
            s.register(
                pb::WorkerInfo {
                    name: format!("{}{i}", if eval { "eval" } else { "cpu" }),
                    slots: 1,
                    task_kinds: kinds(eval),
                    cache_bytes: cfg.cache_bytes as u64,
                    ..Default::default()
                },
                t0,
            )
        })
        .collect();
    let real = Instant::now();
    let id = s.submit(&yaml, "release.yaml", "/sim").expect("the release parses");
    let mut busy = vec![false; cfg.workers];
    let mut busy_s = vec![0.0f64; cfg.workers];
    let mut caches: Vec<Cache> = (0..cfg.workers).map(|_| Cache::default()).collect();
    let mut heap = BinaryHeap::new();
    let mut now = 0.0f64;
    let mut per_kind: BTreeMap<String, (usize, Work, f64)> = BTreeMap::new();
    let mut calls = 0usize;
    let mut first_eval_start: Option<f64> = None;
    loop {
        let mut wake: Option<f64> = None;
        for w in 0..cfg.workers {
            if busy[w] {
                continue;
            }
            calls += 1;
            if cfg.cache_bytes > 0.0 {
                s.holdings(&workers[w], &caches[w].holdings());
            }
            let leased = s.lease(&workers[w], 1, at(now)).expect("lease");
            if let Some(nw) = leased.next_wake {
                let secs = nw.duration_since(t0).as_secs_f64();
                wake = Some(wake.map_or(secs, |x: f64| x.min(secs)));
            }
            let Some(lease) = leased.leases.into_iter().next() else { continue };
            let key = TaskKey::parse(&lease.task_id).expect("a task id");
            if matches!(
                key,
                TaskKey::Kld(Kld::Plan) | TaskKey::KldBase(KldBase { .. }) | TaskKey::Kld(Kld::Measure { .. })
            ) {
                first_eval_start.get_or_insert(now);
            }
            let inputs = lease.task.as_ref().map(|t| t.inputs.clone()).unwrap_or_default();
            let mut work = model.work(&key, logits_group_bytes);
            (work.fetched, work.hits) = if cfg.cache_bytes > 0.0 {
                caches[w].serve(&inputs, cfg.cache_bytes)
            } else {
                (inputs.iter().map(|i| i.bytes as f64).sum(), 0.0)
            };
            let secs = model.seconds(&work);
            if std::env::var_os("SIM_TRACE").is_some() && work.fetched > 0.0 {
                eprintln!(
                    "{now:.1} {} {} fetched {:.1} GB, {:.0} s",
                    workers[w],
                    lease.task_id,
                    work.fetched / 1e9,
                    secs
                );
            }
            busy[w] = true;
            busy_s[w] += secs;
            heap.push(Finish { at: now + secs, worker: w, lease, key, work });
        }
        // The next event: a task finishing, or a waiting task's bound running out.
        let next_finish = heap.peek().map(|f: &Finish| f.at);
        if let Some(wk) = wake.filter(|&wk| wk > now && next_finish.is_none_or(|f| wk < f)) {
            now = wk;
            continue;
        }
        let Some(f) = heap.pop() else { break };
        now = f.at;
        busy[f.worker] = false;
        let t = f.lease.task.clone().expect("a leased task");
        let result = result_for(&t, &f.key, &plan, f.work.written);
        let req = pb::CompleteRequest {
            worker_id: workers[f.worker].clone(),
            lease_id: f.lease.lease_id.clone(),
            release_id: f.lease.release_id.clone(),
            task_id: f.lease.task_id.clone(),
            duration_ms: (model.seconds(&f.work) * 1000.0) as u64,
            fetch_ms: (f.work.fetched / cfg.worker_bps * 1000.0) as u64,
            outcome: Some(Outcome::Result(result)),
        };
        calls += 1;
        assert!(s.complete(req, at(now)).expect("complete"), "{} was not needed", f.lease.task_id);
        let e = per_kind.entry(kind_of(&f.key)).or_insert((0, Work::default(), 0.0));
        e.0 += 1;
        e.1.read += f.work.read;
        e.1.written += f.work.written;
        e.1.fetched += f.work.fetched;
        e.1.hits += f.work.hits;
        e.2 += model.seconds(&f.work);
    }
    let sched_real = real.elapsed();
    let rel = s.release(&id).expect("the release");
    assert_eq!(
        s.effects().reports.len(),
        1,
        "the release did not reach its report: state {:?}, {:?}",
        rel.state,
        rel.error
    );
    let n_tasks = rel.tasks.len() - 1;
    let journal_bytes = std::fs::metadata(&journal_path).map(|m| m.len()).unwrap_or(0)
        + std::fs::metadata(dir.path().join("journal.sqlite-wal")).map(|m| m.len()).unwrap_or(0);

    let gb = |b: f64| b / 1e9;
    println!(
        "model: Llama 70B shape, {:.1} GB bf16 in {} split files; {} levels; {CHUNKS} KLD chunks of {CTX} ({} groups)",
        gb(bf16_bytes),
        shard_bytes.len(),
        LEVELS.len(),
        CHUNKS / (BATCH / CTX)
    );
    println!(
        "farm: {} workers ({} evaluation workers offering kld, {} CPU workers with {} cores), {:.1} GB/s each to the \
         store, bf16 decode {} tok/s, cache: {:.0} GB per worker",
        cfg.workers,
        cfg.eval_workers,
        cfg.workers - cfg.eval_workers,
        cfg.cores,
        cfg.worker_bps / 1e9,
        cfg.eval_tok_s,
        cfg.cache_bytes / 1e9
    );
    println!();
    println!("| kind | tasks | source read GB | written GB | inputs fetched GB | cache hits GB | task-hours |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut tot = (0usize, Work::default(), 0.0);
    for (k, (n, w, secs)) in &per_kind {
        println!(
            "| {k} | {n} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} |",
            gb(w.read),
            gb(w.written),
            gb(w.fetched),
            gb(w.hits),
            secs / 3600.0
        );
        tot.0 += n;
        tot.1.read += w.read;
        tot.1.written += w.written;
        tot.1.fetched += w.fetched;
        tot.1.hits += w.hits;
        tot.2 += secs;
    }
    println!(
        "| **all** | **{}** | **{:.0}** | **{:.0}** | **{:.0}** | **{:.0}** | **{:.2}** |",
        tot.0,
        gb(tot.1.read),
        gb(tot.1.written),
        gb(tot.1.fetched),
        gb(tot.1.hits),
        tot.2 / 3600.0
    );
    assert_eq!(tot.0, n_tasks, "every task ran once");
    let util = |range: std::ops::Range<usize>| {
        let n = range.len().max(1) as f64;
        range.map(|w| busy_s[w]).sum::<f64>() / (n * now) * 100.0
    };
    println!();
    println!("makespan: {:.0} s ({:.2} h) simulated", now, now / 3600.0);
    println!(
        "first evaluation task started at {:.0} s; utilisation: evaluation workers {:.0} %, CPU workers {:.0} %",
        first_eval_start.unwrap_or(0.0),
        util(0..cfg.eval_workers),
        util(cfg.eval_workers..cfg.workers)
    );
    println!(
        "store traffic: {:.2} TB in all, {:.1} GB/s on average over the makespan",
        (tot.1.read + tot.1.written + tot.1.fetched) / 1e12,
        (tot.1.read + tot.1.written + tot.1.fetched) / now / 1e9
    );
    println!(
        "coordinator: {n_tasks} tasks, {calls} lease/complete calls in {:.0} ms of real scheduling ({:.0} µs per call), \
         journal {:.1} MB",
        sched_real.as_secs_f64() * 1e3,
        sched_real.as_secs_f64() * 1e6 / calls as f64,
        journal_bytes as f64 / 1e6
    );
}
