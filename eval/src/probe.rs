//! Task probes (link 4 of the parity method): a YAML suite of chat prompts with expected answers, run on the
//! built-in runtime or on an OpenAI-compatible server (`llama-server`, `mlx_lm.server`, vLLM).
//!
//! An answer cut off by the token cap is *truncated*: neither a pass nor a fail, and reported as such. Thinking is a
//! template kwarg (`enable_thinking`), sent inside `chat_template_kwargs` to servers; a thinking block that shows up
//! in the content anyway is flagged. Repeated passes of the suite give a mean score and its spread.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::template::Message;

/// A probe suite as written in YAML.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuiteFile {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub defaults: Defaults,
    pub probes: Vec<ProbeFile>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    pub max_tokens: Option<usize>,
    pub thinking: Option<bool>,
    pub repeats: Option<usize>,
    pub temperature: Option<f32>,
    #[serde(default)]
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeFile {
    pub name: String,
    /// The chat; or `prompt` for a single user message.
    pub messages: Option<Vec<Message>>,
    pub prompt: Option<String>,
    pub expect: ExpectFile,
    pub max_tokens: Option<usize>,
    pub thinking: Option<bool>,
    pub repeats: Option<usize>,
    pub temperature: Option<f32>,
    /// More template kwargs (e.g. `reasoning_effort: low`).
    #[serde(default)]
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

/// Exactly one of the four.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectFile {
    pub exact: Option<String>,
    pub regex: Option<String>,
    pub contains: Option<String>,
    /// The answer must be JSON; every key given here must be present with this value (`{}`: any object).
    pub json: Option<serde_json::Value>,
}

/// How an answer is judged.
#[derive(Clone, Debug)]
pub enum Expect {
    /// Equal after trimming surrounding whitespace.
    Exact(String),
    Regex(regex::Regex),
    Contains(String),
    Json(serde_json::Value),
}

/// A checked probe, ready to run.
#[derive(Clone, Debug)]
pub struct Probe {
    pub name: String,
    pub messages: Vec<Message>,
    pub expect: Expect,
    pub max_tokens: usize,
    pub thinking: bool,
    pub repeats: usize,
    pub temperature: f32,
    /// Template kwargs, `enable_thinking` included.
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

pub struct Suite {
    pub name: String,
    pub probes: Vec<Probe>,
}

impl Suite {
    pub fn read(path: &Path) -> Result<Suite> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Error::Io { file: file.clone(), source: e })?;
        Suite::parse(&file, &text)
    }

    pub fn parse(file: &str, text: &str) -> Result<Suite> {
        let raw: SuiteFile = serde_norway::from_str(text).map_err(|e| {
            let at = e.location().map_or("suite".to_string(), |l| format!("line {} column {}", l.line(), l.column()));
            Error::format(file, at, e.to_string())
        })?;
        if raw.probes.is_empty() {
            return Err(Error::format(file, "probes", "the suite has no probes"));
        }
        let d = &raw.defaults;
        let mut seen = std::collections::HashSet::new();
        let mut probes = Vec::new();
        for p in raw.probes {
            let field = |f: &str| format!("probes[{}].{f}", p.name);
            if !seen.insert(p.name.clone()) {
                return Err(Error::format(file, field("name"), "given twice"));
            }
            let messages = match (p.messages, p.prompt) {
                (Some(m), None) if !m.is_empty() => m,
                (None, Some(t)) => vec![Message::user(&t)],
                _ => return Err(Error::format(file, field("messages"), "give either messages (non-empty) or prompt")),
            };
            let e = p.expect;
            let expect = match (e.exact, e.regex, e.contains, e.json) {
                (Some(x), None, None, None) => Expect::Exact(x),
                (None, Some(r), None, None) => Expect::Regex(
                    regex::Regex::new(&r).map_err(|err| Error::format(file, field("expect.regex"), err.to_string()))?,
                ),
                (None, None, Some(c), None) => Expect::Contains(c),
                (None, None, None, Some(j)) => Expect::Json(j),
                _ => {
                    return Err(Error::format(
                        file,
                        field("expect"),
                        "give exactly one of exact, regex, contains, json",
                    ))
                }
            };
            let max_tokens = p.max_tokens.or(d.max_tokens).unwrap_or(256);
            let repeats = p.repeats.or(d.repeats).unwrap_or(1);
            if max_tokens == 0 || repeats == 0 {
                return Err(Error::format(file, field("max_tokens/repeats"), "must be at least 1"));
            }
            let thinking = p.thinking.or(d.thinking).unwrap_or(false);
            let mut kwargs = d.kwargs.clone();
            kwargs.extend(p.kwargs);
            kwargs.insert("enable_thinking".into(), thinking.into());
            probes.push(Probe {
                name: p.name,
                messages,
                expect,
                max_tokens,
                thinking,
                repeats,
                temperature: p.temperature.or(d.temperature).unwrap_or(0.0),
                kwargs,
            });
        }
        let name = raw.name.unwrap_or_else(|| file.to_string());
        Ok(Suite { name, probes })
    }
}

/// Why a completion stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    Stop,
    /// The token cap cut it off.
    Length,
}

/// What a runtime answered.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Completion {
    pub content: String,
    /// Thinking a server separated out (`reasoning_content`).
    pub reasoning: Option<String>,
    pub finish: Finish,
    /// Prompt tokens as the runtime counted them (servers' `usage.prompt_tokens`).
    pub prompt_tokens: Option<u64>,
}

/// Something that answers chats: the built-in runtime or a server.
pub trait Responder {
    fn describe(&self) -> String;
    /// One completion; `repeat` seeds sampling when the temperature is above 0.
    fn complete(&mut self, probe: &Probe, repeat: usize) -> Result<Completion>;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Pass,
    Fail,
    /// Cut off by the token cap: not scored.
    Truncated,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProbeRun {
    pub probe: String,
    pub repeat: usize,
    pub outcome: Outcome,
    /// A `<think>` block appeared in the content (with thinking off, the template kwarg was not honoured).
    pub thinking_in_content: bool,
    pub answer: String,
    /// Thinking the runtime returned apart from the content.
    pub reasoning: Option<String>,
    pub prompt_tokens: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProbeReport {
    pub suite: String,
    pub runtime: String,
    pub runs: Vec<ProbeRun>,
    pub passed: usize,
    pub failed: usize,
    pub truncated: usize,
    /// Per repeat pass of the suite that scored anything: passed / scored.
    pub pass_scores: Vec<f64>,
    pub mean_score: f64,
    /// Sample standard deviation of the pass scores (0 for one pass): the noise band.
    pub score_spread: f64,
}

/// The answer the expectation is checked against: the content with any leading thinking block removed.
fn answer_of(content: &str) -> (&str, bool) {
    let has_think = content.contains("<think>") || content.contains("</think>");
    let answer = match content.rfind("</think>") {
        Some(i) => &content[i + "</think>".len()..],
        None => content,
    };
    (answer.trim(), has_think)
}

pub fn judge(expect: &Expect, answer: &str) -> bool {
    match expect {
        Expect::Exact(x) => answer.trim() == x.trim(),
        Expect::Regex(r) => r.is_match(answer),
        Expect::Contains(c) => answer.contains(c.as_str()),
        Expect::Json(want) => {
            let body = answer.trim().trim_start_matches("```json").trim_start_matches("```").trim_end_matches("```");
            match serde_json::from_str::<serde_json::Value>(body.trim()) {
                Ok(got) => json_subset(want, &got),
                Err(_) => false,
            }
        }
    }
}

fn json_subset(want: &serde_json::Value, got: &serde_json::Value) -> bool {
    match (want, got) {
        (serde_json::Value::Object(w), serde_json::Value::Object(g)) => {
            w.iter().all(|(k, v)| g.get(k).is_some_and(|gv| json_subset(v, gv)))
        }
        _ => want == got,
    }
}

/// Runs every probe `repeats` times on `responder`.
pub fn run_suite(suite: &Suite, responder: &mut dyn Responder) -> Result<ProbeReport> {
    let passes = suite.probes.iter().map(|p| p.repeats).max().unwrap_or(1);
    let mut runs = Vec::new();
    let mut pass_scores = Vec::new();
    for repeat in 0..passes {
        let (mut ok, mut scored) = (0usize, 0usize);
        for probe in suite.probes.iter().filter(|p| repeat < p.repeats) {
            let c = responder.complete(probe, repeat)?;
            let (answer, thinking_in_content) = answer_of(&c.content);
            let outcome = if c.finish == Finish::Length {
                Outcome::Truncated
            } else if judge(&probe.expect, answer) {
                Outcome::Pass
            } else {
                Outcome::Fail
            };
            if outcome != Outcome::Truncated {
                scored += 1;
                ok += usize::from(outcome == Outcome::Pass);
            }
            runs.push(ProbeRun {
                probe: probe.name.clone(),
                repeat,
                outcome,
                thinking_in_content,
                answer: c.content,
                reasoning: c.reasoning,
                prompt_tokens: c.prompt_tokens,
            });
        }
        // A pass whose every answer was truncated says nothing about the model: it has no score.
        if scored > 0 {
            pass_scores.push(ok as f64 / scored as f64);
        }
    }
    let count = |o: Outcome| runs.iter().filter(|r| r.outcome == o).count();
    let n = pass_scores.len() as f64;
    let mean = if pass_scores.is_empty() { 0.0 } else { pass_scores.iter().sum::<f64>() / n };
    let spread = if pass_scores.len() > 1 {
        (pass_scores.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    Ok(ProbeReport {
        suite: suite.name.clone(),
        runtime: responder.describe(),
        passed: count(Outcome::Pass),
        failed: count(Outcome::Fail),
        truncated: count(Outcome::Truncated),
        runs,
        pass_scores,
        mean_score: mean,
        score_spread: spread,
    })
}

impl ProbeReport {
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut o = String::new();
        let _ = writeln!(o, "probes {} on {}", self.suite, self.runtime);
        for r in &self.runs {
            let flag = if r.thinking_in_content { "  [thinking block in content]" } else { "" };
            let _ = writeln!(o, "  {:<24} #{:<2} {:?}{flag}", r.probe, r.repeat, r.outcome);
        }
        let _ = writeln!(
            o,
            "passed {}, failed {}, truncated {} (not scored); score {:.3} ± {:.3} over {} pass(es)",
            self.passed,
            self.failed,
            self.truncated,
            self.mean_score,
            self.score_spread,
            self.pass_scores.len()
        );
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suite_parses_and_rejects_bad_expectations() {
        let s = Suite::parse(
            "s.yaml",
            "defaults: {max_tokens: 16, repeats: 2}\nprobes:\n  - name: a\n    prompt: hi\n    expect: {contains: Paris}\n    thinking: true\n",
        )
        .unwrap();
        assert_eq!(s.probes[0].max_tokens, 16);
        assert_eq!(s.probes[0].repeats, 2);
        assert_eq!(s.probes[0].kwargs["enable_thinking"], true);
        let e = Suite::parse("s.yaml", "probes:\n  - name: a\n    prompt: hi\n    expect: {contains: x, exact: y}\n")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("s.yaml") && e.contains("probes[a].expect") && e.contains("exactly one"), "{e}");
        let e = Suite::parse("s.yaml", "probes:\n  - name: a\n    promt: hi\n").err().unwrap().to_string();
        assert!(e.contains("s.yaml") && e.contains("promt"), "{e}");
    }

    #[test]
    fn judging() {
        assert!(judge(&Expect::Exact("Paris".into()), " Paris\n"));
        assert!(judge(&Expect::Json(serde_json::json!({"a": 1})), "```json\n{\"a\": 1, \"b\": 2}\n```"));
        assert!(!judge(&Expect::Json(serde_json::json!({"a": 1})), "{\"a\": 2}"));
        assert!(!judge(&Expect::Json(serde_json::json!({})), "not json"));
        let (a, t) = answer_of("<think>\nhmm\n</think>\n\nParis");
        assert_eq!((a, t), ("Paris", true));
    }

    struct Canned(Vec<Completion>);
    impl Responder for Canned {
        fn describe(&self) -> String {
            "canned".into()
        }
        fn complete(&mut self, _: &Probe, _: usize) -> Result<Completion> {
            Ok(self.0.remove(0))
        }
    }

    #[test]
    fn truncated_answers_are_not_scored() {
        let suite =
            Suite::parse("s", "defaults: {repeats: 2}\nprobes:\n  - {name: a, prompt: q, expect: {contains: yes}}\n")
                .unwrap();
        let c = |t: &str, f| Completion { content: t.into(), reasoning: None, finish: f, prompt_tokens: None };
        let mut r = Canned(vec![c("yes", Finish::Length), c("no", Finish::Stop)]);
        let rep = run_suite(&suite, &mut r).unwrap();
        assert_eq!((rep.passed, rep.failed, rep.truncated), (0, 1, 1));
        assert_eq!(rep.pass_scores, vec![0.0], "the all-truncated pass has no score");
    }
}
