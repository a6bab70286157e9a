//! Greedy agreement (link 1 and 2 of the parity method): the same prompts, rendered by the model's own chat
//! template, continued at temperature 0 by a reference and a model; k of N byte-identical, the mean common-prefix
//! fraction, and for each disagreement where it starts and how close the reference's own choice was there (a late
//! near-tie is not an early break).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::runtime::{GreedyStep, Model, Token};
use crate::template::{ChatTemplate, Message};

/// One prompt: chat messages (rendered with the template) or a raw text (tokenized as is).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// A single user message.
    Text(String),
    Chat {
        messages: Vec<Message>,
    },
    Raw {
        prompt: String,
    },
}

/// Reads a prompt set: a JSON array of prompts, or an object with a `prompts` array.
pub fn read_prompts(path: &Path) -> Result<Vec<Prompt>> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| Error::Io { file: file.clone(), source: e })?;
    parse_prompts(&file, &text)
}

/// Parses a prompt set read from `file`.
pub fn parse_prompts(file: &str, text: &str) -> Result<Vec<Prompt>> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Set {
        List(Vec<Prompt>),
        Object { prompts: Vec<Prompt> },
    }
    let set: Set = serde_json::from_str(text).map_err(|e| {
        Error::format(
            file,
            format!("line {} column {}", e.line(), e.column()),
            format!("{e}; expected an array of prompts (a string, {{\"messages\": [...]}} or {{\"prompt\": \"...\"}})"),
        )
    })?;
    let prompts = match set {
        Set::List(p) | Set::Object { prompts: p } => p,
    };
    if prompts.is_empty() {
        return Err(Error::format(file, "prompts", "the prompt set is empty"));
    }
    Ok(prompts)
}

/// Renders a prompt to tokens for a model, with its chat template.
pub fn prompt_tokens(model: &Model, template: Option<&ChatTemplate>, prompt: &Prompt) -> Result<Vec<Token>> {
    let text = match prompt {
        Prompt::Raw { prompt } => return Ok(model.tokenize(prompt, true, false)),
        Prompt::Text(t) => render(model, template, &[Message::user(t)])?,
        Prompt::Chat { messages } => render(model, template, messages)?,
    };
    Ok(crate::template::tokenize_rendered(model, &text))
}

fn render(model: &Model, template: Option<&ChatTemplate>, messages: &[Message]) -> Result<String> {
    let t = template.ok_or_else(|| Error::Template {
        model: model.name().to_string(),
        msg: "the model has no tokenizer.chat_template; give raw prompts ({\"prompt\": ...})".into(),
    })?;
    t.render(messages, true, &serde_json::Map::new())
}

/// What happened on one prompt.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PromptAgreement {
    pub index: usize,
    pub identical: bool,
    pub reference_tokens: usize,
    pub model_tokens: usize,
    pub common_prefix: usize,
    /// Common prefix over the longer continuation (1 when both are identical).
    pub prefix_fraction: f64,
    /// The first token position where they differ.
    pub first_difference: Option<usize>,
    /// The reference's top-1 minus top-2 logit at that position.
    pub reference_margin: Option<f32>,
    pub reference_text: String,
    pub model_text: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GreedyReport {
    pub n: usize,
    pub identical: usize,
    pub mean_prefix_fraction: f64,
    pub max_tokens: usize,
    pub prompts: Vec<PromptAgreement>,
}

impl GreedyReport {
    pub fn from_prompts(prompts: Vec<PromptAgreement>, max_tokens: usize) -> GreedyReport {
        let n = prompts.len();
        let identical = prompts.iter().filter(|p| p.identical).count();
        let mean = if n == 0 { 0.0 } else { prompts.iter().map(|p| p.prefix_fraction).sum::<f64>() / n as f64 };
        GreedyReport { n, identical, mean_prefix_fraction: mean, max_tokens, prompts }
    }

    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "greedy agreement: {}/{} byte-identical, mean common prefix {:.1}% (temperature 0, up to {} tokens)",
            self.identical,
            self.n,
            100.0 * self.mean_prefix_fraction,
            self.max_tokens
        );
        for p in self.prompts.iter().filter(|p| !p.identical) {
            let _ = writeln!(
                o,
                "  prompt {}: differs at token {} of {} (reference top-2 margin {:.3}); common prefix {:.1}%",
                p.index,
                p.first_difference.map_or("?".into(), |d| d.to_string()),
                p.reference_tokens,
                p.reference_margin.unwrap_or(f32::NAN),
                100.0 * p.prefix_fraction
            );
        }
        o
    }
}

/// Compares two greedy continuations of one prompt.
pub fn compare(index: usize, reference: (&Model, &[GreedyStep]), model: (&Model, &[GreedyStep])) -> PromptAgreement {
    let (rm, r) = reference;
    let (mm, m) = model;
    let r_tokens: Vec<Token> = r.iter().map(|s| s.token).collect();
    let m_tokens: Vec<Token> = m.iter().map(|s| s.token).collect();
    let margins: Vec<f32> = r.iter().map(|s| s.margin).collect();
    agreement(index, (&r_tokens, &margins, rm.detokenize(&r_tokens)), (&m_tokens, mm.detokenize(&m_tokens)))
}

/// Compares a reference continuation (tokens, top-2 margins, bytes) with a model's (tokens, bytes): identical
/// when the bytes are; else the first differing token and the reference's margin there.
pub fn agreement(index: usize, reference: (&[Token], &[f32], Vec<u8>), model: (&[Token], Vec<u8>)) -> PromptAgreement {
    let (r_tokens, margins, r_bytes) = reference;
    let (m_tokens, m_bytes) = model;
    let common = r_tokens.iter().zip(m_tokens).take_while(|(a, b)| a == b).count();
    let identical = r_bytes == m_bytes;
    let longest = r_tokens.len().max(m_tokens.len());
    let prefix_fraction = if identical || longest == 0 { 1.0 } else { common as f64 / longest as f64 };
    let first_difference = (!identical).then_some(common);
    let reference_margin = first_difference.and_then(|d| margins.get(d)).copied();
    PromptAgreement {
        index,
        identical,
        reference_tokens: r_tokens.len(),
        model_tokens: m_tokens.len(),
        common_prefix: common,
        prefix_fraction,
        first_difference,
        reference_margin,
        reference_text: String::from_utf8_lossy(&r_bytes).into_owned(),
        model_text: String::from_utf8_lossy(&m_bytes).into_owned(),
    }
}

/// Generates greedy continuations of every prompt on one model (the prompt tokens are returned too, so the caller
/// can check both models saw the same ones).
pub fn run_prompts(
    model: &Model,
    prompts: &[Prompt],
    max_tokens: usize,
    n_ctx: u32,
) -> Result<Vec<(Vec<Token>, Vec<GreedyStep>)>> {
    let template = ChatTemplate::of_model(model)?;
    let mut session = model.session(n_ctx, 1, 512)?;
    prompts
        .iter()
        .map(|p| {
            let tokens = prompt_tokens(model, template.as_ref(), p)?;
            let steps = session.greedy(&tokens, max_tokens)?;
            Ok((tokens, steps))
        })
        .collect()
}
