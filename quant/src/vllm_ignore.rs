//! The modules a vLLM checkpoint leaves unquantized (`ignore`), as compressed-tensors matches them
//! (`compressed_tensors/utils/match.py`, `match_name`): an entry is a module's exact name (`lm_head`), or
//! `re:PATTERN`, which Python's `re.match` tries against the module's name: anchored at its start, not at its end
//! (`re:.*mlp\.down_proj$`). Patterns are compiled by Rust's `regex`, whose syntax is Python's for everything but
//! look-around and back-references: a pattern using those is refused with `regex`'s message, never misread.

use regex::Regex;

/// One entry of `ignore`.
#[derive(Clone, Debug)]
pub enum IgnoreEntry {
    /// A module's exact name.
    Name(String),
    /// `re:PATTERN`: `text` as written (with its prefix), `regex` anchored at the start as `re.match` is.
    Pattern { text: String, regex: Regex },
}

impl IgnoreEntry {
    /// The entry as written in `ignore`; the error names it and says why it cannot be used.
    pub fn parse(entry: &str) -> Result<IgnoreEntry, String> {
        if entry.trim().is_empty() {
            return Err(format!("{entry:?}: is empty"));
        }
        match entry.strip_prefix("re:") {
            Some(pattern) => {
                let regex = Regex::new(&format!("^(?:{pattern})")).map_err(|e| {
                    format!("{entry:?}: not a pattern this version reads (Python's re syntax without look-around or back-references): {e}")
                })?;
                Ok(IgnoreEntry::Pattern { text: entry.to_string(), regex })
            }
            None if entry.ends_with(".weight") => Err(format!(
                "{entry:?}: must name a module (`lm_head`, `model.layers.0.mlp.down_proj`, `re:.*mlp\\.gate$`), not a \
                 tensor"
            )),
            None => Ok(IgnoreEntry::Name(entry.to_string())),
        }
    }

    /// Whether it names module `module`.
    pub fn matches(&self, module: &str) -> bool {
        match self {
            IgnoreEntry::Name(n) => n == module,
            IgnoreEntry::Pattern { regex, .. } => regex.is_match(module),
        }
    }

    /// The entry as written.
    pub fn text(&self) -> &str {
        match self {
            IgnoreEntry::Name(n) => n,
            IgnoreEntry::Pattern { text, .. } => text,
        }
    }
}

/// Every entry of an `ignore` list.
#[derive(Clone, Debug, Default)]
pub struct Ignore(Vec<IgnoreEntry>);

impl Ignore {
    /// Parses each entry; the error names the first one that cannot be used.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Ignore, String> {
        entries.iter().map(|e| IgnoreEntry::parse(e.as_ref())).collect::<Result<_, _>>().map(Ignore)
    }

    /// Modules by their exact names (never patterns: a name is taken as written).
    pub fn names(names: impl IntoIterator<Item = String>) -> Ignore {
        Ignore(names.into_iter().map(IgnoreEntry::Name).collect())
    }

    /// Whether some entry names module `module`.
    pub fn matches(&self, module: &str) -> bool {
        self.0.iter().any(|e| e.matches(module))
    }

    pub fn entries(&self) -> &[IgnoreEntry] {
        &self.0
    }

    /// These entries, then `more`.
    pub fn with(mut self, more: Ignore) -> Ignore {
        self.0.extend(more.0);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_is_anchored_at_the_start_only_as_re_match_is() {
        let i = Ignore::parse(&["lm_head", r"re:.*mlp\.down_proj$", "re:model.layers.1"]).unwrap();
        assert!(i.matches("lm_head") && !i.matches("lm_head_2"), "a name matches itself only");
        assert!(i.matches("model.layers.3.mlp.down_proj") && !i.matches("model.layers.3.mlp.down_proj_b"));
        // `re.match` does not anchor the end: layers 1, 10, 11 … all start so.
        assert!(i.matches("model.layers.1.self_attn.q_proj") && i.matches("model.layers.10.mlp.up_proj"));
        assert!(!i.matches("x.model.layers.1.mlp.up_proj"), "anchored at the start");
    }

    #[test]
    fn what_cannot_be_used_is_refused_naming_it() {
        for (entry, says) in [
            ("lm_head.weight", "must name a module"),
            ("  ", "is empty"),
            ("re:(?<=x)y", "look-around"),
            ("re:(a", "not a pattern"),
        ] {
            let e = Ignore::parse(&[entry]).unwrap_err();
            assert!(e.contains(&format!("{entry:?}")) && e.contains(says), "{entry}: {e}");
        }
    }
}
