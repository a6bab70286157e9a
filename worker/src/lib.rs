//! A farm worker: registers with the coordinator, leases tasks for its free slots, runs each with the executor
//! of its kind within its share of the memory budget, heartbeats the leases it holds, and reports typed results
//! or failures. On shutdown it stops leasing and finishes (or, when told to stop now, hands back) what it holds.
//! A coordinator that restarts is waited for: results are re-sent until it takes them.
//!
//! Modules by role, each importing only those listed after it: the lease loop (this file) → [`exec`] (one
//! executor per task kind, and the table that maps kinds to them) → `writers` (how each deterministic output is
//! made) → `outputs` (content-addressed outputs: cache hits, staging, digests) → `fetch` (inputs) and `llama`
//! (the evaluation runtime) → `failure` and `env`. `runtimes` finds the peer tools a worker advertises; [`mlx_lm`]
//! runs models in mlx-lm through a helper process (it imports nothing from the worker).

#![forbid(unsafe_code)]

mod cache;
mod env;
pub mod exec;
mod failure;
mod fetch;
pub mod helper;
mod llama;
pub mod mlx_lm;
mod mlx_run;
mod outputs;
mod runtimes;
mod scratch;
pub mod transformers;
mod transformers_run;
mod writers;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quantfarm_proto::farm_client::FarmClient;
use quantfarm_proto::{self as pb, PROTOCOL_VERSION};
use tokio::task::JoinSet;
use tonic::codegen::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request, Status};

pub use env::Env;
pub use failure::Failure;
pub use runtimes::{find_tool, runtimes, runtimes_in};

/// The machine's cores, the default share of a worker.
pub fn available_cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// `http://host:port` or `https://host:port`.
    pub coordinator: String,
    pub token: Option<String>,
    pub name: String,
    /// Tasks run at once.
    pub slots: u32,
    /// Cores all running tasks together may use (each task gets cores ÷ slots threads).
    pub cores: u32,
    /// Bytes of memory all running tasks together stay within.
    pub memory_budget: u64,
    /// PEM CA certificate that signed the coordinator's certificate (for https).
    pub ca_cert: Option<Vec<u8>>,
    /// The folder this machine's workers share for scratch; each works in a folder of its own inside it, and
    /// removes those of workers that died.
    pub scratch: std::path::PathBuf,
    /// How long to keep trying to reach a coordinator that is down before giving up.
    pub patience: Duration,
    /// The local cache of fetched inputs: its folder and size in bytes (a size of 0: none).
    pub cache_dir: std::path::PathBuf,
    pub cache_size: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("coordinator {url}: {msg}")]
    Connect { url: String, msg: String },
    #[error("coordinator refused the worker: {0}")]
    Refused(String),
    #[error("scratch folder {path}: {msg}")]
    Scratch { path: String, msg: String },
    #[error("cache folder {path}: {msg}")]
    Cache { path: String, msg: String },
}

#[derive(Clone)]
pub struct AddToken(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for AddToken {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(t) = &self.0 {
            req.metadata_mut().insert(pb::TOKEN_HEADER, t.clone());
        }
        Ok(req)
    }
}

pub type Client = FarmClient<InterceptedService<Channel, AddToken>>;

/// A lazy channel to the coordinator (calls fail until it is reachable, then work), with TLS for `https://`.
pub fn channel(url: &str, ca_cert: Option<&[u8]>) -> Result<Channel, WorkerError> {
    let err = |msg: String| WorkerError::Connect { url: url.to_string(), msg };
    let mut ep = Endpoint::from_shared(url.to_string()).map_err(|e| err(e.to_string()))?;
    ep = ep.connect_timeout(Duration::from_secs(5)).tcp_nodelay(true);
    if url.starts_with("https://") {
        let mut tls = ClientTlsConfig::new().with_enabled_roots();
        if let Some(ca) = ca_cert {
            tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(ca));
        }
        ep = ep.tls_config(tls).map_err(|e| err(e.to_string()))?;
    }
    Ok(ep.connect_lazy())
}

impl AddToken {
    pub fn new(token: Option<&str>) -> Result<AddToken, WorkerError> {
        match token {
            Some(t) => Ok(AddToken(Some(
                t.parse().map_err(|_| WorkerError::Refused("the token must be printable ASCII".into()))?,
            ))),
            None => Ok(AddToken(None)),
        }
    }
}

/// The `Farm` client a worker uses.
pub fn connect(url: &str, token: Option<&str>, ca_cert: Option<&[u8]>) -> Result<Client, WorkerError> {
    Ok(FarmClient::with_interceptor(channel(url, ca_cert)?, AddToken::new(token)?)
        .max_decoding_message_size(pb::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(pb::MAX_MESSAGE_BYTES))
}

fn is_down(s: &Status) -> bool {
    matches!(s.code(), Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded)
}

struct Running {
    task_id: String,
    abort: tokio::task::AbortHandle,
    /// The task has finished and its outcome waits in the outbox: the coordinator may already have ended the lease,
    /// which is no reason to stop, and the slot is free.
    reporting: Arc<std::sync::atomic::AtomicBool>,
}

impl Running {
    fn reported(&self) -> bool {
        self.reporting.load(std::sync::atomic::Ordering::SeqCst)
    }
}

struct Session {
    client: Client,
    cfg: WorkerConfig,
    worker_id: Arc<Mutex<String>>,
    heartbeat: Duration,
}

impl Session {
    fn info(&self) -> pb::WorkerInfo {
        pb::WorkerInfo {
            name: self.cfg.name.clone(),
            os: std::env::consts::OS.into(),
            arch: std::env::consts::ARCH.into(),
            slots: self.cfg.slots,
            cores: self.cfg.cores,
            memory_budget: self.cfg.memory_budget,
            task_kinds: exec::kinds().iter().map(|k| k.name().to_string()).collect(),
            runtimes: runtimes(),
            version: env!("CARGO_PKG_VERSION").into(),
            cache_bytes: self.cfg.cache_size,
        }
    }

    /// Registers, waiting for a coordinator that is down; a refusal (wrong token, version) is final.
    async fn register(&mut self) -> Result<(), WorkerError> {
        let start = Instant::now();
        loop {
            let req = pb::RegisterRequest { protocol_version: PROTOCOL_VERSION, worker: Some(self.info()) };
            match self.client.register(req).await {
                Ok(r) => {
                    let r = r.into_inner();
                    tracing::info!(worker = %r.worker_id, "registered with {}", self.cfg.coordinator);
                    *self.worker_id.lock().unwrap_or_else(|p| p.into_inner()) = r.worker_id;
                    self.heartbeat = Duration::from_millis(r.heartbeat_ms.max(50) as u64);
                    return Ok(());
                }
                Err(s) if is_down(&s) && start.elapsed() < self.cfg.patience => {
                    tracing::debug!("coordinator not reachable yet: {}", s.message());
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(s) if is_down(&s) => {
                    return Err(WorkerError::Connect {
                        url: self.cfg.coordinator.clone(),
                        msg: s.message().to_string(),
                    })
                }
                Err(s) => return Err(WorkerError::Refused(s.message().to_string())),
            }
        }
    }

    fn id(&self) -> String {
        self.worker_id.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Sends a completion until the coordinator takes it (it may be restarting), within `patience`.
async fn send_completion(mut client: Client, req: pb::CompleteRequest, patience: Duration) {
    let start = Instant::now();
    loop {
        match client.complete(req.clone()).await {
            Ok(_) => return,
            Err(s) if is_down(&s) && start.elapsed() < patience => tokio::time::sleep(Duration::from_millis(300)).await,
            // The coordinator no longer knows the release, task or worker: typically the release is over and this
            // is an outcome sent again after the lease request that carried it was cut short by a shutdown.
            Err(s) if s.code() == Code::NotFound => {
                tracing::info!(task = %req.task_id, "outcome not taken: {}", s.message());
                return;
            }
            Err(s) => {
                tracing::error!(task = %req.task_id, "could not report the outcome: {}", s.message());
                return;
            }
        }
    }
}

/// Runs the worker until `shutdown` resolves; then drains: no new leases, running tasks finish and report
/// (a second `shutdown_now` signal hands them back instead).
pub async fn run(
    cfg: WorkerConfig,
    shutdown: impl std::future::Future<Output = ()>,
    shutdown_now: impl std::future::Future<Output = ()>,
) -> Result<(), WorkerError> {
    let client = connect(&cfg.coordinator, cfg.token.as_deref(), cfg.ca_cert.as_deref())?;
    let mut s =
        Session { client, cfg, worker_id: Arc::new(Mutex::new(String::new())), heartbeat: Duration::from_secs(5) };
    s.register().await?;
    let scratch = scratch::Scratch::claim(&s.cfg.scratch, &s.cfg.name)
        .map_err(|e| WorkerError::Scratch { path: s.cfg.scratch.display().to_string(), msg: e.to_string() })?;
    let cache = match s.cfg.cache_size {
        0 => None,
        size => Some(
            cache::Cache::open(&s.cfg.cache_dir, size)
                .map_err(|e| WorkerError::Cache { path: s.cfg.cache_dir.display().to_string(), msg: e.to_string() })?,
        ),
    };
    let env = Env {
        budget: (s.cfg.memory_budget / s.cfg.slots.max(1) as u64).max(1 << 20),
        scratch: scratch.path().to_path_buf(),
        threads: (s.cfg.cores / s.cfg.slots.max(1)).max(1) as usize,
        cache: cache.clone(),
        ..Env::default()
    };
    let running: Arc<Mutex<HashMap<String, Running>>> = Arc::default();
    let outbox: Outbox = Arc::default();
    let mut tasks: JoinSet<()> = JoinSet::new();

    let hb = tokio::spawn(heartbeat_loop(s.client.clone(), s.worker_id.clone(), running.clone(), s.heartbeat));
    tokio::pin!(shutdown);
    tokio::pin!(shutdown_now);
    let result = loop {
        while tasks.try_join_next().is_some() {}
        let active = running.lock().unwrap_or_else(|p| p.into_inner()).values().filter(|r| !r.reported()).count();
        let free = s.cfg.slots.saturating_sub(active as u32);
        let completed = std::mem::take(&mut *outbox.lock().unwrap_or_else(|p| p.into_inner()));
        if free == 0 && completed.is_empty() {
            tokio::select! {
                _ = tasks.join_next() => continue,
                _ = &mut shutdown => break Ok(()),
            }
        }
        // Idle: a long poll. Busy: a quick look, so a finishing task's outcome is not held up.
        let wait_ms = if active == 0 { 10_000 } else { 0 };
        let done: Vec<String> = completed.iter().map(|c| c.lease_id.clone()).collect();
        let req = pb::LeaseRequest {
            worker_id: s.id(),
            free_slots: free.max(1),
            wait_ms,
            completed: completed.clone(),
            bytes_read: quantfarm_store::io_counters::bytes_read(),
            bytes_written: quantfarm_store::io_counters::bytes_written(),
            holdings: cache.as_ref().map(|c| c.holdings()).unwrap_or_default(),
        };
        let mut client = s.client.clone();
        let leased = tokio::select! {
            r = client.lease(req) => r,
            _ = &mut shutdown => {
                outbox.lock().unwrap_or_else(|p| p.into_inner()).extend(completed);
                break Ok(());
            }
        };
        if leased.is_err() {
            // Not delivered (or not known to be): send again with the next request; a duplicate is harmless.
            outbox.lock().unwrap_or_else(|p| p.into_inner()).extend(completed);
        } else {
            let mut held = running.lock().unwrap_or_else(|p| p.into_inner());
            for l in &done {
                held.remove(l);
            }
        }
        let leases = match leased {
            Ok(r) => r.into_inner().leases,
            Err(st) if st.code() == Code::NotFound => {
                tracing::warn!("{}", st.message());
                if let Err(e) = s.register().await {
                    break Err(e);
                }
                continue;
            }
            Err(st) if is_down(&st) => {
                tracing::debug!("lease: coordinator unreachable: {}", st.message());
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
            Err(st) if st.code() == Code::Unauthenticated || st.code() == Code::FailedPrecondition => {
                break Err(WorkerError::Refused(st.message().to_string()));
            }
            Err(st) => {
                tracing::warn!("lease: {}", st.message());
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if leases.is_empty() && active > 0 {
            tokio::select! {
                _ = tasks.join_next() => {}
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                _ = &mut shutdown => break Ok(()),
            }
        }
        for lease in leases {
            start_task(&mut tasks, &s, lease, &env, &running, &outbox);
        }
    };
    // Drain: finish what runs (reporting each outcome as it comes), unless told to stop now; then hand back
    // whatever is left.
    // Draining, an outcome is retried within the patience (the coordinator may be restarting); stopping now, it
    // is tried once: the lease expires and the coordinator runs the task again if the outcome did not arrive.
    let flush = |outbox: &Outbox, patience: Duration| {
        let pending = std::mem::take(&mut *outbox.lock().unwrap_or_else(|p| p.into_inner()));
        let client = s.client.clone();
        async move {
            for c in pending {
                send_completion(client.clone(), c, patience).await;
            }
        }
    };
    tokio::select! {
        _ = async {
            flush(&outbox, s.cfg.patience).await;
            while tasks.join_next().await.is_some() {
                flush(&outbox, s.cfg.patience).await;
            }
        } => {}
        _ = &mut shutdown_now => {
            let held: Vec<(String, Running)> = running.lock().unwrap_or_else(|p| p.into_inner()).drain().collect();
            for (_, r) in &held {
                r.abort.abort();
            }
            let ids: Vec<String> = held
                .into_iter()
                .filter(|(_, r)| !r.reported())
                .map(|(l, r)| {
                    tracing::info!(task = %r.task_id, "handed back");
                    l
                })
                .collect();
            flush(&outbox, Duration::ZERO).await;
            if !ids.is_empty() {
                let _ = s.client.clone().hand_back(pb::HandBackRequest { worker_id: s.id(), lease_ids: ids }).await;
            }
        }
    }
    hb.abort();
    drop(scratch);
    if let Some(c) = &cache {
        let st = c.stats();
        tracing::info!(
            hits = st.hits,
            hit_bytes = st.hit_bytes,
            fetches = st.fetches,
            fetched_bytes = st.fetched_bytes,
            corrupt = st.corrupt,
            evicted = st.evicted,
            "worker cache"
        );
    }
    result
}

/// Outcomes waiting to be delivered with the next lease request.
type Outbox = Arc<Mutex<Vec<pb::CompleteRequest>>>;

fn start_task(
    tasks: &mut JoinSet<()>,
    s: &Session,
    lease: pb::Lease,
    env: &Env,
    running: &Arc<Mutex<HashMap<String, Running>>>,
    outbox: &Outbox,
) {
    let env = env.clone();
    let worker_id = s.worker_id.clone();
    let outbox = outbox.clone();
    let lease_id = lease.lease_id.clone();
    let task_id = lease.task_id.clone();
    let reg = running.clone();
    let reporting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reporting_flag = reporting.clone();
    // The registration happens before the task can finish: the entry is inserted under the lock the task's
    // own removal takes.
    let mut guard = running.lock().unwrap_or_else(|p| p.into_inner());
    let handle = tasks.spawn(async move {
        tracing::info!(task = %lease.task_id, attempt = lease.attempt, "started");
        let start = Instant::now();
        let mut fetch_ms = 0;
        let outcome = match &lease.task {
            Some(t) => {
                let env = env.for_task(t);
                let r = exec::run_in(t, &env).await;
                fetch_ms = env.fetch_ms();
                r
            }
            None => Err(Failure::input("the lease carries no task")),
        };
        let duration_ms = start.elapsed().as_millis() as u64;
        let outcome = match outcome {
            Ok(r) => {
                tracing::info!(task = %lease.task_id, "done in {duration_ms} ms");
                pb::complete_request::Outcome::Result(r)
            }
            Err(f) => {
                tracing::warn!(task = %lease.task_id, "failed: {}", f.message);
                pb::complete_request::Outcome::Failure(f.into_proto())
            }
        };
        let req = pb::CompleteRequest {
            worker_id: worker_id.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            lease_id: lease.lease_id.clone(),
            release_id: lease.release_id.clone(),
            task_id: lease.task_id.clone(),
            duration_ms,
            outcome: Some(outcome),
            fetch_ms,
        };
        // Delivered by the worker loop with its next request; the lease stays in the heartbeats until then.
        let _held = reg.lock().unwrap_or_else(|p| p.into_inner());
        reporting_flag.store(true, std::sync::atomic::Ordering::SeqCst);
        outbox.lock().unwrap_or_else(|p| p.into_inner()).push(req);
    });
    guard.insert(lease_id, Running { task_id, abort: handle, reporting });
}

async fn heartbeat_loop(
    client: Client,
    worker_id: Arc<Mutex<String>>,
    running: Arc<Mutex<HashMap<String, Running>>>,
    period: Duration,
) {
    loop {
        tokio::time::sleep(period).await;
        let ids: Vec<String> = running.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        let id = worker_id.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let req = pb::HeartbeatRequest {
            worker_id: id,
            lease_ids: ids,
            bytes_read: quantfarm_store::io_counters::bytes_read(),
            bytes_written: quantfarm_store::io_counters::bytes_written(),
        };
        match client.clone().heartbeat(req).await {
            Ok(r) => {
                let r = r.into_inner();
                let mut held = running.lock().unwrap_or_else(|p| p.into_inner());
                for l in r.revoked {
                    if held.get(&l).is_some_and(|t| t.reporting.load(std::sync::atomic::Ordering::SeqCst)) {
                        continue;
                    }
                    if let Some(t) = held.remove(&l) {
                        tracing::warn!(task = %t.task_id, "lease revoked by the coordinator: stopping");
                        t.abort.abort();
                    }
                }
            }
            Err(s) => tracing::debug!("heartbeat: {}", s.message()),
        }
    }
}
