//! Intervals for a mean of per-token values, and paired comparisons of two models measured on the same tokens.
//!
//! llama-perplexity's `±` is `sqrt(var/(n-1))` over tokens, as if every token were independent. They are not: the
//! tokens of a chunk share their context, and a model's loss moves by chunk. And two quants measured on the same
//! text make correlated errors, so comparing their two `±` says little (llama.cpp PR #4739 notes it): only the
//! per-token difference on the same tokens says whether one is better than the other.
//!
//! So every interval here treats the **chunk** as the unit that is sampled (the evaluation text's chunks as draws from
//! the text a model will see), the tokens within it as correlated in any way:
//! - per chunk `c` of `n_c` tokens, the sum `S_c` of the values (a paired difference: `d_i = a_i - b_i`, each value
//!   widened to f64 from the f32 the workers store);
//! - the mean `m = ΣS_c / N` (`N = Σn_c`);
//! - the cluster-robust standard error `se = sqrt(C/(C-1) · Σ_c (S_c - n_c·m)²) / N` (the "CR1" sandwich estimator
//!   for a mean, Cameron & Miller, "A Practitioner's Guide to Cluster-Robust Inference", J. Human Resources 2015);
//! - the two-sided interval `m ± t · se` with `t` Student's quantile at `(1 + confidence)/2` on `C - 1` degrees of
//!   freedom (the small-sample correction the same guide recommends for few clusters).
//!
//! Assumptions, stated in `docs/statistics.md`: chunks are exchangeable draws (the text is representative of the use
//! the verdict speaks for); with fewer than 2 chunks there is no interval. The naive per-token figure is reported
//! beside it so the two can be compared.
//!
//! Sums run in chunk order, then token order, so the figures depend only on the values, never on how they were
//! gathered.

use serde::{Deserialize, Serialize};

use crate::kld::{ChunkStats, StatsError};

/// A mean of per-token values with its chunk-clustered interval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MeanInterval {
    pub n_tokens: u64,
    pub n_chunks: u64,
    pub mean: f64,
    /// The naive per-token standard error, `sqrt(Σ(v - m)² / (N - 1) / N)` (independent tokens).
    pub se_tokens: f64,
    /// The chunk-clustered standard error (see the module's overview).
    pub se_chunks: f64,
    /// The two-sided interval at `confidence`.
    pub low: f64,
    pub high: f64,
    pub confidence: f64,
}

impl MeanInterval {
    /// Whether the interval leaves out `x`: the mean is distinguishable from it at the interval's confidence.
    pub fn excludes(&self, x: f64) -> bool {
        x < self.low || x > self.high
    }
}

/// The interval of the mean of `chunks`' values: (chunk index, its values) in any order, each chunk once.
pub fn mean_interval(chunks: &[(u32, Vec<f64>)], confidence: f64) -> Result<MeanInterval, StatsError> {
    if !(confidence > 0.0 && confidence < 1.0) {
        return Err(StatsError(format!("confidence {confidence}: expected a fraction strictly between 0 and 1")));
    }
    let mut ordered: Vec<&(u32, Vec<f64>)> = chunks.iter().collect();
    ordered.sort_by_key(|c| c.0);
    if let Some(w) = ordered.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(StatsError(format!("chunk {} is given twice", w[0].0)));
    }
    let c = ordered.len();
    let n: usize = ordered.iter().map(|x| x.1.len()).sum();
    if c < 2 || n < 2 {
        return Err(StatsError(format!("{c} chunks of {n} tokens: an interval needs at least 2 chunks")));
    }
    let sums: Vec<f64> = ordered.iter().map(|x| x.1.iter().sum::<f64>()).collect();
    let mean = sums.iter().sum::<f64>() / n as f64;
    let ss_tokens: f64 = ordered.iter().flat_map(|x| x.1.iter()).map(|v| (v - mean) * (v - mean)).sum();
    let se_tokens = (ss_tokens / (n as f64 - 1.0) / n as f64).sqrt();
    let ss_chunks: f64 = ordered.iter().zip(&sums).map(|(x, s)| (s - x.1.len() as f64 * mean).powi(2)).sum::<f64>();
    let se_chunks = (c as f64 / (c as f64 - 1.0) * ss_chunks).sqrt() / n as f64;
    let t = student_t_quantile((1.0 + confidence) / 2.0, (c - 1) as f64);
    Ok(MeanInterval {
        n_tokens: n as u64,
        n_chunks: c as u64,
        mean,
        se_tokens,
        se_chunks,
        low: mean - t * se_chunks,
        high: mean + t * se_chunks,
        confidence,
    })
}

/// A model's per-token KL divergence as chunk values (widened to f64).
pub fn kld_chunks(stats: &[ChunkStats]) -> Vec<(u32, Vec<f64>)> {
    stats.iter().map(|c| (c.chunk, c.kld_values.iter().map(|&v| f64::from(v)).collect())).collect()
}

/// The paired difference `a - b` of two models' per-token KL divergence, token by token on the same chunks.
pub fn paired_kld(a: &[ChunkStats], b: &[ChunkStats], confidence: f64) -> Result<MeanInterval, StatsError> {
    let mut a: Vec<&ChunkStats> = a.iter().collect();
    let mut b: Vec<&ChunkStats> = b.iter().collect();
    a.sort_by_key(|c| c.chunk);
    b.sort_by_key(|c| c.chunk);
    let chunks = |v: &[&ChunkStats]| v.iter().map(|c| c.chunk).collect::<Vec<u32>>();
    if chunks(&a) != chunks(&b) {
        return Err(StatsError(format!(
            "a paired comparison needs the same chunks: {:?} against {:?}",
            chunks(&a),
            chunks(&b)
        )));
    }
    let mut diffs = Vec::with_capacity(a.len());
    for (x, y) in a.iter().zip(&b) {
        if x.kld_values.len() != y.kld_values.len() {
            return Err(StatsError(format!(
                "chunk {}: {} tokens against {}: not the same tokens",
                x.chunk,
                x.kld_values.len(),
                y.kld_values.len()
            )));
        }
        let d = x.kld_values.iter().zip(&y.kld_values).map(|(p, q)| f64::from(*p) - f64::from(*q)).collect();
        diffs.push((x.chunk, d));
    }
    mean_interval(&diffs, confidence)
}

/// Student's t quantile: the `t` with `P(T ≤ t) = p` on `dof` degrees of freedom, by bisection on the distribution
/// function (to f64's last bits; the distribution function is
/// `1 - I_{ν/(ν+t²)}(ν/2, 1/2)/2` for `t ≥ 0`, Abramowitz & Stegun 26.7.1 with 26.5.27).
pub fn student_t_quantile(p: f64, dof: f64) -> f64 {
    if p == 0.5 {
        return 0.0;
    }
    if p < 0.5 {
        return -student_t_quantile(1.0 - p, dof);
    }
    let cdf = |t: f64| 1.0 - 0.5 * incomplete_beta(dof / (dof + t * t), dof / 2.0, 0.5);
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while cdf(hi) < p {
        hi *= 2.0;
        if hi > 1e300 {
            return f64::INFINITY;
        }
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid == lo || mid == hi {
            break;
        }
        if cdf(mid) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The regularized incomplete beta function `I_x(a, b)`, by its continued fraction (Numerical Recipes, 3rd ed.,
/// §6.4, `betai`/`betacf`, evaluated by the modified Lentz method).
fn incomplete_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front = (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_fraction(x, a, b) / a
    } else {
        1.0 - front * beta_fraction(1.0 - x, b, a) / b
    }
}

fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..=300 {
        let m = f64::from(m);
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 + aa * d;
        d = if d.abs() < TINY { TINY } else { d };
        c = 1.0 + aa / c;
        c = if c.abs() < TINY { TINY } else { c };
        d = 1.0 / d;
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 + aa * d;
        d = if d.abs() < TINY { TINY } else { d };
        c = 1.0 + aa / c;
        c = if c.abs() < TINY { TINY } else { c };
        d = 1.0 / d;
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() < 1e-16 {
            break;
        }
    }
    h
}

/// `ln Γ(x)` for `x > 0` (Lanczos, g = 7, 9 coefficients: Godfrey's set as in Numerical Recipes §6.1's successors).
fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1-x) = π / sin(πx).
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut sum = C[0];
    for (i, c) in C.iter().enumerate().skip(1) {
        sum += c / (x + i as f64);
    }
    let t = x + G + 0.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Student's t quantiles from the published tables (e.g. NIST/SEMATECH e-Handbook §1.3.6.7.2), 4+ digits.
    #[test]
    fn t_quantiles_match_the_tables() {
        for (p, dof, t) in [
            (0.975, 1.0, 12.706),
            (0.975, 13.0, 2.160),
            (0.995, 13.0, 3.012),
            (0.95, 5.0, 2.015),
            (0.975, 30.0, 2.042),
            (0.995, 100.0, 2.626),
            (0.975, 1e6, 1.960),
        ] {
            let got = student_t_quantile(p, dof);
            assert!((got - t).abs() < 6e-4, "t({p}, {dof}) = {got}, the table says {t}");
            assert_eq!(student_t_quantile(1.0 - p, dof), -got);
        }
    }

    #[test]
    fn a_constant_shift_is_exact_and_clusters_widen_the_interval() {
        // Two chunks whose values move together: the clustered error is larger than the per-token one.
        let chunks = vec![(0, vec![1.0, 1.1, 0.9, 1.0]), (1, vec![2.0, 2.1, 1.9, 2.0]), (2, vec![1.5; 4])];
        let m = mean_interval(&chunks, 0.95).unwrap();
        assert!((m.mean - 1.5).abs() < 1e-15);
        assert!(m.se_chunks > m.se_tokens, "{m:?}");
        assert!(m.low < 1.5 && m.high > 1.5);
        // A paired difference of a model with itself plus a constant is that constant, with no spread.
        let a = ChunkStats { chunk: 0, kld_values: vec![0.5, 0.25], ..Default::default() };
        let b = ChunkStats { chunk: 0, kld_values: vec![0.25, 0.0], ..Default::default() };
        let (mut a2, mut b2) = (a.clone(), b.clone());
        (a2.chunk, b2.chunk) = (1, 1);
        let d = paired_kld(&[a, a2], &[b, b2], 0.99).unwrap();
        assert_eq!((d.mean, d.se_chunks, d.low, d.high), (0.25, 0.0, 0.25, 0.25));
    }

    #[test]
    fn what_cannot_be_paired_is_refused() {
        let a = ChunkStats { chunk: 0, kld_values: vec![0.5, 0.25], ..Default::default() };
        let b = ChunkStats { chunk: 1, kld_values: vec![0.25, 0.0], ..Default::default() };
        assert!(paired_kld(std::slice::from_ref(&a), &[b], 0.95).is_err());
        let short = ChunkStats { chunk: 0, kld_values: vec![0.5], ..Default::default() };
        assert!(paired_kld(std::slice::from_ref(&a), &[short], 0.95).unwrap_err().0.contains("not the same tokens"));
        assert!(mean_interval(&[(0, vec![1.0, 2.0])], 0.95).unwrap_err().0.contains("at least 2 chunks"));
        assert!(mean_interval(&[(0, vec![1.0]), (1, vec![2.0])], 1.0).is_err());
    }
}
