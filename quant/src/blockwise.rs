//! Walking whole rows block by block, for the formats whose blocks depend on nothing but their own values and
//! their columns' importance: the K-quants, IQ4_*, FP4, ternary and low-bit formats (not the legacy formats'
//! imatrix path, which takes σ² over the row).

use quantfarm_ggml::blocks::Block;

/// Quantizes each `N`-element block of whole rows (`n_per_row` a multiple of `N`) with `f`, given the block's
/// values and, with an imatrix (one weight per column, the same for every row), its columns' weights; writes the
/// blocks into `dst`, whose length the caller has checked. Always inlined, so that it is also compiled for AVX2
/// (see `crate::quantize_chunk`).
#[inline(always)]
pub(crate) fn rows<B: Block, const N: usize>(
    src: &[f32],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
    dst: &mut [u8],
    f: impl Fn(&[f32; N], Option<&[f32; N]>) -> B,
) {
    debug_assert_eq!(B::ELEMENTS, N);
    let row_bytes = n_per_row / N * B::SIZE;
    for (row, out_row) in src.chunks_exact(n_per_row).zip(dst.chunks_exact_mut(row_bytes)) {
        for (i, (x, out)) in row.chunks_exact(N).zip(out_row.chunks_exact_mut(B::SIZE)).enumerate() {
            let x: &[f32; N] = match x.try_into() {
                Ok(x) => x,
                // chunks_exact yields exactly N values.
                Err(_) => continue,
            };
            let qw: Option<&[f32; N]> = imatrix.and_then(|m| m[N * i..N * (i + 1)].try_into().ok());
            f(x, qw).write(out);
        }
    }
}
