//! Chat templates rendered as Hugging Face's `apply_chat_template` renders them (Jinja with `trim_blocks` and
//! `lstrip_blocks`, Python string methods, `raise_exception`), from the model's own `tokenizer.chat_template`, with
//! template kwargs such as `enable_thinking`.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::runtime::{Model, Token};

/// A chat message (`content` is text; structured content parts are passed through as JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: serde_json::Value,
}

impl Message {
    pub fn user(text: &str) -> Message {
        Message { role: "user".into(), content: text.into() }
    }
}

/// The date `strftime_now` gives templates that print today's date (Llama 3.x): fixed, so a prompt renders to the
/// same tokens on every machine and day.
pub const TEMPLATE_DATE: (i32, u32, u32) = (2026, 1, 1);

pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    model: String,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// The model's `tokenizer.chat_template`, or `None` when it has none.
    pub fn of_model(model: &Model) -> Result<Option<ChatTemplate>> {
        let Some(source) = model.chat_template() else { return Ok(None) };
        let bos = String::from_utf8_lossy(&model.piece(model.bos())).into_owned();
        let eos = String::from_utf8_lossy(&model.piece(model.eos())).into_owned();
        ChatTemplate::new(model.name(), &source, &bos, &eos).map(Some)
    }

    pub fn new(model: &str, source: &str, bos: &str, eos: &str) -> Result<ChatTemplate> {
        let mut env = minijinja::Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| Error::Template { model: model.into(), msg: e.to_string() })?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| strftime(&fmt));
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| Error::Template { model: model.into(), msg: e.to_string() })?;
        Ok(ChatTemplate { env, model: model.into(), bos: bos.into(), eos: eos.into() })
    }

    /// Renders `messages`; `kwargs` (e.g. `{"enable_thinking": false}`) are top-level template variables, as
    /// `apply_chat_template(..., **kwargs)` and servers' `chat_template_kwargs` pass them.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let mut ctx = serde_json::Map::new();
        ctx.insert("bos_token".into(), self.bos.clone().into());
        ctx.insert("eos_token".into(), self.eos.clone().into());
        for (k, v) in kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        ctx.insert("messages".into(), serde_json::to_value(messages).unwrap_or_default());
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        let tmpl = self.env.get_template("chat").map_err(|e| self.error(e))?;
        tmpl.render(minijinja::value::Serde(&ctx)).map_err(|e| self.error(e))
    }

    fn error(&self, e: minijinja::Error) -> Error {
        let mut msg = e.to_string();
        if let Some(detail) = e.display_debug_info().to_string().lines().find(|l| l.contains(">")) {
            msg.push_str(&format!(" ({})", detail.trim()));
        }
        Error::Template { model: self.model.clone(), msg }
    }
}

/// Tokenizes a rendered chat as llama-server does (control-token texts parsed), adding BOS only when the vocabulary
/// wants one and the template did not already write it.
pub fn tokenize_rendered(model: &Model, text: &str) -> Vec<Token> {
    let bos_text = String::from_utf8_lossy(&model.piece(model.bos())).into_owned();
    let add = model.add_bos() && (bos_text.is_empty() || !text.starts_with(&bos_text));
    model.tokenize(text, add, true)
}

/// `strftime_now(fmt)` on [`TEMPLATE_DATE`], for the specifiers chat templates use.
fn strftime(fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let (y, m, d) = TEMPLATE_DATE;
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y % 100)),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3_LIKE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content.strip() + '<|im_end|>\\n' }}{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and enable_thinking is false %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}";

    #[test]
    fn renders_kwargs_and_python_methods() {
        let t = ChatTemplate::new("m", QWEN3_LIKE, "", "<|im_end|>").unwrap();
        let msgs = [Message::user("  hi  ")];
        let on = t.render(&msgs, true, &serde_json::Map::new()).unwrap();
        assert_eq!(on, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
        let mut kw = serde_json::Map::new();
        kw.insert("enable_thinking".into(), false.into());
        let off = t.render(&msgs, true, &kw).unwrap();
        assert!(off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "{off:?}");
    }

    #[test]
    fn raise_exception_is_an_error_naming_the_model() {
        let t = ChatTemplate::new("m.gguf", "{{ raise_exception('only user turns') }}", "", "").unwrap();
        let e = t.render(&[], true, &serde_json::Map::new()).unwrap_err().to_string();
        assert!(e.contains("m.gguf") && e.contains("only user turns"), "{e}");
    }

    #[test]
    fn strftime_is_fixed() {
        assert_eq!(strftime("%d %b %Y"), "01 Jan 2026");
    }
}
