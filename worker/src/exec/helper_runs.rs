//! What the helper runtimes' tasks (mlx-lm's and transformers') do alike, on a [`Helper`] with its model loaded:
//! score a base file's chunks on the helper's logits, and continue a reference run's prompts greedily. Each runtime's
//! executor opens its helper its own way and records its own run; these are the loops between.

use std::path::Path;

use quantfarm_eval::greedy::agreement;
use quantfarm_eval::kld::base_file::BaseFile;
use quantfarm_eval::kld::{chunk_input, score_rows};
use quantfarm_proto as pb;

use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{hash_object, local_file, location};
use crate::helper::Helper;
use crate::mlx_run::ids;

/// The base-logits file at `url` fetched into `dir`, after its digest was checked against the one the farm recorded
/// (`sha256`).
pub(super) async fn checked_base(
    url: &str,
    sha256: &str,
    dir: &Path,
    env: &Env,
) -> Result<std::path::PathBuf, Failure> {
    let quantfarm_store::Digest { sha256: sha, .. } = hash_object(&location(url)?, env.budget).await?;
    if sha != sha256 {
        return Err(Failure::corrupt(url, &sha, sha256));
    }
    local_file(url, dir, env).await
}

/// Every chunk of `base` scored against the helper's logits of the same token ids (each chunk's first one `bos` when
/// given, as llama-perplexity decodes it) by llama-perplexity's procedure; one chunk's logits pass through
/// `rows_file` at a time. Chunks are numbered from `first_chunk`, the group's place in the text. `model` names the
/// model in errors.
pub(super) async fn score_chunks(
    helper: &mut Helper,
    model: &str,
    base: &mut BaseFile,
    bos: Option<i32>,
    first_chunk: u32,
    rows_file: &Path,
) -> Result<Vec<pb::KldChunkStats>, Failure> {
    let mut chunks = Vec::with_capacity(base.header.n_chunk());
    for chunk in 0..base.header.n_chunk() {
        let (tokens, first) = chunk_input(&base.header, chunk, bos)?;
        let fed = ids(&tokens, &format!("{}: chunk {chunk}", base.name))?;
        let shape = helper.logits(&fed, first, rows_file).await?;
        if shape.vocab != base.header.n_vocab {
            return Err(Failure::input(format!(
                "{model}: {}'s logits have {} entries, the base logits {} (another vocabulary)",
                helper.runtime(),
                shape.vocab,
                base.header.n_vocab
            )));
        }
        let bytes = std::fs::read(rows_file).map_err(|e| Failure::transient(rows_file.display(), e))?;
        let rows: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let records = base.records(chunk)?;
        let mut stats = score_rows(&base.header, chunk, &rows, &records)?;
        stats.chunk += first_chunk;
        chunks.push(pb::KldChunkStats::from(&stats));
    }
    Ok(chunks)
}

/// The helper's greedy continuation (at most `max_tokens`, to the model's own end-of-sequence) of each reference
/// prompt, fed as the reference run's token ids, compared with that run's continuation as ids and as the text the
/// helper's tokenizer decodes both to; with `keep`, this run's continuations too. `model` names the model in errors.
pub(super) async fn continue_greedily(
    helper: &mut Helper,
    model: &str,
    reference: &[pb::GreedyContinuation],
    max_tokens: u32,
    keep: bool,
) -> Result<pb::GreedyResult, Failure> {
    let mut result = pb::GreedyResult::default();
    for r in reference {
        let what = format!("{model}: prompt {}", r.index);
        let prompt = ids(&r.prompt_tokens, &what)?;
        let reference = ids(&r.tokens, &what)?;
        let c = helper.greedy(&prompt, max_tokens, None).await?;
        let texts = helper.decode(&[&reference, &c.tokens]).await?;
        let Ok([reference_text, text]) = <[String; 2]>::try_from(texts) else {
            return Err(Failure::internal(format!(
                "{what}: {} decoded two sequences to another count of texts",
                helper.runtime()
            )));
        };
        let tokens: Vec<i32> = c.tokens.iter().map(|&t| t as i32).collect();
        let a = agreement(
            r.index as usize,
            (&r.tokens, &r.margins, reference_text.into_bytes()),
            (&tokens, text.into_bytes()),
        );
        result.agreements.push(super::greedy::agreement_proto(a));
        if keep {
            result.continuations.push(pb::GreedyContinuation {
                index: r.index,
                prompt_tokens: r.prompt_tokens.clone(),
                tokens,
                margins: c.margins,
            });
        }
    }
    Ok(result)
}
