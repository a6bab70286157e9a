//! The sub-block scale search of the grid i-quants: the loop that `quantize_row_iq2_xxs_impl`,
//! `quantize_row_iq2_xs_impl` and `quantize_row_iq2_s_impl` (`ggml/src/ggml-quants.c`, llama.cpp 0c1e570) each
//! spell out, written once over the group size `N` and the number of groups `G` in a sub-block.
//!
//! For each candidate inverse scale `id = (2·kMaxQ − 1 + 0.1·is)/denominator`, `is` ascending, every group's levels
//! are rounded (`nearest_int(0.5·(id·x − 1))`, clamped to `0..kMaxQ`); a pattern off the grid is replaced by its
//! best listed neighbour at `1/id`. A candidate wins on strict improvement of `(Σwxq)²/Σwq²`. The groups the winner
//! had to move off their rounded pattern are then rounded again at the winning scale, and the scale refitted.
//!
//! Every sum is sequential f32 in element order, products associate left to right (`w·x·q` is `(w·x)·q`), and
//! comparisons are strict as in the C: the first best candidate wins.

use crate::helpers::nearest_int;
use crate::iq_grid::{Lookup, Search};

/// A sub-block prepared for the search: per group, the magnitudes to approximate (signs folded out), the element
/// weights, and their square roots (the neighbour search's weights).
pub(crate) struct SubBlock<const N: usize, const G: usize> {
    pub(crate) xval: [[f32; N]; G],
    pub(crate) w: [[f32; N]; G],
    pub(crate) waux: [[f32; N]; G],
}

/// How a type scans its candidate scales.
pub(crate) struct Scan {
    /// Levels per element (`kMaxQ`); level `L` stands for `2L + 1`.
    pub(crate) kmaxq: i32,
    /// Candidates `is = −n..=n`.
    pub(crate) n: i32,
    /// Refine every group, not only the groups the winning candidate moved to a neighbour (IQ2_XXS, which keeps no
    /// on-grid flags).
    pub(crate) refine_all: bool,
}

/// The levels of `x` at the inverse scale `id`: `clamp(nearest_int(0.5·(id·x − 1)), 0, kMaxQ − 1)`.
#[inline(always)]
fn round_levels<const N: usize>(x: &[f32; N], id: f32, kmaxq: i32) -> [u8; N] {
    // A loop, not `array::from_fn`: that generic is compiled out of line, for the baseline CPU.
    let mut l = [0u8; N];
    for i in 0..N {
        l[i] = nearest_int(0.5 * (id * x[i] - 1.0)).clamp(0, kmaxq - 1) as u8;
    }
    l
}

/// Puts `l` on the grid: its index if it is a grid point, else the best listed neighbour at `scale` (whose levels
/// replace `l`). Returns the index and whether `l` was on the grid.
#[inline(always)]
fn snap<const N: usize>(s: &Search<N>, l: &mut [u8; N], x: &[f32; N], waux: &[f32; N], scale: f32) -> (u16, bool) {
    match s.lookup(l) {
        Lookup::On(k) => (k, true),
        Lookup::Off(list) => (s.best_neighbour(list, x, waux, scale, l), false),
    }
}

/// `Σ (w·x)·q` and `Σ (w·q)·q` over the sub-block, with `q = 2L + 1`.
#[inline(always)]
fn sums<const N: usize, const G: usize>(b: &SubBlock<N, G>, l: &[[u8; N]; G]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for ((w, x), l) in b.w.iter().flatten().zip(b.xval.iter().flatten()).zip(l.iter().flatten()) {
        let q = f32::from(2 * l + 1);
        sumqx += w * x * q;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// Searches the sub-block's scale starting from `scale0`, the candidates spread over `denominator` (the largest
/// magnitude, or IQ2_XXS's `eff_max`). Returns the scale (negative only in the case the C calls impossible; the
/// caller then flips the signs) and each group's grid index.
#[inline(always)]
pub(crate) fn search<const N: usize, const G: usize>(
    s: &Search<N>,
    b: &SubBlock<N, G>,
    scan: &Scan,
    denominator: f32,
    scale0: f32,
) -> (f32, [u16; G]) {
    let mut best = 0.0f32;
    let mut scale = scale0;
    let mut l = [[0u8; N]; G];
    // Levels all 0 unless a candidate wins: grid point 0 in every grid (the all-lowest pattern sorts first).
    let mut index = [0u16; G];
    let mut on_grid = [!scan.refine_all; G];
    for is in -scan.n..=scan.n {
        let id = (2 * scan.kmaxq - 1) as f32 + is as f32 * 0.1;
        let id = id / denominator;
        let this_scale = 1.0 / id;
        let mut laux = [[0u8; N]; G];
        for (l, x) in laux.iter_mut().zip(&b.xval) {
            *l = round_levels(x, id, scan.kmaxq);
        }
        // Every group's map entry first: independent loads, in flight together.
        let found = s.lookup_all(&laux);
        let mut index_aux = [0u16; G];
        let mut on_grid_aux = [true; G];
        for (k, found) in found.into_iter().enumerate() {
            (index_aux[k], on_grid_aux[k]) = match found {
                Lookup::On(i) => (i, true),
                Lookup::Off(list) => (s.best_neighbour(list, &b.xval[k], &b.waux[k], this_scale, &mut laux[k]), false),
            };
        }
        let (sumqx, sumq2) = sums(b, &laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            l = laux;
            index = index_aux;
            if !scan.refine_all {
                on_grid = on_grid_aux;
            }
        }
    }
    if on_grid.contains(&false) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..G {
            if on_grid[k] {
                continue;
            }
            l[k] = round_levels(&b.xval[k], id, scan.kmaxq);
            index[k] = snap(s, &mut l[k], &b.xval[k], &b.waux[k], scale).0;
        }
        let (sumqx, sumq2) = sums(b, &l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    (scale, index)
}
