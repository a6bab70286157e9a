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

use crate::helpers::{nearest_int, GROUP_MAX_EPS};

/// `x[g][i]` → `t[i][g]`.
fn transpose<T: Copy + Default, const N: usize, const G: usize>(x: &[[T; N]; G]) -> [[T; G]; N] {
    let mut t = [[T::default(); G]; N];
    for (g, row) in x.iter().enumerate() {
        for (i, &v) in row.iter().enumerate() {
            t[i][g] = v;
        }
    }
    t
}

/// `MAX(-nmax, MIN(nmax-1, l))` and friends: `l` clamped to `lo..=hi`, as `min` then `max`.
#[inline(always)]
fn clamp(l: i32, lo: i32, hi: i32) -> i32 {
    l.min(hi).max(lo)
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

/// `m ? a : b` on the bits.
#[inline(always)]
fn pick_i(m: u32, a: i32, b: i32) -> i32 {
    ((a as u32 & m) | (b as u32 & !m)) as i32
}

/// Per lane, the value of largest magnitude (the first one, on ties) and its magnitude (`helpers::signed_max`).
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

    let mut l = [[0i32; G]; N];
    qx_levels(-(nmax as f32), nmax, &max, &xt, &mut l);
    let mut best_l = l;
    let (sumlx, suml2) = qx_sums(&l, &wx, &qwt);
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
        qx_levels(-(nmax as f32 + 0.1f32 * is as f32), nmax, &max, &xt, &mut l);
        let (sumlx, suml2) = qx_sums(&l, &wx, &qwt);
        let mut take = [0u32; G];
        for g in 0..G {
            take[g] = mask((suml2[g] > 0.0) & (sumlx[g] * sumlx[g] > best[g] * suml2[g]));
            scale[g] = pick(take[g], sumlx[g] / suml2[g], scale[g]);
            best[g] = pick(take[g], scale[g] * sumlx[g], best[g]);
        }
        for i in 0..N {
            for g in 0..G {
                best_l[i][g] = pick_i(take[g], l[i][g], best_l[i][g]);
            }
        }
    }
    for g in 0..G {
        let zero = amax[g] < GROUP_MAX_EPS;
        for i in 0..N {
            l_out[g][i] = if zero { 0 } else { (best_l[i][g] + nmax) as i8 };
        }
        if zero {
            scale[g] = 0.0;
        }
    }
    scale
}

/// The levels of one step of `make_qx_quants`: `clamp(nearest_int(iscale·x))` with `iscale = c/max` per lane.
#[inline(always)]
fn qx_levels<const N: usize, const G: usize>(
    c: f32,
    nmax: i32,
    max: &[f32; G],
    xt: &[[f32; G]; N],
    l: &mut [[i32; G]; N],
) {
    let mut iscale = [0.0f32; G];
    for g in 0..G {
        iscale[g] = c / max[g];
    }
    for i in 0..N {
        for g in 0..G {
            l[i][g] = clamp(nearest_int(iscale[g] * xt[i][g]), -nmax, nmax - 1);
        }
    }
}

/// `sumlx = Σ (w·x)·l` and `suml2 = Σ w·l·l`, each lane in element order.
#[inline(always)]
fn qx_sums<const N: usize, const G: usize>(
    l: &[[i32; G]; N],
    wx: &[[f32; G]; N],
    qwt: &[[f32; G]; N],
) -> ([f32; G], [f32; G]) {
    let (mut sumlx, mut suml2) = ([0.0f32; G], [0.0f32; G]);
    for i in 0..N {
        for g in 0..G {
            let lf = l[i][g] as f32;
            sumlx[g] += wx[i][g] * lf;
            suml2[g] += qwt[i][g] * lf * lf;
        }
    }
    (sumlx, suml2)
}

/// [`crate::helpers::make_q3_quants`] on `G` groups of `N`: levels into `l_out[g]`, scales returned.
///
/// The refinement rounds run until no lane changes a level (or 5 rounds): a group whose round changed nothing
/// would change nothing in the next round either, so running on where the scalar code stops is harmless.
pub(crate) fn make_q3_quants<const N: usize, const G: usize>(
    nmax: i32,
    x: &[[f32; N]; G],
    l_out: &mut [[i8; N]; G],
) -> [f32; G] {
    let xt = transpose(x);
    let (max, amax) = signed_max(&xt);
    let mut iscale = [0.0f32; G];
    for g in 0..G {
        iscale[g] = -(nmax as f32) / max[g];
    }
    let mut l = [[0i32; G]; N];
    let (mut sumlx, mut suml2) = ([0.0f32; G], [0.0f32; G]);
    for i in 0..N {
        for g in 0..G {
            let x = xt[i][g];
            l[i][g] = clamp(nearest_int(iscale[g] * x), -nmax, nmax - 1);
            let w = x * x;
            let lf = l[i][g] as f32;
            sumlx[g] += w * x * lf;
            suml2[g] += w * lf * lf;
        }
    }
    for _ in 0..5 {
        let mut changed = [0u32; G];
        for i in 0..N {
            for g in 0..G {
                let x = xt[i][g];
                let w = x * x;
                let li = l[i][g] as f32;
                let slx = sumlx[g] - w * x * li;
                let sl2 = suml2[g] - w * li * li;
                let new_l = clamp(nearest_int(x * sl2 / slx), -nmax, nmax - 1);
                let nf = new_l as f32;
                let slx_new = slx + w * x * nf;
                let sl2_new = sl2 + w * nf * nf;
                let take = mask(
                    (slx > 0.0)
                        & (new_l != l[i][g])
                        & (sl2_new > 0.0)
                        & (slx_new * slx_new * suml2[g] > sumlx[g] * sumlx[g] * sl2_new),
                );
                l[i][g] = pick_i(take, new_l, l[i][g]);
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
        let zero = amax[g] < GROUP_MAX_EPS;
        for i in 0..N {
            l_out[g][i] = if zero { 0 } else { (l[i][g] + nmax) as i8 };
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
    for g in 0..G {
        min[g] = pick(mask(min[g] > 0.0), 0.0, min[g]);
    }
    // The scalar code returns `(0, -min)` with all-zero levels for these groups.
    let degenerate: [bool; G] = std::array::from_fn(|g| max[g] <= min[g]);

    let mut iscale = [0.0f32; G];
    let mut scale = [0.0f32; G];
    for g in 0..G {
        iscale[g] = nmax as f32 / (max[g] - min[g]);
        scale[g] = 1.0 / iscale[g];
    }
    let mut best_l = [[0i32; G]; N];
    let mut best_mad = [0.0f32; G];
    for i in 0..N {
        for g in 0..G {
            let l = clamp(nearest_int(iscale[g] * (xt[i][g] - min[g])), 0, nmax);
            best_l[i][g] = l;
            let diff = scale[g] * l as f32 + min[g] - xt[i][g];
            best_mad[g] += wt[i][g] * err(use_mad, diff);
        }
    }
    if nstep >= 1 {
        let mut laux = [[0i32; G]; N];
        for is in 0..=nstep {
            // `min` is the best candidate's so far, as in the C, which moves the grid with it.
            let c = rmin + rdelta * is as f32 + nmax as f32;
            for g in 0..G {
                iscale[g] = c / (max[g] - min[g]);
            }
            let (mut sum_l, mut sum_l2, mut sum_xl) = ([0.0f32; G], [0.0f32; G], [0.0f32; G]);
            for i in 0..N {
                for g in 0..G {
                    let l = clamp(nearest_int(iscale[g] * (xt[i][g] - min[g])), 0, nmax);
                    laux[i][g] = l;
                    let w = wt[i][g];
                    let lf = l as f32;
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
                    let diff = this_scale[g] * laux[i][g] as f32 + this_min[g] - xt[i][g];
                    mad[g] += wt[i][g] * err(use_mad, diff);
                }
            }
            let mut take = [0u32; G];
            for g in 0..G {
                take[g] = d_pos[g] & mask(mad[g] < best_mad[g]);
                best_mad[g] = pick(take[g], mad[g], best_mad[g]);
                scale[g] = pick(take[g], this_scale[g], scale[g]);
                min[g] = pick(take[g], this_min[g], min[g]);
            }
            for i in 0..N {
                for g in 0..G {
                    best_l[i][g] = pick_i(take[g], laux[i][g], best_l[i][g]);
                }
            }
        }
    }
    let mut the_min = [0.0f32; G];
    for g in 0..G {
        for i in 0..N {
            l_out[g][i] = if degenerate[g] { 0 } else { best_l[i][g] as u8 };
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

    /// Groups of `N` pseudo-random values with outliers, plus degenerate ones: all zero, constant, one value, tiny.
    fn groups<const N: usize, const G: usize>(seed: u64) -> [[f32; N]; G] {
        let mut state = seed;
        let mut next = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as i32 - 8_388_608) as f32 / 8_388_608.0
        };
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
