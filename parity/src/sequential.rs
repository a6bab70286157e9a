//! Sequential measurement (`evaluation.stop`): when a rung's KL divergence measured on part of the text already
//! decides every threshold a gate compares it with, at a stated confidence, measuring it stops.
//!
//! The quantity is the **full-text** mean KLD, the figure llama-perplexity prints: `Σ S_u / Σ n_u` over the text's
//! units (a unit: a chunk group the farm decodes in one task, `S_u` its KLD sum over `n_u` scored tokens; units are
//! never split, so a measured unit's figures are llama-perplexity's own for those chunks).
//!
//! - **Order** ([`unit_order`]): the units are measured in a seeded *stratified* order. The text is cut into `k`
//!   contiguous strata (`k`: the units of the first look); each round takes one not yet measured unit from every
//!   stratum, uniformly at random within it, the strata in a random order. So every look has seen every part of the
//!   text: KLD is not spread evenly over a text (a license's terms, its appendix of code, a table are each harder or
//!   easier), and a plain random sample of a few units can miss a whole hard section.
//! - **Estimate**: the ratio estimator of survey sampling (Cochran, "Sampling Techniques", 3rd ed., §6.3–6.4):
//!   `r = Σ S / Σ n` over the measured units, its standard error
//!   `sqrt((1 − m/N) / m) · s`, `s = sqrt(Σ (S_u − r·n_u)² / (m − 1)) / n̄` (`n̄` the measured units' mean size,
//!   `1 − m/N` the finite-population correction: when every unit is measured the mean is exact).
//! - **A floor under the spread** (the rule's one assumption, `spread`): a few units of a skewed quantity can agree
//!   by chance (all from the easy parts), and their sample spread then says the mean is known far better than it is.
//!   The half-width is `sqrt((1 − m/N) / m) · max(t · s, z · spread · r)`: Student's `t` on `m − 1` degrees of freedom
//!   with the sample's spread, or the normal `z` with a spread of at least `spread` times the mean, raised as
//!   `sqrt(256 / n̄)` for units under 256 scored tokens ([`StopRule::floor`]; the units' own coefficient of variation
//!   on real texts: `docs/statistics.md`).
//! - **Looks**: after each unit from the first look's `k = max(min_units, 3)` on, while at least `k` units remain
//!   unmeasured (at the very end one skewed unit left out moves the mean more than an interval from the rest
//!   allows), so at most `N − 2k + 1` looks; each spends `α/looks` of `α = 1 − confidence` (Bonferroni), so the
//!   chance that *any* look's interval misses the full mean is at most `α` when each holds its own level.
//! - **Stop** when every threshold lies outside the interval (each gate's verdict is known: `Decided`), or when the
//!   half-width is at most `precision` of the mean (`Precise`), or when every unit is measured (`Complete`: exactly
//!   llama-perplexity's figure).
//!
//! Neither the t interval nor the floor is exact for a skewed quantity on a handful of units, so the rule's error rate
//! is *measured*, by simulation over seeded orders on real per-chunk data (`cli/tests/eval.rs`, the long tier), and
//! stated in `docs/statistics.md`.

use serde::{Deserialize, Serialize};

use crate::paired::student_t_quantile;
use crate::splitmix::SplitMix;

/// When to stop measuring a rung.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StopRule {
    /// The chance that a stopped rung's interval misses its full-text mean is at most `1 − confidence`.
    pub confidence: f64,
    /// No look before this many units (at least 3: a spread needs two, and one degree of freedom is no interval).
    pub min_units: usize,
    /// The floor under the units' coefficient of variation (see the module's text).
    pub spread: f64,
    /// Also stop when the interval's half-width is at most this fraction of the mean (`0.05`: ± 5 %).
    pub precision: Option<f64>,
}

/// The fewest units a look needs.
pub const MIN_UNITS: usize = 3;

/// What the units measured so far say.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Look {
    pub measured: usize,
    pub total: usize,
    pub mean: f64,
    pub low: f64,
    pub high: f64,
    /// Why measuring can stop, if it can.
    pub stop: Option<StopReason>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// Every unit was measured: the figures are llama-perplexity's.
    Complete,
    /// Every threshold lies outside the interval: each gate's verdict is known.
    Decided,
    /// The interval is as narrow as `precision` asks.
    Precise,
}

impl StopReason {
    pub fn name(self) -> &'static str {
        match self {
            StopReason::Complete => "complete",
            StopReason::Decided => "decided",
            StopReason::Precise => "precise",
        }
    }
}

/// The seeded order in which the `n_units` units are measured: `strata` contiguous strata (clamped to `1..=n_units`),
/// each round one unmeasured unit of every stratum (uniformly at random within it), the strata in a random order.
/// The same on every machine for the same seed.
pub fn unit_order(n_units: usize, strata: usize, seed: u64) -> Vec<usize> {
    let k = strata.clamp(1, n_units.max(1));
    let mut rng = SplitMix(seed);
    let mut pools: Vec<Vec<usize>> = (0..k).map(|s| (n_units * s / k..n_units * (s + 1) / k).collect()).collect();
    for p in &mut pools {
        rng.shuffle(p);
    }
    let mut order = Vec::with_capacity(n_units);
    while order.len() < n_units {
        let mut live: Vec<usize> = (0..k).filter(|&s| !pools[s].is_empty()).collect();
        rng.shuffle(&mut live);
        order.extend(live.into_iter().filter_map(|s| pools[s].pop()));
    }
    order
}

/// The standard normal quantile: Peter J. Acklam's rational approximation (relative error below 1.15e-9, ample for
/// an interval's width).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] =
        [7.784_695_709_041_462e-3, 3.224_671_290_700_398e-1, 2.445_134_137_142_996, 3.754_408_661_907_416];
    if p <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if p >= 1.0 {
        return f64::INFINITY;
    }
    let tail = |q: f64| {
        let x = (-2.0 * q.ln()).sqrt();
        (((((C[0] * x + C[1]) * x + C[2]) * x + C[3]) * x + C[4]) * x + C[5])
            / ((((D[0] * x + D[1]) * x + D[2]) * x + D[3]) * x + 1.0)
    };
    if p < 0.02425 {
        tail(p)
    } else if p > 1.0 - 0.02425 {
        -tail(1.0 - p)
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

impl StopRule {
    /// The units of the first look: `min_units`, at least [`MIN_UNITS`], at most every unit.
    pub fn first_look(&self, total: usize) -> usize {
        self.min_units.max(MIN_UNITS).min(total)
    }

    /// How many looks the rule may take over `total` units: one after each unit from the first look's on, while at
    /// least as many units remain unmeasured as the first look had (near the end a single skewed unit left out moves
    /// the mean more than any interval from the rest allows, and measuring the rest costs less than a look).
    pub fn looks(&self, total: usize) -> usize {
        let first = self.first_look(total);
        (total + 1).saturating_sub(2 * first).max(1)
    }

    /// The floor under the units' coefficient of variation for units of `size` scored tokens: `spread`, raised as
    /// `sqrt(256 / size)` for units under 256 tokens (the spread of a mean of fewer tokens is larger: measured 0.5
    /// for 63-token units, 0.14–0.34 for 252–255).
    pub fn floor(&self, size: f64) -> f64 {
        self.spread * (256.0 / size).sqrt().max(1.0)
    }

    /// The look after `units` (the measured units' (KLD sum, scored tokens), any order) of `total` units, against
    /// the gates' `thresholds` (each a value of the mean at which a verdict changes).
    pub fn look(&self, units: &[(f64, f64)], total: usize, thresholds: &[f64]) -> Look {
        let m = units.len();
        let tokens: f64 = units.iter().map(|u| u.1).sum();
        let mean = if m == 0 || tokens <= 0.0 { f64::NAN } else { units.iter().map(|u| u.0).sum::<f64>() / tokens };
        if m >= total {
            return Look { measured: m, total, mean, low: mean, high: mean, stop: Some(StopReason::Complete) };
        }
        let first = self.first_look(total);
        if m < first || total - m < first || !mean.is_finite() {
            return Look { measured: m, total, mean, low: f64::NEG_INFINITY, high: f64::INFINITY, stop: None };
        }
        let size = tokens / m as f64;
        let var = units.iter().map(|(s, n)| (s - mean * n).powi(2)).sum::<f64>() / (m as f64 - 1.0);
        let alpha = (1.0 - self.confidence) / self.looks(total) as f64;
        let p = 1.0 - alpha / 2.0;
        let sampled = student_t_quantile(p, (m - 1) as f64) * var.sqrt() / size;
        let floor = normal_quantile(p) * self.floor(size) * mean.abs();
        let half = ((1.0 - m as f64 / total as f64) / m as f64).sqrt() * sampled.max(floor);
        let (low, high) = (mean - half, mean + half);
        let decided = !thresholds.is_empty() && thresholds.iter().all(|&t| t < low || t > high);
        let precise = self.precision.is_some_and(|p| half <= p * mean.abs());
        let stop = if decided {
            Some(StopReason::Decided)
        } else if precise {
            Some(StopReason::Precise)
        } else {
            None
        };
        Look { measured: m, total, mean, low, high, stop }
    }

    /// Runs the rule over `units` measured in `order` (unit indices): the first look that stops, or the complete one.
    pub fn run(&self, units: &[(f64, f64)], order: &[usize], thresholds: &[f64]) -> Look {
        let total = units.len();
        let mut seen = Vec::with_capacity(total);
        for &u in order {
            seen.push(units[u]);
            let look = self.look(&seen, total, thresholds);
            if look.stop.is_some() {
                return look;
            }
        }
        self.look(&seen, total, thresholds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_is_a_seeded_stratified_permutation() {
        let a = unit_order(14, 4, 7);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..14).collect::<Vec<_>>());
        assert_eq!(a, unit_order(14, 4, 7), "the same seed, the same order");
        assert_ne!(a, unit_order(14, 4, 8));
        // Each round holds one unit of every stratum (strata 0..3, 3..7, 7..10, 10..14).
        let stratum = |u: usize| [3, 7, 10, 14].iter().position(|&end| u < end).unwrap_or(3);
        for round in [&a[0..4], &a[4..8], &a[8..12]] {
            let mut s: Vec<usize> = round.iter().map(|&u| stratum(u)).collect();
            s.sort_unstable();
            assert_eq!(s, vec![0, 1, 2, 3], "{a:?}");
        }
        // Within a stratum every unit comes first about as often (uniform within strata).
        let mut first = [0usize; 4];
        for seed in 0..4000 {
            let o = unit_order(8, 2, seed);
            let u = o.iter().find(|&&u| u < 4).copied().unwrap_or(0);
            first[u] += 1;
        }
        assert!(first.iter().all(|&n| (850..1150).contains(&n)), "{first:?}");
        // One stratum: a uniformly random permutation; more strata than units: one unit each.
        assert_eq!(unit_order(5, 9, 3).len(), 5);
    }

    #[test]
    fn the_normal_quantile_matches_tables() {
        for (p, z) in [(0.975, 1.959_963_985), (0.995, 2.575_829_304), (0.9995, 3.290_526_731), (0.5, 0.0)] {
            assert!((normal_quantile(p) - z).abs() < 1e-8, "{p}: {}", normal_quantile(p));
            assert!((normal_quantile(1.0 - p) + z).abs() < 1e-8);
        }
        assert!((normal_quantile(1e-6) + 4.753_424_309).abs() < 1e-7);
    }

    #[test]
    fn a_clear_verdict_stops_early_and_a_complete_text_is_exact() {
        let rule = StopRule { confidence: 0.99, min_units: 4, spread: 0.3, precision: None };
        let units: Vec<(f64, f64)> = (0..40).map(|i| (100.0 * (0.06 + 0.001 * f64::from(i % 5)), 100.0)).collect();
        let order = unit_order(40, 4, 1);
        // A limit far above: decided at the first look.
        let far = rule.run(&units, &order, &[0.3]);
        assert_eq!((far.stop, far.measured), (Some(StopReason::Decided), 4), "{far:?}");
        assert!(far.low <= 0.062 && 0.062 <= far.high);
        // A limit at the mean itself: never decided before every unit is measured, then exact.
        let full_mean = units.iter().map(|u| u.0).sum::<f64>() / 4000.0;
        let tight = rule.run(&units, &order, &[full_mean]);
        assert_eq!((tight.stop, tight.measured), (Some(StopReason::Complete), 40));
        assert_eq!((tight.low, tight.high), (tight.mean, tight.mean));
        // Precision: ± 20 % of the mean is reached without any threshold, and later than the far verdict.
        let precise = StopRule { precision: Some(0.2), ..rule }.run(&units, &order, &[]);
        assert_eq!(precise.stop, Some(StopReason::Precise));
        assert!(precise.measured > 4 && precise.high - precise.low <= 0.4 * precise.mean + 1e-12, "{precise:?}");
    }

    #[test]
    fn the_floor_keeps_agreeing_units_from_a_narrow_interval() {
        // Five units that agree to 1 %: their own spread says ± 1 %, the floor says at least 0.3 of the mean.
        let units = [(5.0, 1000.0), (5.05, 1000.0), (4.95, 1000.0), (5.02, 1000.0), (4.98, 1000.0)];
        let rule = StopRule { confidence: 0.99, min_units: 3, spread: 0.3, precision: None };
        let look = rule.look(&units, 15, &[]);
        assert_eq!(rule.looks(15), 10);
        let z = normal_quantile(1.0 - 0.01 / 10.0 / 2.0);
        let half = ((1.0 - 5.0 / 15.0) / 5.0f64).sqrt() * z * 0.3 * 0.005;
        assert!((look.high - look.mean - half).abs() < 1e-15, "{look:?}");
        // Without the floor the interval is far narrower.
        let bare = StopRule { spread: 0.0, ..rule }.look(&units, 15, &[]);
        assert!(bare.high - bare.mean < 0.2 * half, "{bare:?}");
        // Before the first look, no interval; nor with fewer units left than the first look had.
        assert_eq!(rule.look(&units[..2], 15, &[1.0]).stop, None);
        assert_eq!(rule.look(&units, 7, &[1.0]).stop, None);
        assert_eq!(rule.look(&units, 8, &[1.0]).stop, Some(StopReason::Decided));
        // Small units: the floor grows as the spread of a mean of fewer tokens does.
        assert_eq!(rule.floor(64.0), 0.6);
        assert_eq!(rule.floor(1024.0), 0.3);
    }
}
