//! SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014): a tiny
//! generator that gives the same numbers on every machine, for the farm's seeded orders and sampling.

/// The generator's state; `SplitMix(seed)` starts a stream.
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 bits of the stream.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1): the top 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An unbiased index in `0..n` (`n > 0`; rejection of the short last range).
    pub fn below(&mut self, n: usize) -> usize {
        let span = n as u64;
        let zone = u64::MAX - u64::MAX % span;
        loop {
            let r = self.next_u64();
            if r < zone {
                return (r % span) as usize;
            }
        }
    }

    /// Fisher–Yates, from the last element down.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}
