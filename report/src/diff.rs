//! What changed between two releases (`quantfarm report diff OLD NEW`): per rung, its files and tensor types, its
//! KL divergence paired token by token where both measured the same text, its greedy continuations that flipped
//! between identical and not, its probe results; and the gates whose verdict changed. Rendered as markdown and HTML,
//! and kept as JSON.
//!
//! The paired ΔKLD (`new − old` per token, its chunk-clustered interval: `quantfarm_parity::paired`) needs both
//! releases' per-token values files ([`KldValues`]) with the same tokens (`tokens_sha256`) in the same chunks; the
//! base logits are the same when the references (the GGUF BF16) are the same bytes too, which the diff says. A rung
//! whose files are the same bytes, measured on the same base logits, has a ΔKLD of exactly 0 on every token.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::kld_values::KldValues;
use crate::model::{Artifact, Interval, Report};
use quantfarm_parity::paired::mean_interval;

/// A release as the diff names it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Side {
    pub id: String,
    pub name: String,
    pub source_identity: Option<String>,
    pub verdict: String,
}

/// Two releases' differences.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ReleaseDiff {
    pub old: Side,
    pub new: Side,
    /// Whether the KL divergences are paired token by token, and on what (or why not).
    pub pairing: String,
    pub paired: bool,
    /// Both measured against the same GGUF BF16 (same sha256): the same base logits.
    pub same_reference: bool,
    pub confidence: f64,
    pub rungs: Vec<RungDiff>,
    /// Gates whose verdict differs, or that only one release has.
    pub gates: Vec<GateChange>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Presence {
    Both,
    OnlyOld,
    OnlyNew,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RungDiff {
    pub file_type: String,
    pub presence: Presence,
    /// Some file's sha256 (or the list of files) differs.
    pub files_changed: bool,
    pub old_bytes: Option<u64>,
    pub new_bytes: Option<u64>,
    /// The tensor types whose count differs.
    pub types: Vec<TypeChange>,
    pub old_kld: Option<f64>,
    pub new_kld: Option<f64>,
    /// The paired difference `new − old` of the per-token KL divergence, when both were measured on the same text.
    pub delta: Option<Interval>,
    /// Why there is no paired difference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_delta: Option<String>,
    pub greedy: Option<GreedyFlips>,
    pub probes: Option<ProbeChange>,
    /// Anything above changed.
    pub changed: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TypeChange {
    pub ggml_type: String,
    pub old_tensors: u64,
    pub new_tensors: u64,
}

/// Prompts whose greedy continuation went from identical to the reference's to not, and back.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct GreedyFlips {
    pub old_identical: u64,
    pub new_identical: u64,
    pub n: u64,
    pub now_differ: Vec<u32>,
    pub now_identical: Vec<u32>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ProbeChange {
    pub old_passed: u32,
    pub old_failed: u32,
    pub new_passed: u32,
    pub new_failed: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct GateChange {
    pub name: String,
    pub level: Option<String>,
    pub old: Option<bool>,
    pub new: Option<bool>,
}

/// The diff of `old` and `new`, with their values files where they have them (read and checked by the caller).
pub fn diff(
    old: &Report,
    new: &Report,
    old_values: Option<&KldValues>,
    new_values: Option<&KldValues>,
    confidence: f64,
) -> ReleaseDiff {
    let reference = |r: &Report| -> Option<Vec<String>> {
        r.artifacts.iter().find(|a| a.file_type == "BF16").map(|a| a.files.iter().map(|f| f.sha256.clone()).collect())
    };
    let same_reference = reference(old).is_some() && reference(old) == reference(new);
    let pairing: Result<(&KldValues, &KldValues), String> = match (old_values, new_values) {
        (Some(a), Some(b)) if a.tokens_sha256 != b.tokens_sha256 || a.ctx != b.ctx => Err(format!(
            "not paired: the releases measured different tokens (tokens sha256 {} ctx {} against {} ctx {})",
            short(&a.tokens_sha256),
            a.ctx,
            short(&b.tokens_sha256),
            b.ctx
        )),
        (Some(a), Some(b)) if a.chunks != b.chunks => {
            Err("not paired: the releases measured different chunks of the same tokens".to_string())
        }
        (Some(a), Some(b)) => Ok((a, b)),
        (None, _) => Err("not paired: the old release has no per-token values file".to_string()),
        (_, None) => Err("not paired: the new release has no per-token values file".to_string()),
    };
    let pairing_text = match &pairing {
        Ok((a, _)) => format!(
            "paired token by token: both measured the same {} tokens (sha256 {}) in {} chunks of {}, {}",
            a.chunks.iter().map(|c| c.1).sum::<usize>(),
            short(&a.tokens_sha256),
            a.chunks.len(),
            a.ctx,
            if same_reference {
                "against the same GGUF BF16 (the same base logits)"
            } else {
                "but against different GGUF BF16 references: each ΔKLD also holds the references' difference"
            }
        ),
        Err(e) => e.clone(),
    };
    let names: BTreeSet<&str> =
        old.artifacts.iter().chain(&new.artifacts).map(|a| a.file_type.as_str()).collect::<BTreeSet<_>>();
    // In the new release's order, then what only the old one has.
    let mut order: Vec<&str> = new.artifacts.iter().map(|a| a.file_type.as_str()).collect();
    let only_old: Vec<&str> =
        old.artifacts.iter().map(|a| a.file_type.as_str()).filter(|t| !order.contains(t)).collect();
    order.extend(only_old);
    debug_assert_eq!(order.len(), names.len());
    let rungs = order
        .into_iter()
        .map(|ty| {
            let find = |r: &'_ Report| r.artifacts.iter().find(|a| a.file_type == ty).cloned();
            rung_diff(ty, find(old).as_ref(), find(new).as_ref(), pairing.as_ref().ok().copied(), confidence)
        })
        .collect();
    ReleaseDiff {
        old: side(old),
        new: side(new),
        pairing: pairing_text,
        paired: pairing.is_ok(),
        same_reference,
        confidence,
        rungs,
        gates: gate_changes(old, new),
    }
}

/// A signed figure with 4 significant digits however small (`+1.234e-6`, `-0.01234`).
fn signed(v: f64) -> String {
    if v == 0.0 {
        "0".to_string()
    } else if v.abs() < 1e-3 {
        format!("{v:+.3e}")
    } else {
        format!("{v:+.6}")
    }
}

fn short(sha: &str) -> String {
    sha.chars().take(12).collect()
}

fn side(r: &Report) -> Side {
    Side {
        id: r.release.id.clone(),
        name: r.release.name.clone(),
        source_identity: r.source.identity.clone(),
        verdict: r.verdict.words().to_string(),
    }
}

fn rung_diff(
    ty: &str,
    old: Option<&Artifact>,
    new: Option<&Artifact>,
    values: Option<(&KldValues, &KldValues)>,
    confidence: f64,
) -> RungDiff {
    let presence = match (old, new) {
        (Some(_), Some(_)) => Presence::Both,
        (Some(_), None) => Presence::OnlyOld,
        (None, _) => Presence::OnlyNew,
    };
    let shas = |a: Option<&Artifact>| a.map(|a| a.files.iter().map(|f| f.sha256.clone()).collect::<Vec<_>>());
    let files_changed = shas(old) != shas(new);
    let counts = |a: Option<&Artifact>| -> BTreeMap<String, u64> {
        a.map(|a| a.type_mix.iter().map(|t| (t.ggml_type.clone(), t.tensors)).collect()).unwrap_or_default()
    };
    let (ct_old, ct_new) = (counts(old), counts(new));
    let types: Vec<TypeChange> = ct_old
        .keys()
        .chain(ct_new.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|t| TypeChange {
            ggml_type: t.clone(),
            old_tensors: ct_old.get(t).copied().unwrap_or(0),
            new_tensors: ct_new.get(t).copied().unwrap_or(0),
        })
        .filter(|c| c.old_tensors != c.new_tensors)
        .collect();
    let kld = |a: Option<&Artifact>| a.and_then(Artifact::kld_figures).map(|k| k.mean_kld);
    let (delta, no_delta) = match (values, presence) {
        (_, Presence::OnlyOld | Presence::OnlyNew) => (None, None),
        // The reference itself (or a rung measured in neither).
        _ if kld(old).is_none() && kld(new).is_none() => (None, None),
        (None, Presence::Both) => (None, Some("the releases' KL divergences are not paired (above)".to_string())),
        (Some((a, b)), Presence::Both) => match (a.chunked(ty), b.chunked(ty)) {
            (Some(x), Some(y)) => {
                let d: Vec<(u32, Vec<f64>)> = x
                    .iter()
                    .zip(&y)
                    .map(|((c, p), (_, q))| {
                        (*c, p.iter().zip(*q).map(|(u, v)| f64::from(*v) - f64::from(*u)).collect())
                    })
                    .collect();
                match mean_interval(&d, confidence) {
                    Ok(m) => (Some(Interval::from(&m)), None),
                    Err(e) => (None, Some(e.to_string())),
                }
            }
            _ => (None, Some("not measured in llama.cpp in both releases".to_string())),
        },
    };
    let greedy = match (old.and_then(|a| a.greedy.as_ref()), new.and_then(|a| a.greedy.as_ref())) {
        (Some(a), Some(b)) if a.n == b.n => {
            let differ =
                |g: &crate::model::GreedySummary| g.disagreements.iter().map(|d| d.index).collect::<BTreeSet<_>>();
            let (da, db) = (differ(a), differ(b));
            Some(GreedyFlips {
                old_identical: a.identical,
                new_identical: b.identical,
                n: a.n,
                now_differ: db.difference(&da).copied().collect(),
                now_identical: da.difference(&db).copied().collect(),
            })
        }
        _ => None,
    };
    let probes = match (old.and_then(|a| a.probes.as_ref()), new.and_then(|a| a.probes.as_ref())) {
        (Some(a), Some(b)) => {
            Some(ProbeChange { old_passed: a.passed, old_failed: a.failed, new_passed: b.passed, new_failed: b.failed })
        }
        _ => None,
    };
    let changed = presence != Presence::Both
        || files_changed
        || !types.is_empty()
        || delta.as_ref().is_some_and(|d| d.mean != 0.0 || d.low != 0.0 || d.high != 0.0)
        || (delta.is_none() && kld(old) != kld(new))
        || greedy.as_ref().is_some_and(|g| !g.now_differ.is_empty() || !g.now_identical.is_empty())
        || probes.as_ref().is_some_and(|p| (p.old_passed, p.old_failed) != (p.new_passed, p.new_failed));
    RungDiff {
        file_type: ty.to_string(),
        presence,
        files_changed,
        old_bytes: old.map(|a| a.bytes),
        new_bytes: new.map(|a| a.bytes),
        types,
        old_kld: kld(old),
        new_kld: kld(new),
        delta,
        no_delta,
        greedy,
        probes,
        changed,
    }
}

fn gate_changes(old: &Report, new: &Report) -> Vec<GateChange> {
    let verdicts = |r: &Report| -> BTreeMap<(String, Option<String>), bool> {
        r.gates.iter().map(|g| ((g.name.clone(), g.level.clone()), g.passed)).collect()
    };
    let (a, b) = (verdicts(old), verdicts(new));
    a.keys()
        .chain(b.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| GateChange { name: k.0.clone(), level: k.1.clone(), old: a.get(k).copied(), new: b.get(k).copied() })
        .collect()
}

impl ReleaseDiff {
    /// The diff's table rows: rung, what changed (files, size, tensor types), mean KLD old → new, paired ΔKLD,
    /// greedy flips, probes.
    fn rows(&self) -> Vec<[String; 8]> {
        let pct = 100.0 * self.confidence;
        self.rungs
            .iter()
            .map(|r| {
                let status = match (r.presence, r.changed) {
                    (Presence::OnlyOld, _) => "removed",
                    (Presence::OnlyNew, _) => "added",
                    (Presence::Both, true) => "changed",
                    (Presence::Both, false) => "unchanged",
                };
                let files = match r.presence {
                    Presence::Both if r.files_changed => "changed".to_string(),
                    Presence::Both => "same bytes".to_string(),
                    _ => "—".to_string(),
                };
                let size = match (r.old_bytes, r.new_bytes) {
                    (Some(a), Some(b)) if a == b => crate::views::size(b),
                    (a, b) => format!(
                        "{} → {}",
                        a.map_or("—".into(), crate::views::size),
                        b.map_or("—".into(), crate::views::size)
                    ),
                };
                let types = if r.types.is_empty() {
                    "same".to_string()
                } else {
                    r.types
                        .iter()
                        .map(|t| format!("{} {}→{}", t.ggml_type, t.old_tensors, t.new_tensors))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let num = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.6}"));
                let kld = format!("{} → {}", num(r.old_kld), num(r.new_kld));
                let delta = match (&r.delta, &r.no_delta) {
                    (Some(d), _) if d.mean == 0.0 && d.low == 0.0 && d.high == 0.0 => "0 on every token".to_string(),
                    (Some(d), _) => format!(
                        "{} [{}, {}] at {pct:.0} %{}",
                        signed(d.mean),
                        signed(d.low),
                        signed(d.high),
                        if d.low > 0.0 {
                            ": worse"
                        } else if d.high < 0.0 {
                            ": better"
                        } else {
                            ": within the interval"
                        }
                    ),
                    (None, Some(why)) => why.clone(),
                    (None, None) => "—".to_string(),
                };
                let greedy = r.greedy.as_ref().map_or("—".to_string(), |g| {
                    let mut s = format!("{}/{} → {}/{}", g.old_identical, g.n, g.new_identical, g.n);
                    if !g.now_differ.is_empty() {
                        let _ = write!(s, "; now differ: {:?}", g.now_differ);
                    }
                    if !g.now_identical.is_empty() {
                        let _ = write!(s, "; now identical: {:?}", g.now_identical);
                    }
                    s
                });
                let probes = r.probes.as_ref().map_or("—".to_string(), |p| {
                    format!(
                        "{}/{} → {}/{} passed",
                        p.old_passed,
                        p.old_passed + p.old_failed,
                        p.new_passed,
                        p.new_passed + p.new_failed
                    )
                });
                [format!("{} ({status})", r.file_type), files, size, types, kld, delta, greedy, probes]
            })
            .collect()
    }

    const HEADER: [&'static str; 8] = [
        "Rung",
        "Files",
        "Size",
        "Tensor types",
        "Mean KLD old → new",
        "ΔKLD new − old, paired",
        "Greedy identical",
        "Probes",
    ];

    /// The diff's title: both releases by name, id and verdict.
    pub fn title(&self) -> String {
        format!(
            "Release diff: {} ({}, {}) → {} ({}, {})",
            self.old.name, self.old.id, self.old.verdict, self.new.name, self.new.id, self.new.verdict
        )
    }

    fn gate_lines(&self) -> Vec<String> {
        let v = |p: Option<bool>| match p {
            Some(true) => "pass",
            Some(false) => "FAIL",
            None => "—",
        };
        self.gates
            .iter()
            .map(|g| {
                let level = g.level.as_deref().map(|l| format!(" ({l})")).unwrap_or_default();
                format!("{}{level}: {} → {}", g.name, v(g.old), v(g.new))
            })
            .collect()
    }

    fn summary(&self) -> String {
        let changed: Vec<&str> = self.rungs.iter().filter(|r| r.changed).map(|r| r.file_type.as_str()).collect();
        if changed.is_empty() {
            "No rung changed.".to_string()
        } else {
            format!("Changed: {}.", changed.join(", "))
        }
    }

    /// The diff in markdown.
    pub fn markdown(&self) -> String {
        format!("# {}\n\n{}", crate::views::markdown::cell(&self.title()), self.markdown_body("##"))
    }

    /// The diff under a heading of the report's views: the summary, the table and the gates (`sub`: the gates'
    /// heading marker).
    pub fn markdown_body(&self, sub: &str) -> String {
        let cell = crate::views::markdown::cell;
        let mut md = format!("{}\n\nKL divergence: {}.\n\n", self.summary(), self.pairing);
        let _ = writeln!(md, "| {} |", Self::HEADER.join(" | "));
        let _ = writeln!(md, "|---|---|---:|---|---:|---:|---|---|");
        for r in self.rows() {
            let _ = writeln!(md, "| {} |", r.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | "));
        }
        let gates = self.gate_lines();
        if !gates.is_empty() {
            let _ = writeln!(md, "\n{sub} Gates that changed\n");
            for g in gates {
                let _ = writeln!(md, "- {}", cell(&g));
            }
        }
        md
    }

    /// The diff as a standalone HTML page.
    pub fn html(&self) -> String {
        let esc = crate::views::html::esc;
        format!(
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{}</style></head><body><h1>{}</h1>{}</body></html>\n",
            esc(&self.title()),
            crate::views::html::CSS,
            esc(&self.title()),
            self.html_body("h2"),
        )
    }

    /// The diff as HTML under a heading of the report's page (`sub`: the gates' heading element).
    pub fn html_body(&self, sub: &str) -> String {
        let esc = crate::views::html::esc;
        let mut h = format!("<p>{}</p><p>KL divergence: {}.</p><table><tr>", esc(&self.summary()), esc(&self.pairing));
        for c in Self::HEADER {
            let _ = write!(h, "<th>{}</th>", esc(c));
        }
        h.push_str("</tr>");
        for r in self.rows() {
            h.push_str("<tr>");
            for c in r {
                let _ = write!(h, "<td>{}</td>", esc(&c));
            }
            h.push_str("</tr>");
        }
        h.push_str("</table>");
        let gates = self.gate_lines();
        if !gates.is_empty() {
            let _ = write!(h, "<{sub}>Gates that changed</{sub}><ul>");
            for g in gates {
                let _ = write!(h, "<li>{}</li>", esc(&g));
            }
            h.push_str("</ul>");
        }
        h
    }
}
