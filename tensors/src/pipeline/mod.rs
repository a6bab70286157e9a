//! Conversions as a pipeline of three stages, so that reading piece k+1, transforming piece k and writing piece
//! k−1 happen at once instead of one after another:
//!
//! 1. **read** ([`ReadAhead`]): every byte range a conversion will read is known before it starts ([`Reads`]);
//!    a task of its own reads them in order into a few buffers that go round — one being read, one waiting, one
//!    with the transform;
//! 2. **transform**: the caller's (convert, dequantize, quantize on rayon's threads), one piece at a time;
//! 3. **write**: the staged sink's write-behind thread hashes and writes what the transform hands it
//!    (`quantfarm_store`'s sink: at most 4 queued pieces of 1 MiB).
//!
//! **Memory bound.** The read stage holds at most `depth` pieces, the one with the transform included, and the
//! transform works on one piece at a time. Callers cut their tensors with [`rows_per_piece`], so that [`DEPTH`]
//! pieces plus one piece's transform buffers and output fit their budget; [`Reads::start`] lowers the depth (to 1:
//! no read-ahead at all) when the largest piece would not fit that many times. Tensor data in flight therefore
//! stays within the budget — divided between the stages, not multiplied by them — whenever one row fits at all
//! (a piece is never less than one row, or than the rows a transform needs together), plus the sink's 5 MiB.

mod read_ahead;
mod spans;

pub use read_ahead::{ReadAhead, Reads, DEPTH};
pub use spans::{byte_span, decode_rows, read_spans, row_spans, Span};

/// Rows per piece of a tensor whose rows are `raw_row` bytes as read and need `work_row` bytes of transform
/// buffers and output each: as many as let [`DEPTH`] pieces and one piece's work fit `budget`, a multiple of
/// `unit` (rows a transform needs together, e.g. a head), and at least `unit`.
pub fn rows_per_piece(budget: u64, raw_row: u64, work_row: u64, unit: u64) -> u64 {
    let unit = unit.max(1);
    let per_row = (DEPTH as u64 * raw_row + work_row).max(1);
    (budget / per_row / unit).max(1) * unit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_share_the_budget_between_the_stages() {
        // 1000-byte rows converted into 500 bytes: 3·1000 + 500 per row.
        assert_eq!(rows_per_piece(35_000, 1000, 500, 1), 10);
        assert_eq!(rows_per_piece(35_000, 1000, 500, 4), 8);
        // Less than a row: one row (or one unit) anyway.
        assert_eq!(rows_per_piece(100, 1000, 500, 1), 1);
        assert_eq!(rows_per_piece(100, 1000, 500, 64), 64);
    }
}
