//! The farm commands: `run` (coordinator + local workers in one process, over gRPC on loopback), `coordinator`,
//! `worker`, and `submit` (with `--watch` progress and an exit code that is the verdict).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use quantfarm_coordinator::{Coordinator, CoordinatorConfig, SchedConfig};
use quantfarm_proto::releases_client::ReleasesClient;
use quantfarm_proto::{self as pb, ReleaseState, PROTOCOL_VERSION};
use quantfarm_report::model::{Kld, MergeCheck};
use quantfarm_report::signing::{self, SigningKey};
use quantfarm_store::Location;
use quantfarm_worker::{AddToken, WorkerConfig};
use tokio::sync::watch;

use crate::units::parse_size;

/// Exit codes of `run` and `submit --watch`.
pub const EXIT_RELEASED: u8 = 0;
pub const EXIT_GATE_FAILED: u8 = 1;
pub const EXIT_ERROR: u8 = 2;

#[derive(clap::Args)]
pub struct RunArgs {
    /// The release to make.
    release: PathBuf,
    /// Local workers to start.
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// Where artifacts, reports and the journal go: a folder, file:// or s3://bucket/prefix.
    #[arg(long, default_value = "quantfarm-data")]
    store: String,
    /// Memory budget of each worker (tensor data held at once).
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    memory: u64,
    /// Disk each local worker may keep between tasks and runs (`cache/local-N` in a local store): inputs fetched from
    /// an s3:// store (a local store is read in place), and conversions it made itself, such as the MLX layout
    /// mlx-lm is given for a gpt-oss checkpoint, made once for all of a model's mlx-lm tasks. 0: none.
    #[arg(long, default_value = "64GiB", value_parser = parse_size)]
    cache_size: u64,
    /// Signing key file (default: $QUANTFARM_SIGNING_KEY holding the key text, else $QUANTFARM_KEY_FILE, else
    /// ~/.config/quantfarm/signing.key, created on first use).
    #[arg(long)]
    key: Option<PathBuf>,
    /// Print the final report summary as JSON instead of progress bars.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct CoordinatorArgs {
    /// Address to listen on. Off loopback a token is required.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: String,
    /// Where artifacts and reports go: a folder, file:// or s3://bucket/prefix.
    #[arg(long, default_value = "quantfarm-data")]
    store: String,
    /// The SQLite journal (default: journal.sqlite in the store folder, or ./quantfarm-coordinator.sqlite for an
    /// object store).
    #[arg(long)]
    journal: Option<PathBuf>,
    /// Farm token every worker and client must send (or $QUANTFARM_TOKEN).
    #[arg(long, env = "QUANTFARM_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Signing key file (see `quantfarm run --help`).
    #[arg(long)]
    key: Option<PathBuf>,
    /// TLS certificate and private key (PEM) to serve https.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// How long a lease lives without a heartbeat.
    #[arg(long, default_value_t = 30_000)]
    lease_ms: u64,
    /// Tries per task before the release fails.
    #[arg(long, default_value_t = 4)]
    max_attempts: u32,
    /// First retry delay (doubles per attempt).
    #[arg(long, default_value_t = 500)]
    backoff_ms: u64,
    /// The rate at which a worker fetches from the store, per second: a ready task waits for a worker whose cache
    /// holds its inputs for at most twice the time another would take to fetch them at this rate (or its slack on
    /// the critical path, when longer).
    #[arg(long, default_value = "100MB", value_parser = parse_size)]
    fetch_rate: u64,
    /// Serve Prometheus metrics (/metrics) and a health check (/healthz) over plain HTTP on this address
    /// (e.g. 127.0.0.1:9464; they carry no secrets, but keep them off public interfaces).
    #[arg(long)]
    metrics: Option<String>,
}

#[derive(clap::Args)]
pub struct WorkerArgs {
    /// The coordinator's URL.
    #[arg(long, default_value = "http://127.0.0.1:7070")]
    coordinator: String,
    #[arg(long, env = "QUANTFARM_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Tasks run at once (default: 1).
    #[arg(long, default_value_t = 1)]
    slots: u32,
    /// Cores the worker's tasks may use together (default: all of the machine's).
    #[arg(long)]
    cores: Option<u32>,
    /// Memory budget shared by the running tasks.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    memory: u64,
    /// Worker name (default: the host name).
    #[arg(long)]
    name: Option<String>,
    /// CA certificate (PEM) for an https coordinator with a private CA.
    #[arg(long)]
    ca_cert: Option<PathBuf>,
    /// Scratch folder for recomputed outputs.
    #[arg(long)]
    scratch: Option<PathBuf>,
    /// Size of the local cache of fetched inputs (models, base logits, the files quantize tasks read), kept
    /// between tasks and content-addressed by their recorded sha256; the coordinator leases tasks to workers that
    /// hold their inputs. Default: no cache.
    #[arg(long, value_parser = parse_size)]
    cache_size: Option<u64>,
    /// The cache's folder (default: quantfarm-cache-NAME beside the scratch folder); one worker per folder.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
}

/// How a client reaches the coordinator's Releases service.
#[derive(clap::Args)]
pub struct Connect {
    /// The coordinator's URL (https:// for TLS).
    #[arg(long, default_value = "http://127.0.0.1:7070")]
    coordinator: String,
    /// The farm token (or $QUANTFARM_TOKEN).
    #[arg(long, env = "QUANTFARM_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// CA certificate (PEM) for a coordinator with a private CA.
    #[arg(long)]
    ca_cert: Option<PathBuf>,
}

impl Connect {
    fn client(&self) -> Result<Releases> {
        let ca = match &self.ca_cert {
            Some(p) => Some(std::fs::read(p).with_context(|| p.display().to_string())?),
            None => None,
        };
        releases_client(&self.coordinator, self.token.as_deref(), ca.as_deref())
    }
}

#[derive(clap::Args)]
pub struct SubmitArgs {
    release: PathBuf,
    #[command(flatten)]
    conn: Connect,
    /// Follow the release to its verdict; the exit code is 0 released, 1 a gate failed, 2 an error.
    #[arg(long)]
    watch: bool,
    /// Print JSON lines (events, then the final summary) instead of progress bars.
    #[arg(long)]
    json: bool,
}

fn signing_key(path: Option<&Path>) -> Result<SigningKey> {
    if let Some(p) = path {
        return SigningKey::load(p).with_context(|| format!("signing key {}", p.display()));
    }
    if std::env::var_os("QUANTFARM_SIGNING_KEY").is_some() {
        return Ok(SigningKey::from_env("QUANTFARM_SIGNING_KEY")?);
    }
    let p = signing::default_key_path();
    let (key, created) = signing::load_or_create(&p)?;
    if created {
        eprintln!(
            "made a new signing key at {} (public key {}, fingerprint {}); reports are signed with it",
            p.display(),
            key.public().to_text(),
            key.public().fingerprint()
        );
    }
    Ok(key)
}

fn journal_path(store: &Location, explicit: Option<PathBuf>) -> PathBuf {
    explicit.unwrap_or_else(|| match store.local_path() {
        Some(p) => p.join("journal.sqlite"),
        None => PathBuf::from("quantfarm-coordinator.sqlite"),
    })
}

fn store_location(s: &str) -> Result<Location> {
    let loc = Location::parse(s)?;
    if let Some(p) = loc.local_path() {
        std::fs::create_dir_all(p).with_context(|| format!("cannot create the store folder {}", p.display()))?;
        let abs = std::fs::canonicalize(p).with_context(|| p.display().to_string())?;
        return Ok(Location::local(abs));
    }
    Ok(loc)
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

pub async fn coordinator(args: CoordinatorArgs) -> Result<()> {
    let store = store_location(&args.store)?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => Some((
            std::fs::read(c).with_context(|| c.display().to_string())?,
            std::fs::read(k).with_context(|| k.display().to_string())?,
        )),
        _ => None,
    };
    let cfg = CoordinatorConfig {
        journal: journal_path(&store, args.journal),
        store,
        sched: SchedConfig {
            lease: Duration::from_millis(args.lease_ms),
            heartbeat: Duration::from_millis((args.lease_ms / 4).max(50)),
            max_attempts: args.max_attempts,
            backoff: Duration::from_millis(args.backoff_ms),
            fetch_rate: args.fetch_rate.max(1),
            ..SchedConfig::default()
        },
        token: args.token.clone(),
        key: signing_key(args.key.as_deref())?,
        tls: tls.clone(),
    };
    let coord = Coordinator::open(&cfg)?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() && args.token.is_none() {
        bail!("refusing to listen on {addr} without a token: off loopback, workers and clients must authenticate (pass --token or set QUANTFARM_TOKEN)");
    }
    eprintln!(
        "coordinator listening on {}://{addr}, store {}, journal {}",
        if tls.is_some() { "https" } else { "http" },
        cfg.store,
        cfg.journal.display()
    );
    if let Some(m) = &args.metrics {
        let l = tokio::net::TcpListener::bind(m).await.with_context(|| format!("cannot listen on {m} for metrics"))?;
        eprintln!("metrics on http://{}/metrics, health on http://{}/healthz", l.local_addr()?, l.local_addr()?);
        let c = coord.clone();
        tokio::spawn(async move {
            if let Err(e) = quantfarm_coordinator::metrics::serve(c, l).await {
                eprintln!("error: metrics server: {e}");
            }
        });
    }
    coord.serve(listener, args.token, tls, shutdown_signal()).await?;
    Ok(())
}

fn host_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "worker".into())
}

pub async fn worker(args: WorkerArgs) -> Result<()> {
    let ca = match &args.ca_cert {
        Some(p) => Some(std::fs::read(p).with_context(|| p.display().to_string())?),
        None => None,
    };
    let name = args.name.unwrap_or_else(host_name);
    let scratch = args.scratch.unwrap_or_else(|| std::env::temp_dir().join("quantfarm-scratch"));
    let cache_dir = args.cache_dir.unwrap_or_else(|| {
        let safe: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        scratch.with_file_name(format!("quantfarm-cache-{safe}"))
    });
    let cfg = WorkerConfig {
        coordinator: args.coordinator,
        token: args.token,
        name,
        slots: args.slots.max(1),
        cores: args.cores.unwrap_or_else(quantfarm_worker::available_cores).max(1),
        memory_budget: args.memory,
        ca_cert: ca,
        scratch,
        patience: Duration::from_secs(300),
        cache_dir,
        cache_size: args.cache_size.unwrap_or(0),
    };
    // First SIGTERM/Ctrl-C: drain (finish running tasks). A second one: hand back and stop.
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
    let (second_tx, second_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        shutdown_signal().await;
        eprintln!("draining: finishing running tasks (signal again to hand them back and stop now)");
        let _ = first_tx.send(());
        shutdown_signal().await;
        let _ = second_tx.send(());
    });
    quantfarm_worker::run(
        cfg,
        async {
            let _ = first_rx.await;
        },
        async {
            let _ = second_rx.await;
        },
    )
    .await?;
    Ok(())
}

type Releases = ReleasesClient<tonic::codegen::InterceptedService<tonic::transport::Channel, AddToken>>;

fn releases_client(url: &str, token: Option<&str>, ca: Option<&[u8]>) -> Result<Releases> {
    let channel = quantfarm_worker::channel(url, ca)?;
    Ok(ReleasesClient::with_interceptor(channel, AddToken::new(token)?)
        .max_decoding_message_size(pb::MAX_MESSAGE_BYTES))
}

/// Submits `release` and returns its id. Relative paths in it are resolved against its folder.
async fn submit_file(client: &mut Releases, release: &Path) -> Result<String> {
    let yaml = std::fs::read_to_string(release).with_context(|| format!("cannot read {}", release.display()))?;
    let dir = release.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let base = std::fs::canonicalize(dir).with_context(|| dir.display().to_string())?;
    let req = pb::SubmitRequest {
        protocol_version: PROTOCOL_VERSION,
        release_yaml: yaml,
        base: base.display().to_string(),
        file_name: release.display().to_string(),
    };
    let r = client.submit(req).await.map_err(|s| anyhow::anyhow!("{}", s.message()))?;
    Ok(r.into_inner().release_id)
}

#[derive(Clone, Copy, PartialEq)]
enum Show {
    Bars,
    JsonLines,
    Nothing,
}

/// Follows a release to its end; returns the last event.
async fn watch_release(client: &mut Releases, id: &str, show: Show) -> Result<pb::ReleaseEvent> {
    let mut stream = client
        .watch(pb::WatchRequest { release_id: id.to_string() })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        .into_inner();
    let bars = MultiProgress::new();
    let style = ProgressStyle::with_template("{prefix:>16} [{bar:30}] {pos}/{len} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    let mut stage_bars: Vec<(String, ProgressBar)> = Vec::new();
    let mut last = None;
    while let Some(ev) = stream.message().await.map_err(|s| anyhow::anyhow!("watch: {}", s.message()))? {
        if show == Show::JsonLines {
            println!("{}", event_json(&ev));
        } else if show == Show::Bars {
            for st in &ev.stages {
                let bar = match stage_bars.iter().find(|(n, _)| n == &st.stage) {
                    Some((_, b)) => b.clone(),
                    None => {
                        let b = bars.add(ProgressBar::new(st.total as u64));
                        b.set_style(style.clone());
                        b.set_prefix(st.stage.clone());
                        stage_bars.push((st.stage.clone(), b.clone()));
                        b
                    }
                };
                bar.set_length(st.total as u64);
                bar.set_position(st.done as u64);
                bar.set_message(if st.running > 0 { format!("{} running", st.running) } else { String::new() });
                if st.done == st.total {
                    bar.finish();
                }
            }
        }
        let end = ev.state != ReleaseState::Running as i32;
        last = Some(ev);
        if end {
            break;
        }
    }
    for (_, b) in &stage_bars {
        b.abandon();
    }
    last.ok_or_else(|| anyhow::anyhow!("the coordinator closed the progress stream without a verdict"))
}

fn state_name(s: i32) -> &'static str {
    ReleaseState::try_from(s).map_or("unknown", ReleaseState::label)
}

fn event_json(ev: &pb::ReleaseEvent) -> serde_json::Value {
    serde_json::json!({
        "release_id": ev.release_id,
        "state": state_name(ev.state),
        "message": ev.message,
        "error": ev.error,
        "report_url": ev.report_url,
        "stages": ev.stages.iter().map(|s| serde_json::json!({"stage": s.stage, "done": s.done, "total": s.total, "running": s.running})).collect::<Vec<_>>(),
    })
}

/// Prints the outcome and returns the exit code. `pubkey` is the signer's public key where this process knows it
/// (`run`), for the command that verifies the report.
async fn conclude(
    client: &mut Releases,
    id: &str,
    last: &pb::ReleaseEvent,
    json: bool,
    pubkey: Option<&str>,
) -> Result<u8> {
    let report = client
        .get_report(pb::GetReportRequest { release_id: id.to_string() })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        .into_inner();
    let code = match ReleaseState::try_from(last.state) {
        Ok(ReleaseState::Released) => EXIT_RELEASED,
        Ok(ReleaseState::GateFailed) => EXIT_GATE_FAILED,
        _ => EXIT_ERROR,
    };
    let parsed = (!report.report_json.is_empty()).then(|| quantfarm_report::parse(&report.report_json));
    let parsed = match parsed {
        Some(Err(e)) => {
            println!("release {id}: its report does not fit {}: {e}", quantfarm_report::FORMAT);
            None
        }
        Some(Ok(r)) => Some(r),
        None => None,
    };
    if json {
        println!(
            "{}",
            serde_json::json!({
                "release_id": id, "state": state_name(last.state), "error": last.error,
                "report_url": report.report_url,
                "artifacts": parsed.as_ref().map(|r| &r.artifacts),
                "gates": parsed.as_ref().map(|r| &r.gates),
                "merge_check": parsed.as_ref().map(|r| &r.merge_check),
            })
        );
        return Ok(code);
    }
    println!("release {id}: {}", state_name(last.state));
    if !last.error.is_empty() {
        println!("  error: {}", last.error);
    }
    if let Some(r) = &parsed {
        for a in &r.artifacts {
            println!(
                "  {} ({:.2} bits/weight, {} files, verified: {})",
                a.name,
                a.bits_per_weight,
                a.files.len(),
                a.verified
            );
            for f in &a.files {
                println!("    {}  {}", f.sha256, f.url);
            }
            match &a.kld {
                Some(Kld::Measured(k)) => println!(
                    "    mean KLD {:.6} ± {:.6}, same top p {:.3} %, PPL(Q) {:.4} (base {:.4}), {} chunks",
                    k.mean_kld, k.mean_kld_unc, k.same_top_p, k.mean_ppl_q, k.mean_ppl_base, k.n_chunks
                ),
                Some(Kld::Unmeasured { error }) => println!("    KL divergence: {error}"),
                None => {}
            }
        }
        match &r.merge_check {
            Some(MergeCheck::Measured(m)) => println!(
                "  merge check: {}/{} prompts identical (merge in f32 vs base + adapter at run time), mean prefix {:.3}",
                m.greedy.identical, m.greedy.n, m.greedy.mean_prefix_fraction
            ),
            Some(MergeCheck::Unmeasured { error }) => println!("  merge check: {error}"),
            None => {}
        }
        for g in &r.gates {
            println!("  gate {}: {} — {}", g.name, if g.passed { "pass" } else { "FAIL" }, g.detail);
        }
    }
    if !report.report_url.is_empty() {
        let url = &report.report_url;
        println!("  signed report: {url}");
        // The views are written beside report.json (report.html, report.md, the model card README.md).
        if let Some(dir) = url.strip_suffix("report.json") {
            println!("  view it:       {dir}report.html");
        }
        match pubkey {
            Some(key) => println!("  verify it:     quantfarm report verify {url} --pubkey {key}"),
            None => println!("  verify it:     quantfarm report verify {url} --pubkey SIGNER_PUBLIC_KEY"),
        }
    }
    Ok(code)
}

pub async fn submit(args: SubmitArgs) -> Result<u8> {
    let mut client = args.conn.client()?;
    let id = submit_file(&mut client, &args.release).await?;
    if !args.watch {
        if args.json {
            println!("{}", serde_json::json!({"release_id": id}));
        } else {
            println!("{id}");
        }
        return Ok(EXIT_RELEASED);
    }
    let last = watch_release(&mut client, &id, if args.json { Show::JsonLines } else { Show::Bars }).await?;
    conclude(&mut client, &id, &last, args.json, None).await
}

#[derive(clap::Args)]
pub struct WatchArgs {
    release_id: String,
    #[command(flatten)]
    conn: Connect,
    #[arg(long)]
    json: bool,
}

/// Follows a submitted release to its verdict (the exit code, as `submit --watch`).
pub async fn watch(args: WatchArgs) -> Result<u8> {
    let mut client = args.conn.client()?;
    let last =
        watch_release(&mut client, &args.release_id, if args.json { Show::JsonLines } else { Show::Bars }).await?;
    conclude(&mut client, &args.release_id, &last, args.json, None).await
}

/// Cancels a release: its leases are revoked (workers stop those tasks), nothing more runs.
pub async fn cancel(args: WatchArgs) -> Result<u8> {
    let mut client = args.conn.client()?;
    let r = client
        .cancel(pb::CancelRequest { release_id: args.release_id.clone() })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        .into_inner();
    println!("release {}: {}", args.release_id, state_name(r.state));
    Ok(EXIT_RELEASED)
}

/// `quantfarm run`: everything in one process, talking gRPC over loopback like a farm.
pub async fn run(args: RunArgs) -> Result<u8> {
    // The local workers are the only ones: a peer tool none of them has would leave its tasks waiting for ever.
    let name = args.release.display().to_string();
    if let Ok(text) = std::fs::read_to_string(&args.release) {
        let spec = quantfarm_coordinator::spec::ReleaseSpec::parse(&text, &name)?;
        for peer in spec.evaluation.iter().flat_map(|e| e.peer_tools()) {
            if quantfarm_worker::find_tool(peer.tool()).is_none() {
                bail!(
                    "{name}: evaluation.peers: {} is not on PATH or in $QUANTFARM_LLAMA_BIN, so no local worker can run it",
                    peer.tool()
                );
            }
        }
        // The runtimes the release's tasks ask for, found as the local workers will find them.
        let wanted = [
            (
                spec.runs_mlx_lm(),
                "mlx_lm",
                "evaluation.mlx_lm (on by default with MLX outputs)",
                "mlx-lm under $QUANTFARM_PYTHON or python3 (scripts/install-mlx-runtime)",
            ),
            (
                spec.runs_transformers(),
                "transformers",
                "evaluation.transformers",
                "transformers under $QUANTFARM_TRANSFORMERS_PYTHON (scripts/install-llm-compressor)",
            ),
        ];
        if wanted.iter().any(|w| w.0) {
            let have = tokio::task::spawn_blocking(quantfarm_worker::runtimes).await.context("finding the runtimes")?;
            for (_, runtime, key, how) in wanted.iter().filter(|w| w.0 && !have.iter().any(|h| h == w.1)) {
                bail!(
                    "{name}: {key} asks for {runtime}, which no local worker can run (it needs {how}): its tasks \
                     would wait for ever. Install it, or set it to false to leave that runtime out of the release"
                );
            }
        }
    }
    let store = store_location(&args.store)?;
    let token = {
        let mut b = [0u8; 16];
        rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut b);
        quantfarm_store::hex(&b)
    };
    let cfg = CoordinatorConfig {
        journal: journal_path(&store, None),
        store: store.clone(),
        sched: SchedConfig::default(),
        token: Some(token.clone()),
        key: signing_key(args.key.as_deref())?,
        tls: None,
    };
    let pubkey = cfg.key.public().to_text();
    let coord = Coordinator::open(&cfg)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("cannot listen on loopback")?;
    let url = format!("http://{}", listener.local_addr()?);
    // The workers stop first and the coordinator after them, so that an outcome a worker still holds when the
    // release ends is delivered at once rather than retried against a closed port for the worker's patience.
    let (stop_tx, stop_rx) = watch::channel(false);
    let (stop_server_tx, stop_server_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let server = tokio::spawn(coord.serve(listener, Some(token.clone()), None, stopped(stop_server_rx)));
    // The caches apart from the scratch folders, which a starting worker sweeps of dead workers' folders.
    let (scratch, caches) = match store.local_path() {
        Some(p) => (p.join("scratch"), p.join("cache")),
        None => (std::env::temp_dir().join("quantfarm-scratch"), std::env::temp_dir().join("quantfarm-cache")),
    };
    let mut workers = Vec::new();
    for i in 0..args.workers.max(1) {
        let cfg = WorkerConfig {
            coordinator: url.clone(),
            token: Some(token.clone()),
            name: format!("local-{}", i + 1),
            slots: 1,
            // The local workers share the machine's cores.
            cores: (quantfarm_worker::available_cores() / args.workers.max(1)).max(1),
            memory_budget: args.memory,
            ca_cert: None,
            scratch: scratch.clone(),
            patience: Duration::from_secs(30),
            cache_dir: caches.join(format!("local-{}", i + 1)),
            cache_size: args.cache_size,
        };
        // Drain, then stop now: the release is over, so nothing runs that is still needed.
        let (a, b) = (stopped(stop_rx.clone()), stopped(stop_rx.clone()));
        workers.push(tokio::spawn(quantfarm_worker::run(cfg, a, b)));
    }
    let mut client = releases_client(&url, Some(&token), None)?;
    let outcome = async {
        let id = submit_file(&mut client, &args.release).await?;
        if !args.json {
            eprintln!("release {id}: {} local workers, store {store}", args.workers.max(1));
        }
        let last = watch_release(&mut client, &id, if args.json { Show::Nothing } else { Show::Bars }).await?;
        conclude(&mut client, &id, &last, args.json, Some(&pubkey)).await
    }
    .await;
    let _ = stop_tx.send(true);
    for w in workers {
        if let Ok(Err(e)) = w.await {
            eprintln!("worker: {e}");
        }
    }
    let _ = stop_server_tx.send(true);
    match server.await {
        Ok(Err(e)) => eprintln!("coordinator: {e}"),
        Err(e) => eprintln!("coordinator: {e}"),
        Ok(Ok(())) => {}
    }
    outcome
}
