//! Scoring one position as llama-perplexity does; the per-chunk statistics and their exact merge live in
//! `quantfarm-parity` (the coordinator merges them without linking the runtime).

pub use quantfarm_parity::kld::*;

use super::base_file::Record;

/// Scores one position (the float/double split mirrors llama-perplexity's `log_softmax(..., kl_divergence_result&)`): the model's `logits` against the reference's record, for the observed next `token`.
pub fn score_position(logits: &[f32], base: &Record<'_>, token: usize) -> PositionScore {
    let mut max = logits[0];
    let mut imax = 0;
    for (i, &l) in logits.iter().enumerate().skip(1) {
        if l > max {
            max = l;
            imax = i;
        }
    }
    let sum_exp: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    let lse = sum_exp.ln() as f32;
    let nll = max + lse - logits[token];
    let nll_base = -(base.scale * f32::from(base.codes[token]) + base.min_log_prob);
    let log_norm = max + lse;
    let mut kld = 0f64;
    let mut imax_base = 0;
    let mut best = 0f32;
    for (i, (&q, &l)) in base.codes.iter().zip(logits).enumerate() {
        let lb = base.scale * f32::from(q) + base.min_log_prob;
        if i == 0 || lb > best {
            best = lb;
            imax_base = i;
        }
        if lb > -16.0 {
            kld += f64::from(lb.exp() * (lb - l + log_norm));
        }
    }
    let p_diff = (-nll).exp() - (-nll_base).exp();
    PositionScore { nll, nll_base, kld, p_diff, same_top: imax == imax_base }
}
