//! `quantfarm report diff OLD NEW`: what changed between two releases (`quantfarm_report::diff`), paired token by
//! token with the per-token KL-divergence values file each report has beside it.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use quantfarm_report::kld_values::KldValues;
use quantfarm_report::Report;

/// Arguments of `quantfarm report diff`.
#[derive(clap::Args)]
pub struct DiffArgs {
    /// The older release's report.json (its kld-values.safetensors beside it pairs the KL divergences).
    pub old: PathBuf,
    /// The newer release's report.json.
    pub new: PathBuf,
    /// Also write the diff as an HTML page here.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Also write the diff as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The intervals' two-sided confidence (default: the new report's `paired.confidence`, else 0.95).
    #[arg(long)]
    pub confidence: Option<f64>,
}

/// A report and its values file (when it has one), the file checked against the report's sha256.
fn read(path: &Path) -> Result<(Report, Option<KldValues>)> {
    let name = path.display();
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read report {name}"))?;
    let report = quantfarm_report::parse(&text)
        .map_err(|e| anyhow::anyhow!("report {name} is not a {} report: {e}", quantfarm_report::FORMAT))?;
    let Some(values) = report.paired.as_ref().map(|p| p.values.clone()) else { return Ok((report, None)) };
    let file = values.url.rsplit('/').next().unwrap_or_default();
    let beside = path.parent().unwrap_or(Path::new(".")).join(file);
    let bytes = match std::fs::read(&beside) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("warning: {} is not beside {name}: its KL divergence is not paired", beside.display());
            return Ok((report, None));
        }
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", beside.display())),
    };
    let parsed = KldValues::parse_recorded(&bytes, &beside.display().to_string(), &values)
        .map_err(|e| anyhow::anyhow!("{e} ({name})"))?;
    Ok((report, Some(parsed)))
}

pub fn run(args: DiffArgs) -> Result<()> {
    let (old, old_values) = read(&args.old)?;
    let (new, new_values) = read(&args.new)?;
    let confidence = args.confidence.or(new.paired.as_ref().map(|p| p.confidence)).unwrap_or(0.95);
    if !(0.5..1.0).contains(&confidence) {
        bail!("--confidence {confidence}: expected a fraction from 0.5 up to (not including) 1");
    }
    let d = quantfarm_report::diff::diff(&old, &new, old_values.as_ref(), new_values.as_ref(), confidence);
    if let Some(path) = &args.html {
        std::fs::write(path, d.html()).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&d).context("the diff as JSON")? + "\n";
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    print!("{}", d.markdown());
    Ok(())
}
