//! `transformers/kld/SUBJECT/G`: transformers' logits of one chunk group, fed the base file's token ids as
//! llama-perplexity decodes them (`kld::chunk_input`), scored against llama.cpp's base logits of the GGUF BF16 by
//! llama-perplexity's procedure (`kld::score_rows`): the HF checkpoint across runtimes, and a vLLM rung as vLLM
//! computes it (W8A8 emulated, or weight-only). One chunk's logits at a time pass through a scratch file.

use quantfarm_eval::kld::base_file::BaseFile;
use quantfarm_eval::kld::{chunk_input, score_rows};
use quantfarm_proto::{self as pb, task_result, WorkerKind};
use quantfarm_store::Digest;

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{hash_object, local_file, local_model, location, task_dir};
use crate::mlx_run::ids;
use crate::transformers_run::{activations, open, Opened};

pub struct TransformersKld;

impl Executor for TransformersKld {
    type Task = pb::TransformersKldTask;
    const KIND: WorkerKind = WorkerKind::Transformers;

    async fn run(t: &pb::TransformersKldTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::Kld(kld(t, env).await?))
    }
}

async fn kld(t: &pb::TransformersKldTask, env: &Env) -> Result<pb::KldResult, Failure> {
    let acts = activations(&t.activations)?;
    let dir = task_dir(env)?;
    let Digest { sha256: sha, .. } = hash_object(&location(&t.base)?, env.budget).await?;
    if sha != t.base_sha256 {
        return Err(Failure::corrupt(&t.base, &sha, &t.base_sha256));
    }
    let base_path = local_file(&t.base, dir.path(), env).await?;
    let model = local_model(&t.model, dir.path(), env).await?;
    let (mut helper, run) = match open(&model, acts, env).await? {
        Opened::Ready(helper, run) => (helper, run),
        Opened::Refused(run) => return Ok(pb::KldResult { transformers: Some(run), ..Default::default() }),
    };
    let mut base = BaseFile::open(&base_path)?;
    let bos = (t.bos >= 0).then_some(t.bos);
    let rows_file = dir.path().join("logits.f32");
    let mut chunks = Vec::with_capacity(base.header.n_chunk());
    for chunk in 0..base.header.n_chunk() {
        let (tokens, first) = chunk_input(&base.header, chunk, bos)?;
        let fed = ids(&tokens, &format!("{}: chunk {chunk}", base.name))?;
        let shape = helper.logits(&fed, first, &rows_file).await?;
        if shape.vocab != base.header.n_vocab {
            return Err(Failure::input(format!(
                "{}: transformers' logits have {} entries, the base logits {} (another vocabulary)",
                t.model, shape.vocab, base.header.n_vocab
            )));
        }
        let bytes = std::fs::read(&rows_file).map_err(|e| Failure::transient(rows_file.display(), e))?;
        let rows: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let records = base.records(chunk)?;
        let mut stats = score_rows(&base.header, chunk, &rows, &records)?;
        stats.chunk += t.first_chunk;
        chunks.push(pb::KldChunkStats::from(&stats));
    }
    helper.stop().await;
    drop(dir);
    Ok(pb::KldResult { chunks, transformers: Some(run), ..Default::default() })
}
