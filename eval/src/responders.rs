//! The two things probes run on: the built-in runtime (llama.cpp in process, the model's own template rendered
//! here) and an OpenAI-compatible server (`/v1/chat/completions`, template kwargs in `chat_template_kwargs`).

use crate::error::{Error, Result};
use crate::probe::{Completion, Finish, Probe, Responder};
use crate::runtime::{Model, Token};
use crate::template::{tokenize_rendered, ChatTemplate};
use quantfarm_parity::splitmix::SplitMix;

/// Probes on a model loaded in this process.
pub struct Builtin<'m> {
    model: &'m Model,
    template: ChatTemplate,
    n_ctx: u32,
}

impl<'m> Builtin<'m> {
    pub fn new(model: &'m Model, n_ctx: u32) -> Result<Builtin<'m>> {
        let template = ChatTemplate::of_model(model)?.ok_or_else(|| Error::Template {
            model: model.name().into(),
            msg: "the model has no tokenizer.chat_template; probes are chats".into(),
        })?;
        Ok(Builtin { model, template, n_ctx })
    }
}

impl Responder for Builtin<'_> {
    fn describe(&self) -> String {
        format!("built-in runtime (llama.cpp) on {}", self.model.name())
    }

    fn complete(&mut self, probe: &Probe, repeat: usize) -> Result<Completion> {
        let text = self.template.render(&probe.messages, true, &probe.kwargs)?;
        let prompt = tokenize_rendered(self.model, &text);
        let mut session = self.model.session(self.n_ctx, 1, 512)?;
        // SplitMix64: the same repeat samples the same tokens on every machine.
        let mut rng = SplitMix(0x9E37_79B9_7F4A_7C15 ^ repeat as u64);
        let temperature = probe.temperature;
        let steps = session.generate(&prompt, probe.max_tokens, &mut |logits| {
            if temperature <= 0.0 {
                crate::logits::argmax(logits)
            } else {
                sample(logits, temperature, rng.unit())
            }
        })?;
        let mut tokens: Vec<Token> = steps.iter().map(|s| s.token).collect();
        let stopped = tokens.last().is_some_and(|&t| self.model.is_eog(t));
        if stopped {
            tokens.pop();
        }
        let content = String::from_utf8_lossy(&self.model.detokenize(&tokens)).into_owned();
        let finish = if stopped { Finish::Stop } else { Finish::Length };
        Ok(Completion { content, reasoning: None, finish, prompt_tokens: Some(prompt.len() as u64) })
    }
}

/// Softmax sampling at `temperature` with a uniform draw `u` in [0, 1).
fn sample(logits: &[f32], temperature: f32, u: f64) -> Token {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = logits.iter().map(|&l| f64::from((l - max) / temperature).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut target = u * total;
    for (i, w) in weights.iter().enumerate() {
        target -= w;
        if target < 0.0 {
            return i as Token;
        }
    }
    crate::logits::argmax(logits)
}

/// Probes on an OpenAI-compatible server.
pub struct Endpoint {
    base: String,
    model: String,
    client: reqwest::Client,
    rt: tokio::runtime::Runtime,
}

impl Endpoint {
    /// `url` is the server's base (`http://127.0.0.1:8080` or `…/v1`); `model` the name sent in requests.
    pub fn new(url: &str, model: Option<&str>) -> Result<Endpoint> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let err = |msg: String| Error::Endpoint { endpoint: url.into(), msg };
        let trimmed = url.trim_end_matches('/');
        let base = trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(err("expected an http:// or https:// URL".into()));
        }
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(600))
            .build()
            .map_err(|e| err(e.to_string()))?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| err(e.to_string()))?;
        Ok(Endpoint { base, model: model.unwrap_or("default").into(), client, rt })
    }

    fn post(&self, path: &str, body: &serde_json::Value) -> Result<serde_json::Value> {
        let url = format!("{}{path}", self.base);
        let err = |msg: String| Error::Endpoint { endpoint: url.clone(), msg };
        self.rt.block_on(async {
            let resp = self
                .client
                .post(&url)
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .map_err(|e| err(format!("request failed: {e}")))?;
            let status = resp.status();
            let text = resp.text().await.map_err(|e| err(format!("reading the answer: {e}")))?;
            if !status.is_success() {
                return Err(err(format!("HTTP {status}: {}", text.chars().take(500).collect::<String>())));
            }
            serde_json::from_str(&text)
                .map_err(|e| err(format!("not JSON ({e}): {}", text.chars().take(200).collect::<String>())))
        })
    }
}

impl Responder for Endpoint {
    fn describe(&self) -> String {
        format!("OpenAI-compatible server {}", self.base)
    }

    fn complete(&mut self, probe: &Probe, repeat: usize) -> Result<Completion> {
        let body = serde_json::json!({
            "model": self.model,
            "messages": probe.messages,
            "max_tokens": probe.max_tokens,
            "temperature": probe.temperature,
            "seed": repeat,
            "stream": false,
            "chat_template_kwargs": probe.kwargs,
        });
        let answer = self.post("/v1/chat/completions", &body)?;
        let choice = &answer["choices"][0];
        let bad = |what: &str| Error::Endpoint {
            endpoint: format!("{}/v1/chat/completions", self.base),
            msg: format!("the answer has no {what}: {}", answer.to_string().chars().take(300).collect::<String>()),
        };
        let finish = match choice["finish_reason"].as_str() {
            Some("length") => Finish::Length,
            Some(_) => Finish::Stop,
            None => return Err(bad("choices[0].finish_reason")),
        };
        let message = &choice["message"];
        let content = match &message["content"] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Null => String::new(),
            _ => return Err(bad("choices[0].message.content")),
        };
        let reasoning = message["reasoning_content"].as_str().or(message["reasoning"].as_str()).map(str::to_string);
        let prompt_tokens = answer["usage"]["prompt_tokens"].as_u64();
        Ok(Completion { content, reasoning, finish, prompt_tokens })
    }
}
