//! Scoring one position as llama-perplexity does; the per-chunk statistics and their exact merge live in
//! `quantfarm-parity` (the coordinator merges them without linking the runtime).

pub use quantfarm_parity::kld::*;

use super::base_file::Record;

/// Scores one position (the float/double split mirrors llama-perplexity's `log_softmax(..., kl_divergence_result&)`): the model's `logits` against the reference's record, for the observed next `token`.
pub fn score_position(logits: &[f32], base: &Record<'_>, token: usize) -> PositionScore {
    let s = super::kernels::score(logits, base.codes, base.scale, base.min_log_prob);
    let nll = s.max + s.lse - logits[token];
    let nll_base = -(base.scale * f32::from(base.codes[token]) + base.min_log_prob);
    let p_diff = (-nll).exp() - (-nll_base).exp();
    PositionScore { nll, nll_base, kld: s.kld, p_diff, same_top: s.imax == s.imax_base }
}
