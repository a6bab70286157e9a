//! A report published before the report became typed (`tests/fixtures/report-tiny-llama`, see its SOURCE.md):
//! the current code verifies its signature and its DSSE envelope against the key that signed it, reads it into the
//! report's types without losing a member, renders the same views byte for byte, and refuses it after one changed
//! byte.

use std::path::PathBuf;

use quantfarm_coordinator::attestation::verify_envelope;
use quantfarm_coordinator::canonical::canonical_json;
use quantfarm_coordinator::report;
use quantfarm_coordinator::signing::{verify_report, PublicKey};
use quantfarm_coordinator::views::render_all;
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report-tiny-llama").join(name)
}

fn json(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn signer() -> PublicKey {
    let text = std::fs::read_to_string(fixture("signer.pub")).expect("signer.pub");
    PublicKey::from_text(text.trim()).expect("a public key")
}

#[test]
fn a_published_report_still_verifies_against_its_signer() {
    let report = json("report.json");
    let verified = verify_report(&report, Some(&signer())).expect("the report verifies");
    assert!(verified.pinned, "checked against the pinned key");
    let envelope = verify_envelope(&json("report.intoto.json"), Some(&signer())).expect("the envelope verifies");
    assert_eq!(envelope.report, report, "the envelope carries the same report");
}

#[test]
fn a_published_report_reads_into_the_types_and_back_to_the_same_canonical_form() {
    let text = std::fs::read_to_string(fixture("report.json")).expect("report.json");
    let typed = report::parse(&text).unwrap_or_else(|e| panic!("report.json: {e}"));
    assert_eq!(typed.artifacts.len(), 3);
    let back = serde_json::to_value(&typed).expect("serializes");
    let (ours, published) = (canonical_json(&back).expect("canonical"), canonical_json(&json("report.json")).unwrap());
    if ours != published {
        let at =
            ours.bytes().zip(published.bytes()).position(|(a, b)| a != b).unwrap_or(ours.len().min(published.len()));
        let from = at.saturating_sub(120);
        panic!(
            "the typed report is not the published one; first difference at byte {at}:\n  ours:      …{}\n  published: …{}",
            &ours[from..(at + 80).min(ours.len())],
            &published[from..(at + 80).min(published.len())]
        );
    }
    // So the signature still verifies over what the types hold.
    verify_report(&back, Some(&signer())).expect("the typed report verifies");
}

#[test]
fn a_report_that_does_not_fit_names_the_member() {
    let mut doc = json("report.json");
    doc["artifacts"][1]["kld"]["n_tokens"] = Value::from("many");
    let e = report::parse(&doc.to_string()).expect_err("a string for a count");
    assert!(e.starts_with("artifacts[1].kld"), "{e}");
    let mut doc = json("report.json");
    doc["artifacts"][1].as_object_mut().unwrap().remove("verified");
    let e = report::parse(&doc.to_string()).expect_err("a member missing");
    assert!(e.starts_with("artifacts[1]") && e.contains("verified"), "{e}");
}

#[test]
fn a_published_report_renders_the_same_views() {
    let text = std::fs::read_to_string(fixture("report.json")).expect("report.json");
    let report = report::parse(&text).unwrap_or_else(|e| panic!("report.json: {e}"));
    let views = render_all(&report);
    assert!(views.len() >= 3, "{:?}", views.iter().map(|v| v.0).collect::<Vec<_>>());
    for (name, body) in views {
        // A deliberate change to the views (SOURCE.md lists them) is written back with QUANTFARM_WRITE_VIEWS=1.
        if std::env::var_os("QUANTFARM_WRITE_VIEWS").is_some() {
            std::fs::write(fixture(name), &body).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let published = std::fs::read_to_string(fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some((i, (ours, theirs))) = body.lines().zip(published.lines()).enumerate().find(|(_, (a, b))| a != b) {
            panic!("{name} line {}: renders\n  {ours}\nwhere the published one has\n  {theirs}", i + 1);
        }
        assert_eq!(body.len(), published.len(), "{name} renders to another length than the published one");
    }
}

#[test]
fn one_changed_byte_is_refused() {
    let text = std::fs::read_to_string(fixture("report.json")).expect("report.json");
    // A figure's last digit: still valid JSON, no longer what was signed.
    let at = text.find("\"mean_kld\":").expect("a KLD figure") + "\"mean_kld\":".len() + 3;
    let mut bytes = text.into_bytes();
    bytes[at] = if bytes[at] == b'1' { b'2' } else { b'1' };
    let changed: Value = serde_json::from_slice(&bytes).expect("still JSON");
    assert!(verify_report(&changed, Some(&signer())).is_err(), "a changed report verified");
}
