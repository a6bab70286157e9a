//! Scalar primitives and the scale-search helpers of `ggml/src/ggml-quants.c`, step for step.
//!
//! The search helpers are sensitive to every rounding: accumulators are f32 and sequential, products associate left
//! to right (`w*x*l` is `(w·x)·l`) and integers become floats inside the products, exactly as the C does. Rust never
//! fuses `a * b + c`, which matches ggml-base built for baseline x86-64 (no FMA).

/// Scales whose magnitude stays below this are treated as an all-zero group (`GROUP_MAX_EPS`).
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// `N` consecutive values of `s` from `at`.
#[inline(always)]
pub(crate) fn sub<const N: usize>(s: &[f32], at: usize) -> [f32; N] {
    std::array::from_fn(|i| s[at + i])
}

/// Round to nearest, ties to **even** (`ggml-quants.c::nearest_int`).
///
/// Uses the same trick as the C (add 1.5·2^23 so the FPU rounds, then read the mantissa bits) rather than
/// `round_ties_even`, so that even inputs outside the valid range |f| ≤ 4194303 (or NaN, which gives 0) produce the
/// same integer as a release build of ggml, where the range `assert` is compiled out.
#[inline]
pub fn nearest_int(f: f32) -> i32 {
    let bits = (f + 12_582_912.0).to_bits() as i32;
    (bits & 0x007F_FFFF) - 0x0040_0000
}

/// `(int32_t)f` as x86-64 `cvttss2si` computes it: truncation toward zero, and `i32::MIN` (the "integer
/// indefinite") for NaN and out-of-range values.
///
/// The legacy `_ref` quantizers convert floats with C casts such as `(int8_t)(x*id + 8.5f)`; GCC on x86-64 does that
/// with a 32-bit `cvttss2si` and keeps the low byte. For ordinary inputs the value is in range and this is plain
/// truncation; it only matters when a subnormal scale makes `1/d` infinite.
#[inline]
pub(crate) fn c_trunc_i32(f: f32) -> i32 {
    // 2^31 is exactly representable; everything in [-2^31, 2^31) truncates into range, NaN is in no range.
    if !(-2_147_483_648.0..2_147_483_648.0).contains(&f) {
        i32::MIN
    } else {
        f as i32
    }
}

/// `1.5·2^23`: adding it to a float of magnitude below 2^22 leaves the round-half-even integer in the low mantissa
/// bits (the `nearest_int` trick).
pub(crate) const MAGIC: f32 = 12_582_912.0;

/// Magnitudes below this take the branch-free paths of [`c_round_block`] and [`c_trunc_block`]: 2^21 keeps
/// `y + MAGIC` inside [2^23, 2^24), where the trick is exact (at 2^22 − 0.5 it would already round up to 2^24).
pub(crate) const FAST_LIMIT: f32 = 2_097_152.0;

/// `(int32_t)roundf(y)` for every element, as the `_ref` quantizers compute it: ties away from zero, and
/// [`c_trunc_i32`]'s result for values out of range.
///
/// Bit for bit the scalar `c_trunc_i32(y.round())`, but branch-free when every `|y| < 2^21` (always, for real
/// blocks): `roundf` is a libm call the compiler cannot vectorize, so it is rebuilt from the round-half-even of
/// the magic-number trick plus a fix-up on exact ties, where the two disagree.
#[inline(always)]
pub(crate) fn c_round_block<const N: usize>(y: &[f32; N]) -> [i32; N] {
    let mut out = [0i32; N];
    if !all_small(y) {
        for (o, v) in out.iter_mut().zip(y) {
            *o = c_trunc_i32(v.round());
        }
        return out;
    }
    for (o, &v) in out.iter_mut().zip(y) {
        let (n, nf) = round_even_small(v);
        // A tie that round-half-even took toward zero goes away from zero instead.
        let up = (v - nf == 0.5) & (v > 0.0);
        let down = (v - nf == -0.5) & (v < 0.0);
        *o = n + i32::from(up) - i32::from(down);
    }
    out
}

/// `(int32_t)y` for every element (x86-64 `cvttss2si`, see [`c_trunc_i32`]), branch-free when every `|y| < 2^21`:
/// truncation is the round-half-even integer stepped one toward zero where it overshot.
#[inline(always)]
pub(crate) fn c_trunc_block<const N: usize>(y: &[f32; N]) -> [i32; N] {
    let mut out = [0i32; N];
    if !all_small(y) {
        for (o, &v) in out.iter_mut().zip(y) {
            *o = c_trunc_i32(v);
        }
        return out;
    }
    for (o, &v) in out.iter_mut().zip(y) {
        let (n, nf) = round_even_small(v);
        let over_up = (nf > v) & (v >= 0.0);
        let over_down = (nf < v) & (v < 0.0);
        *o = n - i32::from(over_up) + i32::from(over_down);
    }
    out
}

/// Whether every `|y| <` [`FAST_LIMIT`] (false for NaN): a fold, not a short-circuit, so it vectorizes.
#[inline]
fn all_small<const N: usize>(y: &[f32; N]) -> bool {
    y.iter().fold(true, |ok, v| ok & (v.abs() < FAST_LIMIT))
}

/// Round-half-even of `|y| <` [`FAST_LIMIT`], as an integer and as the (exact) float.
#[inline]
fn round_even_small(y: f32) -> (i32, f32) {
    let s = y + MAGIC;
    ((s.to_bits() as i32 & 0x007F_FFFF) - 0x0040_0000, s - MAGIC)
}

/// The value of largest magnitude (the first one, on ties) and its magnitude: the `max`/`amax` scan that
/// `make_qx_quants` and `make_q3_quants` both open with.
fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    (max, amax)
}

/// `make_qx_quants(n, nmax, x, L, rmse_type = 1, qw)` with importance weights `qw` (the only form the legacy
/// `_impl` quantizers use). Writes `L` in `0..2·nmax` and returns the scale.
///
/// A symmetric scale search: start from `−nmax/max`, then try the 18 neighbouring scales `−(nmax ± 0.1·k)/max` and
/// keep the one that maximises `sumlx²/suml2`, i.e. minimises the weighted squared error.
pub(crate) fn make_qx_quants<const N: usize>(nmax: i32, x: &[f32; N], l_out: &mut [i8; N], qw: &[f32; N]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let clamp = |l: i32| l.min(nmax - 1).max(-nmax); // MAX(-nmax, MIN(nmax-1, l))
                                                     // `w*x[i]*l` in C is `(w*x[i])*l`: the product is the same float whichever pass computes it, so it is computed
                                                     // once. The levels of a step are computed in one pass (which the compiler vectorizes) before the two sums,
                                                     // which keep C's serial order.
    let wx: [f32; N] = std::array::from_fn(|i| qw[i] * x[i]);
    let levels = |iscale: f32| -> [i32; N] { std::array::from_fn(|i| clamp(nearest_int(iscale * x[i]))) };
    let sums = |l: &[i32; N]| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for i in 0..N {
            let lf = l[i] as f32;
            sumlx += wx[i] * lf;
            suml2 += qw[i] * lf * lf;
        }
        (sumlx, suml2)
    };

    let l = levels(-(nmax as f32) / max);
    for i in 0..N {
        l_out[i] = (l[i] + nmax) as i8;
    }
    let (sumlx, suml2) = sums(&l);
    // C tests the float for truthiness: NaN counts as non-zero.
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        let l = levels(-(nmax as f32 + 0.1f32 * is as f32) / max);
        let (sumlx, suml2) = sums(&l);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..N {
                l_out[i] = (nmax + l[i]) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants(n, nmax, x, L, do_rmse = true)`: the symmetric search of `quantize_row_q3_K_ref`. Writes `L` in
/// `0..2·nmax` and returns the scale. The one-group form: `lanes::make_q3_quants` falls back to it for groups
/// outside its fast path, and is tested against it.
///
/// Same steps as ggml's `make_q3_quants`: levels from `−nmax/max`, then up to 5 rounds of single-level refinement
/// with weights `x²` (recomputed per element, as the C does), accepting a change when it raises `sumlx²/suml2`.
pub(crate) fn make_q3_quants<const N: usize>(nmax: i32, x: &[f32; N], l_out: &mut [i8; N]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let clamp = |l: i32| l.min(nmax - 1).max(-nmax); // MAX(-nmax, MIN(nmax-1, l))
    let iscale = -(nmax as f32) / max; // `-nmax / max`: the int is negated, then converted
    let mut l = [0i32; N];
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..N {
        l[i] = clamp(nearest_int(iscale * x[i]));
        let w = x[i] * x[i];
        let lf = l[i] as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..N {
            let w = x[i] * x[i];
            let li = l[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = clamp(nearest_int(x[i] * sl2 / slx));
                if new_l != l[i] {
                    let nf = new_l as f32;
                    slx += w * x[i] * nf;
                    sl2 += w * nf * nf;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for i in 0..N {
        l_out[i] = (l[i] + nmax) as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// `make_qkx3_quants(n, nmax, x, weights, L, &the_min, Laux, rmin, rdelta, nstep, use_mad)` with weights given.
/// Writes `L` in `0..=nmax` and returns `(scale, the_min)`, where `the_min` is the **positive** offset
/// (`x ≈ scale·L − the_min`), as in the C.
///
/// An asymmetric search: for each candidate `iscale = (rmin + rdelta·is + nmax)/(max − min)` the quants are fixed and
/// the best scale and min follow by weighted least squares; the candidate with the smallest weighted error wins.
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx3_quants<const N: usize>(
    nmax: i32,
    x: &[f32; N],
    weights: &[f32; N],
    l_out: &mut [u8; N],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let mut laux = [0u8; N];
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..N {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max <= min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };

    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_mad = 0.0f32;
    for i in 0..N {
        let l = nearest_int(iscale * (x[i] - min));
        l_out[i] = l.min(nmax).max(0) as u8;
        let diff = scale * l_out[i] as f32 + min - x[i];
        best_mad += weights[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for i in 0..N {
            let l = nearest_int(iscale * (x[i] - min)).min(nmax).max(0);
            laux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut mad = 0.0f32;
            for i in 0..N {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                mad += weights[i] * err(diff);
            }
            if mad < best_mad {
                *l_out = laux;
                best_mad = mad;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// `make_qp_quants(n, nmax, x, L, quant_weights)`: quantizes the non-negative sub-block scales (or mins) of the
/// K-quant `_impl` functions to `0..=nmax` and returns the super-block scale; IQ2_XXS quantizes its sub-block values
/// with it.
///
/// A scale search over `(nmax + 0.1·is)/max` for `is` in −4..4, then up to 5 rounds of single-level refinement. The
/// levels live in a `uint8_t` array in the C, so the first pass (no clamp) and every comparison go through `u8`.
/// IQ2_XXS's values may be negative (its parity-flipped elements): a level below 0 is then stored wrapped (−1 as
/// 255) and read back so, while the sums of the final pass use the signed level, as in the C.
#[inline(always)]
pub(crate) fn make_qp_quants<const N: usize>(nmax: i32, x: &[f32; N], l_out: &mut [u8; N], qw: &[f32; N]) -> f32 {
    let mut max = 0.0f32;
    for &v in x {
        max = if max > v { max } else { v }; // MAX(max, x[i])
    }
    // All zero below `GROUP_MAX_EPS` (an exact-zero test in older llama.cpp; 0c1e570 compares with the epsilon).
    if max < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for i in 0..N {
        l_out[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for i in 0..N {
        let diff = x[i] - scale * l_out[i] as f32;
        best_mse += qw[i] * diff * diff;
    }
    // The 8 candidates `is = −4..−1, 1..4`, one per lane: each lane sums its own errors in element order, as the
    // C's loop per candidate does; then the first strict improvement in candidate order wins, as there.
    let iscale_is: [f32; 8] = std::array::from_fn(|c| {
        let is = if c < 4 { c as i32 - 4 } else { c as i32 - 3 };
        (0.1f32 * is as f32 + nmax as f32) / max
    });
    let scale_is = iscale_is.map(|v| 1.0 / v);
    let mut mse = [0.0f32; 8];
    for i in 0..N {
        for c in 0..8 {
            let l = nearest_int(iscale_is[c] * x[i]).min(nmax);
            let diff = x[i] - scale_is[c] * l as f32;
            mse[c] += qw[i] * diff * diff;
        }
    }
    for c in 0..8 {
        if mse[c] < best_mse {
            best_mse = mse[c];
            iscale = iscale_is[c];
        }
    }
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..N {
        let l = nearest_int(iscale * x[i]).min(nmax);
        l_out[i] = l as u8;
        let w = qw[i];
        let lf = l as f32; // the int, not the stored byte
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..N {
            let w = qw[i];
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != i32::from(l_out[i]) {
                    let nf = new_l as f32;
                    slx += w * x[i] * nf;
                    sl2 += w * nf * nf;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    // All-zero weights leave `suml2` at 0: the scale is then 0, not 0/0.
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(2.5000002), 3);
        assert_eq!(nearest_int(-7.49), -7);
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
        assert_eq!(nearest_int(-4_194_303.0), -4_194_303);
        assert_eq!(nearest_int(f32::NAN), 0);
    }

    #[test]
    fn nearest_int_agrees_with_round_ties_even_in_range() {
        let mut f = -40.0f32;
        while f < 40.0 {
            assert_eq!(nearest_int(f), f.round_ties_even() as i32, "{f}");
            f += 0.03125; // exact multiples of 1/32 hit every tie
        }
    }

    #[test]
    fn c_trunc_matches_cvttss2si() {
        assert_eq!(c_trunc_i32(16.5), 16);
        assert_eq!(c_trunc_i32(-0.7), 0);
        assert_eq!(c_trunc_i32(f32::NAN), i32::MIN);
        assert_eq!(c_trunc_i32(f32::INFINITY), i32::MIN);
        assert_eq!(c_trunc_i32(2_147_483_648.0), i32::MIN);
        assert_eq!(c_trunc_i32(-2_147_483_648.0), i32::MIN);
    }

    /// Every float from a dense set of small values, ties, near-ties and out-of-range or non-finite values.
    fn rounding_cases() -> Vec<f32> {
        let mut v: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.25).collect();
        for k in [0.5f32, 1.5, 2.5, 127.5, 4_194_303.5, 2_097_152.5] {
            for x in [k, -k, f32::from_bits(k.to_bits() + 1), f32::from_bits(k.to_bits() - 1)] {
                v.extend([x, -x]);
            }
        }
        v.extend([0.0, -0.0, 4_194_304.0, -4_194_304.0, 3e9, -3e9, f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
        v.extend([f32::MIN_POSITIVE, -f32::MIN_POSITIVE, 1e-40, 0.49999997, -0.49999997]);
        v
    }

    #[test]
    fn block_rounding_equals_the_scalar_c_conversions() {
        let cases = rounding_cases();
        // Blocks of 4 with the cases at every position, so both the fast path and the scalar fallback are taken.
        for w in cases.windows(4) {
            let y: [f32; 4] = [w[0], w[1], w[2], w[3]];
            let round: [i32; 4] = std::array::from_fn(|i| c_trunc_i32(y[i].round()));
            let trunc: [i32; 4] = std::array::from_fn(|i| c_trunc_i32(y[i]));
            assert_eq!(c_round_block(&y), round, "roundf {y:?}");
            assert_eq!(c_trunc_block(&y), trunc, "trunc {y:?}");
        }
        // And every case on the fast path: pad with zeros.
        for &x in &cases {
            let y = [x, 0.0];
            assert_eq!(c_round_block(&y)[0], c_trunc_i32(x.round()), "roundf {x}");
            assert_eq!(c_trunc_block(&y)[0], c_trunc_i32(x), "trunc {x}");
        }
    }

    #[test]
    fn make_q3_quants_levels_and_zero_group() {
        let mut l = [7i8; 4];
        assert_eq!(make_q3_quants(4, &[0.0; 4], &mut l), 0.0);
        assert_eq!(l, [0; 4]);
        // Levels are offset by nmax and lie in 0..2·nmax; within one step (−1.0 is clipped to level 3, the grid being
        // −4..3 with the scale negative).
        let x = [1.0, -0.5, 0.25, -1.0];
        let scale = make_q3_quants(4, &x, &mut l);
        assert!(l.iter().all(|&v| (0..8).contains(&v)), "{l:?}");
        for (xi, li) in x.iter().zip(l) {
            assert!((scale * (li - 4) as f32 - xi).abs() <= scale.abs() + 1e-6, "{x:?} {l:?} {scale}");
        }
    }

    #[test]
    fn make_qx_quants_zero_group() {
        let mut l = [7i8; 4];
        assert_eq!(make_qx_quants(8, &[0.0; 4], &mut l, &[1.0; 4]), 0.0);
        assert_eq!(l, [0; 4]);
    }

    #[test]
    fn make_qp_quants_tiny_group_and_zero_weights_give_scale_0() {
        // Below GROUP_MAX_EPS the group counts as zero, as in the C.
        let mut l = [9u8; 4];
        assert_eq!(make_qp_quants(4, &[1e-16, 0.0, 5e-16, 0.0], &mut l, &[1.0; 4]), 0.0);
        assert_eq!(l, [0; 4]);
        // All weights 0 (an imatrix that is 0 on these columns): 0, not 0/0.
        assert_eq!(make_qp_quants(4, &[1.0, 0.5, 0.25, 2.0], &mut l, &[0.0; 4]), 0.0);
    }

    #[test]
    fn make_qp_quants_stores_negative_levels_wrapped() {
        // IQ2_XXS's parity flip can hand in a negative value; its level −1 is kept as the C's uint8_t keeps it.
        let mut l = [0u8; 4];
        let scale = make_qp_quants(4, &[4.0, 2.0, -1.0, 3.0], &mut l, &[1.0; 4]);
        assert!(scale > 0.0);
        assert_eq!(l[2], 255, "{l:?}");
    }

    #[test]
    fn make_qkx3_quants_constant_positive_group() {
        // min is clamped to 0, so a constant positive group is still quantized (max > min = 0).
        let mut l = [0u8; 4];
        let (scale, the_min) = make_qkx3_quants(15, &[2.0; 4], &[1.0; 4], &mut l, -0.9, 0.05, 36, false);
        assert_eq!(the_min, -0.0);
        assert!((scale * l[0] as f32 - 2.0).abs() < 1e-6, "scale {scale} l {l:?}");
    }
}
