//! GGUF split files' names and keys: `PREFIX-0000N-of-0000M.gguf`, every file holding `split.no` (u16, 0-based),
//! `split.count` (u16) and `split.tensors.count` (i32, all tensors), as llama.cpp 0c1e570's
//! `tools/gguf-split/gguf-split.cpp` and `src/llama.cpp::llama_split_path` write them.

pub const SPLIT_NO: &str = "split.no";
pub const SPLIT_COUNT: &str = "split.count";
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// `llama_split_path`: the file name of shard `no` (0-based) of `count`.
pub fn split_file_name(prefix: &str, no: u16, count: u16) -> String {
    format!("{prefix}-{:05}-of-{:05}.gguf", u32::from(no) + 1, count)
}

/// The prefix and (0-based number, count) of a split file name, if it is one.
pub fn parse_split_file_name(name: &str) -> Option<(&str, u16, u16)> {
    let stem = name.strip_suffix(".gguf")?;
    // "-00001-of-00003" is 15 bytes.
    if stem.len() < 15 || !stem.is_char_boundary(stem.len() - 15) {
        return None;
    }
    let (prefix, tail) = stem.split_at(stem.len() - 15);
    let tail = tail.strip_prefix('-')?;
    let (no, count) = tail.split_once("-of-")?;
    let (no, count): (u16, u16) = (no.parse().ok()?, count.parse().ok()?);
    if no == 0 || no > count {
        return None;
    }
    Some((prefix, no - 1, count))
}
