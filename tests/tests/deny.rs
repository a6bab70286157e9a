//! `scripts/deny` checks RustSec's advisories (its own database, or the snapshot beside the project where GitHub
//! cannot be reached) and fails on an advisory that affects a lockfile: a fixture project pinned to smallvec 1.6.0
//! (RUSTSEC-2021-0003) fails, naming the advisory and the database it used; the same project on the fixed 1.6.1
//! passes.

use std::path::Path;
use std::process::{Command, Output};

fn deny(manifest: &Path) -> (Output, String) {
    let out = Command::new(quantfarm_e2e::repo_root().join("scripts/deny"))
        .arg("--manifest-path")
        .arg(manifest)
        .output()
        .expect("run scripts/deny");
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out, all)
}

#[test]
fn deny_fails_on_an_advisory_in_the_lockfile_and_passes_once_it_is_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = quantfarm_e2e::repo_root().join("tests/fixtures/advisory-lockfile");
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join("src")).unwrap();
    for f in ["Cargo.toml", "Cargo.lock", "src/lib.rs"] {
        std::fs::copy(fixture.join(f), project.join(f)).unwrap();
    }
    let (out, all) = deny(&project.join("Cargo.toml"));
    eprintln!("{all}");
    assert!(!out.status.success(), "scripts/deny passed a lockfile with smallvec 1.6.0:\n{all}");
    assert!(all.contains("RUSTSEC-2021-0003"), "the advisory is not named:\n{all}");
    // It says which database it checked against, and, for the snapshot, its commit, date and age.
    let line = all.lines().find(|l| l.starts_with("scripts/deny: checking advisories against")).unwrap_or_else(|| {
        panic!("no line naming the advisory database:\n{all}");
    });
    if line.contains("snapshot") {
        let snapshot = std::fs::read_to_string(quantfarm_e2e::shared_dir().join("advisory-db/SNAPSHOT")).unwrap();
        let field = |key: &str| {
            snapshot.lines().find_map(|l| l.strip_prefix(key)).map(str::trim).unwrap_or_else(|| panic!("{key}"))
        };
        assert!(line.contains(field("commit:")) && line.contains(field("date:")), "{line}");
        assert!(line.contains("days old"), "{line}");
    }

    // The fixed version: the same project passes (the lockfile made anew by cargo for smallvec 1.6.1).
    let toml = std::fs::read_to_string(project.join("Cargo.toml")).unwrap().replace("=1.6.0", "=1.6.1");
    std::fs::write(project.join("Cargo.toml"), toml).unwrap();
    std::fs::remove_file(project.join("Cargo.lock")).unwrap();
    let (out, all) = deny(&project.join("Cargo.toml"));
    assert!(out.status.success(), "scripts/deny failed on smallvec 1.6.1:\n{all}");
    assert!(!all.contains("RUSTSEC-2021-0003"), "{all}");
}
