//! The scale searches of `helpers`, run on `G` groups at once: one group per SIMD lane.
//!
//! A super-block is quantized as 8 or 16 independent groups (sub-blocks), each searched with sequential f32 sums
//! whose order decides the last bit. Vectorizing *within* a group would reorder those sums; vectorizing *across*
//! groups does not: lane `g` performs exactly the operations, in exactly the order, that the scalar function
//! performs on group `g`. The data is transposed so that element `i` of every group sits in one row
//! (`[[f32; G]; N]`), every step is a plain loop over the lanes (which the compiler turns into vector
//! instructions), and every `if` becomes a per-lane select. A lane whose group takes an early exit in the scalar
//! code computes on, harmlessly (f32 arithmetic does not trap), and gets the early-exit result at the end.
//!
//! Each function equals its scalar twin in `helpers` group for group, bit for bit; the tests check that on random
//! and degenerate groups, and the golden files check the scalar functions against ggml.

use crate::helpers::{self, FAST_LIMIT, GROUP_MAX_EPS, MAGIC};

/// `x[g][i]` → `t[i][g]`.
#[inline(always)]
fn transpose<T: Copy + Default, const N: usize, const G: usize>(x: &[[T; N]; G]) -> [[T; G]; N] {
    let mut t = [[T::default(); G]; N];
    for (g, row) in x.iter().enumerate() {
        for (i, &v) in row.iter().enumerate() {
            t[i][g] = v;
        }
    }
    t
}

/// A per-lane condition as a select mask (all ones or all zeros), the form vector compares produce. Conditions
/// are combined with `&` (never `&&`), and chosen between with [`pick`] / [`pick_i`] rather than `if`, so the lane
/// loops stay free of branches and the compiler vectorizes them.
#[inline(always)]
fn mask(c: bool) -> u32 {
    (c as u32).wrapping_neg()
}

/// `m ? a : b` on the bits.
#[inline(always)]
fn pick(m: u32, a: f32, b: f32) -> f32 {
    f32::from_bits((a.to_bits() & m) | (b.to_bits() & !m))
}

/// `clamp(nearest_int(v), lo, hi)` as a float: clamping first and rounding after gives the same integer (rounding
/// is monotonic and the bounds are integers), and `(v + MAGIC) − MAGIC` rounds half to even exactly. All in float
/// registers (min, max, add, sub), with no float↔int conversions in the search loops.
///
/// Exact only for `|v| <` [`FAST_LIMIT`]: beyond it (and for NaN) ggml's `nearest_int` returns garbage bits, which
/// its clamp then turns into some level. Where `v` is not bounded by construction, the callers flag such lanes
/// ([`out_of_range`]) and redo those groups with the scalar port.
#[inline(always)]
fn level(v: f32, lo: f32, hi: f32) -> f32 {
    let v = if v < hi { v } else { hi };
    let v = if v > lo { v } else { lo };
    (v + MAGIC) - MAGIC
}

/// All ones where [`level`] would not reproduce `nearest_int` on `v` (including NaN).
#[inline(always)]
#[allow(clippy::neg_cmp_op_on_partial_ord)] // on purpose: NaN compares false, so it counts as out of range
fn out_of_range(v: f32) -> u32 {
    mask(!(v.abs() < FAST_LIMIT))
}

/// Per lane, the value of largest magnitude (the first one, on ties) and its magnitude (`helpers::signed_max`).
#[inline(always)]
fn signed_max<const N: usize, const G: usize>(xt: &[[f32; G]; N]) -> ([f32; G], [f32; G]) {
    let (mut max, mut amax) = ([0.0f32; G], [0.0f32; G]);
    for row in xt {
        for g in 0..G {
            let ax = row[g].abs();
            let take = mask(ax > amax[g]);
            amax[g] = pick(take, ax, amax[g]);
            max[g] = pick(take, row[g], max[g]);
        }
    }
    (max, amax)
}

/// [`crate::helpers::make_qx_quants`] on `G` groups of `N`: levels into `l_out[g]`, scales returned.
#[inline(always)]
pub(crate) fn make_qx_quants<const N: usize, const G: usize>(
    nmax: i32,
    x: &[[f32; N]; G],
    l_out: &mut [[i8; N]; G],
    qw: &[[f32; N]; G],
) -> [f32; G] {
    let xt = transpose(x);
    let qwt = transpose(qw);
    let (max, amax) = signed_max(&xt);
    let mut wx = [[0.0f32; G]; N];
    for i in 0..N {
        for g in 0..G {
            wx[i][g] = qwt[i][g] * xt[i][g];
        }
    }
    let (lo, hi) = (-nmax as f32, (nmax - 1) as f32);
    // Step `c` uses `iscale = −c/max`. Only the winning step's `c` is kept per lane; its levels are recomputed at
    // the end (the same operations give the same levels), which spares a select over every level at every step.
    let sums = |c: f32| {
        let mut iscale = [0.0f32; G];
        for g in 0..G {
            iscale[g] = -c / max[g];
        }
        let (mut sumlx, mut suml2) = ([0.0f32; G], [0.0f32; G]);
        for i in 0..N {
            for g in 0..G {
                let lf = level(iscale[g] * xt[i][g], lo, hi);
                sumlx[g] += wx[i][g] * lf;
                suml2[g] += qwt[i][g] * lf * lf;
            }
        }
        (sumlx, suml2)
    };

    let c0 = nmax as f32;
    let mut best_c = [c0; G];
    let (sumlx, suml2) = sums(c0);
    let mut scale = [0.0f32; G];
    let mut best = [0.0f32; G];
    for g in 0..G {
        scale[g] = pick(mask(suml2[g] != 0.0), sumlx[g] / suml2[g], 0.0);
        best[g] = scale[g] * sumlx[g];
    }
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        let c = nmax as f32 + 0.1f32 * is as f32;
        let (sumlx, suml2) = sums(c);
        for g in 0..G {
            let take = mask((suml2[g] > 0.0) & (sumlx[g] * sumlx[g] > best[g] * suml2[g]));
            scale[g] = pick(take, sumlx[g] / suml2[g], scale[g]);
            best[g] = pick(take, scale[g] * sumlx[g], best[g]);
            best_c[g] = pick(take, c, best_c[g]);
        }
    }
    for g in 0..G {
        let zero = amax[g] < GROUP_MAX_EPS;
        let iscale = -best_c[g] / max[g];
        for i in 0..N {
            let l = level(iscale * x[g][i], lo, hi) as i32;
            l_out[g][i] = if zero { 0 } else { (l + nmax) as i8 };
        }
        if zero {
            scale[g] = 0.0;
        }
    }
    scale
}

/// [`crate::helpers::make_q3_quants`] on `G` groups of `N`: levels into `l_out[g]`, scales returned.
///
/// The refinement rounds run until no lane changes a level (or 5 rounds): a group whose round changed nothing
/// would change nothing in the next round either, so running on where the scalar code stops is harmless.
#[inline(always)]
pub(crate) fn make_q3_quants<const N: usize, const G: usize>(
    nmax: i32,
    x: &[[f32; N]; G],
    l_out: &mut [[i8; N]; G],
) -> [f32; G] {
    let xt = transpose(x);
    let (max, amax) = signed_max(&xt);
    let (lo, hi) = (-nmax as f32, (nmax - 1) as f32);
    let mut iscale = [0.0f32; G];
    for g in 0..G {
        iscale[g] = -(nmax as f32) / max[g];
    }
    // Levels as floats (see `level`); `l as f32` in the C is then the level itself.
    let mut l = [[0.0f32; G]; N];
    let (mut sumlx, mut suml2) = ([0.0f32; G], [0.0f32; G]);
    for i in 0..N {
        for g in 0..G {
            let x = xt[i][g];
            l[i][g] = level(iscale[g] * x, lo, hi);
            let w = x * x;
            sumlx[g] += w * x * l[i][g];
            suml2[g] += w * l[i][g] * l[i][g];
        }
    }
    // `iscale·x` is bounded by `nmax` (`max` has the largest magnitude); the refinement's `x·sl2/slx` is not.
    let mut bad = [0u32; G];
    for _ in 0..5 {
        let mut changed = [0u32; G];
        for i in 0..N {
            for g in 0..G {
                let x = xt[i][g];
                let w = x * x;
                let li = l[i][g];
                let slx = sumlx[g] - w * x * li;
                let sl2 = suml2[g] - w * li * li;
                let v = x * sl2 / slx;
                let new_l = level(v, lo, hi);
                // Only lanes that use `new_l` (`slx > 0`) need it exact.
                bad[g] |= mask(slx > 0.0) & out_of_range(v);
                let slx_new = slx + w * x * new_l;
                let sl2_new = sl2 + w * new_l * new_l;
                let take = mask(
                    (slx > 0.0)
                        & (new_l != li)
                        & (sl2_new > 0.0)
                        & (slx_new * slx_new * suml2[g] > sumlx[g] * sumlx[g] * sl2_new),
                );
                l[i][g] = pick(take, new_l, li);
                sumlx[g] = pick(take, slx_new, sumlx[g]);
                suml2[g] = pick(take, sl2_new, suml2[g]);
                changed[g] |= take;
            }
        }
        if changed.iter().all(|&c| c == 0) {
            break;
        }
    }
    let mut scale = [0.0f32; G];
    for g in 0..G {
        if bad[g] != 0 {
            scale[g] = helpers::make_q3_quants(nmax, &x[g], &mut l_out[g]);
            continue;
        }
        let zero = amax[g] < GROUP_MAX_EPS;
        for i in 0..N {
            l_out[g][i] = if zero { 0 } else { (l[i][g] as i32 + nmax) as i8 };
        }
        scale[g] = if !zero && suml2[g] > 0.0 { sumlx[g] / suml2[g] } else { 0.0 };
    }
    scale
}

/// [`crate::helpers::make_qkx3_quants`] on `G` groups of `N`: levels into `l_out[g]`, `(scale, the_min)` per
/// group returned.
///
/// Also ggml's `make_qkx2_quants` (the K-quant `_ref` search), which differs from `make_qkx3_quants` with weights
/// given only in its degenerate test (`max == min` instead of `max <= min`). After `min` is clamped to at most 0,
/// `max < min` cannot happen for finite input (which `quantize` guarantees), so the two agree.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn make_qkx3_quants<const N: usize, const G: usize>(
    nmax: i32,
    x: &[[f32; N]; G],
    weights: &[[f32; N]; G],
    l_out: &mut [[u8; N]; G],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> ([f32; G], [f32; G]) {
    let xt = transpose(x);
    let wt = transpose(weights);
    let mut min = xt[0];
    let mut max = xt[0];
    let mut sum_w = wt[0];
    let mut sum_x = [0.0f32; G];
    for g in 0..G {
        sum_x[g] = sum_w[g] * xt[0][g];
    }
    for i in 1..N {
        for g in 0..G {
            let x = xt[i][g];
            min[g] = pick(mask(x < min[g]), x, min[g]);
            max[g] = pick(mask(x > max[g]), x, max[g]);
            sum_w[g] += wt[i][g];
            sum_x[g] += wt[i][g] * x;
        }
    }
    for m in &mut min {
        *m = pick(mask(*m > 0.0), 0.0, *m);
    }
    // The scalar code returns `(0, -min)` with all-zero levels for these groups.
    let degenerate: [bool; G] = std::array::from_fn(|g| max[g] <= min[g]);
    let (lo, hi) = (0.0f32, nmax as f32);

    // The levels of the best candidate are `level(iscale·(x − min))` for the `iscale` and `min` it was computed
    // with; those two are kept per lane and the levels recomputed at the end (see `make_qx_quants`).
    let mut iscale = [0.0f32; G];
    let mut scale = [0.0f32; G];
    for g in 0..G {
        iscale[g] = nmax as f32 / (max[g] - min[g]);
        scale[g] = 1.0 / iscale[g];
    }
    let mut best_iscale = iscale;
    let mut best_from = min;
    let mut best_mad = [0.0f32; G];
    // `iscale·(x − min) <= c`, but below 0 it is unbounded once `min` has moved up to a candidate's, and NaN for a
    // subnormal range (`iscale` infinite).
    let mut bad = [0u32; G];
    for i in 0..N {
        for g in 0..G {
            let v = iscale[g] * (xt[i][g] - min[g]);
            bad[g] |= out_of_range(v);
            let lf = level(v, lo, hi);
            let diff = scale[g] * lf + min[g] - xt[i][g];
            best_mad[g] += wt[i][g] * err(use_mad, diff);
        }
    }
    if nstep >= 1 {
        let mut laux = [[0.0f32; G]; N];
        for is in 0..=nstep {
            // `min` is the best candidate's so far, as in the C, which moves the grid with it.
            let c = rmin + rdelta * is as f32 + nmax as f32;
            for g in 0..G {
                iscale[g] = c / (max[g] - min[g]);
            }
            let (mut sum_l, mut sum_l2, mut sum_xl) = ([0.0f32; G], [0.0f32; G], [0.0f32; G]);
            for i in 0..N {
                for g in 0..G {
                    let v = iscale[g] * (xt[i][g] - min[g]);
                    bad[g] |= out_of_range(v);
                    let lf = level(v, lo, hi);
                    laux[i][g] = lf;
                    let w = wt[i][g];
                    sum_l[g] += w * lf;
                    sum_l2[g] += w * lf * lf;
                    sum_xl[g] += w * lf * xt[i][g];
                }
            }
            let mut this_scale = [0.0f32; G];
            let mut this_min = [0.0f32; G];
            let mut d_pos = [0u32; G];
            for g in 0..G {
                let d = sum_w[g] * sum_l2[g] - sum_l[g] * sum_l[g];
                d_pos[g] = mask(d > 0.0);
                let s = (sum_w[g] * sum_xl[g] - sum_x[g] * sum_l[g]) / d;
                let m = (sum_l2[g] * sum_x[g] - sum_l[g] * sum_xl[g]) / d;
                let clip = mask(m > 0.0);
                this_min[g] = pick(clip, 0.0, m);
                this_scale[g] = pick(clip, sum_xl[g] / sum_l2[g], s);
            }
            let mut mad = [0.0f32; G];
            for i in 0..N {
                for g in 0..G {
                    let diff = this_scale[g] * laux[i][g] + this_min[g] - xt[i][g];
                    mad[g] += wt[i][g] * err(use_mad, diff);
                }
            }
            for g in 0..G {
                let take = d_pos[g] & mask(mad[g] < best_mad[g]);
                best_mad[g] = pick(take, mad[g], best_mad[g]);
                scale[g] = pick(take, this_scale[g], scale[g]);
                best_iscale[g] = pick(take, iscale[g], best_iscale[g]);
                best_from[g] = pick(take, min[g], best_from[g]);
                min[g] = pick(take, this_min[g], min[g]);
            }
        }
    }
    let mut the_min = [0.0f32; G];
    for g in 0..G {
        if bad[g] != 0 && !degenerate[g] {
            let w = &weights[g];
            (scale[g], the_min[g]) =
                helpers::make_qkx3_quants(nmax, &x[g], w, &mut l_out[g], rmin, rdelta, nstep, use_mad);
            continue;
        }
        for i in 0..N {
            let l = level(best_iscale[g] * (x[g][i] - best_from[g]), lo, hi) as u8;
            l_out[g][i] = if degenerate[g] { 0 } else { l };
        }
        scale[g] = if degenerate[g] { 0.0 } else { scale[g] };
        the_min[g] = -min[g];
    }
    (scale, the_min)
}

/// The error measure of `make_qkx3_quants`: `|diff|` with `use_mad`, else `diff²`.
#[inline(always)]
fn err(use_mad: bool, diff: f32) -> f32 {
    if use_mad {
        diff.abs()
    } else {
        diff * diff
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::helpers;

    /// Groups of `N` pseudo-random values with outliers, plus degenerate ones: all zero, constant, one value, tiny,
    /// subnormal.
    fn groups<const N: usize, const G: usize>(seed: u64) -> [[f32; N]; G] {
        let mut next = crate::test_uniform(seed);
        std::array::from_fn(|g| {
            std::array::from_fn(|i| match (seed as usize + g) % 9 {
                0 => 0.0,
                1 => 0.75,
                2 => -0.5,
                3 if i == 3 => 2.0,
                3 => 0.0,
                4 => next() * 1e-20,
                5 if i % 5 == 0 => next() * 16.0,
                6 => next().abs(),
                // A subnormal range: `nmax/(max − min)` overflows to infinity, so the searches' levels leave
                // `level`'s exact range and these groups take the scalar fallback.
                7 => next().abs() * 1e-39,
                _ => next(),
            })
        })
    }

    fn check<const N: usize, const G: usize>(seed: u64) {
        let x: [[f32; N]; G] = groups(seed);
        let w2: [[f32; N]; G] = std::array::from_fn(|g| std::array::from_fn(|i| x[g][i] * x[g][i]));
        let wabs: [[f32; N]; G] = std::array::from_fn(|g| std::array::from_fn(|i| 0.3 + x[g][i].abs()));

        let mut l = [[0i8; N]; G];
        let s = make_qx_quants(32, &x, &mut l, &w2);
        let mut l3 = [[0i8; N]; G];
        let s3 = make_q3_quants(4, &x, &mut l3);
        let mut lk = [[0u8; N]; G];
        let (sk, mk) = make_qkx3_quants(15, &x, &wabs, &mut lk, -1.0, 0.1, 20, false);
        let mut lm = [[0u8; N]; G];
        let (sm, mm) = make_qkx3_quants(3, &x, &wabs, &mut lm, -0.5, 0.1, 15, true);
        for g in 0..G {
            let mut want = [0i8; N];
            let ws = helpers::make_qx_quants(32, &x[g], &mut want, &w2[g]);
            assert_eq!((s[g].to_bits(), l[g]), (ws.to_bits(), want), "make_qx_quants group {g}: {:?}", x[g]);
            let ws = helpers::make_q3_quants(4, &x[g], &mut want);
            assert_eq!((s3[g].to_bits(), l3[g]), (ws.to_bits(), want), "make_q3_quants group {g}: {:?}", x[g]);
            let mut want = [0u8; N];
            let (ws, wm) = helpers::make_qkx3_quants(15, &x[g], &wabs[g], &mut want, -1.0, 0.1, 20, false);
            assert_eq!((sk[g].to_bits(), mk[g].to_bits(), lk[g]), (ws.to_bits(), wm.to_bits(), want), "qkx3 {g}");
            let (ws, wm) = helpers::make_qkx3_quants(3, &x[g], &wabs[g], &mut want, -0.5, 0.1, 15, true);
            assert_eq!((sm[g].to_bits(), mm[g].to_bits(), lm[g]), (ws.to_bits(), wm.to_bits(), want), "mad {g}");
        }
    }

    #[test]
    fn lanes_equal_the_scalar_searches() {
        for seed in 0..200 {
            check::<16, 16>(seed);
            check::<32, 8>(seed * 7 + 3);
        }
    }
}
