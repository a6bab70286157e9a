//! The report as an in-toto attestation in a DSSE envelope, so that standard supply-chain tooling (in-toto,
//! securesystemslib, sigstore's verifiers) can check it without knowing quantfarm.
//!
//! The envelope (DSSE v1, <https://github.com/secure-systems-lab/dsse/blob/master/protocol.md>):
//!
//! ```json
//! {"payloadType": "application/vnd.in-toto+json",
//!  "payload": "<base64 of the statement>",
//!  "signatures": [{"keyid": "SHA256:<fingerprint>", "sig": "<base64 ed25519 signature of PAE(type, payload)>"}]}
//! ```
//!
//! The statement (in-toto Statement v1) names every artifact file by its object key and sha256 as a `subject`, and
//! carries the signed report itself as the `predicate` (type [`PREDICATE_TYPE`]). The payload bytes are the
//! statement's RFC 8785 canonical form, and DSSE signs those bytes as they are (through the pre-authentication
//! encoding [`pae`]), so no canonicalization is needed to check it. The same ed25519 key signs the envelope and the
//! report inside it; [`verify_envelope`] checks both and that the subjects are the report's artifacts.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::canonical::canonical_json;
use crate::signing::{self, PublicKey, SigningKey, VerifyError};

pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// What the predicate is: a quantfarm parity report (report.json's `format`).
pub const PREDICATE_TYPE: &str = "https://quantfarm.dev/parity-report/v1";

#[derive(Debug, thiserror::Error)]
pub enum AttestationError {
    #[error("not a DSSE envelope: {0}")]
    Malformed(String),
    #[error("the envelope is signed by key {signer}, expected key {expected}")]
    WrongKey { signer: String, expected: String },
    #[error(
        "bad envelope signature by key {signer}: the payload was modified after signing or the signature is forged"
    )]
    BadSignature { signer: String },
    #[error("the report inside the envelope does not verify: {0}")]
    Report(#[from] VerifyError),
    #[error("the statement's subjects are not the report's artifacts: {0}")]
    Subjects(String),
    #[error("cannot sign the statement: {0}")]
    Sign(String),
}

/// DSSE's pre-authentication encoding: `DSSEv1 SP LEN(type) SP type SP LEN(body) SP body`, lengths in ASCII
/// decimal bytes.
pub fn pae(payload_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!("DSSEv1 {} {payload_type} {} ", payload_type.len(), body.len()).into_bytes();
    out.extend_from_slice(body);
    out
}

/// Every artifact file of a report as an in-toto subject: its URL's object key (the part after the store root the
/// report lists) and sha256, in report order.
fn subjects(report: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for a in report["artifacts"].as_array().into_iter().flatten() {
        for f in a["files"].as_array().into_iter().flatten() {
            let (Some(url), Some(sha)) = (f["url"].as_str(), f["sha256"].as_str()) else { continue };
            out.push(json!({"name": url, "digest": {"sha256": sha}}));
        }
    }
    out
}

/// The in-toto statement of a signed report.
pub fn statement(signed_report: &Value) -> Value {
    json!({
        "_type": STATEMENT_TYPE,
        "subject": subjects(signed_report),
        "predicateType": PREDICATE_TYPE,
        "predicate": signed_report,
    })
}

/// Wraps a signed report in a signed DSSE envelope.
pub fn envelope(signed_report: &Value, key: &SigningKey) -> Result<Value, AttestationError> {
    let body = canonical_json(&statement(signed_report)).map_err(|e| AttestationError::Sign(e.to_string()))?;
    let sig = key.sign_bytes(&pae(PAYLOAD_TYPE, body.as_bytes()));
    Ok(json!({
        "payloadType": PAYLOAD_TYPE,
        "payload": BASE64.encode(body.as_bytes()),
        "signatures": [{"keyid": key.public().fingerprint(), "sig": BASE64.encode(sig)}],
    }))
}

/// What a verified envelope held.
#[derive(Debug)]
pub struct VerifiedEnvelope {
    pub report: Value,
    pub verified: signing::Verified,
}

/// Checks an envelope: its signature over the payload (against `pinned`, or else the key the report inside
/// records: integrity only), the report inside, and that the subjects are the report's artifact files.
pub fn verify_envelope(envelope: &Value, pinned: Option<&PublicKey>) -> Result<VerifiedEnvelope, AttestationError> {
    let bad = |s: &str| AttestationError::Malformed(s.to_string());
    let ty = envelope["payloadType"].as_str().ok_or_else(|| bad("no payloadType string"))?;
    if ty != PAYLOAD_TYPE {
        return Err(AttestationError::Malformed(format!("payloadType is {ty:?}, expected {PAYLOAD_TYPE:?}")));
    }
    let payload = envelope["payload"].as_str().ok_or_else(|| bad("no payload string"))?;
    let body =
        BASE64.decode(payload).map_err(|e| AttestationError::Malformed(format!("payload is not base64 ({e})")))?;
    let statement: Value = serde_json::from_slice(&body)
        .map_err(|e| AttestationError::Malformed(format!("the payload is not a JSON statement ({e})")))?;
    if statement["_type"] != STATEMENT_TYPE || statement["predicateType"] != PREDICATE_TYPE {
        return Err(AttestationError::Malformed(format!(
            "the statement is not a {STATEMENT_TYPE} with predicateType {PREDICATE_TYPE}"
        )));
    }
    let report = &statement["predicate"];
    let recorded = signing::recorded_key(report)?;
    let key = pinned.copied().unwrap_or(recorded);
    let sigs = envelope["signatures"].as_array().ok_or_else(|| bad("no signatures array"))?;
    let fingerprint = key.fingerprint();
    let sig = sigs.iter().find(|s| s["keyid"] == fingerprint.as_str()).ok_or_else(|| {
        let signer = sigs.first().and_then(|s| s["keyid"].as_str()).unwrap_or("none").to_string();
        AttestationError::WrongKey { signer, expected: fingerprint.clone() }
    })?;
    let sig = sig["sig"].as_str().ok_or_else(|| bad("signatures[].sig is not a string"))?;
    let sig =
        BASE64.decode(sig).map_err(|e| AttestationError::Malformed(format!("signatures[].sig is not base64 ({e})")))?;
    if !key.verify_bytes(&pae(ty, &body), &sig) {
        return Err(AttestationError::BadSignature { signer: fingerprint });
    }
    let verified = signing::verify_report(report, Some(&key))?;
    let verified = signing::Verified { pinned: pinned.is_some(), ..verified };
    let want = subjects(report);
    if statement["subject"].as_array() != Some(&want) {
        return Err(AttestationError::Subjects(format!(
            "{} subjects, the report lists {} artifact files",
            statement["subject"].as_array().map_or(0, Vec::len),
            want.len()
        )));
    }
    Ok(VerifiedEnvelope { report: report.clone(), verified })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(key: &SigningKey) -> Value {
        let r = json!({
            "format": "quantfarm-report/1",
            "artifacts": [{"files": [{"url": "s3://b/r/Q8_0.gguf", "sha256": "ab".repeat(32), "bytes": 10}]}],
            "verdict": "released",
        });
        signing::sign_report(r, key).unwrap()
    }

    #[test]
    fn pae_is_the_spec_example() {
        // DSSE protocol.md's worked example.
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
        );
    }

    #[test]
    fn sign_then_verify_and_tampering_fails() {
        let key = SigningKey::generate().unwrap();
        let env = envelope(&report(&key), &key).unwrap();
        let v = verify_envelope(&env, Some(&key.public())).unwrap();
        assert!(v.verified.pinned);
        assert_eq!(v.report["verdict"], "released");
        assert!(!verify_envelope(&env, None).unwrap().verified.pinned);

        // One byte of the payload flipped.
        let mut body = BASE64.decode(env["payload"].as_str().unwrap()).unwrap();
        let at = body.windows(8).position(|w| w == b"released").unwrap();
        body[at] = b'R';
        let mut t = env.clone();
        t["payload"] = json!(BASE64.encode(&body));
        assert!(matches!(verify_envelope(&t, Some(&key.public())), Err(AttestationError::BadSignature { .. })));

        let other = SigningKey::generate().unwrap();
        assert!(matches!(verify_envelope(&env, Some(&other.public())), Err(AttestationError::WrongKey { .. })));
        let mut t = env.clone();
        t["payloadType"] = json!("text/plain");
        assert!(matches!(verify_envelope(&t, None), Err(AttestationError::Malformed(_))));
    }

    #[test]
    fn a_resigned_envelope_around_an_edited_report_fails() {
        // Whoever edits the report and re-signs only the envelope with the farm's key still fails on the report.
        let key = SigningKey::generate().unwrap();
        let mut r = report(&key);
        r["verdict"] = json!("gate_failed");
        let env = envelope(&r, &key).unwrap();
        assert!(matches!(verify_envelope(&env, Some(&key.public())), Err(AttestationError::Report(_))));
    }
}
