//! How a plan's tensors are cut into GGUF split files: gguf-split's `split_strategy::should_split` rules
//! (`tools/gguf-split/gguf-split.cpp`) and llama.cpp's split file names (`src/llama.cpp::llama_split_path`).

use std::ops::Range;

use crate::gguf::DEFAULT_ALIGNMENT;

/// When a new split file starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SplitRule {
    /// `--split-max-tensors N`: a new file at every tensor index `i > 0` with `i % N == 0`.
    MaxTensors(usize),
    /// `--split-max-size N` (bytes): a new file when the running sum of `PAD(nbytes, 32)` would exceed N.
    MaxBytes(u64),
}

fn pad(n: u64) -> u64 {
    n.div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT
}

/// The tensor index ranges of each output file (`None`: one file). Every range is non-empty, except the single
/// range of a plan with no tensors. Unlike gguf-split, a first tensor larger than `MaxBytes` does not produce an
/// empty first file: a file is only closed once it holds a tensor.
pub fn split_ranges(nbytes: &[u64], rule: Option<SplitRule>) -> Vec<Range<usize>> {
    let n = nbytes.len();
    let mut out = Vec::new();
    let mut start = 0;
    let mut size = 0u64;
    for (i, &b) in nbytes.iter().enumerate() {
        let b = pad(b);
        let split = i > start
            && match rule {
                None => false,
                Some(SplitRule::MaxTensors(m)) => m > 0 && i % m == 0,
                Some(SplitRule::MaxBytes(max)) => size.saturating_add(b) > max,
            };
        if split {
            out.push(start..i);
            start = i;
            size = 0;
        }
        size = size.saturating_add(b);
    }
    out.push(start..n);
    out
}

/// `PREFIX.gguf` for one file, else llama.cpp's `PREFIX-0000N-of-0000M.gguf` (`llama_split_path`; N is 1-based).
pub fn output_file_name(prefix: &str, shard: usize, n_shards: usize) -> String {
    if n_shards == 1 {
        format!("{prefix}.gguf")
    } else {
        format!("{prefix}-{:05}-of-{:05}.gguf", shard + 1, n_shards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_tensors() {
        assert_eq!(split_ranges(&[1; 7], Some(SplitRule::MaxTensors(3))), vec![0..3, 3..6, 6..7]);
        assert_eq!(split_ranges(&[1; 6], Some(SplitRule::MaxTensors(3))), vec![0..3, 3..6]);
        assert_eq!(split_ranges(&[1; 6], None), vec![0..6]);
        assert_eq!(split_ranges(&[], Some(SplitRule::MaxTensors(3))), vec![0..0]);
    }

    #[test]
    fn max_bytes_counts_padded_sizes() {
        // Padded sizes 32, 32, 64, 32: with max 64 the first two fit together (64), the third alone (64).
        assert_eq!(split_ranges(&[1, 32, 33, 5], Some(SplitRule::MaxBytes(64))), vec![0..2, 2..3, 3..4]);
        // 31 + 1 bytes unpadded would fit in 32, padded they do not.
        assert_eq!(split_ranges(&[31, 1], Some(SplitRule::MaxBytes(32))), vec![0..1, 1..2]);
        // A tensor larger than the max gets a file of its own, never an empty file before it.
        assert_eq!(split_ranges(&[100, 1, 1], Some(SplitRule::MaxBytes(64))), vec![0..1, 1..3]);
    }

    #[test]
    fn names() {
        assert_eq!(output_file_name("m", 0, 1), "m.gguf");
        assert_eq!(output_file_name("m", 1, 3), "m-00002-of-00003.gguf");
    }
}
