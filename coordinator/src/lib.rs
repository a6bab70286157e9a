//! The farm's coordinator: turns a `release.yaml` into a graph of small tasks, leases them to workers by
//! capability and critical path, retries what fails, keeps every change in a SQLite journal so a restart resumes
//! each release, and gathers the results into one signed report.
//!
//! It never touches tensor bytes: planning, conversion, quantization and verification run on workers; the
//! coordinator only writes the report.

#![forbid(unsafe_code)]

mod affinity;
pub mod graph;
pub mod history;
pub mod journal;
pub mod kinds;
pub mod metrics;
pub mod report;
pub mod sched;
pub mod server;
pub mod spec;

// The evidence side lives in `quantfarm-report`, which has no database, RPC or HTTP dependency; its modules keep
// their paths here.
pub use quantfarm_report::{attestation, canonical, gates, signing, views};
pub use sched::SchedConfig;
pub use server::{Coordinator, CoordinatorConfig, ServeError};
