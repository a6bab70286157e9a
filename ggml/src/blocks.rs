//! The byte layout of each quantized block, as a struct with named fields: the one definition the quantizer writes
//! and the dequantizer reads (after candle's `k_quants.rs`, one `#[repr(C)]` struct per format).
//!
//! Layouts are ggml's `block_*` structs in llama.cpp 0c1e570's `ggml/src/ggml-common.h`, field for field and in
//! that order; `f16` fields hold the IEEE half's bits, little-endian in the file. Each struct's size is checked at
//! compile time against [`GgmlType::type_size`], and the sum of its fields' sizes too, so a block has no padding
//! and its in-memory order is its on-disk order.
//!
//! Blocks are read from and written to byte slices by copying field by field ([`Block::read`],
//! [`Block::write`]): no `unsafe`, no alignment demands on the caller's buffer, and the same code on big- and
//! little-endian machines.
//!
//! The sub-block scale packings that several formats share live here too: [`k4_scales`] (Q4_K, Q5_K) and
//! [`q3_scales`] (Q3_K), each with its packing and unpacking side by side.

use crate::{GgmlType, QK_K};

/// Elements per block of the legacy formats (Q4_0 … Q8_1).
pub const QK: usize = 32;

/// A fixed-size field of a block, as stored in the file (little-endian).
pub trait Field: Sized + Copy {
    /// Bytes in the file.
    const SIZE: usize;
    /// Reads the field from exactly [`Field::SIZE`] bytes.
    fn get(b: &[u8]) -> Self;
    /// Writes the field into exactly [`Field::SIZE`] bytes.
    fn put(&self, out: &mut [u8]);
}

impl Field for u8 {
    const SIZE: usize = 1;
    fn get(b: &[u8]) -> u8 {
        b[0]
    }
    fn put(&self, out: &mut [u8]) {
        out[0] = *self;
    }
}

impl Field for u16 {
    const SIZE: usize = 2;
    fn get(b: &[u8]) -> u16 {
        u16::from_le_bytes([b[0], b[1]])
    }
    fn put(&self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_le_bytes());
    }
}

impl Field for f32 {
    const SIZE: usize = 4;
    fn get(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    fn put(&self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_le_bytes());
    }
}

impl<const N: usize> Field for [u8; N] {
    const SIZE: usize = N;
    fn get(b: &[u8]) -> [u8; N] {
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        a
    }
    fn put(&self, out: &mut [u8]) {
        out.copy_from_slice(self);
    }
}

impl<const N: usize> Field for [i8; N] {
    const SIZE: usize = N;
    fn get(b: &[u8]) -> [i8; N] {
        let mut a = [0i8; N];
        for (x, &y) in a.iter_mut().zip(b) {
            *x = y as i8;
        }
        a
    }
    fn put(&self, out: &mut [u8]) {
        for (o, &x) in out.iter_mut().zip(self) {
            *o = x as u8;
        }
    }
}

impl<const N: usize> Field for [i16; N] {
    const SIZE: usize = 2 * N;
    fn get(b: &[u8]) -> [i16; N] {
        let mut a = [0i16; N];
        for (x, y) in a.iter_mut().zip(b.chunks_exact(2)) {
            *x = i16::from_le_bytes([y[0], y[1]]);
        }
        a
    }
    fn put(&self, out: &mut [u8]) {
        for (o, &x) in out.chunks_exact_mut(2).zip(self) {
            o.copy_from_slice(&x.to_le_bytes());
        }
    }
}

impl<const N: usize> Field for [u16; N] {
    const SIZE: usize = 2 * N;
    fn get(b: &[u8]) -> [u16; N] {
        let mut a = [0u16; N];
        for (x, y) in a.iter_mut().zip(b.chunks_exact(2)) {
            *x = u16::from_le_bytes([y[0], y[1]]);
        }
        a
    }
    fn put(&self, out: &mut [u8]) {
        for (o, &x) in out.chunks_exact_mut(2).zip(self) {
            o.copy_from_slice(&x.to_le_bytes());
        }
    }
}

/// A quantized block: [`Block::TYPE`]'s bytes as named fields.
pub trait Block: Sized + Copy {
    /// The ggml type whose blocks these are.
    const TYPE: GgmlType;
    /// Bytes per block (`TYPE.type_size()`).
    const SIZE: usize = Self::TYPE.type_size();
    /// Elements per block (`TYPE.block_size()`).
    const ELEMENTS: usize = Self::TYPE.block_size();
    /// Reads a block from exactly [`Block::SIZE`] bytes (panics on another length: callers slice by `SIZE`).
    fn read(b: &[u8]) -> Self;
    /// Writes the block into exactly [`Block::SIZE`] bytes.
    fn write(&self, out: &mut [u8]);
}

/// Declares a block struct, its compile-time size checks and its field-by-field [`Block`] codec.
macro_rules! blocks {
    ($(
        $(#[$m:meta])*
        $name:ident = $ty:ident {
            $( $(#[$fm:meta])* $field:ident: $fty:ty, )*
        }
    )*) => {$(
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub struct $name {
            $( $(#[$fm])* pub $field: $fty, )*
        }

        // The struct is exactly ggml's block, with no padding between or after the fields.
        const _: () = assert!(std::mem::size_of::<$name>() == GgmlType::$ty.type_size());
        const _: () = assert!(0 $( + <$fty as Field>::SIZE )* == GgmlType::$ty.type_size());

        impl Block for $name {
            const TYPE: GgmlType = GgmlType::$ty;

            fn read(b: &[u8]) -> $name {
                assert_eq!(b.len(), Self::SIZE, concat!(stringify!($name), " bytes"));
                let mut at = 0;
                $(
                    let $field = <$fty as Field>::get(&b[at..at + <$fty as Field>::SIZE]);
                    at += <$fty as Field>::SIZE;
                )*
                debug_assert_eq!(at, Self::SIZE);
                $name { $( $field, )* }
            }

            fn write(&self, out: &mut [u8]) {
                assert_eq!(out.len(), Self::SIZE, concat!(stringify!($name), " bytes"));
                let mut at = 0;
                $(
                    self.$field.put(&mut out[at..at + <$fty as Field>::SIZE]);
                    at += <$fty as Field>::SIZE;
                )*
                debug_assert_eq!(at, Self::SIZE);
            }
        }
    )*};
}

blocks! {
    /// `block_q4_0`: `x = d · (q − 8)`; element `j` in the low nibble of `qs[j]`, element `j + 16` in its high one.
    BlockQ4_0 = Q4_0 {
        d: u16,
        qs: [u8; QK / 2],
    }

    /// `block_q4_1`: `x = d · q + m`, nibbles as Q4_0.
    BlockQ4_1 = Q4_1 {
        d: u16,
        m: u16,
        qs: [u8; QK / 2],
    }

    /// `block_q5_0`: Q4_0's nibbles plus bit 4 of element `j` at bit `j` of `qh` (little-endian u32); `q − 16`.
    BlockQ5_0 = Q5_0 {
        d: u16,
        qh: [u8; 4],
        qs: [u8; QK / 2],
    }

    /// `block_q5_1`: Q5_0's codes, `x = d · q + m`.
    BlockQ5_1 = Q5_1 {
        d: u16,
        m: u16,
        qh: [u8; 4],
        qs: [u8; QK / 2],
    }

    /// `block_q8_0`: `x = d · q`.
    BlockQ8_0 = Q8_0 {
        d: u16,
        qs: [i8; QK],
    }

    /// `block_q8_1`: Q8_0 plus `s = d · Σq` (an f16), the dot products' intermediate type.
    BlockQ8_1 = Q8_1 {
        d: u16,
        s: u16,
        qs: [i8; QK],
    }

    /// `block_q2_K`: 16 sub-blocks of 16; `scales[j]` = scale level (low nibble) | min level (high nibble);
    /// 2-bit codes in the 128-half packing ([`two_bit`]); `x = d · sc · q − dmin · m`.
    BlockQ2K = Q2_K {
        scales: [u8; QK_K / 16],
        qs: [u8; QK_K / 4],
        d: u16,
        dmin: u16,
    }

    /// `block_q3_K`: 16 sub-blocks of 16; the high bit of element `e` at bit `e / 32` of `hmask[e % 32]`, low 2 bits
    /// in the 128-half packing; 16 signed 6-bit scales packed by [`q3_scales`]; `x = d · (sc − 32) · (q − 4·!h)`.
    BlockQ3K = Q3_K {
        hmask: [u8; QK_K / 8],
        qs: [u8; QK_K / 4],
        scales: [u8; 12],
        d: u16,
    }

    /// `block_q4_K`: 8 sub-blocks of 32; 6-bit (scale, min) pairs packed by [`k4_scales`]; byte `32c + l` of `qs`
    /// holds element `64c + l` (low nibble) and `64c + 32 + l` (high nibble); `x = d · sc · q − dmin · m`.
    BlockQ4K = Q4_K {
        d: u16,
        dmin: u16,
        scales: [u8; 12],
        qs: [u8; QK_K / 2],
    }

    /// `block_q5_K`: Q4_K plus bit 4 of element `e` at bit `e / 32` of `qh[e % 32]`.
    BlockQ5K = Q5_K {
        d: u16,
        dmin: u16,
        scales: [u8; 12],
        qh: [u8; QK_K / 8],
        qs: [u8; QK_K / 2],
    }

    /// `block_q6_K`: 16 sub-blocks of 16 with int8 scales; in half `h`, element `128h + 64s + l` has its low 4
    /// bits in nibble `s` of `ql[64h + l]`, element `128h + 32t + l` its high 2 bits at bits `2t` of
    /// `qh[32h + l]`; `x = d · sc · (q − 32)`.
    BlockQ6K = Q6_K {
        ql: [u8; QK_K / 2],
        qh: [u8; QK_K / 4],
        scales: [i8; QK_K / 16],
        d: u16,
    }

    /// `block_q8_K`: `x = d · q` with an f32 scale, and the sums of each 16 codes (for dot products).
    BlockQ8K = Q8_K {
        d: f32,
        qs: [i8; QK_K],
        bsums: [i16; QK_K / 16],
    }

    /// `block_iq4_nl`: `x = d · KVALUES_IQ4NL[q]` ([`crate::tables`]); element `j` in the low nibble of `qs[j]`,
    /// element `j + 16` in its high one.
    BlockIQ4NL = IQ4_NL {
        d: u16,
        qs: [u8; QK / 2],
    }

    /// `block_iq4_xs`: 8 sub-blocks of 32, each with a 6-bit level `ls` (low nibble in `scales_l[ib / 2]`, low
    /// half for even `ib`; high 2 bits at bits `2·ib` of `scales_h`) and IQ4_NL's nibbles in `qs[16·ib..]`;
    /// `x = d · (ls − 32) · KVALUES_IQ4NL[q]`.
    BlockIQ4XS = IQ4_XS {
        d: u16,
        scales_h: u16,
        scales_l: [u8; QK_K / 64],
        qs: [u8; QK_K / 2],
    }

    /// `block_tq1_0`: ternary digits `t ∈ {0, 1, 2}` (`x = (t − 1) · d`), five per byte of `qs` and four per byte
    /// of `qh`, stored as `⌈q · 256 / 243⌉` of the base-3 number `q` whose most significant trit comes first (see
    /// [`trits`]).
    BlockTQ1_0 = TQ1_0 {
        qs: [u8; (QK_K - 4 * QK_K / 64) / 5],
        qh: [u8; QK_K / 64],
        d: u16,
    }

    /// `block_tq2_0`: 2-bit `t` (`x = (t − 1) · d`); byte `32c + m` holds element `128c + 32n + m` at bits `2n`.
    BlockTQ2_0 = TQ2_0 {
        qs: [u8; QK_K / 4],
        d: u16,
    }

    /// `block_mxfp4`: an E8M0 exponent `e` and E2M1 codes; `x = KVALUES_MXFP4[q] · 2^(e − 128)`; nibbles as
    /// IQ4_NL's.
    BlockMXFP4 = MXFP4 {
        e: u8,
        qs: [u8; QK / 2],
    }

    /// `block_nvfp4`: 4 sub-blocks of 16 with a UE4M3 scale each; `qs[8s + j]` holds element `16s + j` (low
    /// nibble) and `16s + j + 8` (high); `x = KVALUES_MXFP4[q] · ue4m3_half(d[s])`.
    BlockNVFP4 = NVFP4 {
        d: [u8; 4],
        qs: [u8; 32],
    }

    /// `block_iq2_xxs`: 8 sub-blocks of 32, each two u32 words (`qs[4ib..4ib+2]` and `qs[4ib+2..4ib+4]` as
    /// little-endian u16 pairs): byte `l` of the first is group `l`'s index into [`crate::grids::Grid8::Iq2xxs`];
    /// bits `7l..7l+7` of the second are its 7 sign bits ([`crate::grids::parity_signs`]) and bits 28..32 the
    /// scale `s`; `x = ((d · (0.5 + s)) · 0.25) · grid · ±1`.
    BlockIQ2XXS = IQ2_XXS {
        d: u16,
        qs: [u16; QK_K / 8],
    }

    /// `block_iq2_xs`: `qs[g]` holds group `g`'s index into [`crate::grids::Grid8::Iq2xs`] (bits 0..9) and its 7
    /// sign bits (9..16); `scales[ib / 2]` holds 16-element sub-block `ib`'s 4-bit scale (low nibble for even
    /// `ib`); `x = ((d · (0.5 + s)) · 0.25) · grid · ±1`.
    BlockIQ2XS = IQ2_XS {
        d: u16,
        qs: [u16; QK_K / 8],
        scales: [u8; QK_K / 32],
    }

    /// `block_iq2_s`: group `g`'s index into [`crate::grids::Grid8::Iq2s`] is `qs[g]` plus bits `2(g % 4)..+2` of
    /// `qh[g / 4]` as bits 8..10; `qs[32 + g]` is its full 8-bit sign mask; scales as IQ2_XS's.
    BlockIQ2S = IQ2_S {
        d: u16,
        qs: [u8; QK_K / 4],
        qh: [u8; QK_K / 32],
        scales: [u8; QK_K / 32],
    }

    /// `block_iq3_xxs`: `qs[0..64]` are the indices into [`crate::grids::Grid4::Iq3xxs`] of the 4-element groups;
    /// `qs[64..96]` are 8 little-endian u32 words, word `ib` holding the 7 sign bits of 8-element group `l` at
    /// `7l..7l+7` and the scale `s` at 28..32; `x = ((d · (0.5 + s)) · 0.5) · grid · ±1`.
    BlockIQ3XXS = IQ3_XXS {
        d: u16,
        qs: [u8; 3 * QK_K / 8],
    }

    /// `block_iq3_s`: the index of 4-element group `8ib + k` into [`crate::grids::Grid4::Iq3s`] is `qs[8ib + k]`
    /// plus bit `k` of `qh[ib]` as bit 8; `signs[e / 8]` has a full sign mask per 8 elements; `scales[ib / 2]`
    /// holds sub-block `ib`'s 4-bit `s` (low nibble for even `ib`); `x = (d · (1 + 2s)) · grid · ±1`.
    BlockIQ3S = IQ3_S {
        d: u16,
        qs: [u8; QK_K / 4],
        qh: [u8; QK_K / 32],
        signs: [u8; QK_K / 8],
        scales: [u8; QK_K / 64],
    }

    /// `block_iq1_s`: group `g`'s index into [`crate::grids::Grid8::Iq1s`] is `qs[g]` plus bits `3(g % 4)..+3` of
    /// `qh[g / 4]` as bits 8..11; bits 12..15 of `qh[ib]` are sub-block `ib`'s scale `s` and bit 15 its shift's
    /// sign; `x = (d · (2s + 1)) · (grid ± 0.125)`.
    BlockIQ1S = IQ1_S {
        d: u16,
        qs: [u8; QK_K / 8],
        qh: [u16; QK_K / 32],
    }

    /// `block_iq1_m`: group `g`'s index into [`crate::grids::Grid8::Iq1s`] is `qs[g]` plus bits `4(g % 2)..+3` of
    /// `qh[g / 2]` as bits 8..11, bit `4(g % 2) + 3` its shift's sign; `scales` (4 little-endian u16) holds
    /// 16-element sub-block `ib`'s 3-bit scale at bits `3(ib % 4)` of word `ib / 4`, and the fp16 `d` in the four
    /// words' top nibbles; `x = (d · (2s + 1)) · (grid ± 0.125)`.
    BlockIQ1M = IQ1_M {
        qs: [u8; QK_K / 8],
        qh: [u8; QK_K / 16],
        scales: [u8; QK_K / 32],
    }

    /// `block_q1_0`: one sign bit per element (bit `j % 8` of `qs[j / 8]` set: `+d`, clear: `−d`).
    BlockQ1_0 = Q1_0 {
        d: u16,
        qs: [u8; 16],
    }

    /// `block_q2_0`: 2-bit `q` at bits `2·(j % 4)` of `qs[j / 4]`; `x = (q − 1) · d`.
    BlockQ2_0 = Q2_0 {
        d: u16,
        qs: [u8; 16],
    }
}

/// The 128-half packing of 2-bit codes (Q2_K's `qs`, Q3_K's low bits): element `128h + 32s + l` (h < 2, s < 4,
/// l < 32) is bits `2s..2s+2` of byte `32h + l`.
pub mod two_bit {
    use crate::QK_K;

    /// The code of element `e`.
    #[inline]
    pub fn get(qs: &[u8; QK_K / 4], e: usize) -> u8 {
        let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
        (qs[32 * h + l] >> (2 * s)) & 3
    }

    /// Packs 256 codes (each `< 4`), as `quantize_row_q2_K_ref` does.
    pub fn pack(codes: &[u8; QK_K]) -> [u8; QK_K / 4] {
        let mut qs = [0u8; QK_K / 4];
        for h in 0..2 {
            for l in 0..32 {
                let c = |s: usize| codes[128 * h + 32 * s + l];
                qs[32 * h + l] = c(0) | (c(1) << 2) | (c(2) << 4) | (c(3) << 6);
            }
        }
        qs
    }
}

/// TQ1_0's base-3 packing (`quantize_row_tq1_0_ref` and `dequantize_row_tq1_0`, `ggml/src/ggml-quants.c`).
///
/// A byte holds 5 trits as `⌈q · 256 / 243⌉`, `q = Σ t_n · 3^(4 − n)`; trit `n` is read back as
/// `((byte · 3^n mod 256) · 3) >> 8`. `qs[m]` for `m < 32` holds elements `32n + m`, `qs[32 + m]` (`m < 16`) holds
/// `160 + 16n + m`, and `qh[m]` holds `240 + 4n + m` in its first 4 trits.
pub mod trits {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];

    /// Packs 5 trits (each `< 3`), the first the most significant.
    pub fn pack5(t: [u8; 5]) -> u8 {
        let q = t.iter().fold(0u16, |q, &t| q * 3 + u16::from(t));
        // The ceiling of q · 256 / 243, as ggml writes `(q * 256 + (243 - 1)) / 243`.
        (q * 256).div_ceil(243) as u8
    }

    /// Packs 4 trits into the top 4 of a byte's 5 (`qh`).
    pub fn pack4(t: [u8; 4]) -> u8 {
        pack5([t[0], t[1], t[2], t[3], 0])
    }

    /// Trit `n` (`< 5`) of a packed byte.
    #[inline]
    pub fn get(byte: u8, n: usize) -> u8 {
        ((u16::from(byte.wrapping_mul(POW3[n])) * 3) >> 8) as u8
    }
}

/// Q4_K's and Q5_K's 8 pairs of 6-bit (scale, min) in 12 bytes: ggml's `get_scale_min_k4` and the packing of
/// `quantize_row_q4_K_ref` (`ggml/src/ggml-quants.c`).
pub mod k4_scales {
    /// Packs 8 scale levels and 8 min levels (each `< 64`).
    pub fn pack(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
        let mut s = [0u8; 12];
        for j in 0..8 {
            if j < 4 {
                s[j] = ls[j];
                s[j + 4] = lm[j];
            } else {
                s[j + 4] = (ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4);
                s[j - 4] |= (ls[j] >> 4) << 6;
                s[j] |= (lm[j] >> 4) << 6;
            }
        }
        s
    }

    /// `get_scale_min_k4(j, q)`: sub-block `j`'s (scale, min) levels.
    #[inline]
    pub fn get(j: usize, q: &[u8; 12]) -> (u8, u8) {
        if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            ((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
        }
    }

    /// All 8 (scales, mins).
    pub fn unpack(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
        let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
        for j in 0..8 {
            (sc[j], m[j]) = get(j, q);
        }
        (sc, m)
    }
}

/// Q3_K's 16 signed 6-bit scales in 12 bytes, stored as `level = scale + 32`: the low nibbles in bytes 0..8
/// (`j < 8` low, `j ≥ 8` high nibble of byte `j − 8`), the high 2 bits in byte `8 + j % 4` at bits `2·(j / 4)`
/// (`quantize_row_q3_K_ref` and `dequantize_row_q3_K`, `ggml/src/ggml-quants.c`).
pub mod q3_scales {
    /// Packs 16 levels (each `< 64`).
    pub fn pack(ls: &[u8; 16]) -> [u8; 12] {
        let mut s = [0u8; 12];
        for (j, &l) in ls.iter().enumerate() {
            if j < 8 {
                s[j] = l & 0x0f;
            } else {
                s[j - 8] |= (l & 0x0f) << 4;
            }
            s[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
        }
        s
    }

    /// Sub-block `j`'s signed scale (`level − 32`).
    #[inline]
    pub fn get(j: usize, s: &[u8; 12]) -> i8 {
        let low = if j < 8 { s[j] & 0x0f } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        ((low | (high << 4)) as i8) - 32
    }

    /// All 16 signed scales.
    pub fn unpack(s: &[u8; 12]) -> [i8; 16] {
        let mut out = [0i8; 16];
        for (j, o) in out.iter_mut().enumerate() {
            *o = get(j, s);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every block reads back what it wrote, and writes back the bytes it read.
    fn round_trip<B: Block + PartialEq + std::fmt::Debug>() {
        let bytes: Vec<u8> = (0..B::SIZE).map(|i| (i * 37 + 11) as u8).collect();
        let b = B::read(&bytes);
        let mut out = vec![0u8; B::SIZE];
        b.write(&mut out);
        assert_eq!(out, bytes, "{}", B::TYPE);
        assert_eq!(B::read(&out), b);
    }

    #[test]
    fn blocks_round_trip() {
        round_trip::<BlockQ4_0>();
        round_trip::<BlockQ4_1>();
        round_trip::<BlockQ5_0>();
        round_trip::<BlockQ5_1>();
        round_trip::<BlockQ8_0>();
        round_trip::<BlockQ8_1>();
        round_trip::<BlockQ2K>();
        round_trip::<BlockQ3K>();
        round_trip::<BlockQ4K>();
        round_trip::<BlockQ5K>();
        round_trip::<BlockQ6K>();
        round_trip::<BlockQ8K>();
        round_trip::<BlockIQ4NL>();
        round_trip::<BlockIQ4XS>();
        round_trip::<BlockTQ1_0>();
        round_trip::<BlockTQ2_0>();
        round_trip::<BlockMXFP4>();
        round_trip::<BlockNVFP4>();
        round_trip::<BlockQ1_0>();
        round_trip::<BlockQ2_0>();
    }

    #[test]
    fn trits_round_trip() {
        for q in 0..243u16 {
            let t: [u8; 5] = std::array::from_fn(|n| ((q / 3u16.pow(4 - n as u32)) % 3) as u8);
            let b = trits::pack5(t);
            for (n, &want) in t.iter().enumerate() {
                assert_eq!(trits::get(b, n), want, "q {q} trit {n}");
            }
        }
    }

    #[test]
    fn fields_sit_where_ggml_puts_them() {
        // block_q4_K: d at 0, dmin at 2, scales at 4, qs at 16.
        let mut bytes = [0u8; 144];
        bytes[0] = 0x01;
        bytes[2] = 0x02;
        bytes[4] = 0x03;
        bytes[16] = 0x04;
        let b = BlockQ4K::read(&bytes);
        assert_eq!((b.d, b.dmin, b.scales[0], b.qs[0]), (1, 2, 3, 4));
        // block_q3_K: d last, at 108.
        let mut bytes = [0u8; 110];
        bytes[108] = 0x3c;
        assert_eq!(BlockQ3K::read(&bytes).d, 0x3c);
        // block_q8_K: f32 d first, bsums last, little-endian.
        let mut bytes = [0u8; 292];
        bytes[..4].copy_from_slice(&(-0.5f32).to_le_bytes());
        bytes[290] = 0xff;
        bytes[291] = 0xff;
        let b = BlockQ8K::read(&bytes);
        assert_eq!((b.d, b.bsums[15]), (-0.5, -1));
    }

    #[test]
    fn k4_scale_packing_round_trips() {
        let ls = [1, 63, 17, 32, 48, 5, 63, 33];
        let lm = [0, 2, 63, 40, 16, 49, 1, 62];
        assert_eq!(k4_scales::unpack(&k4_scales::pack(&ls, &lm)), (ls, lm));
    }

    #[test]
    fn q3_scale_packing_round_trips() {
        let ls: [u8; 16] = std::array::from_fn(|j| (4 * j + 1) as u8);
        let s = q3_scales::unpack(&q3_scales::pack(&ls));
        for (j, &sc) in s.iter().enumerate() {
            assert_eq!(i32::from(sc), 4 * j as i32 + 1 - 32, "{j}");
        }
    }

    #[test]
    fn two_bit_packing_round_trips() {
        let codes: [u8; QK_K] = std::array::from_fn(|e| ((e * 7 + e / 5) % 4) as u8);
        let qs = two_bit::pack(&codes);
        for (e, &c) in codes.iter().enumerate() {
            assert_eq!(two_bit::get(&qs, e), c, "{e}");
        }
    }
}
