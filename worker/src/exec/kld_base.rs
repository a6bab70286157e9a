//! `kld-base/G`: runs the reference over one group of chunks (the chunks llama-perplexity decodes together) and
//! stores their base logits as a base-logits file of their own. A group is never split: llama.cpp's logits for a
//! chunk depend on which chunks share its decode, and only llama-perplexity's grouping gives its figures exactly.

use quantfarm_store::Digest;
use std::io::BufWriter;

use quantfarm_eval::kld::{chunks_per_decode, write_base};
use quantfarm_proto::{self as pb, task_result, WorkerKind};
use quantfarm_store::Location;

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{local_model, read_text, task_dir};
use crate::llama::{blocking, load, session, settings, tokenize_as_planned};
use crate::outputs::{produce, upload};

pub struct KldBase;

impl Executor for KldBase {
    type Task = pb::KldBaseTask;
    const KIND: WorkerKind = WorkerKind::Kld;

    async fn run(t: &pb::KldBaseTask, env: &Env) -> Result<task_result::Kind, Failure> {
        let made = produce(&t.output, env, |out| async move { write_base_part(t, &out, env).await }).await?;
        Ok(task_result::Kind::Artifact(made))
    }
}

/// Writes the base-logits part of one chunk group to `out` (staged; a failed run leaves nothing there).
async fn write_base_part(t: &pb::KldBaseTask, out: &Location, env: &Env) -> Result<Digest, Failure> {
    let s = settings(&t.settings)?.clone();
    let dir = task_dir(env)?;
    let reference = local_model(&t.reference, dir.path(), env).await?;
    let (text, _) = read_text(&s.text).await?;
    let local = dir.path().join("base.logits");
    let (first, count, expect) = (t.first_chunk as usize, t.n_chunks as usize, t.tokens_sha256.clone());
    let (env2, local2) = (env.clone(), local.clone());
    blocking(move || {
        let model = load(&reference, None, &env2)?;
        let header = tokenize_as_planned(&model, &text, &s, &expect)?;
        if count == 0 || first + count > header.n_chunk() {
            return Err(Failure::input(format!(
                "chunks {first}..{}: the text has {} chunks",
                first + count,
                header.n_chunk()
            )));
        }
        let part = header.part(first..first + count);
        let mut session = session(&model, &s)?;
        let name = local2.display().to_string();
        let mut w = BufWriter::new(std::fs::File::create(&local2).map_err(|e| Failure::transient(&name, e))?);
        write_base(&mut session, &part, chunks_per_decode(s.ctx, s.batch) as usize, &name, &mut w, |_, _| {})?;
        Ok(())
    })
    .await?;
    let done = upload(&local, out, env).await?;
    drop(dir);
    Ok(done)
}
