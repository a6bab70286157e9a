//! The coordinator's top-level modules depend on each other without a cycle, and no source file is over 700 lines.
//!
//! A module's dependencies are the `crate::X` paths its files name (comments left out), `X` a top-level module or
//! a name `lib.rs` re-exports from one (`crate::Coordinator` is `server`'s). The graph is printed, so a failure
//! shows the cycle's modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The source without its comments (line comments and doc comments; the coordinator has no block comments).
fn code(p: &Path) -> String {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// Every identifier that follows `crate::` in `src`.
fn crate_paths(src: &str) -> BTreeSet<String> {
    src.match_indices("crate::")
        .filter(|(i, _)| !src[..*i].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
        .map(|(i, m)| src[i + m.len()..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect())
        .collect()
}

#[test]
fn modules_form_no_cycle_and_files_stay_small() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // The top-level modules and their files.
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "lib" {
            continue;
        }
        let mut files = Vec::new();
        if p.is_dir() {
            rust_files(&p, &mut files);
        } else {
            files.push(p);
        }
        modules.insert(name, files);
    }
    // Names lib.rs re-exports from a module: `pub use server::{Coordinator, ...};`.
    let mut alias: BTreeMap<String, String> = BTreeMap::new();
    for line in code(&src.join("lib.rs")).lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else { continue };
        let Some((module, names)) = rest.split_once("::") else { continue };
        if modules.contains_key(module) {
            for n in names.trim_matches(|c| c == '{' || c == '}' || c == ';').split(',') {
                alias.insert(n.trim().to_string(), module.to_string());
            }
        }
    }
    let mut deps: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let mut long = Vec::new();
    for (m, files) in &modules {
        let d = deps.entry(m).or_default();
        for f in files {
            let lines = std::fs::read_to_string(f).unwrap().lines().count();
            if lines > 700 {
                long.push(format!("{} ({lines} lines)", f.display()));
            }
            for name in crate_paths(&code(f)) {
                let target = if modules.contains_key(&name) { Some(name) } else { alias.get(&name).cloned() };
                if let Some(t) = target.filter(|t| t != m) {
                    d.insert(t);
                }
            }
        }
    }
    for (m, d) in &deps {
        eprintln!("{m} -> {d:?}");
    }
    assert!(long.is_empty(), "coordinator source files over 700 lines: {long:?}");
    // Depth-first search for a back edge.
    fn visit<'a>(
        m: &'a str,
        deps: &'a BTreeMap<&'a str, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if let Some(i) = path.iter().position(|p| *p == m) {
            panic!("module cycle: {} -> {m}", path[i..].join(" -> "));
        }
        if done.contains(m) {
            return;
        }
        path.push(m);
        for d in &deps[m] {
            visit(d, deps, path, done);
        }
        path.pop();
        done.insert(m);
    }
    let mut done = BTreeSet::new();
    for m in deps.keys() {
        visit(m, &deps, &mut Vec::new(), &mut done);
    }
    assert!(deps.len() >= 8, "found only {:?}", deps.keys());
}
