//! `kld-base`: the reference's base logits for one chunk group of the evaluation text (the chunks llama-perplexity
//! decodes together), which every model's `kld` task of that group is scored against.

use std::fmt;

use quantfarm_proto::{self as pb, task};

use super::expand::model_cost;
use super::kld::{n_groups, Sequential};
use super::lookup::{kld_plan_of, kld_settings, reference_files};
use super::{num, Done, Family, Folded, Grown, Kld, Results, Stage};
use crate::graph::naming::artifact;
use crate::graph::Ctx;

/// The reference's base logits of chunk group `group` of a planned text (`kp`, tokenized with `settings`), named
/// `name(first chunk, chunks)`: content-addressed by the text, its tokens, the chunking and the reference, so the same
/// text and chunking make the same file (the evaluation's and a search's).
pub(super) fn base_part(
    ctx: &Ctx,
    results: &Results,
    kp: &pb::KldPlanResult,
    settings: pb::KldSettings,
    group: u32,
    name: impl Fn(u32, u32) -> String,
) -> Result<pb::KldBaseTask, String> {
    let first = group * kp.n_seq;
    if first >= kp.n_chunks {
        return Err(format!("chunk group {group} starts past the text's {} chunks", kp.n_chunks));
    }
    let n_chunks = kp.n_seq.min(kp.n_chunks - first);
    let refs = reference_files(results)?;
    let (ctx_s, batch_s, first_s, n_s) =
        (settings.ctx.to_string(), settings.batch.to_string(), first.to_string(), n_chunks.to_string());
    let mut parts = vec!["quantfarm kld-base v1", &kp.text_sha256, &kp.tokens_sha256, &ctx_s, &batch_s, &first_s, &n_s];
    parts.extend(refs.iter().map(|a| a.sha256.as_str()));
    let output = artifact(ctx, &parts, &name(first, n_chunks))?;
    Ok(pb::KldBaseTask {
        reference: refs[0].url.clone(),
        settings: Some(settings),
        first_chunk: first,
        n_chunks,
        tokens_sha256: kp.tokens_sha256.clone(),
        output: output.to_string(),
    })
}

/// The base logits of one chunk group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KldBase {
    pub group: u32,
}

impl Family for KldBase {
    const NAME: &'static str = "kld-base";

    fn write_rest(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}", self.group)
    }

    fn parse(rest: &[&str]) -> Option<KldBase> {
        match rest {
            [g] => Some(KldBase { group: num(g)? }),
            _ => None,
        }
    }

    fn worker_kind(&self) -> Option<pb::WorkerKind> {
        Some(pb::WorkerKind::Kld)
    }

    fn stage(&self) -> String {
        "kld reference".into()
    }

    fn message(&self, ctx: &Ctx, results: &Results) -> Result<task::Kind, String> {
        let name = |first: u32, n: u32| format!("{}-BF16-kld-base-{first:05}-{n}.logits", ctx.spec.prefix());
        Ok(task::Kind::KldBase(base_part(ctx, results, kld_plan_of(results)?, kld_settings(ctx)?, self.group, name)?))
    }

    /// An intermediate: the `kld` tasks read it.
    fn fold<'a>(&self, _: Done<'a>, _: &mut Folded<'a>) {}

    /// After the evaluation text's plan: one per chunk group; with `evaluation.stop`, those of the first look (the
    /// rest as the rungs reach them, `kld`), unless something measures the whole text against them (mlx-lm,
    /// transformers, a third party's GGUF).
    fn grow(stage: Stage, ctx: &Ctx, results: &Results, out: &mut Grown) {
        let Stage::TextPlanned(kp) = stage else { return };
        let whole = ctx.spec.runs_mlx_lm() || ctx.spec.runs_transformers() || !ctx.eval.third_party.is_empty();
        let groups: Vec<u32> = match Sequential::of(ctx.spec, kp) {
            Some(seq) if !whole => seq.order[..seq.first].to_vec(),
            _ => (0..n_groups(kp)).collect(),
        };
        for group in groups {
            out.add(KldBase { group }, vec![Kld::Plan.into()], model_cost(results));
        }
    }
}
