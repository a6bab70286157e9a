//! `evaluation.compare_with`: the diff of an earlier release's report and this one (`quantfarm_report::diff`), put in
//! this report when it is made. The earlier report and its per-token values file are read from the store (the values
//! checked against that report's sha256); what cannot be read is said in the report, never failing the release.

use quantfarm_report::diff::diff;
use quantfarm_report::kld_values::KldValues;
use quantfarm_store::{Blob, Location};

use super::model::Comparison;
use super::Built;

async fn read(loc: &Location) -> Result<Vec<u8>, String> {
    let blob = Blob::open(loc).await.map_err(|e| format!("{loc}: {e}"))?;
    blob.read_vec(0, blob.len()).await.map_err(|e| format!("{loc}: {e}"))
}

/// The values file of a report, checked against its recorded sha256 (`None` when it has none).
async fn values_of(report: &quantfarm_report::Report, report_loc: &Location) -> Result<Option<KldValues>, String> {
    let Some(v) = report.paired.as_ref().map(|p| &p.values) else { return Ok(None) };
    let loc = report_loc.sibling(super::VALUES_FILE).map_err(|e| e.to_string())?;
    let bytes = read(&loc).await?;
    KldValues::parse_recorded(&bytes, &loc.to_string(), v).map(Some)
}

/// Puts the diff with the release `with` (`releases/<id>`, its report at `old_report`) in `built`'s report.
pub async fn compare(built: &mut Built, with: &str, old_report: &Location) {
    let comparison = match diff_with(built, old_report).await {
        Ok(d) => Comparison::Diff(Box::new(d)),
        Err(error) => Comparison::Unavailable { with: with.to_string(), error },
    };
    built.report.comparison = Some(comparison);
}

async fn diff_with(built: &Built, old_report: &Location) -> Result<quantfarm_report::diff::ReleaseDiff, String> {
    let text = read(old_report).await?;
    let old = quantfarm_report::parse(std::str::from_utf8(&text).map_err(|e| format!("{old_report}: {e}"))?)
        .map_err(|e| format!("{old_report}: not a {} report: {e}", quantfarm_report::FORMAT))?;
    let old_values = values_of(&old, old_report).await?;
    let new = &built.report;
    let new_values = match built.attachments.iter().find(|(n, _)| *n == super::VALUES_FILE) {
        Some((n, bytes)) => Some(KldValues::parse(bytes, n)?),
        None => None,
    };
    let confidence = new.paired.as_ref().map_or(0.95, |p| p.confidence);
    Ok(diff(&old, new, old_values.as_ref(), new_values.as_ref(), confidence))
}
