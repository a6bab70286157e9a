//! The report's `sequential` section (`evaluation.stop`): per rung, how many of the text's chunks it was measured
//! on, why measuring it stopped, and its interval at the rule's confidence — each look recomputed here from the
//! groups' results exactly as the graph made it (`crate::kinds::Sequential`), so a rung's partial figures are
//! accepted only where the rule stopped it.

use quantfarm_parity::sequential::Look;
use quantfarm_proto as pb;

use super::model::{Sequential as Section, SequentialRung};
use crate::kinds::{eval_targets_of, Sequential, TaskKey};
use crate::sched::Release;
use crate::spec::EvalTarget;

fn plan(rel: &Release) -> Option<&pb::KldPlanResult> {
    rel.result(&crate::kinds::Kld::Plan.into())?.kld_plan()
}

/// The rule's last look at `target` (over every group it measured), when the release has `evaluation.stop`.
fn look(rel: &Release, seq: &Sequential, target: EvalTarget) -> Option<Look> {
    let results = |k: &TaskKey| rel.result(k);
    seq.look(&rel.spec, target, &results)
}

/// Whether the rung named `file_type` was stopped before the end of the text by the rule (its figures are then
/// the measured chunks', standing for the whole text within the section's interval).
pub(super) fn stopped_early(rel: &Release, file_type: &str) -> bool {
    let (Some(kp), Some(target)) = (plan(rel), EvalTarget::parse(file_type)) else { return false };
    let Some(seq) = Sequential::of(&rel.spec, kp) else { return false };
    look(rel, &seq, target).is_some_and(|l| l.stop.is_some() && l.measured < l.total)
}

/// The section, when the release has `evaluation.stop` and its text was planned.
pub(super) fn section(rel: &Release) -> Option<Section> {
    let stop = rel.spec.evaluation.as_ref()?.stop?;
    let kp = plan(rel)?;
    let seq = Sequential::of(&rel.spec, kp)?;
    let n_seq = kp.n_seq.max(1);
    let chunks_of = |group: u32| u64::from(n_seq.min(kp.n_chunks.saturating_sub(group * n_seq)));
    let mut rungs = Vec::new();
    for target in eval_targets_of(&rel.spec) {
        let Some(l) = look(rel, &seq, target) else { continue };
        let thresholds = Sequential::thresholds(&rel.spec, target);
        rungs.push(SequentialRung {
            file_type: target.to_string(),
            chunks: seq.order[..l.measured].iter().map(|&g| chunks_of(g)).sum(),
            of_chunks: u64::from(kp.n_chunks),
            stopped: l.stop.map_or("not stopped", |s| s.name()).to_string(),
            mean: l.mean,
            low: l.low,
            high: l.high,
            thresholds: thresholds.clone().unwrap_or_default(),
            note: thresholds.err().map(|e| format!("never decided early: {e}")),
        });
    }
    let method = format!(
        "the text's {} chunk groups measured in one seeded stratified order (the first look's {} groups at once, then \
         one at a time); after each, the ratio estimate of the full-text mean KLD with a Student-t interval (the \
         groups' own spread, or at least {} of the mean with the normal quantile, more for groups under 256 scored \
         tokens), finite-population corrected, Bonferroni over the looks while as many groups remain as the first \
         look had; a rung stops when every gate threshold lies outside its interval{} \
         (quantfarm_parity::sequential; docs/statistics.md)",
        seq.order.len(),
        seq.first,
        stop.spread,
        stop.precision.map_or(String::new(), |p| format!(" or its half-width is at most {p} of its mean")),
    );
    Some(Section {
        method,
        confidence: stop.confidence,
        min_chunks: u64::from(stop.min_chunks),
        spread: stop.spread,
        precision: stop.precision,
        chunks_per_group: u64::from(n_seq),
        order: seq.order.clone(),
        rungs,
    })
}
