//! The i-quants' grids: the points a group of 8 (IQ2, IQ1) or 4 (IQ3) elements may take, used both ways. The
//! quantizer searches the level patterns ([`Grid8::levels`], [`Grid4::levels`]: one level index per element); the
//! dequantizer reads the values ([`Grid8::values`], [`Grid4::values`]), which are each level mapped through the
//! grid's value table, exactly as llama.cpp 0c1e570's `ggml/src/ggml-common.h` (`iq2xxs_grid`, `iq2xs_grid`,
//! `iq2s_grid`, `iq1s_grid`, `iq3xxs_grid`, `iq3s_grid`) spells them out.

use std::sync::LazyLock;

mod levels;

/// A grid of 8-element points (IQ2_XXS, IQ2_XS, IQ2_S, and IQ1_S/IQ1_M's shared one), 2 bits per level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Grid8 {
    Iq2xxs,
    Iq2xs,
    Iq2s,
    Iq1s,
}

/// A grid of 4-element points (IQ3_XXS, IQ3_S), 3 bits per level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Grid4 {
    Iq3xxs,
    Iq3s,
}

/// The IQ2 grids' values per level (`8, 25, 43`: not exactly proportional to the quantizer's `1, 3, 5`).
const IQ2_VALUES: [i8; 3] = [8, 25, 43];
/// IQ1's values per level: −1, 0, +1 (the block adds a ±1/8 shift).
const IQ1_VALUES: [i8; 3] = [-1, 0, 1];
/// IQ3_XXS's values per level (the last step is 10, not 8).
const IQ3XXS_VALUES: [i8; 8] = [4, 12, 20, 28, 36, 44, 52, 62];
/// IQ3_S's values per level, `2L + 1`.
const IQ3S_VALUES: [i8; 8] = [1, 3, 5, 7, 9, 11, 13, 15];

fn expand<const N: usize>(levels: &[u16], bits: u32, values: &[i8]) -> Vec<[i8; N]> {
    let mask = (1u16 << bits) - 1;
    levels.iter().map(|&p| std::array::from_fn(|i| values[usize::from((p >> (bits * i as u32)) & mask)])).collect()
}

static IQ2XXS_GRID: LazyLock<Vec<[i8; 8]>> = LazyLock::new(|| expand(&levels::IQ2XXS, 2, &IQ2_VALUES));
static IQ2XS_GRID: LazyLock<Vec<[i8; 8]>> = LazyLock::new(|| expand(&levels::IQ2XS, 2, &IQ2_VALUES));
static IQ2S_GRID: LazyLock<Vec<[i8; 8]>> = LazyLock::new(|| expand(&levels::IQ2S, 2, &IQ2_VALUES));
static IQ1S_GRID: LazyLock<Vec<[i8; 8]>> = LazyLock::new(|| expand(&levels::IQ1S, 2, &IQ1_VALUES));
static IQ3XXS_GRID: LazyLock<Vec<[i8; 4]>> = LazyLock::new(|| expand(&levels::IQ3XXS, 3, &IQ3XXS_VALUES));
static IQ3S_GRID: LazyLock<Vec<[i8; 4]>> = LazyLock::new(|| expand(&levels::IQ3S, 3, &IQ3S_VALUES));

impl Grid8 {
    /// The grid's points as level patterns: element i's level (0..=2) at bits `2i..2i+1`, ascending.
    pub fn levels(self) -> &'static [u16] {
        match self {
            Grid8::Iq2xxs => &levels::IQ2XXS,
            Grid8::Iq2xs => &levels::IQ2XS,
            Grid8::Iq2s => &levels::IQ2S,
            Grid8::Iq1s => &levels::IQ1S,
        }
    }

    /// The grid's points as the values the dequantizer multiplies (`ggml-common.h`'s bytes, element i in byte i).
    pub fn values(self) -> &'static [[i8; 8]] {
        match self {
            Grid8::Iq2xxs => &IQ2XXS_GRID,
            Grid8::Iq2xs => &IQ2XS_GRID,
            Grid8::Iq2s => &IQ2S_GRID,
            Grid8::Iq1s => &IQ1S_GRID,
        }
    }
}

impl Grid4 {
    /// The grid's points as level patterns: element i's level (0..=7) at bits `3i..3i+2`, ascending.
    pub fn levels(self) -> &'static [u16] {
        match self {
            Grid4::Iq3xxs => &levels::IQ3XXS,
            Grid4::Iq3s => &levels::IQ3S,
        }
    }

    /// The grid's points as the values the dequantizer multiplies.
    pub fn values(self) -> &'static [[i8; 4]] {
        match self {
            Grid4::Iq3xxs => &IQ3XXS_GRID,
            Grid4::Iq3s => &IQ3S_GRID,
        }
    }
}

/// The full 8-bit sign mask of 7 stored sign bits (`ksigns_iq2xs`): the 8th bit makes the count of negatives even.
#[inline]
pub fn parity_signs(s7: u8) -> u8 {
    let s7 = s7 & 0x7F;
    s7 | (((s7.count_ones() & 1) as u8) << 7)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_have_the_sizes_ggml_gives_and_are_ascending() {
        for (g, n) in [(Grid8::Iq2xxs, 256), (Grid8::Iq2xs, 512), (Grid8::Iq2s, 1024), (Grid8::Iq1s, 2048)] {
            assert_eq!((g.levels().len(), g.values().len()), (n, n), "{g:?}");
            assert!(g.levels().windows(2).all(|w| w[0] < w[1]), "{g:?}");
            assert!(g.levels().iter().all(|&p| (0..8).all(|i| (p >> (2 * i)) & 3 != 3)), "{g:?}: level 3");
        }
        for (g, n) in [(Grid4::Iq3xxs, 256), (Grid4::Iq3s, 512)] {
            assert_eq!((g.levels().len(), g.values().len()), (n, n), "{g:?}");
            assert!(g.levels().windows(2).all(|w| w[0] < w[1]), "{g:?}");
        }
        // A few entries as ggml-common.h spells them (little-endian: element 0 is the low byte).
        let bytes = |v: [i8; 8]| u64::from_le_bytes(v.map(|b| b as u8));
        assert_eq!(bytes(Grid8::Iq2xxs.values()[0]), 0x0808080808080808);
        assert_eq!(bytes(Grid8::Iq2xxs.values()[255]), 0x2b2b2b1908081908);
        assert_eq!(bytes(Grid8::Iq1s.values()[0]), 0xffffffffffffffff);
        assert_eq!(bytes(Grid8::Iq1s.values()[1]), 0xffffffffffffff01);
        assert_eq!(u32::from_le_bytes(Grid4::Iq3xxs.values()[0].map(|b| b as u8)), 0x04040404);
        assert_eq!(u32::from_le_bytes(Grid4::Iq3s.values()[511].map(|b| b as u8)), 0x0f0f0101);
    }

    #[test]
    fn parity_signs_make_the_count_of_negatives_even() {
        for s in 0..128u8 {
            assert_eq!(parity_signs(s) & 0x7F, s);
            assert_eq!(parity_signs(s).count_ones() % 2, 0);
        }
    }
}
