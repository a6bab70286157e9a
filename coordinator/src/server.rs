//! The coordinator's gRPC face: the `Farm` service for workers and the `Releases` service for users, both behind
//! the token check, around one [`Sched`] under a mutex. Long-polled leases wait on a notification that every
//! state change fires; an expiry ticker turns silent workers' leases into retries; due reports are built and
//! published (`report::publish`) on a task of their own. The clock is read here and handed to the scheduler.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use quantfarm_proto::farm_server::{Farm, FarmServer};
use quantfarm_proto::releases_server::{Releases, ReleasesServer};
use quantfarm_proto::{self as pb, ReleaseState, PROTOCOL_VERSION};
use quantfarm_store::Location;
use tokio::sync::{broadcast, Notify};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::journal::Journal;
use crate::sched::{Effects, Sched, SchedConfig, SchedError};
use crate::signing::SigningKey;

pub struct CoordinatorConfig {
    pub journal: std::path::PathBuf,
    /// Where artifacts and reports are written.
    pub store: Location,
    pub sched: SchedConfig,
    /// Required from every client when set; required to be set off loopback.
    pub token: Option<String>,
    pub key: SigningKey,
    /// TLS certificate and key (PEM); off loopback traffic should be encrypted.
    pub tls: Option<(Vec<u8>, Vec<u8>)>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Sched(#[from] SchedError),
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    #[error("refusing to listen on {0} without a token: off loopback, workers and clients must authenticate (pass --token or set QUANTFARM_TOKEN)")]
    NoToken(SocketAddr),
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
}

struct Shared {
    sched: Mutex<Sched>,
    /// Fired when a task becomes ready (or the server is closing): wakes long-polled leases.
    notify: Notify,
    closing: std::sync::atomic::AtomicBool,
    events: broadcast::Sender<pb::ReleaseEvent>,
    key: SigningKey,
}

/// A handle on a running coordinator's state (for the embedded run and tests).
#[derive(Clone)]
pub struct Coordinator {
    shared: Arc<Shared>,
}

fn status(e: SchedError) -> Status {
    match e {
        SchedError::NoRelease(_) | SchedError::NoTask { .. } => Status::not_found(e.to_string()),
        SchedError::UnknownWorker(_) => Status::not_found(e.to_string()),
        SchedError::Spec(_) | SchedError::Source(_) => Status::invalid_argument(e.to_string()),
        SchedError::Journal(_) | SchedError::Corrupt { .. } => Status::internal(e.to_string()),
    }
}

impl Coordinator {
    pub fn open(cfg: &CoordinatorConfig) -> Result<Coordinator, ServeError> {
        if let Some(dir) = cfg.journal.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let journal = Journal::open(&cfg.journal)?;
        let sched = Sched::open(journal, cfg.store.clone(), cfg.sched.clone(), Instant::now())?;
        let (events, _) = broadcast::channel(4096);
        let c = Coordinator {
            shared: Arc::new(Shared {
                sched: Mutex::new(sched),
                notify: Notify::new(),
                closing: std::sync::atomic::AtomicBool::new(false),
                events,
                key: cfg.key.clone(),
            }),
        };
        Ok(c)
    }

    /// Runs `f` on the scheduler's state under its lock (metrics, health, tests).
    pub fn with_sched<T>(&self, f: impl FnOnce(&Sched) -> T) -> T {
        f(&self.lock())
    }

    fn lock(&self) -> MutexGuard<'_, Sched> {
        self.shared.sched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes what the last transitions produced: events, woken lease waiters, reports to make.
    fn after(&self, mut s: MutexGuard<'_, Sched>) {
        let Effects { events, reports, sweeps, ready_changed: woke } = s.take_effects();
        // Finished releases leave memory once their last events are taken (the journal keeps them). Only news of
        // ready work wakes the lease waiters (waking them on every change would have idle waiters wake each other
        // forever).
        s.evict_finished();
        drop(s);
        for e in events {
            let _ = self.shared.events.send(e);
        }
        if woke {
            self.shared.notify.notify_waiters();
        }
        for job in reports {
            let me = self.clone();
            tokio::spawn(async move { me.make_report(job.release_id).await });
        }
        if !sweeps.is_empty() {
            tokio::spawn(sweep_all(sweeps));
        }
    }

    async fn make_report(&self, release_id: String) {
        // What killed writers staged goes before the report says the release's files are all there. (Every task of
        // the release is done: no writer of its outputs is alive. A concurrent release making the same
        // content-addressed output would see its upload aborted and its task retried.)
        let retried = self.lock().release(&release_id).map(|r| r.retried_outputs(Instant::now())).unwrap_or_default();
        sweep_all(retried).await;
        let built = {
            let s = self.lock();
            match s.release(&release_id) {
                Ok(rel) => {
                    let target = s.store().child(&format!("releases/{release_id}/report.json"));
                    let values = target
                        .as_ref()
                        .ok()
                        .and_then(|t| t.sibling(crate::report::VALUES_FILE).ok())
                        .map(|l| l.to_string())
                        .unwrap_or_default();
                    let report = crate::report::build(rel, s.workers(), (s.cfg().wall_clock)(), &values);
                    let with = rel.spec.evaluation.as_ref().and_then(|e| e.compare_with.clone());
                    let old = with.as_ref().map(|w| (w.clone(), s.store().child(&format!("{w}/report.json"))));
                    Some((report, target, old))
                }
                Err(_) => None,
            }
        };
        let Some((mut report, target, old)) = built else { return };
        match old {
            Some((with, Ok(old))) => crate::report::compare(&mut report, &with, &old).await,
            Some((with, Err(e))) => {
                report.report.comparison =
                    Some(crate::report::model::Comparison::Unavailable { with, error: e.to_string() })
            }
            None => {}
        }
        let outcome = match target {
            Ok(target) => crate::report::publish(report, &self.shared.key, &target).await,
            Err(e) => Err(e.to_string()),
        };
        let mut s = self.lock();
        if let Err(e) = s.report_done(&release_id, outcome) {
            tracing::error!("release {release_id}: {e}");
        }
        self.after(s);
    }

    /// Turns expired leases into retries, forever (run it as a task).
    async fn expiry_loop(self) {
        let period = {
            let s = self.lock();
            (s.cfg().lease / 4).clamp(Duration::from_millis(50), Duration::from_millis(500))
        };
        loop {
            tokio::time::sleep(period).await;
            let mut s = self.lock();
            let now = Instant::now();
            if let Err(e) = s.expire(now) {
                tracing::error!("lease expiry: {e}");
            }
            s.note_unserved(now);
            self.after(s);
        }
    }

    /// Serves on `listener` until `shutdown` resolves.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        token: Option<String>,
        tls: Option<(Vec<u8>, Vec<u8>)>,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let addr = listener.local_addr()?;
        if !addr.ip().is_loopback() && token.is_none() {
            return Err(ServeError::NoToken(addr));
        }
        // Reports that were due when the coordinator stopped, and releases resumed from the journal.
        {
            let s = self.lock();
            self.after(s);
        }
        let expiry = tokio::spawn(self.clone().expiry_loop());
        let check = TokenCheck { token: token.map(Arc::from) };
        let farm = FarmServer::new(FarmSvc(self.clone()))
            .max_decoding_message_size(pb::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(pb::MAX_MESSAGE_BYTES);
        let releases = ReleasesServer::new(ReleasesSvc(self.clone()))
            .max_decoding_message_size(pb::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(pb::MAX_MESSAGE_BYTES);
        // On shutdown, long-polled leases return at once, so the graceful stop does not wait out their polls.
        let me = self.clone();
        let closing = async move {
            shutdown.await;
            me.shared.closing.store(true, std::sync::atomic::Ordering::SeqCst);
            me.shared.notify.notify_waiters();
        };
        let mut builder = tonic::transport::Server::builder();
        if let Some((cert, key)) = tls {
            let identity = tonic::transport::Identity::from_pem(cert, key);
            builder = builder.tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))?;
        }
        let result = builder
            .add_service(tonic::service::interceptor::InterceptedService::new(farm, check.clone()))
            .add_service(tonic::service::interceptor::InterceptedService::new(releases, check))
            // No Nagle: a lease answer must not wait for the delayed ACK of the previous reply (40 ms per task).
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                closing,
            )
            .await;
        expiry.abort();
        result.map_err(ServeError::from)
    }

    /// Submits a release directly (the embedded run uses the gRPC path; this is for tests and tools).
    pub fn submit(&self, yaml: &str, file_name: &str, base: &str) -> Result<String, SchedError> {
        let mut s = self.lock();
        let r = s.submit(yaml, file_name, base);
        self.after(s);
        r
    }
}

/// Checks the `x-quantfarm-token` metadata in constant time.
#[derive(Clone)]
struct TokenCheck {
    token: Option<Arc<str>>,
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(want) = &self.token else { return Ok(req) };
        let got = req.metadata().get(pb::TOKEN_HEADER).map(|v| v.as_bytes()).unwrap_or(b"");
        let want = want.as_bytes();
        let mut diff = (got.len() != want.len()) as u8;
        for (i, &b) in want.iter().enumerate() {
            diff |= b ^ got.get(i).copied().unwrap_or(0);
        }
        if diff == 0 {
            Ok(req)
        } else {
            Err(Status::unauthenticated("wrong or missing farm token (x-quantfarm-token)"))
        }
    }
}

fn check_version(v: u32, who: &str) -> Result<(), Status> {
    if v == PROTOCOL_VERSION {
        Ok(())
    } else {
        Err(Status::failed_precondition(format!(
            "this {who} speaks quantfarm protocol {v}, the coordinator speaks {PROTOCOL_VERSION}: upgrade the {who} (or the coordinator) so both match"
        )))
    }
}

struct FarmSvc(Coordinator);

#[tonic::async_trait]
impl Farm for FarmSvc {
    async fn register(&self, req: Request<pb::RegisterRequest>) -> Result<Response<pb::RegisterResponse>, Status> {
        let req = req.into_inner();
        check_version(req.protocol_version, "worker")?;
        let info = req.worker.ok_or_else(|| Status::invalid_argument("register: no worker info"))?;
        if info.task_kinds.is_empty() || info.slots == 0 {
            return Err(Status::invalid_argument("register: a worker must offer at least one task kind and slot"));
        }
        // A newer worker may offer kinds this coordinator does not know: they are ignored, not an error.
        if !info.task_kinds.iter().any(|k| pb::WorkerKind::parse(k).is_some()) {
            let known: Vec<&str> = pb::WorkerKind::ALL.iter().map(|k| k.name()).collect();
            return Err(Status::invalid_argument(format!(
                "register: no task kind this coordinator knows among {:?} (known: {})",
                info.task_kinds,
                known.join(", ")
            )));
        }
        let mut s = self.0.lock();
        let id = s.register(info, Instant::now());
        let (hb, lease) = (s.cfg().heartbeat.as_millis() as u32, s.cfg().lease.as_millis() as u32);
        tracing::info!("worker {id} registered");
        drop(s);
        Ok(Response::new(pb::RegisterResponse { worker_id: id, heartbeat_ms: hb, lease_ms: lease }))
    }

    async fn lease(&self, req: Request<pb::LeaseRequest>) -> Result<Response<pb::LeaseResponse>, Status> {
        let mut req = req.into_inner();
        {
            let mut s = self.0.lock();
            s.io_report(&req.worker_id, req.bytes_read, req.bytes_written);
            s.holdings(&req.worker_id, &req.holdings);
        }
        if !req.completed.is_empty() {
            let mut s = self.0.lock();
            for c in std::mem::take(&mut req.completed) {
                let task = c.task_id.clone();
                if let Err(e) = s.complete(c, Instant::now()) {
                    tracing::warn!(task = %task, "completion from {}: {e}", req.worker_id);
                }
            }
            self.0.after(s);
        }
        let deadline = Instant::now() + Duration::from_millis(req.wait_ms.min(60_000) as u64);
        loop {
            let notified = self.0.shared.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let crate::sched::Leases { leases, next_wake } = {
                let mut s = self.0.lock();
                let r = s.lease(&req.worker_id, req.free_slots, Instant::now()).map_err(status)?;
                self.0.after(s);
                r
            };
            if !leases.is_empty() {
                return Ok(Response::new(pb::LeaseResponse { leases }));
            }
            let now = Instant::now();
            if now >= deadline || self.0.shared.closing.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(Response::new(pb::LeaseResponse { leases: vec![] }));
            }
            let until = next_wake.map_or(deadline, |w| w.min(deadline));
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }

    async fn heartbeat(&self, req: Request<pb::HeartbeatRequest>) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let req = req.into_inner();
        let beat = {
            let mut s = self.0.lock();
            s.io_report(&req.worker_id, req.bytes_read, req.bytes_written);
            s.heartbeat(&req.worker_id, &req.lease_ids, Instant::now())
        };
        Ok(Response::new(pb::HeartbeatResponse { revoked: beat.revoked, reregister: beat.unknown_worker }))
    }

    async fn complete(&self, req: Request<pb::CompleteRequest>) -> Result<Response<pb::CompleteResponse>, Status> {
        let mut s = self.0.lock();
        let accepted = s.complete(req.into_inner(), Instant::now()).map_err(status)?;
        self.0.after(s);
        Ok(Response::new(pb::CompleteResponse { accepted }))
    }

    async fn hand_back(&self, req: Request<pb::HandBackRequest>) -> Result<Response<pb::HandBackResponse>, Status> {
        let mut s = self.0.lock();
        s.hand_back(&req.into_inner().lease_ids).map_err(status)?;
        self.0.after(s);
        Ok(Response::new(pb::HandBackResponse {}))
    }
}

struct ReleasesSvc(Coordinator);

#[tonic::async_trait]
impl Releases for ReleasesSvc {
    async fn submit(&self, req: Request<pb::SubmitRequest>) -> Result<Response<pb::SubmitResponse>, Status> {
        let req = req.into_inner();
        check_version(req.protocol_version, "client")?;
        let name = if req.file_name.is_empty() { "release.yaml" } else { &req.file_name };
        let id = self.0.submit(&req.release_yaml, name, &req.base).map_err(status)?;
        Ok(Response::new(pb::SubmitResponse { release_id: id }))
    }

    type WatchStream = ReceiverStream<Result<pb::ReleaseEvent, Status>>;

    async fn watch(&self, req: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let id = req.into_inner().release_id;
        let mut rx = self.0.shared.events.subscribe();
        let snapshot = self.0.lock().summary(&id).map_err(status)?.event;
        let (tx, out) = tokio::sync::mpsc::channel(256);
        let me = self.0.clone();
        tokio::spawn(async move {
            let terminal = |e: &pb::ReleaseEvent| e.state != ReleaseState::Running as i32;
            let done = terminal(&snapshot);
            if tx.send(Ok(snapshot)).await.is_err() || done {
                return;
            }
            loop {
                let ev = match rx.recv().await {
                    Ok(ev) if ev.release_id == id => ev,
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(_)) => match me.lock().summary(&id) {
                        Ok(r) => pb::ReleaseEvent {
                            message: "(progress events were dropped; this is the current state)".into(),
                            ..r.event
                        },
                        Err(_) => return,
                    },
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                let end = terminal(&ev);
                if tx.send(Ok(ev)).await.is_err() || end {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(out)))
    }

    async fn get_report(&self, req: Request<pb::GetReportRequest>) -> Result<Response<pb::GetReportResponse>, Status> {
        let sum = self.0.lock().summary(&req.into_inner().release_id).map_err(status)?;
        Ok(Response::new(pb::GetReportResponse {
            state: sum.state as i32,
            report_json: sum.report_json.unwrap_or_default(),
            report_url: sum.report_url.unwrap_or_default(),
        }))
    }

    async fn cancel(&self, req: Request<pb::CancelRequest>) -> Result<Response<pb::CancelResponse>, Status> {
        let mut s = self.0.lock();
        let state = s.cancel(&req.into_inner().release_id).map_err(status)?;
        self.0.after(s);
        Ok(Response::new(pb::CancelResponse { state: state as i32 }))
    }
}

/// Sweeps what the writers of dead leases staged (`quantfarm_store::staging`). A failure is logged, not fatal: the
/// staging is garbage, not an output, and the next sweep of the same output tries again.
async fn sweep_all(sweeps: Vec<crate::sched::Sweep>) {
    for sw in sweeps {
        // The lease's death on this machine's wall clock (file times and object stores keep wall-clock time).
        let ago = Instant::now().saturating_duration_since(sw.died);
        let before = std::time::SystemTime::now().checked_sub(ago).unwrap_or(std::time::UNIX_EPOCH);
        let swept = match quantfarm_store::Location::parse(&sw.url) {
            Ok(loc) => quantfarm_store::staging::sweep(&loc, before).await,
            Err(e) => Err(e),
        };
        match swept {
            Ok(s) if s.files + s.uploads > 0 => {
                tracing::info!(output = %sw.url, files = s.files, uploads = s.uploads, "swept a dead writer's staging")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(output = %sw.url, "sweeping a dead writer's staging: {e}"),
        }
    }
}
