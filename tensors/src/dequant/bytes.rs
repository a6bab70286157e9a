//! Little-endian field readers for the block decoders (ggml stores every field little-endian, fp16 as a raw u16).

use super::float::f16_bits_to_f32;

/// The fp16 at byte `at`, widened exactly to f32.
#[inline]
pub(super) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// The f32 at byte `at`.
#[inline]
pub(super) fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The u32 at byte `at`.
#[inline]
pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
