//! Walking whole rows block by block, for the formats whose blocks depend on nothing but their own values and
//! their columns' importance: the K-quants, the i-quants, FP4, ternary and low-bit formats (not the legacy formats'
//! imatrix path, which takes σ² over the row).

use quantfarm_ggml::blocks::Block;

/// Quantizes each `N`-element block of whole rows (`n_per_row` a multiple of `N`) with the block function `$f`
/// (`fn(&[f32; N], Option<&[f32; N]>) -> B`), given the block's values and, with an imatrix (one weight per column,
/// the same for every row), its columns' weights; writes the blocks into `$dst`, whose length the caller has
/// checked.
///
/// A macro rather than a function taking the block function as `impl Fn`: a call through `Fn` goes through a shim
/// that the compiler keeps out of line, compiled for the baseline CPU with the whole quantizer inlined into it, so
/// the quantizer never ran in the AVX2 build. Here `$f` (`#[inline(always)]`) is called directly and inlined where
/// the rows are walked, inside `crate::quantize_chunk`'s AVX2 build.
macro_rules! rows {
    ($src:expr, $n_per_row:expr, $imatrix:expr, $dst:expr, $f:path) => {{
        let (src, n_per_row, imatrix, dst): (&[f32], usize, Option<&[f32]>, &mut [u8]) =
            ($src, $n_per_row, $imatrix, $dst);
        let (n, size) = $crate::blockwise::geometry(&$f);
        for (row, out_row) in src.chunks_exact(n_per_row).zip(dst.chunks_exact_mut(n_per_row / n * size)) {
            for (i, (x, out)) in row.chunks_exact(n).zip(out_row.chunks_exact_mut(size)).enumerate() {
                // chunks_exact yields exactly N values.
                let Ok(x) = x.try_into() else { continue };
                let qw = imatrix.and_then(|m| m[n * i..n * (i + 1)].try_into().ok());
                quantfarm_ggml::blocks::Block::write(&$f(x, qw), out);
            }
        }
    }};
}
pub(crate) use rows;

/// The block length `N` and the encoded block's size of a block function, read off its type.
#[inline(always)]
pub(crate) fn geometry<B: Block, const N: usize>(_: &impl Fn(&[f32; N], Option<&[f32; N]>) -> B) -> (usize, usize) {
    debug_assert_eq!(B::ELEMENTS, N);
    (N, B::SIZE)
}
