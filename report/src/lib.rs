//! The evidence side of quantfarm: a release's parity report as types, the gates that decide its verdict, its
//! RFC 8785 canonical form, its ed25519 signature and DSSE envelope, and its views (HTML with charts, markdown, the
//! model card). It depends on no database, RPC or HTTP crate: `quantfarm report verify` and `report render` need
//! only this crate, and the coordinator builds a [`Report`] from a finished release and publishes it.
//!
//! - [`model`]: the report as types ([`Report`], [`FORMAT`]), read back by [`parse`];
//! - [`gates`]: named checks over a report's figures (`kld.mean <= 0.05`), the defaults in `gates/defaults.yaml`;
//! - [`canonical`]: RFC 8785 JSON, the signed form;
//! - [`signing`]: keys, signatures and their verification; [`attestation`]: the in-toto DSSE envelope;
//! - [`views`]: every file rendered from a report, byte for byte the same from its JSON;
//! - [`diff`]: what changed between two releases, paired token by token with their [`kld_values`] files.

#![forbid(unsafe_code)]

pub mod attestation;
pub mod canonical;
pub mod diff;
pub mod gates;
pub mod kld_values;
pub mod model;
pub mod signing;
pub mod views;

pub use model::{Report, FORMAT};

use serde::{Deserialize, Serialize};

/// Reads a report (`report.json`, signed or not) into its types; an error names the member that does not fit
/// (`artifacts[2].kld.mean_kld: invalid type: string "x", expected f64`).
pub fn parse(text: &str) -> Result<Report, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            inner.to_string()
        } else {
            format!("{path}: {inner}")
        }
    })
}

/// The model card's front matter and introduction (`README.md` beside the report).
#[derive(Clone, Debug, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ModelCard {
    /// The licence identifier (`apache-2.0`), as the base model's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
    /// The base model's repository id (default: `base_name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_model: Option<String>,
    /// A paragraph under the title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}
