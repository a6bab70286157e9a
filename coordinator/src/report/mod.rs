//! The release's record: `report.json` with the spec, every artifact's identity (URL, sha256, bytes, type mix,
//! bits per weight), every task's inputs, outputs, worker and duration, the gates with their inputs and results,
//! and the verdict.
//!
//! - [`model`]: the report as types ([`Report`]), which the views read (`quantfarm-report`);
//! - [`build()`]: a finished release's report, with the gates evaluated;
//! - [`publish()`]: signed by [`crate::signing`] over its RFC 8785 canonical form, staged with its views and DSSE
//!   envelope, committed last.

mod build;
mod compare;
mod figures;
mod paired;
mod publish;
mod search;
mod sequential;
mod tasks;
mod third_party;
mod transformers;

pub use build::{build, Built};
pub use compare::compare;
pub use paired::{VALUES_FILE, VALUES_FORMAT};
pub use publish::publish;
pub use quantfarm_report::model;
pub use quantfarm_report::{parse, Report, FORMAT};
