//! GGUF split files: `PREFIX-0000N-of-0000M.gguf`, the first holding all metadata, every file holding the keys
//! `split.no` (u16, 0-based), `split.count` (u16) and `split.tensors.count` (i32, all tensors) —
//! `tools/gguf-split/gguf-split.cpp` and `llama_split_path` (llama.cpp 0c1e570).

use super::value::Value;
use super::GgufHeader;
use super::GgufModel;
use crate::error::{Error, Result};
use quantfarm_store::Blob;
use quantfarm_store::Location;

pub use quantfarm_ggml::split::{parse_split_file_name, split_file_name, SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS_COUNT};

/// The split keys of a header: (split.no, split.count, split.tensors.count), if present.
fn split_keys(h: &GgufHeader, file: &str) -> Result<Option<(u16, u16, u64)>> {
    let get = |key: &str| -> Result<Option<u64>> {
        match h.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                Error::format(file, key, format!("has type {}, expected an unsigned integer", v.value_type().name()))
            }),
        }
    };
    let (Some(no), Some(count)) = (get(SPLIT_NO)?, get(SPLIT_COUNT)?) else {
        return Ok(None);
    };
    let total = get(SPLIT_TENSORS_COUNT)?
        .ok_or_else(|| Error::format(file, SPLIT_TENSORS_COUNT, "missing although split.no and split.count are set"))?;
    let to16 = |v: u64, key: &str| u16::try_from(v).map_err(|_| Error::format(file, key, format!("{v} > 65535")));
    Ok(Some((to16(no, SPLIT_NO)?, to16(count, SPLIT_COUNT)?, total)))
}

/// Completes a model whose first file is already open: opens and checks every other shard.
pub(super) async fn open_siblings(
    loc: &Location,
    blob: Blob,
    header: GgufHeader,
    resolve: &(dyn Fn(&str) -> Option<Location> + Sync),
) -> Result<GgufModel> {
    let file = blob.name().to_string();
    let Some((no, count, total)) = split_keys(&header, &file)? else {
        return Ok(GgufModel { shards: vec![(blob, header)] });
    };
    // A merged file keeps the keys with split.count = 0; llama.cpp treats count ≤ 1 as "not split".
    if count <= 1 {
        return Ok(GgufModel { shards: vec![(blob, header)] });
    }
    if no != 0 {
        return Err(Error::format(&file, SPLIT_NO, format!("is {no}: open the first file of the split (split.no 0)")));
    }
    let name = loc.file_name();
    let (prefix, _, name_count) = parse_split_file_name(name).ok_or_else(|| {
        Error::format(
            &file,
            "file name",
            format!("split.count is {count} but the name is not PREFIX-00001-of-{count:05}.gguf"),
        )
    })?;
    if name_count != count {
        return Err(Error::format(&file, SPLIT_COUNT, format!("is {count} but the file name says {name_count}")));
    }
    let mut shards = vec![(blob, header)];
    for i in 1..count {
        let sib_name = split_file_name(prefix, i, count);
        let sib = match resolve(&sib_name) {
            Some(l) => l,
            None => loc.sibling(&sib_name)?,
        };
        let b = Blob::open(&sib).await?;
        let h = GgufHeader::read(&b).await?;
        match split_keys(&h, b.name())? {
            Some((n, c, t)) if n == i && c == count && t == total => {}
            other => {
                return Err(Error::format(
                    b.name(),
                    "split keys",
                    format!("expected split.no {i}, split.count {count}, split.tensors.count {total}; found {other:?}"),
                ))
            }
        }
        shards.push((b, h));
    }
    let found: usize = shards.iter().map(|(_, h)| h.tensors.len()).sum();
    if found as u64 != total {
        return Err(Error::format(
            &file,
            SPLIT_TENSORS_COUNT,
            format!("is {total} but the {count} files hold {found}"),
        ));
    }
    let mut names = std::collections::HashSet::with_capacity(found);
    for (b, h) in &shards {
        for t in &h.tensors {
            if !names.insert(t.name.as_str()) {
                return Err(Error::format(b.name(), format!("tensor {:?}", t.name), "appears in two split files"));
            }
        }
    }
    Ok(GgufModel { shards })
}

/// The split keys as gguf-split appends them (after its remove-and-append of `split.count`).
pub fn split_metadata(no: u16, count: u16, total_tensors: i32) -> Vec<(String, Value)> {
    vec![
        (SPLIT_NO.to_string(), Value::U16(no)),
        (SPLIT_TENSORS_COUNT.to_string(), Value::I32(total_tensors)),
        (SPLIT_COUNT.to_string(), Value::U16(count)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names() {
        assert_eq!(split_file_name("m", 0, 3), "m-00001-of-00003.gguf");
        assert_eq!(parse_split_file_name("dir-x/m-00002-of-00003.gguf"), Some(("dir-x/m", 1, 3)));
        assert_eq!(parse_split_file_name("m-00004-of-00003.gguf"), None);
        assert_eq!(parse_split_file_name("m.gguf"), None);
        assert_eq!(parse_split_file_name("m-00000-of-00003.gguf"), None);
    }
}
