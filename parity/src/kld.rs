//! KL-divergence statistics as llama-perplexity computes them (`tools/perplexity/perplexity.cpp::kl_divergence`),
//! kept per chunk so chunks computed anywhere merge into exactly the figures one run prints.
//!
//! A chunk's [`ChunkStats`] holds the sufficient sums and its per-token KLD and Δp values (the percentiles need them).
//! [`KldSummary::merge`] adds chunks in chunk order whatever order they arrive in, so the figures depend only on
//! which chunks were measured, never on how they were spread over workers.

use serde::{Deserialize, Serialize};

/// Chunk statistics that cannot be merged.
#[derive(Debug, thiserror::Error)]
#[error("KL-divergence statistics: {0}")]
pub struct StatsError(pub String);

pub type Result<T> = std::result::Result<T, StatsError>;

/// What one scored position contributes (the float/double split mirrors llama-perplexity's `log_softmax(...,
/// kl_divergence_result&)`, so the sums match its own).
#[derive(Clone, Copy, Debug)]
pub struct PositionScore {
    pub nll: f32,
    pub nll_base: f32,
    pub kld: f64,
    pub p_diff: f32,
    pub same_top: bool,
}

/// One chunk's sufficient statistics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChunkStats {
    /// The chunk's index in the evaluation text.
    pub chunk: u32,
    pub count: u64,
    pub sum_nll: f64,
    pub sum_nll2: f64,
    pub sum_nll_base: f64,
    pub sum_nll_base2: f64,
    pub sum_nll_nll_base: f64,
    pub sum_kld: f64,
    pub sum_kld2: f64,
    pub sum_p_diff: f64,
    pub sum_p_diff2: f64,
    pub sum_p_diff4: f64,
    pub max_abs_p_diff: f32,
    pub n_same_top: u64,
    /// Per scored position, in order.
    pub kld_values: Vec<f32>,
    pub p_diff_values: Vec<f32>,
}

impl ChunkStats {
    /// Accumulates position scores in position order (so the sums do not depend on how they were computed).
    pub fn from_scores(chunk: u32, scores: &[PositionScore]) -> ChunkStats {
        let mut s = ChunkStats { chunk, ..ChunkStats::default() };
        for p in scores {
            s.count += 1;
            s.sum_nll += f64::from(p.nll);
            s.sum_nll2 += f64::from(p.nll * p.nll);
            s.sum_nll_base += f64::from(p.nll_base);
            s.sum_nll_base2 += f64::from(p.nll_base * p.nll_base);
            s.sum_nll_nll_base += f64::from(p.nll * p.nll_base);
            s.sum_kld += p.kld;
            s.sum_kld2 += p.kld * p.kld;
            let d2 = f64::from(p.p_diff * p.p_diff);
            s.sum_p_diff += f64::from(p.p_diff);
            s.sum_p_diff2 += d2;
            s.sum_p_diff4 += d2 * d2;
            s.max_abs_p_diff = s.max_abs_p_diff.max(p.p_diff.abs());
            s.n_same_top += u64::from(p.same_top);
            s.kld_values.push(p.kld as f32);
            s.p_diff_values.push(p.p_diff);
        }
        s
    }

    fn add(&mut self, o: &ChunkStats) {
        self.count += o.count;
        self.sum_nll += o.sum_nll;
        self.sum_nll2 += o.sum_nll2;
        self.sum_nll_base += o.sum_nll_base;
        self.sum_nll_base2 += o.sum_nll_base2;
        self.sum_nll_nll_base += o.sum_nll_nll_base;
        self.sum_kld += o.sum_kld;
        self.sum_kld2 += o.sum_kld2;
        self.sum_p_diff += o.sum_p_diff;
        self.sum_p_diff2 += o.sum_p_diff2;
        self.sum_p_diff4 += o.sum_p_diff4;
        self.max_abs_p_diff = self.max_abs_p_diff.max(o.max_abs_p_diff);
        self.n_same_top += o.n_same_top;
        self.kld_values.extend_from_slice(&o.kld_values);
        self.p_diff_values.extend_from_slice(&o.p_diff_values);
    }

    fn check(&self) -> Result<()> {
        let n = self.count as usize;
        if n == 0 || self.kld_values.len() != n || self.p_diff_values.len() != n || self.n_same_top > self.count {
            return Err(StatsError(format!(
                "chunk {}: {} positions but {} KLD and {} Δp values, {} same-top",
                self.chunk,
                self.count,
                self.kld_values.len(),
                self.p_diff_values.len(),
                self.n_same_top
            )));
        }
        Ok(())
    }
}

/// A value and its uncertainty, as printed `value ± unc`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    pub value: f64,
    pub unc: f64,
}

/// Every final figure llama-perplexity prints in KL-divergence mode (percent figures as fractions here, ×100 when
/// printed), plus the counts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KldSummary {
    pub n_chunks: u64,
    pub n_tokens: u64,
    /// The chunk indices merged, ascending.
    pub chunks: Vec<u32>,
    pub mean_ppl_q: Estimate,
    pub mean_ppl_base: Estimate,
    /// Cor(ln PPL(Q), ln PPL(base)), a fraction.
    pub cor_ln_ppl: f64,
    pub mean_ln_ppl_ratio: Estimate,
    pub mean_ppl_ratio: Estimate,
    pub mean_ppl_diff: Estimate,
    pub mean_kld: Estimate,
    pub max_kld: f64,
    pub median_kld: f64,
    /// (fraction, value): 99.9, 99, 95, 90, 10, 5, 1, 0.1 %.
    pub kld_percentiles: Vec<(f64, f64)>,
    pub min_kld: f64,
    pub mean_dp: Estimate,
    pub max_dp: f64,
    pub median_dp: f64,
    /// (fraction, value): 99.9, 99, 95, 90, 75, 25, 10, 5, 1, 0.1 %.
    pub dp_percentiles: Vec<(f64, f64)>,
    pub min_dp: f64,
    pub max_abs_dp: f64,
    pub rms_dp: Estimate,
    pub same_top_p: Estimate,
}

const KLD_FRACTIONS: [f32; 8] = [0.999, 0.990, 0.950, 0.900, 0.100, 0.050, 0.010, 0.001];
const DP_FRACTIONS: [f32; 10] = [0.999, 0.990, 0.950, 0.900, 0.750, 0.250, 0.100, 0.050, 0.010, 0.001];

/// llama-perplexity's `mean_and_uncertainty`.
fn mean_and_unc(sum: f64, sum2: f64, n: u64) -> Estimate {
    if n < 1 {
        return Estimate { value: 0.0, unc: 0.0 };
    }
    let f = sum / n as f64;
    let var = sum2 / n as f64 - f * f;
    let unc = if var > 0.0 && n > 10 { (var / (n - 1) as f64).sqrt() } else { 0.0 };
    Estimate { value: f, unc }
}

fn covariance(a: f64, b: f64, ab: f64, n: u64) -> f64 {
    if n < 10 {
        return 0.0;
    }
    let n_f = n as f64;
    (ab / n_f - (a / n_f) * (b / n_f)) / (n_f - 1.0)
}

/// llama-perplexity's percentile: linear interpolation at `fraction·(len−1)`, in float.
fn percentile(sorted: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return sorted[0];
    }
    if fraction >= 1.0 {
        return sorted[sorted.len() - 1];
    }
    let mut p = fraction * (sorted.len() - 1) as f32;
    let ip = p as usize;
    p -= ip as f32;
    (1.0 - p) * sorted[ip] + p * sorted[(ip + 1).min(sorted.len() - 1)]
}

fn median(sorted: &[f32]) -> f32 {
    let n = sorted.len();
    if n.is_multiple_of(2) {
        0.5 * (sorted[n / 2] + sorted[n / 2 - 1])
    } else {
        sorted[n / 2]
    }
}

impl KldSummary {
    /// Merges chunk statistics (any order, from anywhere) into the final figures. Refuses a chunk given twice, and
    /// fewer than 100 scored tokens (llama-perplexity prints no statistics below that).
    pub fn merge(chunks: &[ChunkStats]) -> Result<KldSummary> {
        let mut ordered: Vec<&ChunkStats> = chunks.iter().collect();
        ordered.sort_by_key(|c| c.chunk);
        if let Some(w) = ordered.windows(2).find(|w| w[0].chunk == w[1].chunk) {
            return Err(StatsError(format!("chunk {} is given twice", w[0].chunk)));
        }
        let mut t = ChunkStats::default();
        for c in &ordered {
            c.check()?;
            t.add(c);
        }
        if t.count < 100 {
            return Err(StatsError(format!(
                "only {} scored tokens; llama-perplexity computes no statistics on fewer than 100",
                t.count
            )));
        }
        let n = t.count;
        let mut kld = t.kld_values;
        let mut dp = t.p_diff_values;
        kld.sort_by(f32::total_cmp);
        dp.sort_by(f32::total_cmp);

        let log_ppl = mean_and_unc(t.sum_nll, t.sum_nll2, n);
        let log_ppl_base = mean_and_unc(t.sum_nll_base, t.sum_nll_base2, n);
        let ppl = log_ppl.value.exp();
        let ppl_base = log_ppl_base.value.exp();
        let cov = covariance(t.sum_nll, t.sum_nll_base, t.sum_nll_nll_base, n);
        let ratio = log_ppl.value - log_ppl_base.value;
        let ratio_unc = (log_ppl.unc * log_ppl.unc + log_ppl_base.unc * log_ppl_base.unc - 2.0 * cov).sqrt();
        let ppl_unc = ppl * log_ppl.unc;
        let ppl_base_unc = ppl_base * log_ppl_base.unc;
        let diff_unc = (ppl_unc * ppl_unc + ppl_base_unc * ppl_base_unc - 2.0 * ppl * ppl_base * cov).sqrt();
        let mse = mean_and_unc(t.sum_p_diff2, t.sum_p_diff4, n);
        let rms = mse.value.sqrt();
        let same = t.n_same_top as f64 / n as f64;
        Ok(KldSummary {
            n_chunks: ordered.len() as u64,
            n_tokens: n,
            chunks: ordered.iter().map(|c| c.chunk).collect(),
            mean_ppl_q: Estimate { value: ppl, unc: ppl_unc },
            mean_ppl_base: Estimate { value: ppl_base, unc: ppl_base_unc },
            cor_ln_ppl: cov / (log_ppl.unc * log_ppl_base.unc),
            mean_ln_ppl_ratio: Estimate { value: ratio, unc: ratio_unc },
            mean_ppl_ratio: Estimate { value: ratio.exp(), unc: ratio.exp() * ratio_unc },
            mean_ppl_diff: Estimate { value: ppl - ppl_base, unc: diff_unc },
            mean_kld: mean_and_unc(t.sum_kld, t.sum_kld2, n),
            max_kld: f64::from(kld[kld.len() - 1]),
            median_kld: f64::from(median(&kld)),
            kld_percentiles: KLD_FRACTIONS.iter().map(|&f| (f64::from(f), f64::from(percentile(&kld, f)))).collect(),
            min_kld: f64::from(kld[0]),
            mean_dp: mean_and_unc(t.sum_p_diff, t.sum_p_diff2, n),
            max_dp: f64::from(dp[dp.len() - 1]),
            median_dp: f64::from(median(&dp)),
            dp_percentiles: DP_FRACTIONS.iter().map(|&f| (f64::from(f), f64::from(percentile(&dp, f)))).collect(),
            min_dp: f64::from(dp[0]),
            max_abs_dp: f64::from(t.max_abs_p_diff),
            rms_dp: Estimate { value: rms, unc: 0.5 / rms * mse.unc },
            same_top_p: Estimate { value: same, unc: (same * (1.0 - same) / (n - 1) as f64).sqrt() },
        })
    }

    /// The KL divergence at `fraction` (0.99 for the 99th percentile), one of llama-perplexity's percentiles
    /// (0.999, 0.99, 0.95, 0.9, 0.1, 0.05, 0.01, 0.001); `None` for another. Fractions are the f32 values
    /// llama-perplexity uses, so 0.99 here is `0.99f32`, not the f64 0.99.
    pub fn kld_percentile(&self, fraction: f32) -> Option<f64> {
        self.kld_percentiles.iter().find(|p| p.0 == f64::from(fraction)).map(|p| p.1)
    }

    fn kld_at(&self, fraction: f32) -> f64 {
        self.kld_percentile(fraction).unwrap_or(f64::NAN)
    }

    fn dp_at(&self, fraction: f32) -> f64 {
        self.dp_percentiles.iter().find(|p| p.0 == f64::from(fraction)).map_or(f64::NAN, |p| p.1)
    }

    /// The final report, line for line as llama-perplexity prints it.
    pub fn llama_text(&self) -> String {
        use std::fmt::Write;
        let mut o = String::new();
        let e = |o: &mut String, label: &str, v: Estimate| {
            let _ = writeln!(o, "{label:<30}: {:10.6} ± {:10.6}", v.value, v.unc);
        };
        o.push_str("====== Perplexity statistics ======\n");
        e(&mut o, "Mean PPL(Q)", self.mean_ppl_q);
        e(&mut o, "Mean PPL(base)", self.mean_ppl_base);
        let _ = writeln!(o, "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%", 100.0 * self.cor_ln_ppl);
        e(&mut o, "Mean ln(PPL(Q)/PPL(base))", self.mean_ln_ppl_ratio);
        e(&mut o, "Mean PPL(Q)/PPL(base)", self.mean_ppl_ratio);
        e(&mut o, "Mean PPL(Q)-PPL(base)", self.mean_ppl_diff);
        o.push_str("\n====== KL divergence statistics ======\n");
        let _ = writeln!(o, "Mean    KLD: {:10.6} ± {:10.6}", self.mean_kld.value, self.mean_kld.unc);
        let _ = writeln!(o, "Maximum KLD: {:10.6}", self.max_kld);
        for f in [0.999f32, 0.990, 0.950, 0.900] {
            let _ = writeln!(o, "{:4.1}%   KLD: {:10.6}", 100.0 * f, self.kld_at(f));
        }
        let _ = writeln!(o, "Median  KLD: {:10.6}", self.median_kld);
        for f in [0.100f32, 0.050, 0.010, 0.001] {
            let _ = writeln!(o, "{:4.1}%   KLD: {:10.6}", 100.0 * f, self.kld_at(f));
        }
        let _ = writeln!(o, "Minimum KLD: {:10.6}", self.min_kld);
        o.push_str("\n====== Token probability statistics ======\n");
        let _ = writeln!(o, "Mean    Δp: {:6.3} ± {:5.3} %", 100.0 * self.mean_dp.value, 100.0 * self.mean_dp.unc);
        let _ = writeln!(o, "Maximum Δp: {:6.3}%", 100.0 * self.max_dp);
        for f in [0.999f32, 0.990, 0.950, 0.900, 0.750] {
            let _ = writeln!(o, "{:4.1}%   Δp: {:6.3}%", 100.0 * f, 100.0 * self.dp_at(f));
        }
        let _ = writeln!(o, "Median  Δp: {:6.3}%", 100.0 * self.median_dp);
        for f in [0.250f32, 0.100, 0.050, 0.010, 0.001] {
            let _ = writeln!(o, "{:4.1}%   Δp: {:6.3}%", 100.0 * f, 100.0 * self.dp_at(f));
        }
        let _ = writeln!(o, "Minimum Δp: {:6.3}%", 100.0 * self.min_dp);
        let _ = writeln!(o, "RMS Δp    : {:6.3} ± {:5.3} %", 100.0 * self.rms_dp.value, 100.0 * self.rms_dp.unc);
        let _ =
            writeln!(o, "Same top p: {:6.3} ± {:5.3} %", 100.0 * self.same_top_p.value, 100.0 * self.same_top_p.unc);
        o
    }

    /// The `--json` object: snake_case keys, percent figures in percent (as printed).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        let pct = |v: f64| 100.0 * v;
        let mut o = json!({
            "n_tokens": self.n_tokens,
            "n_chunks": self.n_chunks,
            "mean_ppl_q": self.mean_ppl_q.value,
            "mean_ppl_q_unc": self.mean_ppl_q.unc,
            "mean_ppl_base": self.mean_ppl_base.value,
            "mean_ppl_base_unc": self.mean_ppl_base.unc,
            "cor_ln_ppl": pct(self.cor_ln_ppl),
            "mean_ln_ppl_ratio": self.mean_ln_ppl_ratio.value,
            "mean_ln_ppl_ratio_unc": self.mean_ln_ppl_ratio.unc,
            "mean_ppl_ratio": self.mean_ppl_ratio.value,
            "mean_ppl_ratio_unc": self.mean_ppl_ratio.unc,
            "mean_ppl_diff": self.mean_ppl_diff.value,
            "mean_ppl_diff_unc": self.mean_ppl_diff.unc,
            "mean_kld": self.mean_kld.value,
            "mean_kld_unc": self.mean_kld.unc,
            "max_kld": self.max_kld,
            "median_kld": self.median_kld,
            "min_kld": self.min_kld,
            "mean_dp": pct(self.mean_dp.value),
            "mean_dp_unc": pct(self.mean_dp.unc),
            "max_dp": pct(self.max_dp),
            "median_dp": pct(self.median_dp),
            "min_dp": pct(self.min_dp),
            "rms_dp": pct(self.rms_dp.value),
            "rms_dp_unc": pct(self.rms_dp.unc),
            "same_top_p": pct(self.same_top_p.value),
            "same_top_p_unc": pct(self.same_top_p.unc),
        });
        let map = o.as_object_mut().expect("an object");
        for (f, v) in &self.kld_percentiles {
            map.insert(format!("kld_p{}", percent_key(*f)), (*v).into());
        }
        for (f, v) in &self.dp_percentiles {
            map.insert(format!("dp_p{}", percent_key(*f)), pct(*v).into());
        }
        o
    }
}

/// 0.999 → "99_9", 0.99 → "99", 0.001 → "0_1".
fn percent_key(fraction: f64) -> String {
    let tenths = (fraction * 1000.0).round() as u64;
    if tenths.is_multiple_of(10) {
        format!("{}", tenths / 10)
    } else {
        format!("{}_{}", tenths / 10, tenths % 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(i: u32, seed: u32) -> ChunkStats {
        let scores: Vec<PositionScore> = (0..60u32)
            .map(|k| {
                let x = ((k * 7919 + seed * 104_729) % 1000) as f32 / 1000.0;
                PositionScore {
                    nll: 1.0 + x,
                    nll_base: 1.1 + 0.9 * x,
                    kld: f64::from(x * x) * 0.1,
                    p_diff: x - 0.5,
                    same_top: k % 3 != 0,
                }
            })
            .collect();
        ChunkStats::from_scores(i, &scores)
    }

    #[test]
    fn merge_is_independent_of_arrival_order_and_refuses_duplicates() {
        let a = [chunk(0, 1), chunk(1, 2), chunk(2, 3)];
        let b = [chunk(2, 3), chunk(0, 1), chunk(1, 2)];
        let sa = KldSummary::merge(&a).unwrap();
        assert_eq!(sa, KldSummary::merge(&b).unwrap());
        assert_eq!(sa.n_tokens, 180);
        assert_eq!(sa.chunks, vec![0, 1, 2]);
        assert!((sa.same_top_p.value - 120.0 / 180.0).abs() < 1e-12);
        let err = KldSummary::merge(&[chunk(0, 1), chunk(0, 1)]).unwrap_err().to_string();
        assert!(err.contains("twice"), "{err}");
        let err = KldSummary::merge(&[chunk(0, 1)]).unwrap_err().to_string();
        assert!(err.contains("fewer than 100"), "{err}");
    }

    #[test]
    fn percentiles_follow_llama_perplexity() {
        let v: Vec<f32> = (0..11).map(|i| i as f32).collect();
        assert_eq!(percentile(&v, 0.5), 5.0);
        assert_eq!(percentile(&v, 0.95), 9.5);
        assert_eq!(median(&v[..10]), 4.5);
        assert_eq!(percent_key(0.999), "99_9");
        assert_eq!(percent_key(0.99), "99");
        assert_eq!(percent_key(0.001), "0_1");
    }

    #[test]
    fn text_has_every_final_line() {
        let s = KldSummary::merge(&[chunk(0, 1), chunk(1, 2)]).unwrap();
        let t = s.llama_text();
        for label in [
            "Mean PPL(Q)                   :",
            "Cor(ln(PPL(Q)), ln(PPL(base))):",
            "Mean    KLD:",
            "99.9%   KLD:",
            " 0.1%   KLD:",
            "Median  Δp:",
            "RMS Δp    :",
            "Same top p:",
        ] {
            assert!(t.contains(label), "{label} missing from\n{t}");
        }
        // Every percentile llama-perplexity prints is there by its f32 fraction.
        for f in KLD_FRACTIONS {
            assert!(s.kld_percentile(f).is_some_and(f64::is_finite), "{f}");
        }
        assert_eq!(s.kld_percentile(0.5), None);
        let j = s.to_json();
        for key in [
            "mean_kld",
            "mean_kld_unc",
            "max_kld",
            "median_kld",
            "same_top_p",
            "rms_dp",
            "mean_ppl_q",
            "mean_ppl_base",
            "mean_ln_ppl_ratio",
            "kld_p99_9",
            "dp_p0_1",
            "n_tokens",
            "n_chunks",
        ] {
            assert!(j.get(key).is_some(), "{key} missing");
        }
    }
}
