//! The release's verdict: named gates over its measured figures, each printed with its inputs, threshold and
//! result. `released` only when every gate passes.
//!
//! Every release has the built-in `measured` gate — each quant level (GGUF and MLX) needs its KL-divergence figure
//! and its probe results, whatever else passes: a level that was not measured never passes — plus the defaults of
//! `defaults.yaml` (reproducible bytes, a per-level KLD limit, probes within the reference's noise band, the merge
//! check with an adapter), and the release's own gates, a same-named one replacing a default.
//!
//! A gate is a [`Check`] (see [`expr`]); with `levels`, it is evaluated once per level, and names without a level
//! prefix are that level's figures. Figure names are listed in [`LEVEL_FIGURES`] and [`GLOBAL_FIGURES`].

pub mod expr;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::model::{GateInput, GateRecord};
use serde::{Deserialize, Serialize};

use expr::Term;
pub use expr::{Check, FigureValue, Figures, Outcome};

/// A gate as `release.yaml` (or `defaults.yaml`) gives it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Gate {
    pub name: String,
    pub check: String,
    /// Evaluate once per level: `all`, or a list of levels (`Q4_K_M`, `MLX-4bit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub levels: Option<LevelSel>,
    /// Only in `defaults.yaml`: the gate applies when the release has this (`adapter`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<When>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum LevelSel {
    /// Must be `all`.
    All(String),
    List(Vec<String>),
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum When {
    Adapter,
    /// The release runs models in mlx-lm (`ReleaseSpec::runs_mlx_lm`).
    MlxLm,
    /// The release runs models in transformers (`ReleaseSpec::runs_transformers`).
    Transformers,
    /// The release runs models in transformers and has a PEFT adapter: the merge check in transformers.
    TransformersAdapter,
}

/// One enum of figure names from one table: each variant's name and meaning, `ALL`, `parse`, and the table as
/// (name, meaning) pairs for the docs (`$table`).
macro_rules! figures {
    ($(#[$doc:meta])* $enum:ident, $table:ident: $($variant:ident = $name:literal: $about:literal,)*) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $enum {
            $($variant,)*
        }

        impl $enum {
            pub const ALL: &'static [$enum] = &[$($enum::$variant,)*];

            /// The figure's name in gate checks (`kld.mean`).
            pub fn name(self) -> &'static str {
                match self {
                    $($enum::$variant => $name,)*
                }
            }

            /// What it measures, in words.
            pub fn about(self) -> &'static str {
                match self {
                    $($enum::$variant => $about,)*
                }
            }

            /// The figure a gate check names.
            pub fn parse(name: &str) -> Option<$enum> {
                Self::ALL.iter().copied().find(|f| f.name() == name)
            }
        }

        /// The figures' (name, meaning) pairs, in order.
        pub const $table: &[(&str, &str)] = &[$(($name, $about),)*];
    };
}

figures! {
    /// A figure every level has (a level's GGUF quant or MLX checkpoint against the GGUF BF16 reference).
    Figure, LEVEL_FIGURES:
    KldMean = "kld.mean": "mean KL divergence (nats per token), llama-perplexity's Mean KLD",
    KldMeanUnc = "kld.mean_unc": "its uncertainty (±)",
    KldMedian = "kld.median": "median KL divergence",
    KldMax = "kld.max": "largest KL divergence of one token",
    KldP90 = "kld.p90": "90th percentile of the KL divergence",
    KldP95 = "kld.p95": "95th percentile",
    KldP99 = "kld.p99": "99th percentile",
    KldP999 = "kld.p99_9": "99.9th percentile",
    KldSameTopP = "kld.same_top_p": "percent of tokens whose most likely next token is the reference's (Same top p)",
    KldRmsDp = "kld.rms_dp": "RMS of the change in the correct token's probability, percent (RMS Δp)",
    KldPpl = "kld.ppl": "the level's perplexity, Mean PPL(Q)",
    KldPplRatio = "kld.ppl_ratio": "Mean PPL(Q)/PPL(base)",
    KldLnPplRatio = "kld.ln_ppl_ratio": "Mean ln(PPL(Q)/PPL(base))",
    KldMeanLow = "kld.mean_low": "the low end of kld.mean's chunk-clustered interval at evaluation.confidence (docs/statistics.md)",
    KldMeanHigh = "kld.mean_high": "its high end: `kld.mean_high <= X` passes only when the mean is below X at that confidence",
    NextKldMean = "next.kld.mean": "the next larger rung's kld.mean (by bytes, among the rungs measured in llama.cpp)",
    PairedNextDiff = "paired.next.diff": "the mean over the same tokens of this rung's KL divergence minus the next larger rung's",
    PairedNextLow = "paired.next.low": "the low end of that paired difference's interval (> 0: distinguishably worse than the next larger)",
    PairedNextHigh = "paired.next.high": "the high end of that interval (< 0: distinguishably better than the next larger)",
    GreedyAgree = "greedy.agree": "fraction of prompts whose greedy continuation is byte-identical to the reference's",
    GreedyPrefix = "greedy.prefix": "mean common-prefix fraction of the greedy continuations",
    ProbePassRate = "probe.pass_rate": "mean fraction of scored probes passed over the suite's repeated passes",
    ProbeSpread = "probe.spread": "standard deviation of that fraction over the passes",
    ProbeTruncated = "probe.truncated": "probe answers cut off by their token cap (never scored)",
    Baseline = "baseline": "the reference's probe.pass_rate",
    Noise = "noise": "the probes' noise band: the larger of the reference's and the level's probe.spread",
    ChoiceAccuracy = "choice.accuracy": "multiple-choice accuracy (a fraction) on evaluation.choices, as llama-perplexity --multiple-choice scores it",
    ChoiceChanged = "choice.changed": "multiple-choice tasks whose chosen answer differs from the reference's",
    ChoiceNowWrong = "choice.now_wrong": "multiple-choice tasks the reference answers right and this level wrong",
    BitsPerWeight = "bits_per_weight": "tensor bits per weight of the artifact",
    Bytes = "bytes": "the artifact's bytes, every file",
    Verified = "verified": "yes/no: every file of the artifact was recomputed from its input with identical bytes",
    DefaultKldMean = "default.kld.mean": "the level's default limit on kld.mean (defaults.yaml)",
    MlxLmKldMean = "mlx_lm.kld.mean": "an MLX rung in mlx-lm: mean KL divergence against the GGUF BF16's logits in llama.cpp",
    MlxLmKldSameTopP = "mlx_lm.kld.same_top_p": "an MLX rung in mlx-lm: percent of tokens with the GGUF BF16's most likely token",
    MlxLmGreedyAgree = "mlx_lm.greedy.agree": "an MLX rung in mlx-lm: fraction of prompts identical to mlx-lm's bf16 continuation",
    MlxLmGreedyPrefix = "mlx_lm.greedy.prefix": "an MLX rung in mlx-lm: mean common-prefix fraction against mlx-lm's bf16",
    MlxLmProbePassRate = "mlx_lm.probe.pass_rate": "an MLX rung on mlx_lm.server: the probe suite's pass rate",
    MlxLmProbeTruncated = "mlx_lm.probe.truncated": "an MLX rung on mlx_lm.server: probe answers cut off by their token cap",
    TransformersKldMean = "transformers.kld.mean": "a vLLM rung in transformers as saved (FP8_DYNAMIC's W8A8, emulated): mean KL divergence against the GGUF BF16's logits in llama.cpp",
    TransformersKldSameTopP = "transformers.kld.same_top_p": "a vLLM rung in transformers as saved: percent of tokens with the GGUF BF16's most likely token",
    TransformersWeightOnlyKldMean = "transformers.weight_only.kld.mean": "an FP8_DYNAMIC rung in transformers with bf16 inputs (vLLM's weight-only path): mean KL divergence against the GGUF BF16",
    TransformersGreedyAgree = "transformers.greedy.agree": "a vLLM rung in transformers as saved: fraction of prompts identical to transformers' bf16 continuation",
    TransformersProbePassRate = "transformers.probe.pass_rate": "a vLLM rung in transformers as saved: the probe suite's pass rate",
    TransformersProbeTruncated = "transformers.probe.truncated": "a vLLM rung in transformers as saved: probe answers cut off by their token cap",
}

// Besides the release's own figures, `<level>.<figure>` names any level's figure, the level written in lower case
// with `-` as `_` (`q4_k_m.kld.mean`, `mlx_4bit.probe.pass_rate`).
figures! {
    /// A figure of the release as a whole.
    GlobalFigure, GLOBAL_FIGURES:
    Verified = "verified": "yes/no: every artifact was recomputed from its inputs with identical bytes",
    MergeGreedyAgree = "merge.greedy.agree": "merge check: fraction of prompts identical, the merge vs the base + adapter at run time",
    MergeGreedyPrefix = "merge.greedy.prefix": "merge check: mean common-prefix fraction",
    MergeTransformersGreedyAgree = "merge.transformers.greedy.agree": "merge check in transformers, in f32: fraction of prompts identical, the merge vs the base with the PEFT adapter at run time (unmerged)",
    MergeTransformersGreedyPrefix = "merge.transformers.greedy.prefix": "merge check in transformers: mean common-prefix fraction",
    ReferenceKldPpl = "reference.kld.ppl": "the reference's perplexity, Mean PPL(base)",
    ReferenceProbePassRate = "reference.probe.pass_rate": "the reference's probe pass rate",
    ReferenceChoiceAccuracy = "reference.choice.accuracy": "the reference's multiple-choice accuracy (a fraction)",
    CrossRuntimeGreedyAgree = "cross_runtime.greedy.agree": "link 2: fraction of prompts identical, the bf16 weights in mlx-lm vs the GGUF BF16 in llama.cpp",
    CrossRuntimeGreedyPrefix = "cross_runtime.greedy.prefix": "link 2: mean common-prefix fraction of those continuations",
    CrossRuntimeKldMean = "cross_runtime.kld.mean": "link 2: mean KL divergence of the bf16 weights in mlx-lm against the GGUF BF16 in llama.cpp",
    CrossRuntimeKldSameTopP = "cross_runtime.kld.same_top_p": "link 2: percent of tokens whose most likely next token is the same in both runtimes",
    CrossRuntimeProbePassRate = "cross_runtime.probe.pass_rate": "the bf16 weights on mlx_lm.server: the probe suite's pass rate",
    TransformersBf16KldMean = "transformers.bf16.kld.mean": "the bf16 checkpoint in transformers against the GGUF BF16 in llama.cpp: mean KL divergence",
    TransformersBf16GreedyAgree = "transformers.bf16.greedy.agree": "the bf16 checkpoint in transformers: fraction of prompts identical to llama.cpp's GGUF BF16",
    TransformersBf16ProbePassRate = "transformers.bf16.probe.pass_rate": "the bf16 checkpoint in transformers: the probe suite's pass rate",
}

const FLAGS: &[&str] = &["verified"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Defaults {
    gates: Vec<Gate>,
    kld_mean_max: BTreeMap<String, f64>,
}

fn defaults() -> &'static Defaults {
    static D: OnceLock<Defaults> = OnceLock::new();
    D.get_or_init(|| {
        // Embedded and checked by a unit test, so a bad edit fails the build's tests, not a release.
        serde_norway::from_str(include_str!("defaults.yaml")).unwrap_or_else(|e| panic!("gates/defaults.yaml: {e}"))
    })
}

/// The default limit on a level's mean KL divergence, if it has one.
pub fn default_kld_max(level: &str) -> Option<f64> {
    defaults().kld_mean_max.get(level).copied()
}

/// A level's prefix in figure names: `Q4_K_M` → `q4_k_m`, `MLX-4bit` → `mlx_4bit`.
pub fn level_prefix(level: &str) -> String {
    level.to_ascii_lowercase().replace('-', "_")
}

fn is_level_figure(name: &str) -> bool {
    Figure::parse(name).is_some()
}

fn is_global_figure(name: &str, levels: &[String]) -> bool {
    GlobalFigure::parse(name).is_some()
        || levels.iter().any(|l| name.strip_prefix(&format!("{}.", level_prefix(l))).is_some_and(is_level_figure))
}

/// Checks a release's own gates against its levels (`levels`: every measured output's name, `Q8_0`, `MLX-4bit`);
/// returns the first problem, naming the gate.
pub fn check_release_gates(gates: &[Gate], levels: &[String]) -> Result<(), String> {
    let mut names = std::collections::HashSet::new();
    for (i, g) in gates.iter().enumerate() {
        let at = format!("gates[{i}] ({})", g.name);
        if g.name.trim().is_empty() {
            return Err(format!("gates[{i}].name: is empty"));
        }
        if !names.insert(g.name.as_str()) {
            return Err(format!("gates[{i}].name: {:?} is used twice", g.name));
        }
        if g.name == MEASURED {
            return Err(format!(
                "{at}: `measured` is built in (every level needs its KL-divergence figure and probe results) and cannot be replaced"
            ));
        }
        if g.when.is_some() {
            return Err(format!("{at}: `when` is only for the built-in defaults"));
        }
        let per_level = selected_levels(g, levels).map_err(|e| format!("{at}: {e}"))?;
        let check = Check::parse(&g.check, |_| true).map_err(|e| format!("{at}: check {:?}: {e}", g.check))?;
        let known = |n: &str| is_global_figure(n, levels) || (per_level.is_some() && is_level_figure(n));
        if let Some(unknown) = check.figures().into_iter().find(|n| !known(n)) {
            let hint = if per_level.is_none() && is_level_figure(unknown) {
                " (a level's figure: add `levels: all` or a list of levels, or prefix it with the level, e.g. q4_k_m.kld.mean)"
            } else {
                ""
            };
            return Err(format!("{at}: check {:?}: unknown figure {unknown:?}{hint}", g.check));
        }
        if let Check::Flag(name) = &check {
            if !FLAGS.contains(&name.as_str()) {
                return Err(format!(
                    "{at}: check {:?}: {name} is a number, so compare it (e.g. `{name} <= 0.05`); only {} stand alone",
                    g.check,
                    FLAGS.join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// The levels a gate runs over (`None`: the gate is release-wide).
fn selected_levels(g: &Gate, levels: &[String]) -> Result<Option<Vec<String>>, String> {
    match &g.levels {
        None => Ok(None),
        Some(LevelSel::All(s)) if s == "all" => Ok(Some(levels.to_vec())),
        Some(LevelSel::All(s)) => Err(format!("levels: {s:?}: expected `all` or a list of levels")),
        Some(LevelSel::List(list)) => {
            if list.is_empty() {
                return Err("levels: the list is empty".into());
            }
            for l in list {
                if !levels.contains(l) {
                    return Err(format!(
                        "levels: {l:?} is not an output of this release (its levels: {})",
                        if levels.is_empty() { "none".to_string() } else { levels.join(", ") }
                    ));
                }
            }
            Ok(Some(list.clone()))
        }
    }
}

/// The values of `level`'s `kld.mean` at which a gate's verdict changes, for the sequential stop rule
/// (`quantfarm_parity::sequential`): one per comparison, among the defaults the release keeps and its own gates,
/// that reads it; `levels` are the release's measured levels. An error names a gate whose verdict the rule cannot
/// foresee from the mean alone: one reading another of the level's KL-divergence figures (a percentile, the top
/// token, an interval), one comparing two rungs token by token (`next.*`, `paired.*`), or one setting `kld.mean`
/// against a figure known only at the end.
pub fn kld_mean_thresholds(release_gates: &[Gate], level: &str, levels: &[String]) -> Result<Vec<f64>, String> {
    let replaced = |name: &str| release_gates.iter().any(|g| g.name == name);
    let kept = defaults().gates.iter().filter(|g| !replaced(&g.name));
    let prefix = format!("{}.", level_prefix(level));
    let mut out = Vec::new();
    for g in kept.chain(release_gates) {
        let Ok(check) = Check::parse(&g.check, |_| true) else { continue };
        let per_level = matches!(selected_levels(g, levels), Ok(Some(ls)) if ls.iter().any(|l| l == level));
        let mine = |name: &str| -> Option<Figure> {
            match name.strip_prefix(&prefix) {
                Some(rest) => Figure::parse(rest),
                None if per_level => Figure::parse(name),
                None => None,
            }
        };
        let mut reads_mean = false;
        for name in check.figures() {
            let unbounded = |why: &str| format!("gate {:?} ({}) {why}", g.name, g.check);
            if name.starts_with("next.") || name.starts_with("paired.") || name.contains(".next.") {
                return Err(unbounded("compares two rungs on the same tokens"));
            }
            match mine(name) {
                Some(Figure::KldMean) => reads_mean = true,
                Some(f) if f.name().starts_with("kld.") => {
                    return Err(unbounded(&format!("reads {}, which the stop rule does not bound", f.name())))
                }
                _ => {}
            }
        }
        let Check::Compare { left, right, .. } = &check else { continue };
        if !reads_mean {
            continue;
        }
        // left − right = a·kld.mean + c: the verdict changes at kld.mean = −c/a.
        let (mut a, mut c) = (0.0, 0.0);
        for (side, sum) in [(1.0, left), (-1.0, right)] {
            for (sign, term) in &sum.0 {
                let k = side * sign;
                match term {
                    Term::Number(n) => c += k * n,
                    Term::Figure(name) => match mine(name) {
                        Some(Figure::KldMean) => a += k,
                        Some(Figure::DefaultKldMean) => match default_kld_max(level) {
                            Some(v) => c += k * v,
                            None => return Err(format!("gate {:?}: {level} has no default kld.mean limit", g.name)),
                        },
                        _ => {
                            return Err(format!(
                                "gate {:?} ({}) sets kld.mean against {name}, known only when the release ends",
                                g.name, g.check
                            ))
                        }
                    },
                }
            }
        }
        if a != 0.0 {
            out.push(-c / a);
        }
    }
    Ok(out)
}

/// The name of the built-in gate that every level was measured.
pub const MEASURED: &str = "measured";

/// One level's figures, each a value or why it has none.
#[derive(Clone, Debug, Default)]
pub struct LevelFigures {
    pub numbers: BTreeMap<Figure, Result<f64, String>>,
    pub verified: Option<bool>,
    /// The level is an MLX rung the release also runs in mlx-lm: `measured` requires its `mlx_lm.kld.mean` too
    /// (a checkpoint mlx-lm cannot load is not measured, whatever llama.cpp measured on its conversion).
    pub in_mlx_lm: bool,
    /// The level is a vLLM rung the release also runs in transformers: `measured` requires its
    /// `transformers.kld.mean` too.
    pub in_transformers: bool,
    /// The release scores multiple-choice tasks (`evaluation.choices`): `measured` requires `choice.accuracy` too.
    pub in_choices: bool,
}

impl LevelFigures {
    pub fn set(&mut self, figure: Figure, v: Result<f64, String>) {
        self.numbers.insert(figure, v);
    }

    /// The figure a gate check names, if the level has it.
    fn get(&self, name: &str) -> Option<&Result<f64, String>> {
        self.numbers.get(&Figure::parse(name)?)
    }
}

/// Everything the gates read.
#[derive(Clone, Debug, Default)]
pub struct Measured {
    /// In report order, by level name (`Q8_0`, `MLX-4bit`).
    pub levels: Vec<(String, LevelFigures)>,
    pub global: BTreeMap<GlobalFigure, Result<f64, String>>,
    pub all_verified: bool,
    pub has_adapter: bool,
    /// The release ran models in mlx-lm (the gates `when: mlx_lm` apply).
    pub has_mlx_lm: bool,
    /// The release ran models in transformers on its evaluation text (the gates `when: transformers` apply).
    pub has_transformers: bool,
    /// It also checked a PEFT adapter's merge there (the gates `when: transformers_adapter` apply).
    pub has_transformers_adapter: bool,
}

impl Measured {
    fn level(&self, name: &str) -> Option<&LevelFigures> {
        self.levels.iter().find(|(l, _)| l == name).map(|(_, f)| f)
    }
}

struct Scope<'a> {
    m: &'a Measured,
    level: Option<(&'a str, &'a LevelFigures)>,
}

fn missing(name: &str) -> String {
    format!("no figure {name}")
}

impl Scope<'_> {
    fn level_number(level: &str, f: &LevelFigures, name: &str) -> Result<f64, String> {
        f.get(name).cloned().unwrap_or_else(|| Err(format!("{level}: {}", missing(name))))
    }
}

impl Figures for Scope<'_> {
    fn number(&self, name: &str) -> Result<f64, String> {
        if let Some((level, f)) = self.level {
            if is_level_figure(name) {
                return Scope::level_number(level, f, name);
            }
        }
        if let Some(v) = GlobalFigure::parse(name).and_then(|g| self.m.global.get(&g)) {
            return v.clone();
        }
        for (level, f) in &self.m.levels {
            if let Some(rest) = name.strip_prefix(&format!("{}.", level_prefix(level))) {
                return Scope::level_number(level, f, rest);
            }
        }
        Err(missing(name))
    }

    fn flag(&self, name: &str) -> Result<bool, String> {
        if name != "verified" {
            return Err(format!("{name} is a number, not yes/no"));
        }
        match self.level {
            Some((level, f)) => f.verified.ok_or_else(|| format!("{level}: no verify task ran")),
            None => Ok(self.m.all_verified),
        }
    }
}

/// One gate's result on one level (or the release).
#[derive(Clone, Debug)]
pub struct GateResult {
    pub name: String,
    pub level: Option<String>,
    pub check: String,
    /// `default` (defaults.yaml), `release` (its own gates) or `built-in` (`measured`).
    pub source: &'static str,
    pub outcome: Outcome,
}

impl GateResult {
    /// As the report records it.
    pub fn record(&self) -> GateRecord {
        let inputs = self
            .outcome
            .inputs
            .iter()
            .map(|(name, v)| {
                let input = match v {
                    FigureValue::Number(x) if x.is_finite() => GateInput::Number(*x),
                    FigureValue::Number(x) => GateInput::Text(x.to_string()),
                    FigureValue::Flag(b) => GateInput::Flag(*b),
                    FigureValue::Missing(why) => GateInput::Missing { missing: why.clone() },
                };
                (name.clone(), input)
            })
            .collect();
        GateRecord {
            name: self.name.clone(),
            level: self.level.clone(),
            check: self.check.clone(),
            source: self.source.to_string(),
            inputs,
            threshold: self.outcome.threshold,
            passed: self.outcome.passed,
            detail: match &self.level {
                Some(l) => format!("{l}: {}", self.outcome.detail),
                None => self.outcome.detail.clone(),
            },
        }
    }
}

/// The built-in gate: the level has its KL-divergence figure and probe results.
fn measured_gate(level: &str, f: &LevelFigures) -> GateResult {
    let mut inputs = Vec::new();
    let mut why = Vec::new();
    // The probe task ran when its truncation count is there; whether its answers could be scored is the `probes`
    // gate's question (an all-truncated suite has no pass rate, and fails that gate saying so).
    let mut required = vec![("kld.mean", "no KL-divergence figure"), ("probe.truncated", "no probe results")];
    if f.in_mlx_lm {
        required.push(("mlx_lm.kld.mean", "no KL-divergence figure in mlx-lm"));
        required.push(("mlx_lm.probe.truncated", "no probe results on mlx_lm.server"));
    }
    if f.in_transformers {
        required.push(("transformers.kld.mean", "no KL-divergence figure in transformers"));
        required.push(("transformers.probe.truncated", "no probe results in transformers"));
    }
    if f.in_choices {
        required.push(("choice.accuracy", "no multiple-choice results"));
    }
    for (name, what) in required {
        match f.get(name) {
            Some(Ok(v)) => inputs.push((name.to_string(), FigureValue::Number(*v))),
            Some(Err(e)) => {
                inputs.push((name.to_string(), FigureValue::Missing(e.clone())));
                why.push(format!("{what} ({e})"));
            }
            None => {
                inputs.push((name.to_string(), FigureValue::Missing("not measured".into())));
                why.push(what.to_string());
            }
        }
    }
    let passed = why.is_empty();
    let detail = if passed {
        match (f.in_mlx_lm, f.in_transformers) {
            (true, _) => "KL divergence and probes measured, in llama.cpp and in mlx-lm",
            (false, true) => "KL divergence and probes measured, in llama.cpp and in transformers",
            (false, false) => "KL divergence and probes measured",
        }
        .to_string()
    } else {
        format!("not measured: {}; a level that was not measured never passes", why.join("; "))
    };
    GateResult {
        name: MEASURED.into(),
        level: Some(level.to_string()),
        check: "kld.mean and probe results measured".into(),
        source: "built-in",
        outcome: Outcome { passed, inputs, threshold: None, detail },
    }
}

/// Evaluates every gate: `measured` per level, the defaults (less those the release replaces), then the release's
/// own, in that order. A gate whose check does not parse (it was checked at submission, so only a report built by
/// another version) fails with the parse error.
pub fn evaluate(release_gates: &[Gate], m: &Measured) -> Vec<GateResult> {
    let mut out: Vec<GateResult> = m.levels.iter().map(|(l, f)| measured_gate(l, f)).collect();
    let level_names: Vec<String> = m.levels.iter().map(|(l, _)| l.clone()).collect();
    let replaced = |name: &str| release_gates.iter().any(|g| g.name == name);
    let defaults = defaults()
        .gates
        .iter()
        .filter(|g| !replaced(&g.name))
        .filter(|g| match g.when {
            None => true,
            Some(When::Adapter) => m.has_adapter,
            Some(When::MlxLm) => m.has_mlx_lm,
            Some(When::Transformers) => m.has_transformers,
            Some(When::TransformersAdapter) => m.has_transformers_adapter,
        })
        .map(|g| (g, "default"));
    for (g, source) in defaults.chain(release_gates.iter().map(|g| (g, "release"))) {
        let check = Check::parse(&g.check, |_| true);
        let scopes: Vec<Option<&str>> = match selected_levels(g, &level_names) {
            Ok(Some(levels)) => levels
                .iter()
                .filter_map(|l| m.levels.iter().find(|(n, _)| n == l))
                .map(|(n, _)| Some(n.as_str()))
                .collect(),
            Ok(None) => vec![None],
            Err(e) => {
                out.push(failed(g, None, source, e));
                continue;
            }
        };
        for level in scopes {
            match &check {
                Ok(c) => {
                    let scope = Scope { m, level: level.and_then(|l| m.level(l).map(|f| (l, f))) };
                    out.push(GateResult {
                        name: g.name.clone(),
                        level: level.map(str::to_string),
                        check: c.to_string(),
                        source,
                        outcome: c.evaluate(&scope),
                    });
                }
                Err(e) => out.push(failed(g, level, source, format!("check {:?}: {e}", g.check))),
            }
        }
    }
    out
}

fn failed(g: &Gate, level: Option<&str>, source: &'static str, why: String) -> GateResult {
    GateResult {
        name: g.name.clone(),
        level: level.map(str::to_string),
        check: g.check.clone(),
        source,
        outcome: Outcome { passed: false, inputs: Vec::new(), threshold: None, detail: why },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(kld: Option<f64>, pass: Option<f64>) -> LevelFigures {
        let mut f = LevelFigures { verified: Some(true), ..Default::default() };
        if let Some(k) = kld {
            f.set(Figure::KldMean, Ok(k));
        } else {
            f.set(Figure::KldMean, Err("no KL-divergence task ran (evaluation.skip)".into()));
        }
        if let Some(p) = pass {
            f.set(Figure::ProbePassRate, Ok(p));
            f.set(Figure::ProbeTruncated, Ok(0.0));
            f.set(Figure::Baseline, Ok(0.75));
            f.set(Figure::Noise, Ok(0.1));
        }
        f.set(Figure::DefaultKldMean, Ok(0.1));
        f
    }

    fn measured() -> Measured {
        Measured {
            levels: vec![
                ("Q8_0".into(), level(Some(0.004), Some(0.75))),
                ("Q4_K_M".into(), level(Some(0.06), Some(0.5))),
            ],
            global: BTreeMap::new(),
            all_verified: true,
            has_adapter: false,
            has_mlx_lm: false,
            has_transformers: false,
            has_transformers_adapter: false,
        }
    }

    #[test]
    fn the_stop_rule_reads_each_gates_kld_mean_threshold() {
        let levels = vec!["Q8_0".to_string(), "Q4_K_M".to_string()];
        let g = |name: &str, check: &str, levels: Option<LevelSel>| Gate {
            name: name.into(),
            check: check.into(),
            levels,
            when: None,
        };
        let close = |got: Result<Vec<f64>, String>, want: &[f64]| {
            let got = got.unwrap();
            assert!(got.len() == want.len() && got.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12), "{got:?}");
        };
        // The defaults alone: the `kld` gate at the level's default limit.
        close(kld_mean_thresholds(&[], "Q8_0", &levels), &[0.01]);
        // A release-wide gate naming the level, as a sum; it is not the other level's.
        let gates = [g("tight", "q8_0.kld.mean + 0.001 <= 0.003", None)];
        close(kld_mean_thresholds(&gates, "Q8_0", &levels), &[0.01, 0.002]);
        close(kld_mean_thresholds(&gates, "Q4_K_M", &levels), &[0.1]);
        // The default `kld` replaced for one level: the other has no threshold left.
        let gates = [g("kld", "0.05 >= kld.mean", Some(LevelSel::List(vec!["Q4_K_M".into()])))];
        close(kld_mean_thresholds(&gates, "Q4_K_M", &levels), &[0.05]);
        close(kld_mean_thresholds(&gates, "Q8_0", &levels), &[]);
        // What the rule cannot foresee from the mean: named in the error.
        let all = || Some(LevelSel::All("all".into()));
        let err = |gates: &[Gate]| kld_mean_thresholds(gates, "Q8_0", &levels).unwrap_err();
        assert!(err(&[g("tail", "kld.p99 <= 1", all())]).contains("kld.p99"));
        assert!(err(&[g("tail", "q8_0.kld.same_top_p >= 90", None)]).contains("kld.same_top_p"));
        assert!(err(&[g("pair", "paired.next.high < 0", all())]).contains("two rungs"));
        assert!(err(&[g("size", "kld.mean <= bits_per_weight - 4", all())]).contains("bits_per_weight"));
        // Figures that do not come from the KL divergence leave the rule alone.
        close(kld_mean_thresholds(&[g("p", "probe.pass_rate >= 0.5", all())], "Q8_0", &levels), &[0.01]);
    }

    #[test]
    fn the_defaults_parse_and_name_only_known_figures() {
        let d = defaults();
        assert!(d.kld_mean_max.contains_key("Q4_K_M") && d.kld_mean_max.contains_key("MLX-4bit"));
        for ft in quantfarm_ggml::FileType::ALL {
            assert!(d.kld_mean_max.contains_key(ft.name()), "no default limit for {}", ft.name());
        }
        for g in &d.gates {
            let per_level = g.levels.is_some();
            Check::parse(&g.check, |n| {
                is_global_figure(n, &[]) || (per_level && (is_level_figure(n) || FLAGS.contains(&n)))
            })
            .unwrap_or_else(|e| panic!("{}: {e}", g.name));
        }
    }

    #[test]
    fn every_level_is_gated_and_the_failure_names_the_level() {
        let r = evaluate(&[], &measured());
        let failed: Vec<String> = r
            .iter()
            .filter(|g| !g.outcome.passed)
            .map(|g| format!("{}/{}", g.name, g.level.as_deref().unwrap_or("-")))
            .collect();
        // Q4_K_M's probes: 0.5 < 0.75 - 0.1.
        assert_eq!(failed, ["probes/Q4_K_M"], "{r:#?}");
        let line = r.iter().find(|g| g.name == "probes" && g.level.as_deref() == Some("Q4_K_M")).unwrap().record();
        assert_eq!(line.detail, "Q4_K_M: probe.pass_rate = 0.5 < baseline - noise = 0.65");
        assert_eq!(line.threshold, Some(0.65));
        assert_eq!(line.inputs["baseline"], crate::model::GateInput::Number(0.75));
    }

    #[test]
    fn an_unmeasured_level_fails_measured_whatever_else_passes() {
        let mut m = measured();
        m.levels[1].1 = level(None, None);
        // The release replaces the defaults that would also fail, so only `measured` is left to say it.
        let lenient = [
            Gate {
                name: "kld".into(),
                check: "bytes >= 0".into(),
                levels: Some(LevelSel::All("all".into())),
                when: None,
            },
            Gate {
                name: "probes".into(),
                check: "bytes >= 0".into(),
                levels: Some(LevelSel::All("all".into())),
                when: None,
            },
        ];
        let r = evaluate(&lenient, &m);
        let bad: Vec<&GateResult> = r.iter().filter(|g| !g.outcome.passed).collect();
        assert!(bad.iter().any(|g| g.name == MEASURED), "{r:#?}");
        let g = bad.iter().find(|g| g.name == MEASURED).unwrap();
        assert_eq!(g.level.as_deref(), Some("Q4_K_M"));
        assert!(g.outcome.detail.contains("no KL-divergence figure (no KL-divergence task ran (evaluation.skip))"));
        assert!(g.outcome.detail.contains("no probe results"), "{}", g.outcome.detail);
    }

    #[test]
    fn release_gates_replace_defaults_and_read_any_level() {
        let gates = [Gate {
            name: "q4-tight".into(),
            check: "q4_k_m.kld.mean <= q8_0.kld.mean * 2".into(),
            levels: None,
            when: None,
        }];
        let levels = ["Q8_0".to_string(), "Q4_K_M".to_string()];
        assert!(check_release_gates(&gates, &levels).unwrap_err().contains("unexpected character"));
        let gates = [Gate { check: "q4_k_m.kld.mean <= q8_0.kld.mean + 0.05".into(), ..gates[0].clone() }];
        check_release_gates(&gates, &levels).unwrap();
        let r = evaluate(&gates, &measured());
        let g = r.iter().find(|g| g.name == "q4-tight").unwrap();
        assert!(!g.outcome.passed, "0.06 > 0.054");
        assert_eq!(g.source, "release");
    }

    #[test]
    fn release_gates_are_checked_at_submission() {
        let levels = ["Q8_0".to_string()];
        let g =
            |check: &str, levels: Option<LevelSel>| Gate { name: "g".into(), check: check.into(), levels, when: None };
        for (gate, want) in [
            (g("kld.mean <= 0.1", None), "add `levels: all`"),
            (g("q6_k.kld.mean <= 0.1", None), "unknown figure \"q6_k.kld.mean\""),
            (g("kld.mean <= 0.1", Some(LevelSel::List(vec!["Q6_K".into()]))), "\"Q6_K\" is not an output"),
            (g("kld.mean <= 0.1", Some(LevelSel::All("every".into()))), "expected `all`"),
            (Gate { name: MEASURED.into(), ..g("verified", None) }, "built in"),
            (Gate { when: Some(When::Adapter), ..g("verified", None) }, "only for the built-in"),
            (g("kld.mean", Some(LevelSel::All("all".into()))), "is a number, so compare it"),
        ] {
            let e = check_release_gates(std::slice::from_ref(&gate), &levels).unwrap_err();
            assert!(e.contains(want), "{gate:?}: {e}");
        }
        check_release_gates(&[g("kld.mean <= 0.1", Some(LevelSel::All("all".into())))], &levels).unwrap();
        check_release_gates(&[g("merge.greedy.agree >= 0.8", None)], &levels).unwrap();
    }
}
