//! Publishing a report: signed, rendered, staged and committed, report.json last.

use quantfarm_store::{Location, StagedSink};

use crate::canonical::canonical_json;
use quantfarm_report::parse;

/// Signs `report` with `key` and publishes it at `target` (`…/report.json`) with its views (`report.html`, the
/// model card, …) and its DSSE envelope beside it. Every file is staged before any is committed, and report.json is
/// committed last: its presence says the release's files are all there.
pub async fn publish(
    built: super::Built,
    key: &crate::signing::SigningKey,
    target: &Location,
) -> Result<crate::sched::Published, String> {
    let super::Built { report, attachments } = built;
    let passed = report.verdict == super::model::Verdict::Released;
    let unsigned = serde_json::to_value(&report).map_err(|e| e.to_string())?;
    let signed = crate::signing::sign_report(unsigned, key).map_err(|e| e.to_string())?;
    let text = canonical_json(&signed).map_err(|e| e.to_string())?;
    let envelope = crate::attestation::envelope(&signed, key).map_err(|e| e.to_string())?;
    // The views are rendered from the report as published, so that `quantfarm report render` of report.json gives
    // the same files byte for byte.
    let published = parse(&text)?;
    let mut files: Vec<(&str, String)> = crate::views::render_all(&published);
    files.push(("report.intoto.json", format!("{}\n", canonical_json(&envelope).map_err(|e| e.to_string())?)));
    let mut sinks = Vec::new();
    let bodies = files.iter().map(|(n, b)| (*n, b.as_bytes())).chain(attachments.iter().map(|(n, b)| (*n, &b[..])));
    for (name, body) in bodies {
        let loc = target.sibling(name).map_err(|e| e.to_string())?;
        let mut sink = StagedSink::create(&loc, true).await.map_err(|e| format!("{loc}: {e}"))?;
        sink.write(body).await.map_err(|e| format!("{loc}: {e}"))?;
        sinks.push(sink);
    }
    let mut sink = StagedSink::create(target, true).await.map_err(|e| e.to_string())?;
    sink.write(text.as_bytes()).await.map_err(|e| e.to_string())?;
    for s in sinks {
        s.commit().await.map_err(|e| e.to_string())?;
    }
    sink.commit().await.map_err(|e| e.to_string())?;
    Ok(crate::sched::Published { json: text, url: target.to_string(), passed })
}
