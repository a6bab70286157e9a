//! KL divergence of a model against a reference, by llama-perplexity's procedure
//! (`tools/perplexity/perplexity.cpp::kl_divergence`): the text tokenized once with BOS, cut into `n_ctx`-token
//! chunks (the remainder dropped), each chunk decoded from position 0 with its first token overwritten by BOS, and
//! positions `n_ctx/2 .. n_ctx−2` scored against the next token.
//!
//! The work is per chunk so a farm can spread it: [`base_chunks`] turns chunks of the reference into base-file
//! records, [`kld_chunks`] scores chunks of a model against those records, and [`stats::KldSummary::merge`] gives
//! the final figures from chunk statistics computed anywhere.

pub mod base_file;
pub mod stats;

use rayon::prelude::*;

use std::io::Write;

use crate::error::{Error, Result, Setting};
use crate::runtime::{Model, Session, Token};
use base_file::{encode_record, BaseFile, BaseHeader, ChunkRecords};
use stats::{score_position, ChunkStats, PositionScore};

/// llama-perplexity's defaults: `-c 512`, `-b 2048`.
pub const DEFAULT_CTX: u32 = 512;
pub const DEFAULT_BATCH: u32 = 2048;

/// Tokenizes the evaluation text as llama-perplexity does (`common_tokenize(text, add_special=true,
/// parse_special=false)`) and keeps the whole chunks: all of them, or the first `max_chunks`.
pub fn tokenize_text(model: &Model, text: &str, n_ctx: u32, max_chunks: Option<usize>) -> Result<BaseHeader> {
    if n_ctx < 8 {
        return Err(Error::setting(Setting::Ctx, format!("{n_ctx}: expected at least 8 tokens")));
    }
    if model.add_eos() {
        return Err(Error::mismatch(
            model.name(),
            "the vocabulary appends EOS to every text; llama-perplexity refuses such models too",
        ));
    }
    let tokens = model.tokenize(text, true, false);
    let n = n_ctx as usize;
    if tokens.len() < 2 * n {
        return Err(Error::setting(
            Setting::Text,
            format!("the text tokenizes to {} tokens; a context of {n_ctx} needs at least {}", tokens.len(), 2 * n),
        ));
    }
    let n_chunk = match max_chunks {
        Some(c) => c.min(tokens.len() / n),
        None => tokens.len() / n,
    };
    if n_chunk == 0 {
        return Err(Error::setting(Setting::Chunks, "0: nothing to evaluate"));
    }
    Ok(BaseHeader { n_ctx, n_vocab: model.n_vocab(), tokens: tokens[..n_chunk * n].to_vec() })
}

/// Checks that a base file and a model can be compared: same vocabulary size, and a context the model's session
/// uses (the caller asks for `n_ctx`).
pub fn check_compatible(header: &BaseHeader, base_name: &str, model: &Model, n_ctx: Option<u32>) -> Result<()> {
    if header.n_vocab != model.n_vocab() {
        return Err(Error::mismatch(
            format!("{base_name} and {}", model.name()),
            format!("the base logits have a vocabulary of {} tokens, the model {}", header.n_vocab, model.n_vocab()),
        ));
    }
    if let Some(c) = n_ctx {
        if c != header.n_ctx {
            return Err(Error::setting(
                Setting::Ctx,
                format!("{c}, but {base_name} was computed with a context of {} tokens", header.n_ctx),
            ));
        }
    }
    Ok(())
}

/// Chunks decoded together: `batch / ctx`, at least one (llama-perplexity's and llama-imatrix's `n_seq`).
pub fn chunks_per_decode(n_ctx: u32, n_batch: u32) -> u32 {
    (n_batch / n_ctx.max(1)).max(1)
}

/// Refuses a batch that is neither below nor a multiple of the context, as llama-perplexity and llama-imatrix do.
pub fn check_batch(n_ctx: u32, n_batch: u32) -> Result<()> {
    if n_batch >= n_ctx && !n_batch.is_multiple_of(n_ctx) {
        return Err(Error::setting(
            Setting::Batch,
            format!("{n_batch} must be below or a multiple of the context {n_ctx}"),
        ));
    }
    Ok(())
}

/// A session shaped like llama-perplexity's for this chunking.
pub fn session_for<'m>(model: &'m Model, n_ctx: u32, n_batch: u32) -> Result<Session<'m>> {
    check_batch(n_ctx, n_batch)?;
    model.session(n_ctx, chunks_per_decode(n_ctx, n_batch), n_batch)
}

/// One decoded chunk: the logits of its scored positions, and the token each of them predicts.
struct Scored<'a> {
    logits: &'a [f32],
    n_vocab: usize,
    targets: &'a [Token],
}

impl Scored<'_> {
    fn len(&self) -> usize {
        self.targets.len()
    }

    /// Position `i`'s logits and the next token.
    fn at(&self, i: usize) -> (&[f32], usize) {
        (&self.logits[i * self.n_vocab..(i + 1) * self.n_vocab], self.targets[i] as usize)
    }
}

/// Decodes the given chunks, `n_seq` at a time, and hands each chunk's scored positions to `f`.
fn for_each_chunk(
    session: &mut Session<'_>,
    header: &BaseHeader,
    chunks: &[usize],
    n_seq: usize,
    mut f: impl FnMut(usize, Scored<'_>) -> Result<()>,
) -> Result<()> {
    for &c in chunks {
        check_chunk(header, c)?;
    }
    let first = (header.n_ctx / 2) as usize;
    let bos = session.model().add_bos().then(|| session.model().bos());
    let (mut decoding, mut scoring) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
    for group in chunks.chunks(n_seq.max(1)) {
        let seqs: Vec<Vec<Token>> =
            group.iter().map(|&c| chunk_input(header, c, bos).map(|(t, _)| t)).collect::<Result<_>>()?;
        let refs: Vec<&[Token]> = seqs.iter().map(Vec::as_slice).collect();
        let t0 = std::time::Instant::now();
        let logits = session.decode_sequences(&refs, first)?;
        let t1 = std::time::Instant::now();
        for (&c, l) in group.iter().zip(logits) {
            // Position p (first ≤ p ≤ n_ctx−2) predicts token p+1 of the chunk as tokenized.
            let targets = &header.chunk_tokens(c)[first + 1..];
            f(c, Scored { logits: l, n_vocab: header.n_vocab as usize, targets })?;
        }
        decoding += t1 - t0;
        scoring += t1.elapsed();
    }
    tracing::debug!(
        chunks = chunks.len(),
        decode_s = decoding.as_secs_f64(),
        score_s = scoring.as_secs_f64(),
        "chunk pass: time in llama.cpp's decode and in scoring"
    );
    Ok(())
}

/// The reference's records for one chunk, and its perplexity sums over the chunk (Σnll, Σnll²).
pub struct BaseChunk {
    pub chunk: usize,
    pub records: ChunkRecords,
    pub sum_nll: f64,
    pub sum_nll2: f64,
}

/// Runs the reference over `chunks` and encodes each scored position into base-file records.
pub fn base_chunks(
    session: &mut Session<'_>,
    header: &BaseHeader,
    chunks: &[usize],
    n_seq: usize,
    mut emit: impl FnMut(BaseChunk) -> Result<()>,
) -> Result<()> {
    for_each_chunk(session, header, chunks, n_seq, |chunk, scored| {
        let mut records = ChunkRecords::new(header.n_vocab, scored.len());
        let nll: Vec<f64> = records
            .records_mut()
            .collect::<Vec<_>>()
            .into_par_iter()
            .enumerate()
            .map(|(i, rec)| {
                let (logits, next) = scored.at(i);
                encode_record(logits, next, rec)
            })
            .collect();
        let sum_nll = nll.iter().sum();
        let sum_nll2 = nll.iter().map(|v| v * v).sum();
        emit(BaseChunk { chunk, records, sum_nll, sum_nll2 })
    })
}

/// Scores `chunks` of a model against the reference's records (`records(chunk)` yields them) into chunk statistics.
pub fn kld_chunks(
    session: &mut Session<'_>,
    header: &BaseHeader,
    chunks: &[usize],
    n_seq: usize,
    mut records: impl FnMut(usize) -> Result<ChunkRecords>,
    mut emit: impl FnMut(ChunkStats) -> Result<()>,
) -> Result<()> {
    for_each_chunk(session, header, chunks, n_seq, |chunk, scored| emit(score(chunk, &scored, &records(chunk)?)?))
}

/// One chunk's statistics: its scored positions against the reference's records of the chunk.
fn score(chunk: usize, scored: &Scored<'_>, base: &ChunkRecords) -> Result<ChunkStats> {
    if base.positions() != scored.len() {
        return Err(Error::mismatch(
            format!("base records of chunk {chunk}"),
            format!("{} positions, expected {}", base.positions(), scored.len()),
        ));
    }
    let scores: Vec<PositionScore> = (0..scored.len())
        .into_par_iter()
        .map(|i| {
            let (logits, next) = scored.at(i);
            score_position(logits, &base.record(i), next)
        })
        .collect();
    Ok(ChunkStats::from_scores(chunk as u32, &scores))
}

/// A chunk of the evaluation text, or the error naming it.
fn check_chunk(header: &BaseHeader, chunk: usize) -> Result<()> {
    if chunk >= header.n_chunk() {
        return Err(Error::mismatch("chunks", format!("chunk {chunk} asked for, the text has {}", header.n_chunk())));
    }
    Ok(())
}

/// What a runtime is fed for `chunk` so that its logits line up with the base file's records (llama.cpp's decode
/// here, and another runtime such as mlx-lm): the chunk's token ids as tokenized (never re-tokenized), the first one overwritten with `bos` when the model adds
/// one (as llama-perplexity decodes it), and the first scored position (`n_ctx/2`). Positions `first..=n_ctx−2`
/// are scored, each predicting the next token.
pub fn chunk_input(header: &BaseHeader, chunk: usize, bos: Option<Token>) -> Result<(Vec<Token>, usize)> {
    check_chunk(header, chunk)?;
    let mut t = header.chunk_tokens(chunk).to_vec();
    // llama-perplexity overwrites (does not insert) each chunk's first token with BOS for the decode.
    if let Some(bos) = bos {
        t[0] = bos;
    }
    Ok((t, (header.n_ctx / 2) as usize))
}

/// Scores `chunk` from another runtime's logits against the reference's records, as [`kld_chunks`] scores
/// llama.cpp's: `rows` holds the logits of positions `first..` of [`chunk_input`] (`n_vocab` f32 each, row after
/// row), at least the scored ones; a row for the last position (which predicts nothing) is ignored.
pub fn score_rows(header: &BaseHeader, chunk: usize, rows: &[f32], base: &ChunkRecords) -> Result<ChunkStats> {
    let (first, n_vocab, scored) = ((header.n_ctx / 2) as usize, header.n_vocab as usize, header.scored_per_chunk());
    check_chunk(header, chunk)?;
    if rows.len() < scored * n_vocab {
        return Err(Error::mismatch(
            format!("logits of chunk {chunk}"),
            format!("{} values, expected {scored} rows of {n_vocab}", rows.len()),
        ));
    }
    let targets = &header.chunk_tokens(chunk)[first + 1..];
    score(chunk, &Scored { logits: &rows[..scored * n_vocab], n_vocab, targets }, base)
}

/// The reference's perplexity sums over the chunks a base pass wrote.
#[derive(Clone, Copy, Debug, Default)]
pub struct BasePass {
    pub sum_nll: f64,
    pub positions: usize,
}

impl BasePass {
    /// PPL(base) over what was written.
    pub fn ppl(&self) -> f64 {
        (self.sum_nll / self.positions.max(1) as f64).exp()
    }
}

/// Runs the reference over every chunk of `header` and writes a whole base-logits file (header, tokens, records)
/// to `w`; `progress` sees each chunk as it is written. `file` names `w` in errors.
pub fn write_base(
    session: &mut Session<'_>,
    header: &BaseHeader,
    n_seq: usize,
    file: &str,
    w: &mut impl Write,
    mut progress: impl FnMut(usize, &BasePass),
) -> Result<BasePass> {
    let io = |e| Error::Io { file: file.to_string(), source: e };
    w.write_all(&header.encode()).map_err(io)?;
    let chunks: Vec<usize> = (0..header.n_chunk()).collect();
    let mut pass = BasePass::default();
    base_chunks(session, header, &chunks, n_seq, |b| {
        pass.sum_nll += b.sum_nll;
        pass.positions += b.records.positions();
        w.write_all(&b.records.as_bytes()).map_err(io)?;
        progress(b.chunk, &pass);
        Ok(())
    })?;
    w.flush().map_err(io)?;
    Ok(pass)
}

/// Scores `chunks` of a model against a base file's records.
pub fn score_against(
    session: &mut Session<'_>,
    base: &mut BaseFile,
    chunks: &[usize],
    n_seq: usize,
    emit: impl FnMut(ChunkStats) -> Result<()>,
) -> Result<()> {
    let header = base.header.clone();
    kld_chunks(session, &header, chunks, n_seq, |c| base.records(c), emit)
}
