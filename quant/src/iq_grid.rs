//! The i-quants' grid search structures, built once per process from the grids' level patterns
//! (`quantfarm_ggml::grids`), by the construction of `iq2xs_init_impl` and `iq3xs_init_impl` in llama.cpp
//! 0c1e570's `ggml/src/ggml-quants.c`:
//!
//! - each grid point as bytes `2L + 1` ([`Search::point`]): the quantizers measure distances on these, never on
//!   the dequantization values;
//! - a map from every level pattern's code (`Σ L_i << bits·i`) to its grid index, or for a pattern off the grid,
//!   to its neighbour list: every grid point `j` whose squared distance `Σ (point_j,i − (2L_i + 1))²` is among
//!   the `nwant` smallest distinct distances, ordered by (distance, j);
//! - the neighbour searches that pick the best listed point for given values, weights and scale
//!   (`iq2_find_best_neighbour`, `iq3_find_best_neighbour`, `iq1_find_best_neighbour2`).
//!
//! The tables are integers and the same on every machine; the tests check them against the sha256 of their text
//! dump (`G <u> <k>` or `N <u> <count> <j…>` per code).

use std::sync::LazyLock;

use quantfarm_ggml::grids::{Grid4, Grid8};
use rayon::prelude::*;

/// A grid's search structures, for groups of `N` elements.
pub(crate) struct Search<const N: usize> {
    /// Grid point k as the bytes `2L + 1`.
    points: Vec<[i8; N]>,
    /// Level bits per element.
    bits: u32,
    /// Per code: the grid index (`>= 0`), or for a pattern off the grid `−(at << 8 | chunks) − 1`: its neighbour
    /// list's codes are `lists[at..at + 8·chunks]`, found with the map's one load.
    map: Vec<i32>,
    /// The neighbour lists, each `[len, code…]`: the level patterns (codes) of its `len` points, followed by
    /// copies of the first up to a multiple of 8 (a copy never beats the first: the search takes strict
    /// improvements only, in list order). A point's grid index is `map[code]`. Codes fit 16 bits (8 elements of 2
    /// bits, 4 of 3), so a list is one short run of memory: the tables stay small enough for the cache (IQ2_XXS's
    /// 1.2 MB, against 3.6 MB with a separate index list and 32-bit codes).
    lists: Vec<u16>,
}

/// Where a level pattern lies: on the grid (its index), or off it (the candidates to search instead).
pub(crate) enum Lookup<'a> {
    On(u16),
    Off(Neighbours<'a>),
}

/// A neighbour list: the codes of its points, padded with copies of the first to a multiple of 8.
#[derive(Clone, Copy)]
pub(crate) struct Neighbours<'a> {
    padded: &'a [u16],
}

/// All ones where `c` holds: a per-lane select mask, the form vector compares produce.
#[inline(always)]
fn mask(c: bool) -> u32 {
    (c as u32).wrapping_neg()
}

/// `m ? a : b` on the bits.
#[inline(always)]
fn pick(m: u32, a: u32, b: u32) -> u32 {
    (a & m) | (b & !m)
}

/// `t[level]` for a level of `BITS` bits, as selects on the bits of `level` (no table lookup, so a loop over 8
/// lanes of levels compiles to vector blends).
#[inline(always)]
fn select<const BITS: u32>(t: &[u32; 8], level: u32) -> u32 {
    let m0 = mask(level & 1 != 0);
    let m1 = mask(level & 2 != 0);
    let lo = pick(m1, pick(m0, t[3], t[2]), pick(m0, t[1], t[0]));
    if BITS == 2 {
        return lo;
    }
    let m2 = mask(level & 4 != 0);
    let hi = pick(m1, pick(m0, t[7], t[6]), pick(m0, t[5], t[4]));
    pick(m2, hi, lo)
}

/// [`Search::nearest`]'s scan without vector instructions: each term picked by selects on the level's bits, so
/// a loop over 8 lanes compiles to vector blends where the compiler can. Returns the winning point's code.
#[inline(always)]
fn nearest_portable<const N: usize>(padded: &[u16], bits: u32, terms: &[[f32; 8]; N]) -> u16 {
    let t: [[u32; 8]; N] = std::array::from_fn(|i| terms[i].map(f32::to_bits));
    let mut best_d2 = f32::MAX;
    let mut best = padded[0];
    for c in padded.chunks_exact(8) {
        let c: [u32; 8] = std::array::from_fn(|k| u32::from(c[k]));
        let mut d2 = [0.0f32; 8];
        for (i, t) in t.iter().enumerate() {
            let shift = bits * i as u32;
            for k in 0..8 {
                let level = c[k] >> shift;
                let term = if bits == 2 { select::<2>(t, level) } else { select::<3>(t, level) };
                d2[k] += f32::from_bits(term);
            }
        }
        for k in 0..8 {
            if d2[k] < best_d2 {
                best_d2 = d2[k];
                best = c[k] as u16;
            }
        }
    }
    best
}

/// [`nearest_portable`] with AVX2: a term is one `vpermps` of the element's 8 terms by the code shifted to the
/// element (the permute reads the low 3 bits: the level, and with 2-bit levels the next element's low bit, which
/// the 4-periodic terms ignore). The same adds in the same order, so the same bits. Chunks with no lane below the
/// best so far are passed over with one compare.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn nearest_avx2<const N: usize>(padded: &[u16], bits: u32, terms: &[[f32; 8]; N]) -> u16 {
    use std::arch::x86_64::*;
    // SAFETY (loads): `terms[i]` is 8 f32s and each chunk 8 u16s, both read unaligned.
    let mut t = [_mm256_setzero_ps(); N];
    for i in 0..N {
        t[i] = unsafe { _mm256_loadu_ps(terms[i].as_ptr()) };
    }
    let mut best_d2 = f32::MAX;
    let mut best = padded[0];
    for chunk in padded.chunks_exact(8) {
        let c = _mm256_cvtepu16_epi32(unsafe { _mm_loadu_si128(chunk.as_ptr().cast()) });
        let mut d2 = _mm256_setzero_ps();
        for (i, t) in t.iter().enumerate() {
            let level = _mm256_srlv_epi32(c, _mm256_set1_epi32((bits * i as u32) as i32));
            d2 = _mm256_add_ps(d2, _mm256_permutevar8x32_ps(*t, level));
        }
        if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(d2, _mm256_set1_ps(best_d2))) != 0 {
            let mut d = [0.0f32; 8];
            // SAFETY: `d` is 8 f32s.
            unsafe { _mm256_storeu_ps(d.as_mut_ptr(), d2) };
            for k in 0..8 {
                if d[k] < best_d2 {
                    best_d2 = d[k];
                    best = chunk[k];
                }
            }
        }
    }
    best
}

impl<const N: usize> Search<N> {
    /// Builds the structures of the grid `levels` (`bits` per element), keeping `nwant` distinct distances per
    /// neighbour list, over the codes `0..map_size`.
    fn build(levels: &[u16], bits: u32, nwant: usize, map_size: usize) -> Search<N> {
        let field = (1usize << bits) - 1;
        let points: Vec<[i8; N]> = levels
            .iter()
            .map(|&p| std::array::from_fn(|i| (2 * ((usize::from(p) >> (bits as usize * i)) & field) + 1) as i8))
            .collect();
        let mut map = vec![-1i32; map_size];
        for (k, &p) in levels.iter().enumerate() {
            map[usize::from(p)] = k as i32;
        }
        let lists: Vec<Option<Vec<u16>>> = (0..map_size)
            .into_par_iter()
            .map(|u| {
                if map[u] >= 0 {
                    return None;
                }
                let pos: [i32; N] = std::array::from_fn(|i| 2 * ((u >> (bits as usize * i)) & field) as i32 + 1);
                let d2: Vec<i32> = points
                    .iter()
                    .map(|q| q.iter().zip(&pos).map(|(&q, &p)| (i32::from(q) - p) * (i32::from(q) - p)).sum())
                    .collect();
                // The nwant smallest distinct distances, then every point at each, by (distance, index): the order
                // ggml's sort of (d2, j) pairs gives.
                let mut list = Vec::new();
                let mut floor = i32::MIN;
                for _ in 0..nwant {
                    let Some(next) = d2.iter().copied().filter(|&d| d > floor).min() else { break };
                    list.extend(d2.iter().enumerate().filter(|&(_, &d)| d == next).map(|(j, _)| j as u16));
                    floor = next;
                }
                Some(list)
            })
            .collect();
        let mut packed = Vec::new();
        for (u, list) in lists.into_iter().enumerate() {
            if let Some(list) = list {
                let chunks = list.len().div_ceil(8);
                let at = packed.len() + 1;
                assert!(chunks < 256 && at < 1 << 23, "neighbour lists too long for the map's encoding");
                map[u] = -((at << 8 | chunks) as i32) - 1;
                packed.push(list.len() as u16);
                let mut codes: Vec<u16> = list.iter().map(|&j| levels[usize::from(j)]).collect();
                codes.resize(list.len().next_multiple_of(8), codes[0]);
                packed.extend(codes);
            }
        }
        Search { points, bits, map, lists: packed }
    }

    /// Grid point `k` as bytes `2L + 1`.
    #[inline]
    pub(crate) fn point(&self, k: u16) -> &[i8; N] {
        &self.points[usize::from(k)]
    }

    /// The code of a level pattern (`Σ L_i << bits·i`).
    #[inline(always)]
    pub(crate) fn code(&self, l: &[u8; N]) -> usize {
        l.iter().enumerate().fold(0, |c, (i, &l)| c | (usize::from(l) << (self.bits as usize * i)))
    }

    /// Where the level pattern `l` (each level below the grid's count) lies.
    #[inline(always)]
    pub(crate) fn lookup(&self, l: &[u8; N]) -> Lookup<'_> {
        self.entry(self.map[self.code(l)])
    }

    /// What a map entry says.
    #[inline(always)]
    fn entry(&self, m: i32) -> Lookup<'_> {
        if m >= 0 {
            Lookup::On(m as u16)
        } else {
            let (at, chunks) = Self::list_at(m);
            Lookup::Off(Neighbours { padded: &self.lists[at..at + 8 * chunks] })
        }
    }

    /// [`Search::lookup`] of each pattern, all map entries loaded before any is used.
    #[inline(always)]
    pub(crate) fn lookup_all<const G: usize>(&self, l: &[[u8; N]; G]) -> [Lookup<'_>; G] {
        let mut m = [0i32; G];
        for k in 0..G {
            m[k] = self.map[self.code(&l[k])];
        }
        let mut found = [const { Lookup::On(0) }; G];
        for k in 0..G {
            found[k] = self.entry(m[k]);
        }
        found
    }

    /// Where an off-grid map entry's list starts in `lists`, and its chunks of 8.
    #[inline(always)]
    fn list_at(m: i32) -> (usize, usize) {
        let m = (-(m + 1)) as usize;
        (m >> 8, m & 255)
    }

    /// The grid index of a grid point's code.
    #[inline(always)]
    fn index(&self, code: u16) -> u16 {
        self.map[usize::from(code)] as u16
    }

    /// The first point of a neighbour list.
    pub(crate) fn first(&self, list: Neighbours<'_>) -> u16 {
        self.index(list.padded[0])
    }

    /// The listed point nearest `xval` at `scale` under the weights `w` (`Σ (w·diff)·diff`, `diff = scale·q − x`,
    /// the first strict minimum; `iq2_find_best_neighbour`/`iq3_find_best_neighbour`); writes its levels into `l`.
    /// With no finite distance (ggml aborts there) the first listed point is taken.
    #[inline(always)]
    pub(crate) fn best_neighbour(
        &self,
        list: Neighbours<'_>,
        xval: &[f32; N],
        w: &[f32; N],
        scale: f32,
        l: &mut [u8; N],
    ) -> u16 {
        // Each element's term for each level, as the C computes it per point: `q = 2L + 1`.
        let field = (1 << self.bits) - 1;
        let mut terms = [[0.0f32; 8]; N];
        for (t, (&x, &w)) in terms.iter_mut().zip(xval.iter().zip(w)) {
            for (level, t) in t.iter_mut().enumerate() {
                let diff = scale * (2 * (level & field) + 1) as f32 - x;
                *t = w * diff * diff;
            }
        }
        self.nearest(list, &terms, l)
    }

    /// IQ1's search (`iq1_find_best_neighbour2`): level `L` stands for `values[L]`, `diff = scale·values[L] − x`.
    #[inline(always)]
    pub(crate) fn best_neighbour_valued(
        &self,
        list: Neighbours<'_>,
        x: &[f32; N],
        w: &[f32; N],
        scale: f32,
        values: &[f32; 3],
        l: &mut [u8; N],
    ) -> u16 {
        let mut terms = [[0.0f32; 8]; N];
        for (t, (&x, &w)) in terms.iter_mut().zip(x.iter().zip(w)) {
            for (level, t) in t.iter_mut().enumerate() {
                let diff = scale * values[(level & 3).min(2)] - x;
                *t = w * diff * diff;
            }
        }
        self.nearest(list, &terms, l)
    }

    /// The listed point with the smallest `Σ_i terms[i][L_i]` (summed from 0 in element order, as the C sums each
    /// point's distance; the first strict minimum in list order), its levels written into `l`. `terms[i]` holds
    /// element `i`'s term for each level in its low 3 bits: with 2-bit levels the 8 entries repeat every 4.
    ///
    /// Eight listed points are summed at once, one per lane: lane `k` adds exactly the terms, in exactly the order,
    /// that the one-point loop adds for point `k`, so the distances are the same bits.
    #[inline(always)]
    fn nearest(&self, list: Neighbours<'_>, terms: &[[f32; 8]; N], l: &mut [u8; N]) -> u16 {
        #[cfg(target_arch = "x86_64")]
        let code = if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            unsafe { nearest_avx2(list.padded, self.bits, terms) }
        } else {
            nearest_portable(list.padded, self.bits, terms)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let code = nearest_portable(list.padded, self.bits, terms);
        let field = (1u16 << self.bits) - 1;
        for (i, l) in l.iter_mut().enumerate() {
            *l = ((code >> (self.bits as usize * i)) & field) as u8;
        }
        self.index(code)
    }

    /// Writes grid point `k`'s levels into `l`.
    #[inline]
    pub(crate) fn levels_of(&self, k: u16, l: &mut [u8; N]) {
        for (l, &q) in l.iter_mut().zip(self.point(k)) {
            *l = ((q - 1) / 2) as u8;
        }
    }

    /// The text dump the tests hash: per code ascending, `G <u> <k>` or `N <u> <count> <j…>`.
    #[cfg(test)]
    fn dump(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        for (u, &m) in self.map.iter().enumerate() {
            if m >= 0 {
                let _ = writeln!(s, "G {u} {m}");
            } else {
                let at = Self::list_at(m).0;
                let len = usize::from(self.lists[at - 1]);
                let _ = write!(s, "N {u} {len}");
                for &c in &self.lists[at..at + len] {
                    let _ = write!(s, " {}", self.index(c));
                }
                s.push('\n');
            }
        }
        s
    }
}

/// Codes of 2-bit patterns whose fields are 0..=2 are below this (the largest is 0xAAAA); ggml's `kmap_size`.
const MAP_2BIT: usize = 43692;
/// Every 3-bit pattern of 4 elements.
const MAP_3BIT: usize = 4096;

static IQ2XXS: LazyLock<Search<8>> = LazyLock::new(|| Search::build(Grid8::Iq2xxs.levels(), 2, 2, MAP_2BIT));
static IQ2XS: LazyLock<Search<8>> = LazyLock::new(|| Search::build(Grid8::Iq2xs.levels(), 2, 2, MAP_2BIT));
static IQ2S: LazyLock<Search<8>> = LazyLock::new(|| Search::build(Grid8::Iq2s.levels(), 2, 1, MAP_2BIT));
static IQ1S: LazyLock<Search<8>> = LazyLock::new(|| Search::build(Grid8::Iq1s.levels(), 2, 3, MAP_2BIT));
static IQ3XXS: LazyLock<Search<4>> = LazyLock::new(|| Search::build(Grid4::Iq3xxs.levels(), 3, 2, MAP_3BIT));
static IQ3S: LazyLock<Search<4>> = LazyLock::new(|| Search::build(Grid4::Iq3s.levels(), 3, 3, MAP_3BIT));

/// The search structures of an 8-element grid (built on first use, shared by every thread).
pub(crate) fn search8(grid: Grid8) -> &'static Search<8> {
    match grid {
        Grid8::Iq2xxs => &IQ2XXS,
        Grid8::Iq2xs => &IQ2XS,
        Grid8::Iq2s => &IQ2S,
        Grid8::Iq1s => &IQ1S,
    }
}

/// The search structures of a 4-element grid.
pub(crate) fn search4(grid: Grid4) -> &'static Search<4> {
    match grid {
        Grid4::Iq3xxs => &IQ3XXS,
        Grid4::Iq3s => &IQ3S,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha256(s: &str) -> String {
        use sha2::Digest;
        sha2::Sha256::digest(s.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Off-grid codes, listed neighbours in all, and the dump's sha256, as ggml's tables give them (measured by
    /// dumping ggml's own `kmap_q2xs`/`kneighbors_q2xs` and `kmap_q3xs`/`kneighbors_q3xs`).
    fn check<const N: usize>(s: &Search<N>, off: usize, total: usize, digest: &str) {
        let lists: Vec<usize> =
            s.map.iter().filter(|&&m| m < 0).map(|&m| usize::from(s.lists[Search::<N>::list_at(m).0 - 1])).collect();
        assert_eq!(lists.len(), off);
        assert_eq!(lists.iter().sum::<usize>(), total);
        assert_eq!(sha256(&s.dump()), digest);
        // Each list is padded with its first point to a whole number of 8.
        let padded: usize = lists.iter().map(|n| 1 + n.next_multiple_of(8)).sum();
        assert_eq!(s.lists.len(), padded);
    }

    #[test]
    fn the_tables_are_ggmls() {
        check(
            search8(Grid8::Iq2xxs),
            43436,
            373964,
            "d5a3eb12142b1f9e7edcba54b669dbb0975f6cef9d8915252bcb56a567e309b2",
        );
        check(search8(Grid8::Iq2xs), 43180, 508542, "2292b29c0bd824fbdb6ccdc1c2d7b010d24d3cab6b4dd1c61b4f766a67d7cb3e");
        check(search8(Grid8::Iq2s), 42668, 166432, "bbb7daa4f93004a6eaefc6e6cda3855c503cc3ac2db410fb53cff1ff613056c9");
        check(search8(Grid8::Iq1s), 41644, 1333695, "60c2f906f7c74d4313b817d206b944856fa26b7752c8fc0d7561af5d63f8c15e");
        check(search4(Grid4::Iq3xxs), 3840, 18985, "63f58ab913ffcb479b0fc13f4f5ecbd583aec6d6591e2fd4f9f9c03a082f14d8");
        check(search4(Grid4::Iq3s), 3584, 24733, "9150ac1bed5c5b77ab0ec815a54c9bcf691c8fe7503bad340cf707c9141e1575");
    }

    /// The AVX2 scan finds the same point as the portable one on every neighbour list of every grid: random
    /// terms (some lists with ties: terms equal across levels, so many points have the same distance), and the
    /// terms the quantizers build (2-bit terms repeat every 4 entries).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx2_scan_equals_the_portable_scan() {
        if !std::is_x86_feature_detected!("avx2") {
            eprintln!("SKIP the_avx2_scan_equals_the_portable_scan: this CPU has no AVX2");
            return;
        }
        fn check<const N: usize>(s: &Search<N>, seed: u64) {
            let mut r = crate::test_uniform(seed);
            let field = (1usize << s.bits) - 1;
            let mut lists = 0;
            for (u, &m) in s.map.iter().enumerate() {
                if m >= 0 {
                    continue;
                }
                let (at, chunks) = Search::<N>::list_at(m);
                let padded = &s.lists[at..at + 8 * chunks];
                let ties = u % 5 == 0;
                let terms: [[f32; 8]; N] = std::array::from_fn(|_| {
                    let t: [f32; 8] = std::array::from_fn(|_| if ties { 1.0 } else { r().abs() * 10.0 });
                    std::array::from_fn(|level| t[level & field])
                });
                // SAFETY: AVX2 was checked above.
                let fast = unsafe { nearest_avx2(padded, s.bits, &terms) };
                assert_eq!(fast, nearest_portable(padded, s.bits, &terms), "code {u}");
                lists += 1;
            }
            assert!(lists > 3000);
        }
        check(search8(Grid8::Iq2xxs), 1);
        check(search8(Grid8::Iq2xs), 2);
        check(search8(Grid8::Iq2s), 3);
        check(search8(Grid8::Iq1s), 4);
        check(search4(Grid4::Iq3xxs), 5);
        check(search4(Grid4::Iq3s), 6);
    }

    #[test]
    fn every_grid_point_maps_to_itself() {
        let s = search8(Grid8::Iq2xs);
        for k in 0..512u16 {
            let mut l = [0u8; 8];
            s.levels_of(k, &mut l);
            assert!(matches!(s.lookup(&l), Lookup::On(i) if i == k), "{k}");
        }
    }
}
