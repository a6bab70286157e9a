//! llama.cpp as the evaluation runtime (through `llama-cpp-2`): the arithmetic users deploy, for every architecture
//! llama.cpp runs. This module and the imatrix collector ([`crate::imatrix`], which needs the evaluation callback)
//! are the only ones that touch the C API; the rest of the crate sees tokens and logits.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaLoraAdapter, LlamaModel};
use llama_cpp_2::token::LlamaToken;

use crate::error::{Error, Result};

pub use crate::logits::Token;

/// llama.cpp's backend can be initialized once per process; every model shares it.
fn backend() -> Result<&'static LlamaBackend> {
    static BACKEND: OnceLock<std::result::Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            // llama.cpp's own log lines go through `tracing` at debug level (`quantfarm -v` shows them).
            crate::runtime_log::install();
            LlamaBackend::init().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Error::runtime("llama.cpp", format!("backend: {e}")))
}

/// Initialises llama.cpp's backend (once per process) for code that calls the C API itself ([`crate::imatrix`]).
pub(crate) fn ensure_backend() -> Result<()> {
    backend().map(|_| ())
}

/// How to load a model.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Threads for decoding (llama.cpp's `-t`); 0 means all cores.
    pub threads: usize,
    /// Layers offloaded to a GPU backend (Metal/CUDA builds); 0 on CPU.
    pub gpu_layers: u32,
    /// A GGUF LoRA adapter applied at run time, unmerged, with its scale (llama.cpp's `--lora-scaled`).
    pub lora: Option<(PathBuf, f32)>,
}

/// A loaded GGUF model (and its run-time LoRA adapter, if any).
pub struct Model {
    inner: LlamaModel,
    /// llama-cpp-2 takes the adapter `&mut` to attach it to a context; the lock lends it out.
    lora: Option<(std::sync::Mutex<LlamaLoraAdapter>, f32)>,
    name: String,
    threads: i32,
}

impl Model {
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<Model> {
        let name = path.display().to_string();
        if !path.is_file() {
            return Err(Error::runtime(&name, "no such GGUF file"));
        }
        let params = LlamaModelParams::default().with_n_gpu_layers(opts.gpu_layers);
        let mut inner = LlamaModel::load_from_file(backend()?, path, &params)
            .map_err(|e| Error::runtime(&name, format!("llama.cpp cannot load it: {e}")))?;
        let lora = match &opts.lora {
            Some((lora_path, scale)) => {
                if !lora_path.is_file() {
                    return Err(Error::runtime(lora_path.display().to_string(), "no such GGUF LoRA adapter"));
                }
                let adapter = inner.lora_adapter_init(lora_path).map_err(|e| {
                    Error::runtime(
                        lora_path.display().to_string(),
                        format!("llama.cpp cannot apply this adapter to {name}: {e}"),
                    )
                })?;
                Some((std::sync::Mutex::new(adapter), *scale))
            }
            None => None,
        };
        let threads =
            if opts.threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { opts.threads };
        let name = match &opts.lora {
            Some((l, s)) => format!("{name} + LoRA {} (scale {s})", l.display()),
            None => name,
        };
        Ok(Model { inner, lora, name, threads: threads as i32 })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn n_vocab(&self) -> u32 {
        self.inner.n_vocab() as u32
    }

    pub fn n_ctx_train(&self) -> u32 {
        self.inner.n_ctx_train()
    }

    /// Whether the vocabulary prepends BOS to a text (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.inner.vocab().should_add_bos()
    }

    pub fn add_eos(&self) -> bool {
        self.inner.vocab().should_add_eos()
    }

    pub fn bos(&self) -> Token {
        self.inner.vocab().bos().0
    }

    pub fn eos(&self) -> Token {
        self.inner.vocab().eos().0
    }

    /// The model's `tokenizer.chat_template`.
    pub fn chat_template(&self) -> Option<String> {
        self.inner.chat_template(None).ok().and_then(|t| t.to_string().ok())
    }

    pub fn is_eog(&self, token: Token) -> bool {
        self.inner.vocab().is_eog(LlamaToken(token))
    }

    /// llama.cpp's tokenizer (`common_tokenize`): `add_special` adds BOS/EOS as the vocabulary says,
    /// `parse_special` turns control-token texts into their tokens.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<Token> {
        self.inner.vocab().tokenize(text.as_bytes(), add_special, parse_special).into_iter().map(|t| t.0).collect()
    }

    /// A token's bytes (special tokens rendered as their text).
    pub fn piece(&self, token: Token) -> Vec<u8> {
        self.inner.vocab().token_to_piece(LlamaToken(token), true, None)
    }

    pub fn detokenize(&self, tokens: &[Token]) -> Vec<u8> {
        tokens.iter().flat_map(|&t| self.piece(t)).collect()
    }

    /// A metadata value as text (arrays are not returned by llama.cpp).
    pub fn meta(&self, key: &str) -> Option<String> {
        self.inner.meta_val_str(key).ok()
    }

    /// A context for up to `n_seq` sequences of `n_ctx` tokens each, decoded `n_batch` tokens at a time: the
    /// shape llama-perplexity creates (`n_ctx·n_seq` cells, `n_parallel = n_seq`, micro-batches of 512).
    pub fn session(&self, n_ctx: u32, n_seq: u32, n_batch: u32) -> Result<Session<'_>> {
        self.session_with(n_ctx, n_seq, n_batch, false)
    }

    /// A session whose `n_seq` sequences share one KV buffer (`kv_unified`), as llama-perplexity's multiple-choice,
    /// HellaSwag and Winogrande modes make theirs.
    pub fn unified_session(&self, n_ctx: u32, n_seq: u32, n_batch: u32) -> Result<Session<'_>> {
        self.session_with(n_ctx, n_seq, n_batch, true)
    }

    fn session_with(&self, n_ctx: u32, n_seq: u32, n_batch: u32, kv_unified: bool) -> Result<Session<'_>> {
        let total = n_ctx
            .checked_mul(n_seq)
            .and_then(NonZeroU32::new)
            .ok_or_else(|| Error::runtime(&self.name, format!("a context of {n_seq} × {n_ctx} tokens")))?;
        let n_batch = n_batch.min(total.get());
        let params = LlamaContextParams::default()
            .with_n_ctx(Some(total))
            .with_n_batch(n_batch)
            .with_n_ubatch(n_batch.min(512))
            .with_n_seq_max(n_seq)
            .with_kv_unified(kv_unified)
            .with_n_threads(self.threads)
            .with_n_threads_batch(self.threads);
        let mut ctx = self
            .inner
            .new_context(backend()?, params)
            .map_err(|e| Error::runtime(&self.name, format!("cannot create a context of {total} tokens: {e}")))?;
        if let Some((adapter, scale)) = &self.lora {
            let mut adapter = adapter.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            ctx.lora_adapter_set(&mut adapter, *scale)
                .map_err(|e| Error::runtime(&self.name, format!("cannot apply the LoRA adapter: {e}")))?;
        }
        let batch = LlamaBatch::new(n_batch as usize, n_seq as i32);
        Ok(Session { ctx, batch, model: self, n_batch: n_batch as usize, n_seq: n_seq as usize, logits: Vec::new() })
    }
}

/// A context on a model: decodes token sequences and yields their logits.
pub struct Session<'m> {
    ctx: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    model: &'m Model,
    n_batch: usize,
    n_seq: usize,
    /// Each sequence's logits of the last decode, kept between decodes: their pages are reused, not faulted in
    /// again for every chunk group.
    logits: Vec<Vec<f32>>,
}

impl Session<'_> {
    pub fn model(&self) -> &Model {
        self.model
    }

    /// Decodes up to `n_seq` sequences from position 0 (memory cleared first), each its own sequence id, fed
    /// `n_batch` tokens at a time exactly as llama-perplexity feeds chunks, and returns for each sequence the logits
    /// of its positions `first..len`, row after row (`n_vocab` floats each).
    pub fn decode_sequences(&mut self, seqs: &[&[Token]], first: usize) -> Result<&[Vec<f32>]> {
        if seqs.len() > self.n_seq {
            return Err(Error::runtime(
                self.model.name(),
                format!("{} sequences in a context for {}", seqs.len(), self.n_seq),
            ));
        }
        let n_vocab = self.model.n_vocab() as usize;
        let len = seqs.first().map_or(0, |s| s.len());
        if seqs.iter().any(|s| s.len() != len) || first >= len {
            return Err(Error::runtime(self.model.name(), "sequences of unequal length, or nothing to score"));
        }
        self.ctx.clear_kv_cache();
        self.logits.resize_with(seqs.len().max(self.logits.len()), Vec::new);
        for l in &mut self.logits {
            l.clear();
            l.reserve((len - first) * n_vocab);
        }
        let out = &mut self.logits;
        // llama-perplexity: one batch of n_batch tokens covers n_batch/len whole sequences; a longer sequence is fed
        // in several batches of one sequence.
        let per_batch = if len <= self.n_batch { len } else { self.n_batch };
        let mut start = 0;
        while start < len {
            let end = (start + per_batch).min(len);
            self.batch.clear();
            let mut outputs = Vec::new();
            for (seq, tokens) in seqs.iter().enumerate() {
                for (pos, &tok) in tokens.iter().enumerate().take(end).skip(start) {
                    let want = pos >= first;
                    self.batch
                        .add(LlamaToken(tok), pos as i32, &[seq as i32], want)
                        .map_err(|e| Error::runtime(self.model.name(), format!("batch: {e}")))?;
                    if want {
                        outputs.push((seq, self.batch.n_tokens() - 1));
                    }
                }
            }
            self.ctx
                .decode(&mut self.batch)
                .map_err(|e| Error::runtime(self.model.name(), format!("decode failed: {e}")))?;
            for (seq, index) in outputs {
                out[seq].extend_from_slice(self.ctx.get_logits_ith(index));
            }
            start = end;
        }
        Ok(&self.logits[..seqs.len()])
    }

    /// Decodes `entries` (token, position, sequences, whether its logits are wanted) from an empty KV cache, in
    /// pieces of the session's batch size as llama-perplexity's `decode_helper` feeds them, and returns the wanted
    /// logits, entry order, `n_vocab` each.
    pub fn decode_entries(&mut self, entries: &[(Token, i32, &[i32], bool)]) -> Result<Vec<f32>> {
        self.ctx.clear_kv_cache();
        let mut out = Vec::new();
        for piece in entries.chunks(self.n_batch.max(1)) {
            self.batch.clear();
            let mut wanted = Vec::new();
            for &(tok, pos, seqs, want) in piece {
                self.batch
                    .add(LlamaToken(tok), pos, seqs, want)
                    .map_err(|e| Error::runtime(self.model.name(), format!("batch: {e}")))?;
                if want {
                    wanted.push(self.batch.n_tokens() - 1);
                }
            }
            self.ctx
                .decode(&mut self.batch)
                .map_err(|e| Error::runtime(self.model.name(), format!("decode failed: {e}")))?;
            for index in wanted {
                out.extend_from_slice(self.ctx.get_logits_ith(index));
            }
        }
        Ok(out)
    }

    /// Greedy (temperature 0) continuation of `prompt`: at each step the first arg-max token, until an
    /// end-of-generation token or `max_tokens`. Each step reports the chosen token and the top-2 logit margin.
    pub fn greedy(&mut self, prompt: &[Token], max_tokens: usize) -> Result<Vec<GreedyStep>> {
        self.generate(prompt, max_tokens, &mut |logits| crate::logits::argmax(logits))
    }

    /// Continuation of `prompt`, choosing each token with `pick` from the logits.
    pub fn generate(
        &mut self,
        prompt: &[Token],
        max_tokens: usize,
        pick: &mut dyn FnMut(&[f32]) -> Token,
    ) -> Result<Vec<GreedyStep>> {
        let limit = self.ctx.n_ctx() as usize;
        if prompt.is_empty() || prompt.len() >= limit {
            return Err(Error::runtime(
                self.model.name(),
                format!("a prompt of {} tokens does not fit a context of {limit}", prompt.len()),
            ));
        }
        self.ctx.clear_kv_cache();
        let mut steps = Vec::new();
        let mut pos = 0usize;
        let mut pending: Vec<Token> = prompt.to_vec();
        loop {
            for chunk in pending.chunks(self.n_batch) {
                self.batch.clear();
                for (i, &tok) in chunk.iter().enumerate() {
                    let last = pos + i + 1 == prompt.len() + steps.len();
                    self.batch
                        .add(LlamaToken(tok), (pos + i) as i32, &[0], last)
                        .map_err(|e| Error::runtime(self.model.name(), format!("batch: {e}")))?;
                }
                self.ctx
                    .decode(&mut self.batch)
                    .map_err(|e| Error::runtime(self.model.name(), format!("decode failed: {e}")))?;
                pos += chunk.len();
            }
            let logits = self.ctx.get_logits_ith(self.batch.n_tokens() - 1);
            let token = pick(logits);
            steps.push(GreedyStep { token, margin: crate::logits::top2_margin(logits) });
            if self.model.is_eog(token) || steps.len() >= max_tokens || pos + 1 >= limit {
                return Ok(steps);
            }
            pending = vec![token];
        }
    }
}

/// One generated token and how decided the choice was (top-1 minus top-2 logit).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GreedyStep {
    pub token: Token,
    pub margin: f32,
}
