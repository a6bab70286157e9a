//! An object's identity as the farm records it: the sha256 of its bytes and its size. For a folder (an MLX
//! checkpoint, a merged HF checkpoint) the sha256 is of its files' digest lines and the size their sum.

use std::fmt;

/// The sha256 (lower-case hex) and the size in bytes of an object or folder.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Digest {
    pub sha256: String,
    pub bytes: u64,
}

impl Digest {
    pub fn new(sha256: impl Into<String>, bytes: u64) -> Digest {
        Digest { sha256: sha256.into(), bytes }
    }

    /// The digest of a folder whose files are given as (name, sha256, bytes): sha256 over their `sha256  name`
    /// lines (as `sha256sum` prints them) sorted by name, and the sum of their sizes.
    pub fn of_folder(mut files: Vec<(String, String, u64)>) -> Digest {
        use sha2::{Digest as _, Sha256};
        files.sort();
        let mut h = Sha256::new();
        for (name, sha, _) in &files {
            h.update(format!("{sha}  {name}\n").as_bytes());
        }
        Digest::new(crate::hex(&h.finalize()), files.iter().map(|f| f.2).sum())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256 {} ({} bytes)", self.sha256, self.bytes)
    }
}
