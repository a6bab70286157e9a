//! The loops that run over a whole vocabulary at every scored position (log-softmax, the KL sum, the base record's
//! codes): the KLD pass's own arithmetic, beside llama.cpp's decode.
//!
//! The sums are kept in fixed blocks of [`LANES`] values with one f64 accumulator per lane, so every machine adds
//! in the same order whatever its vector width: the figures depend on the logits alone. On x86-64 with AVX2 the
//! two hot loops (Σ e^x and the KL sum) run as explicit AVX2 code doing the same operations in the same order as
//! the portable loops (no fused multiply-add, which Rust never introduces by itself), so both give the same bits.
//!
//! The one departure from llama-perplexity's `log_softmax` is `expf`: [`exp`] is Cephes' `expf` (range reduction by
//! ln 2 in two parts, a degree-5 polynomial, the exponent set by bits), within 2 ulp of the C library's. Over a
//! 49,152-token vocabulary and thousands of positions that moves the figures by parts in 10^7, below every digit
//! llama-perplexity prints.

/// Values per block; a multiple of every vector width in use (AVX2: 8 f32, 4 f64).
const LANES: usize = 16;

/// e^x for x ≤ 0 (the only arguments here: a logit minus the maximum, a log-probability), 0 below e^-87.3, where
/// f32 has only subnormals left.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n·LN2_HI is exact for the n that occur.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 · 2^23: adding it rounds to an integer (to nearest, ties to even) held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_2e-4;
    let p = p * r + 1.398_2e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 5.000_000_1e-1;
    let e = p * (r * r) + r + 1.0;
    // 2^n from n's bits in `t` (its low 22 bits hold n in two's complement, offset by 2^22).
    let n_int = (t.to_bits() as i32) - 0x4B40_0000;
    let scale = f32::from_bits(((n_int + 127) << 23) as u32);
    if x < -87.3 {
        0.0
    } else {
        e * scale
    }
}

/// The first index of the largest value, and the value.
#[inline(always)]
fn max_first(xs: &[f32]) -> (f32, usize) {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let blocks = xs.chunks_exact(LANES);
    let rest = blocks.remainder();
    for b in blocks {
        for (m, &x) in lanes.iter_mut().zip(b) {
            *m = if x > *m { x } else { *m };
        }
    }
    let mut max = lanes.iter().copied().fold(f32::NEG_INFINITY, |a, b| if b > a { b } else { a });
    for &x in rest {
        max = if x > max { x } else { max };
    }
    // The first position holding it (llama-perplexity's scan keeps the first of equal maxima).
    let at = xs.iter().position(|&x| x == max).unwrap_or(0);
    (max, at)
}

/// Σ e^(x − max) in f64, each term rounded to f32 first (as `double += expf(...)` does).
#[inline(always)]
fn sum_exp(xs: &[f32], max: f32) -> f64 {
    let blocks = xs.chunks_exact(LANES);
    let rest = blocks.remainder();
    let mut lanes = [0f64; LANES];
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: the CPU has AVX2.
        unsafe { avx2::sum_exp_blocks(xs, max, &mut lanes) };
    } else {
        sum_exp_blocks(xs, max, &mut lanes);
    }
    #[cfg(not(target_arch = "x86_64"))]
    sum_exp_blocks(xs, max, &mut lanes);
    let mut sum = lanes.iter().sum::<f64>();
    for &x in rest {
        sum += f64::from(exp(x - max));
    }
    sum
}

/// Adds e^(x − max) of the whole blocks of `xs` into `lanes`, block value j into lane j.
fn sum_exp_blocks(xs: &[f32], max: f32, lanes: &mut [f64; LANES]) {
    for b in xs.chunks_exact(LANES) {
        for (s, &x) in lanes.iter_mut().zip(b) {
            *s += f64::from(exp(x - max));
        }
    }
}

/// One position's KL term for reference code `q` against model logit `l`.
#[inline(always)]
fn kl_term(q: u16, l: f32, scale: f32, min_log_prob: f32, log_norm: f32) -> f64 {
    let lb = scale * f32::from(q) + min_log_prob;
    if lb > -16.0 {
        f64::from(exp(lb) * (lb - l + log_norm))
    } else {
        0.0
    }
}

/// Adds the KL terms of the whole blocks into `lanes`, block value j into lane j.
fn kl_blocks(codes: &[u16], logits: &[f32], k: (f32, f32, f32), lanes: &mut [f64; LANES]) {
    for (c, l) in codes.chunks_exact(LANES).zip(logits.chunks_exact(LANES)) {
        for ((s, &q), &x) in lanes.iter_mut().zip(c).zip(l) {
            *s += kl_term(q, x, k.0, k.1, k.2);
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// The block loops in AVX2: the same operations in the same order as [`exp`], [`sum_exp_blocks`] and
/// [`kl_blocks`], eight lanes at a time, so they give the same bits.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::LANES;

    #[target_feature(enable = "avx2")]
    unsafe fn exp8(x: __m256) -> __m256 {
        let round = _mm256_set1_ps(12_582_912.0);
        let t = _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)), round);
        let n = _mm256_sub_ps(t, round);
        let r = _mm256_sub_ps(
            _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693_359_4))),
            _mm256_mul_ps(n, _mm256_set1_ps(-2.121_944_4e-4)),
        );
        let mut p = _mm256_set1_ps(1.987_569_2e-4);
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.398_2e-3));
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.333_452e-3));
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.166_579_6e-2));
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.666_666_5e-1));
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.000_000_1e-1));
        let e = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0));
        let n_int = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B40_0000));
        let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n_int, _mm256_set1_epi32(127))));
        let below = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.3));
        _mm256_andnot_ps(below, _mm256_mul_ps(e, scale))
    }

    /// One block half's KL terms (eight codes, eight logits), zero where the reference is below −16.
    #[target_feature(enable = "avx2")]
    unsafe fn kl8(q: __m128i, l: __m256, scale: __m256, min_log_prob: __m256, log_norm: __m256) -> __m256 {
        let lb = _mm256_add_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(q))), min_log_prob);
        let t = _mm256_mul_ps(exp8(lb), _mm256_add_ps(_mm256_sub_ps(lb, l), log_norm));
        _mm256_and_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(lb, _mm256_set1_ps(-16.0)), t)
    }

    /// Adds 16 f32 values (two vectors) into 16 f64 lanes (four vectors), value j into lane j.
    #[target_feature(enable = "avx2")]
    unsafe fn add_wide(acc: &mut [__m256d; 4], lo: __m256, hi: __m256) {
        acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(lo)));
        acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(lo)));
        acc[2] = _mm256_add_pd(acc[2], _mm256_cvtps_pd(_mm256_castps256_ps128(hi)));
        acc[3] = _mm256_add_pd(acc[3], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(hi)));
    }

    #[target_feature(enable = "avx2")]
    unsafe fn load(acc: &[f64; LANES]) -> [__m256d; 4] {
        let p = acc.as_ptr();
        [_mm256_loadu_pd(p), _mm256_loadu_pd(p.add(4)), _mm256_loadu_pd(p.add(8)), _mm256_loadu_pd(p.add(12))]
    }

    #[target_feature(enable = "avx2")]
    unsafe fn store(v: [__m256d; 4], acc: &mut [f64; LANES]) {
        let p = acc.as_mut_ptr();
        for (i, x) in v.into_iter().enumerate() {
            _mm256_storeu_pd(p.add(4 * i), x);
        }
    }

    #[target_feature(enable = "avx2")]
    pub unsafe fn sum_exp_blocks(xs: &[f32], max: f32, lanes: &mut [f64; LANES]) {
        let mut acc = load(lanes);
        let m = _mm256_set1_ps(max);
        for b in xs.chunks_exact(LANES) {
            let lo = exp8(_mm256_sub_ps(_mm256_loadu_ps(b.as_ptr()), m));
            let hi = exp8(_mm256_sub_ps(_mm256_loadu_ps(b.as_ptr().add(8)), m));
            add_wide(&mut acc, lo, hi);
        }
        store(acc, lanes);
    }

    #[target_feature(enable = "avx2")]
    pub unsafe fn kl_blocks(codes: &[u16], logits: &[f32], k: (f32, f32, f32), lanes: &mut [f64; LANES]) {
        let mut acc = load(lanes);
        let (scale, min_log_prob, log_norm) = (_mm256_set1_ps(k.0), _mm256_set1_ps(k.1), _mm256_set1_ps(k.2));
        for (c, l) in codes.chunks_exact(LANES).zip(logits.chunks_exact(LANES)) {
            let q = _mm256_loadu_si256(c.as_ptr().cast());
            let lo = kl8(_mm256_castsi256_si128(q), _mm256_loadu_ps(l.as_ptr()), scale, min_log_prob, log_norm);
            let hi = kl8(
                _mm256_extracti128_si256::<1>(q),
                _mm256_loadu_ps(l.as_ptr().add(8)),
                scale,
                min_log_prob,
                log_norm,
            );
            add_wide(&mut acc, lo, hi);
        }
        store(acc, lanes);
    }
}

/// One scored position, computed as in llama-perplexity's `log_softmax(..., kl_divergence_result&)`:
/// the model's `logits` against the reference's record (`codes` decoded as `scale · q + min_log_prob`).
pub struct Scored {
    pub max: f32,
    pub imax: usize,
    /// ln Σ e^(logit − max).
    pub lse: f32,
    /// Σ p_base · (log p_base − log q) over the reference's tokens with log-probability above −16.
    pub kld: f64,
    pub imax_base: usize,
}

/// Scores one position: see [`Scored`].
pub fn score(logits: &[f32], codes: &[u16], scale: f32, min_log_prob: f32) -> Scored {
    let (max, imax) = max_first(logits);
    let lse = sum_exp(logits, max).ln() as f32;
    let log_norm = max + lse;
    let k = (scale, min_log_prob, log_norm);
    let mut lanes = [0f64; LANES];
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: the CPU has AVX2.
        unsafe { avx2::kl_blocks(codes, logits, k, &mut lanes) };
    } else {
        kl_blocks(codes, logits, k, &mut lanes);
    }
    #[cfg(not(target_arch = "x86_64"))]
    kl_blocks(codes, logits, k, &mut lanes);
    let mut kld = lanes.iter().sum::<f64>();
    let whole = codes.len().min(logits.len()) / LANES * LANES;
    for (&q, &x) in codes[whole..].iter().zip(&logits[whole..]) {
        kld += kl_term(q, x, scale, min_log_prob, log_norm);
    }
    // The reference's top token: the largest log-probability, the first of equals. A record's log-probability
    // rises with its code when scale > 0 (distinct codes are at least scale ≈ 2.4e-4 apart, far above an f32
    // step at |lb| ≤ 16, so no two collide), falls when scale < 0, and is constant when scale is 0.
    let imax_base = if scale > 0.0 {
        first_of(codes, codes.iter().copied().max())
    } else if scale < 0.0 {
        first_of(codes, codes.iter().copied().min())
    } else {
        0
    };
    Scored { max, imax, lse, kld, imax_base }
}

fn first_of(codes: &[u16], value: Option<u16>) -> usize {
    value.and_then(|v| codes.iter().position(|&q| q == v)).unwrap_or(0)
}

/// The reference's record of one position, as llama-perplexity's `log_softmax(int, const float*, uint16_t*, int)`
/// writes it: (scale, min log-prob, ln Σ e^(logit − max), max), with the codes written into `codes`.
pub fn encode(logits: &[f32], codes: &mut [u16]) -> (f32, f32, f32, f32) {
    let (max, _) = max_first(logits);
    let mut lanes = [f32::INFINITY; LANES];
    let blocks = logits.chunks_exact(LANES);
    let rest = blocks.remainder();
    for b in blocks {
        for (m, &x) in lanes.iter_mut().zip(b) {
            *m = if x < *m { x } else { *m };
        }
    }
    let mut min = lanes.iter().copied().fold(f32::INFINITY, |a, b| if b < a { b } else { a });
    for &x in rest {
        min = if x < min { x } else { min };
    }
    let min = min.max(max - 16.0);
    let lse = sum_exp(logits, max).ln() as f32;
    let min_log_prob = min - max - lse;
    let scale = (max - min) / 65535.0;
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (c, &l) in codes.iter_mut().zip(logits) {
            *c = if l > min { nearest_int(inv * (l - min)) as u16 } else { 0 };
        }
    } else {
        codes.iter_mut().for_each(|c| *c = 0);
    }
    (scale, min_log_prob, lse, max)
}

/// ggml's round-half-to-even via the 1.5·2^23 trick (spec §2.1 `nearest_int`).
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_of_the_c_library_on_its_range() {
        let mut worst = 0u32;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let (ours, libm) = (exp(x), x.exp());
            worst = worst.max(ours.to_bits().abs_diff(libm.to_bits()));
            x += 1.0e-3;
        }
        assert!(worst <= 2, "worst difference {worst} ulp");
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
    }

    /// The AVX2 loops and the portable ones give the same bits (where the CPU has AVX2).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_and_portable_loops_agree_bit_for_bit() {
        if !avx2() {
            eprintln!("SKIPPED: this CPU has no AVX2, so there is no second path to compare");
            return;
        }
        let n = 49152;
        let logits: Vec<f32> = (0..n).map(|i| ((i * 7919 % 10007) as f32) / 97.0 - 95.0).collect();
        let codes: Vec<u16> = (0..n).map(|i| (i * 1237 % 65535) as u16).collect();
        let (mut a, mut b) = ([0f64; LANES], [0f64; LANES]);
        sum_exp_blocks(&logits, 3.0, &mut a);
        // SAFETY: the CPU has AVX2.
        unsafe { avx2::sum_exp_blocks(&logits, 3.0, &mut b) };
        assert_eq!(a.map(f64::to_bits), b.map(f64::to_bits));
        let k = (2.4e-4, -15.9, 1.25);
        let (mut a, mut b) = ([0f64; LANES], [0f64; LANES]);
        kl_blocks(&codes, &logits, k, &mut a);
        // SAFETY: the CPU has AVX2.
        unsafe { avx2::kl_blocks(&codes, &logits, k, &mut b) };
        assert_eq!(a.map(f64::to_bits), b.map(f64::to_bits));
        assert!(a.iter().all(|v| *v != 0.0), "every lane has terms above the floor: {a:?}");
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
        assert_eq!(nearest_int(65534.6), 65535);
    }

    #[test]
    fn blocks_and_remainders_give_the_scalar_results() {
        // 16·3 + 5 values: whole blocks and a remainder; the maximum twice, in the remainder the second time.
        let xs: Vec<f32> = (0..53).map(|i| ((i * 37 % 53) as f32 - 40.0) / 3.0).collect();
        let (max, at) = max_first(&xs);
        let want = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!((max, at), (want, xs.iter().position(|&x| x == want).unwrap()));
        let scalar: f64 = xs.iter().map(|&x| f64::from(exp(x - max))).sum();
        assert!((sum_exp(&xs, max) - scalar).abs() <= 1e-12 * scalar);
        let codes: Vec<u16> = (0..53).map(|i| (i * 1237 % 65535) as u16).collect();
        let top = codes.iter().enumerate().max_by_key(|&(i, &q)| (q, std::cmp::Reverse(i))).unwrap().0;
        assert_eq!(score(&xs, &codes, 2.4e-4, -16.5).imax_base, top);
    }
}

#[cfg(test)]
mod timing {
    #[test]
    #[ignore]
    fn time_kernels() {
        let n = 49152;
        let logits: Vec<f32> = (0..n).map(|i| ((i * 7919 % 10007) as f32) / 400.0 - 20.0).collect();
        let codes: Vec<u16> = (0..n).map(|i| (i * 1237 % 65535) as u16).collect();
        let t = std::time::Instant::now();
        let mut acc = 0.0;
        for _ in 0..1000 {
            acc += super::score(&logits, &codes, 2.4e-4, -16.5).kld;
        }
        eprintln!("score: {:.2} ns/elt ({acc})", t.elapsed().as_nanos() as f64 / 1000.0 / n as f64);
        let t = std::time::Instant::now();
        for _ in 0..1000 {
            acc += super::sum_exp(&logits, 0.0);
        }
        eprintln!("sum_exp: {:.2} ns/elt ({acc})", t.elapsed().as_nanos() as f64 / 1000.0 / n as f64);
        let t = std::time::Instant::now();
        for _ in 0..1000 {
            acc += logits.iter().map(|&l| f64::from(l.exp())).sum::<f64>();
        }
        eprintln!("libm sum: {:.2} ns/elt ({acc})", t.elapsed().as_nanos() as f64 / 1000.0 / n as f64);
        let t = std::time::Instant::now();
        for _ in 0..1000 {
            acc += super::max_first(&logits).0 as f64;
        }
        eprintln!("max_first: {:.2} ns/elt ({acc})", t.elapsed().as_nanos() as f64 / 1000.0 / n as f64);
    }
}
