//! Multiple-choice accuracy as `llama-perplexity --multiple-choice` scores it (llama.cpp
//! `tools/perplexity/perplexity.cpp`, `multiple_choice_score`), and its binary task format.
//!
//! **Format** (little-endian; `multiple_choice_task::deserialize`): `u32 n_task`, `u32 offset[n_task]` (each task's
//! byte offset in the file), then per task: the question (`u32 len` + UTF-8 bytes), `mc1` and `mc2`, each `u32 n`
//! (at most 100), `n` strings (`u32 len` + bytes) and `n` `i32` labels (1 for a correct answer). Only `mc1` (one
//! correct answer) is scored; `mc2` is read and kept.
//!
//! **Scoring**, bit for bit as llama-perplexity: each answer is tokenized as `question + " " + answer` with the
//! model's special tokens (BOS); the tokens all answers share are decoded once, each answer's rest on its own
//! sequence of a unified KV cache, as many whole tasks per decode as fit the context (`parallel × ctx` tokens and
//! `parallel` sequences; llama-perplexity takes `parallel = max(4, -np)`). An answer's score is the mean log
//! probability of its tokens after the shared prefix (the first from a softmax of the prefix's last logits, the rest
//! by a log-softmax in f32, as `compute_logprobs`); the first answer with the highest score is the model's choice.

use crate::error::{Error, Result};
use crate::runtime::{Model, Token};

/// The most answers llama-perplexity reads per task.
pub const MAX_ANSWERS: u32 = 100;

/// A task's answers and their labels (1: correct).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answers {
    pub answers: Vec<String>,
    pub labels: Vec<i32>,
}

/// One multiple-choice task.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChoiceTask {
    pub question: String,
    /// Answers with a single correct one: what is scored.
    pub mc1: Answers,
    /// Answers with several correct ones (read and written, not scored, as llama-perplexity).
    pub mc2: Answers,
}

/// Reads a task file (`file` names it in errors).
pub fn read_tasks(bytes: &[u8], file: &str) -> Result<Vec<ChoiceTask>> {
    let mut r = Reader { bytes, at: 0, file };
    let n = r.u32("n_task")?;
    if n == 0 {
        return Err(r.bad("n_task", "no tasks".into()));
    }
    let mut offsets = Vec::with_capacity(n.min(1 << 20) as usize);
    for i in 0..n {
        offsets.push(r.u32(&format!("offset[{i}]"))?);
    }
    let mut tasks = Vec::with_capacity(offsets.len());
    for (i, &offset) in offsets.iter().enumerate() {
        // Read in order, as llama-perplexity reads all tasks; each task must start where its offset says.
        if offset as usize != r.at {
            return Err(r.bad(&format!("offset[{i}]"), format!("{offset}, but task {i} starts at byte {}", r.at)));
        }
        let question = r.string(&format!("task {i}: question"))?;
        let mc1 = r.answers(&format!("task {i}: mc1"))?;
        let mc2 = r.answers(&format!("task {i}: mc2"))?;
        tasks.push(ChoiceTask { question, mc1, mc2 });
    }
    if r.at != bytes.len() {
        return Err(r.bad("end", format!("{} bytes after the last task", bytes.len() - r.at)));
    }
    Ok(tasks)
}

/// Writes tasks in the format [`read_tasks`] reads (and llama-perplexity).
pub fn write_tasks(tasks: &[ChoiceTask]) -> Vec<u8> {
    let mut body = Vec::new();
    let mut offsets = Vec::with_capacity(tasks.len());
    let head = 4 + 4 * tasks.len();
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    };
    let answers = |out: &mut Vec<u8>, a: &Answers| {
        out.extend_from_slice(&(a.answers.len() as u32).to_le_bytes());
        for s in &a.answers {
            string(out, s);
        }
        for l in &a.labels {
            out.extend_from_slice(&l.to_le_bytes());
        }
    };
    for t in tasks {
        offsets.push((head + body.len()) as u32);
        string(&mut body, &t.question);
        answers(&mut body, &t.mc1);
        answers(&mut body, &t.mc2);
    }
    let mut out = (tasks.len() as u32).to_le_bytes().to_vec();
    for o in offsets {
        out.extend_from_slice(&o.to_le_bytes());
    }
    out.extend(body);
    out
}

/// A question set as written for people (YAML): `name`, then `tasks`, each `{question, answers: [...], correct:
/// INDEX}` (2 to 100 answers, `correct` the index of the right one).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct QuestionSet {
    #[serde(default)]
    #[allow(dead_code)]
    name: Option<String>,
    tasks: Vec<Question>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Question {
    question: String,
    answers: Vec<String>,
    correct: usize,
}

/// Reads a question set (YAML, see [`QuestionSet`]) as tasks; an error names the file and the task.
pub fn read_question_set(bytes: &[u8], file: &str) -> Result<Vec<ChoiceTask>> {
    let bad = |field: String, msg: String| Error::Format { file: file.to_string(), field, msg };
    let set: QuestionSet = serde_norway::from_slice(bytes).map_err(|e| bad("tasks".into(), e.to_string()))?;
    if set.tasks.is_empty() {
        return Err(bad("tasks".into(), "none".into()));
    }
    set.tasks
        .into_iter()
        .enumerate()
        .map(|(i, q)| {
            let n = q.answers.len();
            if !(2..=MAX_ANSWERS as usize).contains(&n) || q.correct >= n {
                let msg = format!(
                    "{n} answers and correct {}: expected 2 to 100 answers, correct one of their indices",
                    q.correct
                );
                return Err(bad(format!("tasks[{i}]"), msg));
            }
            if q.question.trim().is_empty() || q.answers.iter().any(|a| a.trim().is_empty()) {
                return Err(bad(format!("tasks[{i}]"), "an empty question or answer".into()));
            }
            let labels = (0..n).map(|k| i32::from(k == q.correct)).collect();
            Ok(ChoiceTask {
                question: q.question,
                mc1: Answers { answers: q.answers, labels },
                mc2: Answers::default(),
            })
        })
        .collect()
}

/// Reads tasks in either form: a question set when `file` ends in `.yaml`/`.yml`, else llama-perplexity's binary
/// format.
pub fn read_any(bytes: &[u8], file: &str) -> Result<Vec<ChoiceTask>> {
    if file.ends_with(".yaml") || file.ends_with(".yml") {
        read_question_set(bytes, file)
    } else {
        read_tasks(bytes, file)
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    file: &'a str,
}

impl Reader<'_> {
    fn bad(&self, field: &str, msg: String) -> Error {
        Error::Format { file: self.file.to_string(), field: field.to_string(), msg }
    }

    fn take(&mut self, n: usize, field: &str) -> Result<&[u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(self.bad(field, format!("{n} bytes at byte {}, past the file's end", self.at)));
        };
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self, field: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, field)?.try_into().expect("4 bytes")))
    }

    fn string(&mut self, field: &str) -> Result<String> {
        let n = self.u32(field)? as usize;
        let b = self.take(n, field)?.to_vec();
        String::from_utf8(b).map_err(|e| self.bad(field, format!("not UTF-8: {e}")))
    }

    fn answers(&mut self, field: &str) -> Result<Answers> {
        let n = self.u32(field)?;
        if n > MAX_ANSWERS {
            return Err(self.bad(field, format!("{n} answers; llama-perplexity reads at most {MAX_ANSWERS}")));
        }
        let answers = (0..n).map(|i| self.string(&format!("{field}: answer {i}"))).collect::<Result<Vec<_>>>()?;
        let labels = (0..n)
            .map(|i| Ok(i32::from_le_bytes(self.take(4, &format!("{field}: label {i}"))?.try_into().expect("4"))))
            .collect::<Result<Vec<_>>>()?;
        Ok(Answers { answers, labels })
    }
}

/// A task as scored: each answer's mean log probability, the answer chosen (the first highest), and whether it is
/// labelled correct.
#[derive(Clone, Debug, PartialEq)]
pub struct ChoiceScore {
    pub log_probs: Vec<f32>,
    pub chosen: usize,
    pub correct: bool,
}

/// llama-perplexity's final figures: accuracy and random chance, each `(percent, ± percent)` in f32 as it prints
/// them (`Final result: %.4f +/- %.4f`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChoiceSummary {
    pub n_tasks: usize,
    pub n_correct: usize,
    pub accuracy: (f32, f32),
    pub chance: (f32, f32),
}

pub fn summarize(scores: &[ChoiceScore]) -> ChoiceSummary {
    let n_done = scores.len();
    let n_correct = scores.iter().filter(|s| s.correct).count();
    let n_answers: usize = scores.iter().map(|s| s.log_probs.len()).sum();
    let figure = |p: f32| (100.0 * p, 100.0 * (p * (1.0 - p) / (n_done as f32 - 1.0)).sqrt());
    ChoiceSummary {
        n_tasks: n_done,
        n_correct,
        accuracy: figure(n_correct as f32 / n_done as f32),
        chance: figure(n_done as f32 / n_answers as f32),
    }
}

/// A task's tokens: each answer's sequence, their common prefix's length and the tokens a decode needs.
struct Prepared {
    seqs: Vec<Vec<Token>>,
    common: usize,
    required: usize,
}

fn prepare(model: &Model, i: usize, t: &ChoiceTask) -> Result<Prepared> {
    let bad = |msg: &str| Error::Mismatch { what: format!("task {i}"), msg: msg.to_string() };
    if t.question.is_empty() || t.mc1.answers.is_empty() {
        return Err(bad("an empty question or no answers"));
    }
    if t.mc1.labels.len() != t.mc1.answers.len() {
        return Err(bad("not one label per answer"));
    }
    if t.mc1.answers.iter().any(String::is_empty) {
        return Err(bad("an empty answer"));
    }
    let seqs: Vec<Vec<Token>> =
        t.mc1.answers.iter().map(|a| model.tokenize(&format!("{} {a}", t.question), true, false)).collect();
    let min_len = seqs.iter().map(Vec::len).min().unwrap_or(0);
    let common = (0..min_len).take_while(|&k| seqs.iter().all(|s| s[k] == seqs[0][k])).count();
    if common == 0 {
        // llama-perplexity would read the logits of the batch's previous token here: refused instead.
        return Err(bad("its answers share no first token (the model adds no BOS): nothing to score them after"));
    }
    if seqs.iter().any(|s| s.len() == common) {
        return Err(bad("an answer adds no token to the question"));
    }
    let required = common + seqs.iter().map(|s| s.len() - common).sum::<usize>();
    Ok(Prepared { seqs, common, required })
}

/// llama-perplexity's `softmax` of one row: f32 exponentials summed in f64, each divided by the sum.
fn softmax_at(logits: &[f32], tok: usize) -> f32 {
    let max = logits.iter().copied().fold(logits[0], f32::max);
    let mut sum = 0.0f64;
    for &v in logits {
        sum += f64::from((v - max).exp());
    }
    (f64::from((logits[tok] - max).exp()) / sum) as f32
}

/// llama-perplexity's `compute_logprobs` of one row: all in f32.
fn log_softmax_at(logits: &[f32], tok: usize) -> f32 {
    let max = logits.iter().copied().fold(logits[0], f32::max);
    let mut sum = 0.0f32;
    for &v in logits {
        sum += (v - max).exp();
    }
    logits[tok] - max - sum.ln()
}

/// Scores `tasks` on `model` with llama-perplexity's settings: `ctx` tokens per sequence (`-c`), `n_batch` (`-b`),
/// `parallel` sequences (its `max(4, -np)`).
pub fn score_tasks(
    model: &Model,
    tasks: &[ChoiceTask],
    ctx: u32,
    n_batch: u32,
    parallel: u32,
) -> Result<Vec<ChoiceScore>> {
    let prepared: Vec<Prepared> = tasks.iter().enumerate().map(|(i, t)| prepare(model, i, t)).collect::<Result<_>>()?;
    let mut session = model.unified_session(ctx, parallel, n_batch)?;
    let n_ctx = (ctx * parallel) as usize;
    let max_seq = (4 * 32).min(parallel as usize);
    let n_vocab = model.n_vocab() as usize;
    let mut scores = Vec::with_capacity(tasks.len());
    let mut i0 = 0;
    while i0 < tasks.len() {
        // As many whole tasks as fit the context and the sequences.
        let (mut i1, mut n_cur, mut s0) = (i0, 0usize, 0usize);
        let mut seq_ids: Vec<Vec<i32>> = Vec::new();
        while i1 < tasks.len() && n_cur + prepared[i1].required <= n_ctx {
            let n = prepared[i1].seqs.len();
            if s0 + n > max_seq {
                if s0 == 0 {
                    return Err(Error::Mismatch {
                        what: format!("task {i1}"),
                        msg: format!("{n} answers need {n} parallel sequences; the context has {max_seq}"),
                    });
                }
                break;
            }
            seq_ids.push((s0 as i32..(s0 + n) as i32).collect());
            s0 += n;
            n_cur += prepared[i1].required;
            i1 += 1;
        }
        if i1 == i0 {
            return Err(Error::Mismatch {
                what: format!("task {i0}"),
                msg: format!("needs {} tokens, more than the context's {n_ctx}", prepared[i0].required),
            });
        }
        let mut entries: Vec<(Token, i32, &[i32], bool)> = Vec::new();
        let singles: Vec<Vec<[i32; 1]>> = seq_ids.iter().map(|ids| ids.iter().map(|&s| [s]).collect()).collect();
        for (k, p) in prepared[i0..i1].iter().enumerate() {
            for (pos, &tok) in p.seqs[0][..p.common].iter().enumerate() {
                entries.push((tok, pos as i32, &seq_ids[k], pos + 1 == p.common));
            }
            for (s, seq) in p.seqs.iter().enumerate() {
                for (pos, &tok) in seq.iter().enumerate().skip(p.common) {
                    entries.push((tok, pos as i32, &singles[k][s], pos + 1 < seq.len()));
                }
            }
        }
        let logits = session.decode_entries(&entries)?;
        let row = |r: usize| &logits[r * n_vocab..(r + 1) * n_vocab];
        let mut r = 0;
        for (k, p) in prepared[i0..i1].iter().enumerate() {
            let prefix = row(r);
            r += 1;
            let mut log_probs = Vec::with_capacity(p.seqs.len());
            for seq in &p.seqs {
                let mut count = 1usize;
                let mut lp = softmax_at(prefix, seq[p.common] as usize).ln();
                for j in p.common..seq.len() - 1 {
                    count += 1;
                    lp += log_softmax_at(row(r), seq[j + 1] as usize);
                    r += 1;
                }
                log_probs.push(lp / count as f32);
            }
            let mut chosen = 0;
            for (s, &v) in log_probs.iter().enumerate().skip(1) {
                if v > log_probs[chosen] {
                    chosen = s;
                }
            }
            let correct = tasks[i0 + k].mc1.labels[chosen] == 1;
            scores.push(ChoiceScore { log_probs, chosen, correct });
        }
        i0 = i1;
    }
    Ok(scores)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(q: &str, answers: &[&str], right: usize) -> ChoiceTask {
        ChoiceTask {
            question: q.into(),
            mc1: Answers {
                answers: answers.iter().map(|s| s.to_string()).collect(),
                labels: (0..answers.len()).map(|i| i32::from(i == right)).collect(),
            },
            mc2: Answers::default(),
        }
    }

    #[test]
    fn the_format_reads_back_what_it_writes_and_names_what_is_wrong() {
        let tasks = vec![task("Q1?", &["a", "b"], 1), task("Q2?", &["c", "d", "e"], 0)];
        let bytes = write_tasks(&tasks);
        assert_eq!(read_tasks(&bytes, "t.bin").unwrap(), tasks);
        let err = read_tasks(&bytes[..bytes.len() - 2], "t.bin").unwrap_err().to_string();
        assert!(err.starts_with("t.bin: task 1: mc2") && err.contains("past the file's end"), "{err}");
        let mut moved = bytes.clone();
        moved[8] ^= 1;
        let err = read_tasks(&moved, "t.bin").unwrap_err().to_string();
        assert!(err.contains("offset[1]"), "{err}");
        let err = read_tasks(&0u32.to_le_bytes(), "t.bin").unwrap_err().to_string();
        assert!(err.contains("no tasks"), "{err}");
    }

    #[test]
    fn a_question_set_is_the_tasks_it_says_and_a_bad_one_is_named() {
        let yaml = "tasks:\n  - {question: 'Q?', answers: [a, b, c], correct: 2}\n";
        assert_eq!(read_question_set(yaml.as_bytes(), "s.yaml").unwrap(), [task("Q?", &["a", "b", "c"], 2)]);
        let err = read_question_set(yaml.replace("correct: 2", "correct: 3").as_bytes(), "s.yaml").unwrap_err();
        assert!(err.to_string().starts_with("s.yaml: tasks[0]: 3 answers and correct 3"), "{err}");
        let err = read_question_set(b"tasks: []\n", "s.yaml").unwrap_err().to_string();
        assert!(err.contains("none"), "{err}");
    }
}
