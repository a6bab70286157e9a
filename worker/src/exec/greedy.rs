//! `greedy/MODEL/S`: greedy continuations of one share of the release's prompts, rendered by the model's own chat
//! template; against a reference's continuations (when the task carries them) the agreement of each prompt.

use quantfarm_proto::{self as pb, task_result, WorkerKind};

use super::Executor;
use crate::env::Env;
use crate::failure::Failure;
use crate::fetch::{local_file, local_model, read_text, task_dir};
use crate::llama::{blocking, load_prepared};

pub struct Greedy;

impl Executor for Greedy {
    type Task = pb::GreedyTask;
    const KIND: WorkerKind = WorkerKind::Greedy;

    async fn run(t: &pb::GreedyTask, env: &Env) -> Result<task_result::Kind, Failure> {
        Ok(task_result::Kind::Greedy(greedy(t, env).await?))
    }
}

async fn greedy(t: &pb::GreedyTask, env: &Env) -> Result<pb::GreedyResult, Failure> {
    use quantfarm_eval::greedy::{agreement, parse_prompts, run_prompts};
    if t.n_shares == 0 || t.share >= t.n_shares {
        return Err(Failure::input(format!("greedy share {} of {}: no such share", t.share, t.n_shares)));
    }
    let dir = task_dir(env)?;
    let model_path = local_model(&t.model, dir.path(), env).await?;
    let lora = if t.lora.is_empty() { None } else { Some(local_file(&t.lora, dir.path(), env).await?) };
    let (text, _) = read_text(&t.prompts).await?;
    let (t, env) = (t.clone(), env.clone());
    blocking(move || {
        let prompts = parse_prompts(&t.prompts, &text)?;
        let mine: Vec<usize> = (0..prompts.len()).filter(|i| i % t.n_shares as usize == t.share as usize).collect();
        let selected: Vec<_> = mine.iter().map(|&i| prompts[i].clone()).collect();
        let (model, note) = load_prepared(&model_path, lora, dir.path(), &env)?;
        let runs = run_prompts(&model, &selected, t.max_tokens as usize, t.ctx)?;
        let mut result = pb::GreedyResult { note: note.unwrap_or_default(), ..Default::default() };
        if t.reference.is_empty() {
            result.continuations = mine
                .iter()
                .zip(runs)
                .map(|(&index, (prompt_tokens, steps))| pb::GreedyContinuation {
                    index: index as u32,
                    prompt_tokens,
                    tokens: steps.iter().map(|s| s.token).collect(),
                    margins: steps.iter().map(|s| s.margin).collect(),
                })
                .collect();
            return Ok(result);
        }
        for (&index, (prompt_tokens, steps)) in mine.iter().zip(runs) {
            let r = t.reference.iter().find(|r| r.index as usize == index).ok_or_else(|| {
                Failure::input(format!("{}: prompt {index} has no reference continuation", t.prompts))
            })?;
            if r.prompt_tokens != prompt_tokens {
                return Err(Failure::input(format!(
                    "{}: prompt {index} renders to other tokens for {} than for the reference (another template or tokenizer)",
                    t.prompts, t.model
                )));
            }
            let tokens: Vec<i32> = steps.iter().map(|s| s.token).collect();
            // Both continuations are spelled out with this model's vocabulary: the prompt tokens agree, so it is
            // the reference's too.
            let a = agreement(
                index,
                (&r.tokens, &r.margins, model.detokenize(&r.tokens)),
                (&tokens, model.detokenize(&tokens)),
            );
            result.agreements.push(agreement_proto(a));
        }
        Ok(result)
    })
    .await
}

/// One prompt's agreement as the protocol carries it (also the mlx-lm greedy task's).
pub(super) fn agreement_proto(a: quantfarm_eval::greedy::PromptAgreement) -> pb::PromptAgreement {
    pb::PromptAgreement {
        index: a.index as u32,
        identical: a.identical,
        reference_tokens: a.reference_tokens as u32,
        model_tokens: a.model_tokens as u32,
        common_prefix: a.common_prefix as u32,
        prefix_fraction: a.prefix_fraction,
        first_difference: a.first_difference.map_or(-1, |d| d as i32),
        reference_margin: a.reference_margin.unwrap_or(f32::NAN),
        reference_text: a.reference_text,
        model_text: a.model_text,
    }
}
