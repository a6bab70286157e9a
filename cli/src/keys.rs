//! `quantfarm keygen` and `quantfarm verify`: make the farm's signing key, and check a signed report.
//!
//! `verify` says which of two claims it checked, because they differ in what they prove: against a key given with
//! `--pubkey` (obtained from somewhere the report's author cannot edit) a valid signature proves authorship and
//! integrity; against the key the report itself records it proves only that the report was not edited after being
//! signed by whoever holds that key — anybody can edit a report and re-sign it with their own key.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use quantfarm_report::attestation;
use quantfarm_report::signing::{self, PublicKey, SigningKey};

/// Arguments of `quantfarm keygen`.
#[derive(clap::Args)]
pub struct KeygenArgs {
    /// Path of the secret key file to create (default: $QUANTFARM_KEY_FILE, else
    /// $XDG_CONFIG_HOME/quantfarm/signing.key or ~/.config/quantfarm/signing.key). An existing file is never
    /// overwritten. The public key is written next to it, as <path>.pub.
    pub out: Option<PathBuf>,
}

/// Arguments of `quantfarm report render`.
#[derive(clap::Args)]
pub struct RenderArgs {
    /// The signed report (JSON).
    pub report: PathBuf,
    /// Folder to write report.md, report.html and README.md (the model card) into (default: beside the report).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Writes the report's views (the files the coordinator writes beside it) from a report file.
pub fn render(args: RenderArgs) -> Result<()> {
    let name = args.report.display();
    let text = std::fs::read_to_string(&args.report).with_context(|| format!("cannot read report {name}"))?;
    let report = quantfarm_report::parse(&text)
        .map_err(|e| anyhow::anyhow!("report {name} is not a {} report: {e}", quantfarm_report::FORMAT))?;
    let out = args.out.unwrap_or_else(|| args.report.parent().map(Path::to_path_buf).unwrap_or_default());
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    for (file, body) in quantfarm_report::views::render_all(&report) {
        let path = out.join(file);
        // Staged beside the target and renamed over it: a reader never sees half a file.
        let staged = out.join(format!(".{file}.partial"));
        std::fs::write(&staged, body).with_context(|| format!("cannot write {}", staged.display()))?;
        std::fs::rename(&staged, &path).with_context(|| format!("cannot write {}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(())
}

/// Arguments of `quantfarm verify`.
#[derive(clap::Args)]
pub struct VerifyArgs {
    /// The signed report (JSON).
    pub report: PathBuf,
    /// The key the report must be signed by: a public key file, or the text `quantfarm-ed25519-public:...`.
    /// Without it only integrity is checked, against the key recorded in the report.
    #[arg(long)]
    pub pubkey: Option<String>,
}

/// The key a report must be signed by, from `--pubkey`: a public key file, or the text `quantfarm-ed25519-public:...`.
pub fn pinned_key(given: Option<&str>) -> Result<Option<PublicKey>> {
    Ok(match given {
        None => None,
        Some(text) if text.trim_start().starts_with("quantfarm-ed25519-") => {
            Some(PublicKey::from_text(text).context("--pubkey")?)
        }
        Some(path) => Some(PublicKey::load(Path::new(path)).context("--pubkey")?),
    })
}

/// Writes a new secret key (mode 0600) and its public key, and prints the public key and fingerprint.
pub fn keygen(args: KeygenArgs) -> Result<()> {
    let path = args.out.unwrap_or_else(signing::default_key_path);
    let key = SigningKey::write_new(&path)?;
    let public = key.public();
    let mut pub_path = path.clone().into_os_string();
    pub_path.push(".pub");
    let pub_path = PathBuf::from(pub_path);
    // The public file is derived from the secret just created, so replacing a stale one is correct.
    std::fs::write(&pub_path, format!("{public}\n")).with_context(|| {
        format!("wrote the secret key {}, but cannot write the public key {}", path.display(), pub_path.display())
    })?;
    println!("secret key:  {} (mode 0600: keep it private and back it up; it is never overwritten)", path.display());
    println!("public key:  {}", pub_path.display());
    println!("             {public}");
    println!("fingerprint: {}", public.fingerprint());
    println!("Publish the public key where readers of your reports can fetch it, and verify with --pubkey.");
    Ok(())
}

/// Verifies a signed report; prints the outcome. `Ok(false)` when the signature does not verify (exit 1); `Err`
/// when the report or the key cannot be read at all.
pub fn verify(args: VerifyArgs) -> Result<bool> {
    let name = args.report.display();
    let pinned = pinned_key(args.pubkey.as_deref())?;
    let text = std::fs::read_to_string(&args.report).with_context(|| format!("cannot read report {name}"))?;
    let report: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("report {name} is not valid JSON"))?;
    // Either form: report.json (a `signature` member) or report.intoto.json (a DSSE envelope around it).
    let outcome = if report.get("payloadType").is_some() {
        attestation::verify_envelope(&report, pinned.as_ref()).map(|v| v.verified).map_err(anyhow::Error::from)
    } else {
        signing::verify_report(&report, pinned.as_ref()).map_err(anyhow::Error::from)
    };
    let form = if report.get("payloadType").is_some() { "DSSE envelope (in-toto statement)" } else { "report" };
    match outcome {
        Ok(verified) if verified.pinned => {
            println!(
                "{name}: {form} signature valid, signed by key {} (checked against --pubkey: authorship and integrity)",
                verified.fingerprint
            );
            Ok(true)
        }
        Ok(verified) => {
            println!(
                "{name}: {form} signature valid, signed by key {} (checked against the key recorded in the report: \
                 integrity only, not authorship; pass --pubkey to check who signed it)",
                verified.fingerprint
            );
            Ok(true)
        }
        Err(e) => {
            eprintln!("{name}: {form} signature INVALID: {e:#}");
            Ok(false)
        }
    }
}
