//! The `general.*` authorship and sampling keys convert_hf_to_gguf.py writes, as gguf-py's `Metadata` computes
//! them (`gguf-py/gguf/metadata.py` and `ModelBase.prepare_metadata` in `conversion/base.py`, llama.cpp 0.3.36):
//!
//! 1. `generation_config.json`'s sampling settings (`general.sampling.*`);
//! 2. README.md's YAML front matter (the model card): llama.cpp's own keys (`name`, `author`, …), its `model_*`
//!    convention, Hugging Face's `base_model`, `datasets`, `license`, `tags`, `pipeline_tag`, `language`;
//! 3. config.json's `_name_or_path` when it is a model id (at most one `/`), split into name, organization, base
//!    name, fine-tune, version and size label by `get_model_id_components`' heuristics;
//! 4. the same heuristics on the folder's name; the folder's name itself as the last resort for the name, and the
//!    parameter count in gguf-py's rounded notation for the size label.
//!
//! Each is written in `Metadata.set_gguf_meta_model`'s order. Where gguf-py reads YAML 1.1 (PyYAML) this reads YAML
//! 1.2: values that differ between them (`yes`, `on`, unquoted dates) are not strings in either, and a key gguf-py
//! writes as a string must be a string here (an error names the file and the key); the text is the same.

use serde_json::{Map, Value as Json};

use super::hf::HfFiles;
use super::metadata::{id_to_title, size_label, Kvs, PlanFacts};
use crate::error::{Error, Result};
use crate::gguf::Value;

/// The parts of a model id (`org/name`) gguf-py's `get_model_id_components` finds.
#[derive(Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub struct IdComponents {
    /// The whole name after the organization.
    pub name: Option<String>,
    pub organization: Option<String>,
    pub basename: Option<String>,
    pub finetune: Option<String>,
    pub version: Option<String>,
    pub size_label: Option<String>,
}

/// What a part of a name was taken for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Basename,
    SizeLabel,
    Finetune,
    Version,
    Type,
}

/// gguf-py `Metadata.get_model_id_components(model_id, total_params)`: `total_params` decides whether a size-like
/// part is the model's size or a context length (negative for a LoRA adapter).
pub fn id_components(model_id: &str, total_params: i64) -> IdComponents {
    if model_id.contains(' ') {
        // A human sentence: the name only.
        return IdComponents { name: Some(model_id.to_string()), ..IdComponents::default() };
    }
    let (org, full) = match model_id.split_once('/') {
        Some((org, name)) => (Some(org), name),
        None => (None, model_id),
    };
    // `./` or `../` is not an organization.
    let org = org.filter(|o| !o.starts_with('.'));
    let re = |p: &str| regex::Regex::new(&format!("(?i)^(?:{p})$")).expect("constant regex");
    let (version_re, type_re) = (re(r"(v|iter)?\d+([.]\d+)*"), re(r"i?q\d(_\w)*|b?fp?(16|32)"));
    let size_re = re(r"(([A]|\d+[x])?\d+([._]\d+)?[KMBT][\d]?|small|mini|medium|large|x?xl)");
    let finetune_re = re(r"chat|instruct|vision|lora");
    let mut parts: Vec<String> = full.split('-').filter(|p| !p.is_empty()).map(str::to_string).collect();
    let mut types: Vec<Vec<Part>> = vec![Vec::new(); parts.len()];
    for (i, part) in parts.iter_mut().enumerate() {
        let t = &mut types[i];
        if version_re.is_match(part) {
            t.push(Part::Version);
        } else if type_re.is_match(part) {
            t.push(Part::Type);
            *part = part.to_uppercase();
        } else if i > 0 && size_re.is_match(part) {
            let mut p: Vec<char> = part.replace('_', ".").chars().collect();
            // bloom-7b1 → 7.1b
            if p.last().is_some_and(char::is_ascii_digit) && p.len() >= 2 {
                let (a, b) = (p[p.len() - 1], p[p.len() - 2]);
                p.truncate(p.len() - 2);
                p.extend(['.', a, b]);
            }
            // 7b → 7B
            let n = p.len();
            if n > 1 && p[n - 2].is_ascii_digit() && "kmbt".contains(p[n - 1]) {
                p[n - 1] = p[n - 1].to_ascii_uppercase();
            }
            if total_params != 0 {
                let last = p[p.len() - 1];
                let head: String = p[..p.len() - 1].iter().collect();
                // Python's float() of the head; `" KMBT".find` gives -1 for another suffix (1000^-1).
                if let Some(x) = python_float(&head) {
                    let exp = " KMBT".find(last).map_or(-1, |e| e as i32);
                    let label_params = x * 1000f64.powi(exp);
                    let context = if total_params < 0 {
                        label_params < (total_params.unsigned_abs() / 8) as f64
                    } else {
                        (label_params - total_params as f64).abs() > (7 * total_params / 8) as f64
                    };
                    if context {
                        // Likely a context length: lower-cased, a fine-tune part.
                        t.push(Part::Finetune);
                        let n = p.len();
                        p[n - 1] = p[n - 1].to_lowercase().next().unwrap_or(p[n - 1]);
                    }
                }
            }
            if t.is_empty() {
                t.push(Part::SizeLabel);
            }
            *part = p.into_iter().collect();
        } else if i > 0 && finetune_re.is_match(part) {
            t.push(if total_params < 0 && part.eq_ignore_ascii_case("lora") { Part::Type } else { Part::Finetune });
        }
    }
    // Word sizes (small, xl) give way to a numeric one.
    let numeric = parts.iter().zip(&types).any(|(p, t)| t.contains(&Part::SizeLabel) && p.chars().any(is_decimal));
    if numeric {
        for (p, t) in parts.iter().zip(types.iter_mut()) {
            if t.contains(&Part::SizeLabel) && p.chars().all(char::is_alphabetic) {
                t.retain(|x| *x != Part::SizeLabel);
            }
        }
    }
    // The base name: leading untyped words and versions; later untyped parts are fine-tunes.
    let mut at_start = true;
    for (p, t) in parts.iter().zip(types.iter_mut()) {
        if at_start
            && ((t.is_empty() && p.chars().next().is_some_and(char::is_alphabetic)) || t.contains(&Part::Version))
        {
            t.push(Part::Basename);
        } else {
            at_start = false;
            if t.is_empty() {
                t.push(Part::Finetune);
            }
        }
    }
    // A trailing version is not the base name's.
    for t in types.iter_mut().rev() {
        if t.contains(&Part::Basename) && t.len() > 1 {
            t.retain(|x| *x != Part::Basename);
        } else {
            break;
        }
    }
    let join = |keep: &dyn Fn(&[Part]) -> bool| {
        let v: Vec<&str> = parts.iter().zip(&types).filter(|(_, t)| keep(t)).map(|(p, _)| p.as_str()).collect();
        (!v.is_empty()).then(|| v.join("-"))
    };
    let mut sizes: Vec<&str> = Vec::new();
    for (p, t) in parts.iter().zip(&types) {
        if t.contains(&Part::SizeLabel) && !sizes.contains(&p.as_str()) {
            sizes.push(p);
        }
    }
    let size_label = (!sizes.is_empty()).then(|| sizes.join("-"));
    let finetune = join(&|t| t.contains(&Part::Finetune));
    let version = join(&|t| t.contains(&Part::Version) && !t.contains(&Part::Basename));
    let basename = match (&size_label, &finetune, &version) {
        // Too ambiguous: nothing.
        (None, None, None) => None,
        _ => join(&|t| t.contains(&Part::Basename)),
    };
    IdComponents {
        name: Some(full.to_string()),
        organization: org.map(str::to_string),
        basename,
        finetune,
        version,
        size_label,
    }
}

/// Python's `str.isdecimal` for the characters model ids hold.
fn is_decimal(c: char) -> bool {
    c.is_ascii_digit()
}

/// Python's `float(s)` for the heads of size parts (digits, one dot; `inf`/`nan` words are not sizes).
fn python_float(s: &str) -> Option<f64> {
    let t = s.trim();
    let ok =
        !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.') && t.chars().any(|c| c.is_ascii_digit());
    if ok {
        t.parse().ok()
    } else {
        None
    }
}

/// The YAML front matter of a README.md (gguf-py `Metadata.load_model_card`): the lines after a first line that is
/// exactly `---` (after Python's `splitlines`; a byte-order mark is part of that line) up to the next `---`, with
/// gguf-py's two fixes (`- no` quoted, tabs as two spaces); `None` without front matter, or when it is not a mapping.
pub fn model_card(text: &str, file: &str) -> Result<Option<Map<String, Json>>> {
    let lines = split_lines(text);
    if lines.first() != Some(&"---") {
        return Ok(None);
    }
    let mut yaml: String = lines[1..].iter().take_while(|l| **l != "---").map(|l| format!("{l}\n")).collect();
    yaml = yaml.replace("- no\n", "- \"no\"\n").replace('\t', "  ");
    if yaml.trim().is_empty() {
        return Ok(None);
    }
    let value: Json = serde_norway::from_str(&yaml)
        .map_err(|e| Error::format(file, "model card (YAML front matter)", e.to_string()))?;
    Ok(match value {
        Json::Object(m) => Some(m),
        _ => None,
    })
}

/// Python's `str.splitlines()`.
fn split_lines(text: &str) -> Vec<&str> {
    let breaks = ['\n', '\r', '\u{0b}', '\u{0c}', '\u{1c}', '\u{1d}', '\u{1e}', '\u{85}', '\u{2028}', '\u{2029}'];
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if breaks.contains(&c) {
            out.push(&text[start..i]);
            let mut end = i + c.len_utf8();
            if c == '\r' {
                if let Some((j, '\n')) = chars.peek().copied() {
                    chars.next();
                    end = j + 1;
                }
            }
            start = end;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// gguf-py's `Metadata` fields that reach the GGUF.
#[derive(Default)]
struct Metadata {
    name: Option<String>,
    author: Option<String>,
    version: Option<String>,
    organization: Option<String>,
    finetune: Option<String>,
    basename: Option<String>,
    description: Option<String>,
    quantized_by: Option<String>,
    size_label: Option<String>,
    license: Option<String>,
    license_name: Option<String>,
    license_link: Option<String>,
    url: Option<String>,
    doi: Option<String>,
    uuid: Option<String>,
    repo_url: Option<String>,
    source_url: Option<String>,
    source_doi: Option<String>,
    source_uuid: Option<String>,
    source_repo_url: Option<String>,
    base_models: Option<Vec<Map<String, Json>>>,
    datasets: Option<Vec<Map<String, Json>>>,
    tags: Option<Vec<String>>,
    languages: Option<Vec<String>>,
}

/// The string a model card key gguf-py writes with `add_string` holds.
fn card_string(card: &Map<String, Json>, key: &str, file: &str) -> Result<Option<String>> {
    match card.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(Error::format(file, format!("model card: {key}"), format!("is {v}; a string was expected"))),
    }
}

/// gguf-py's entries for base models and datasets (`base_model: [ids or dicts]`): an id as its name,
/// organization, version and Hugging Face URL; a URL as it is (with the id's parts when it is huggingface.co's);
/// a dict as written.
fn sources(value: &Json, total_params: i64, file: &str, key: &str) -> Result<Vec<Map<String, Json>>> {
    let items: Vec<&Json> = match value {
        Json::String(_) => vec![value],
        Json::Array(a) => a.iter().collect(),
        _ => Vec::new(),
    };
    let hf_url = regex::Regex::new(r"^https?://huggingface.co/([^/]+/[^/]+)$").expect("constant regex");
    let mut out = Vec::new();
    for item in items {
        let mut entry = Map::new();
        match item {
            Json::String(id) if id.starts_with("http://") || id.starts_with("https://") || id.starts_with("ssh://") => {
                entry.insert("repo_url".into(), Json::String(id.clone()));
                if let Some(c) = id.contains("huggingface.co").then(|| hf_url.captures(id)).flatten() {
                    let parts = id_components(&c[1], total_params);
                    if let Some(n) = parts.name {
                        entry.insert("name".into(), Json::String(id_to_title(&n)));
                    }
                    if let Some(o) = parts.organization {
                        entry.insert("organization".into(), Json::String(id_to_title(&o)));
                    }
                    if let Some(v) = parts.version {
                        entry.insert("version".into(), Json::String(v));
                    }
                }
            }
            Json::String(id) => {
                let parts = id_components(id, total_params);
                if let Some(n) = &parts.name {
                    entry.insert("name".into(), Json::String(id_to_title(n)));
                }
                if let Some(o) = &parts.organization {
                    entry.insert("organization".into(), Json::String(id_to_title(o)));
                }
                if let Some(v) = parts.version {
                    entry.insert("version".into(), Json::String(v));
                }
                if let (Some(o), Some(n)) = (&parts.organization, &parts.name) {
                    entry.insert("repo_url".into(), Json::String(format!("https://huggingface.co/{o}/{n}")));
                }
            }
            Json::Object(m) => entry = m.clone(),
            other => {
                tracing::error!(file, key, entry = %other, "a model card entry in no known format (as gguf-py: an empty one)")
            }
        }
        out.push(entry);
    }
    Ok(out)
}

/// A model card value as gguf-py's `use_array_model_card_metadata` appends it: a string, or a list's items.
fn append_array(to: &mut Option<Vec<String>>, value: Option<&Json>, file: &str, key: &str) -> Result<()> {
    let Some(v) = value.filter(|v| !v.is_null()) else { return Ok(()) };
    let items: Vec<&Json> = match v {
        Json::Array(a) => a.iter().collect(),
        Json::String(_) => vec![v],
        // gguf-py leaves another type out but still sets the list.
        _ => Vec::new(),
    };
    let list = to.get_or_insert_with(Vec::new);
    for item in items {
        match item {
            Json::String(s) => list.push(s.clone()),
            other => {
                return Err(Error::format(
                    file,
                    format!("model card: {key}"),
                    format!("holds {other}; gguf-py writes strings only"),
                ))
            }
        }
    }
    Ok(())
}

fn apply_card(m: &mut Metadata, card: &Map<String, Json>, total_params: i64, file: &str) -> Result<()> {
    macro_rules! first {
        ($field:ident, $($key:literal),+) => {
            $( if m.$field.is_none() { m.$field = card_string(card, $key, file)?; } )+
        };
    }
    // llama.cpp's own convention, then its `model_*` one, then keys some model creators use.
    first!(name, "name");
    first!(author, "author");
    first!(version, "version");
    first!(organization, "organization");
    first!(description, "description");
    first!(finetune, "finetune");
    first!(basename, "basename");
    first!(size_label, "size_label");
    first!(source_url, "url");
    first!(source_doi, "doi");
    first!(source_uuid, "uuid");
    first!(source_repo_url, "repo_url");
    first!(name, "model_name");
    first!(author, "model_author");
    first!(version, "model_version");
    first!(organization, "model_organization");
    first!(description, "model_description");
    first!(finetune, "model_finetune");
    first!(basename, "model_basename");
    first!(size_label, "model_size_label");
    first!(source_url, "model_url");
    first!(source_doi, "model_doi");
    first!(source_uuid, "model_uuid");
    first!(source_repo_url, "model_repo_url");
    first!(author, "model_creator");
    first!(basename, "model_type");
    for (keys, field, what) in [
        (["base_model", "base_models", "base_model_sources"], &mut m.base_models, "base_model"),
        (["datasets", "dataset", "dataset_sources"], &mut m.datasets, "datasets"),
    ] {
        if keys.iter().any(|k| card.contains_key(*k)) {
            // The first key present, even when null (gguf-py's nested .get).
            let value = keys.iter().find_map(|k| card.get(*k)).unwrap_or(&Json::Null);
            field.get_or_insert_with(Vec::new).extend(sources(value, total_params, file, what)?);
        }
    }
    if m.license.is_none() {
        m.license = match card.get("license") {
            None | Some(Json::Null) => None,
            Some(Json::String(s)) => Some(s.clone()),
            Some(Json::Array(a)) => Some(
                a.iter()
                    .map(|x| x.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| Error::format(file, "model card: license", "a list of strings was expected"))?
                    .join(","),
            ),
            Some(v) => {
                return Err(Error::format(file, "model card: license", format!("is {v}; a string was expected")))
            }
        };
    }
    first!(license_name, "license_name");
    first!(license_link, "license_link");
    append_array(&mut m.tags, card.get("tags"), file, "tags")?;
    append_array(&mut m.tags, card.get("pipeline_tag"), file, "pipeline_tag")?;
    append_array(&mut m.languages, card.get("languages"), file, "languages")?;
    append_array(&mut m.languages, card.get("language"), file, "language")?;
    Ok(())
}

/// Fills what is still missing from a model id's parts (`_name_or_path`, then the folder's name).
fn apply_id(m: &mut Metadata, id: &str, total_params: i64) {
    let c = id_components(id, total_params);
    if m.name.is_none() {
        m.name = c.name.map(|n| id_to_title(&n));
    }
    if m.organization.is_none() {
        m.organization = c.organization.map(|o| id_to_title(&o));
    }
    m.basename = m.basename.take().or(c.basename);
    m.finetune = m.finetune.take().or(c.finetune);
    m.version = m.version.take().or(c.version);
    m.size_label = m.size_label.take().or(c.size_label);
}

/// `generation_config.json`'s sampling settings, as `Metadata.load` reads them and `set_gguf_meta_model` writes them.
fn sampling(hf: &HfFiles, kv: &mut Kvs) -> Result<()> {
    let Some(Json::Object(g)) = &hf.generation_config else { return Ok(()) };
    let file = hf.file_name("generation_config.json");
    let get = |keys: &[&str]| keys.iter().find_map(|k| g.get(*k)).filter(|v| !v.is_null());
    for (key, names, int) in [
        ("general.sampling.sequence", &["sequence"][..], None),
        ("general.sampling.top_k", &["top_k"], Some(true)),
        ("general.sampling.top_p", &["top_p"], Some(false)),
        ("general.sampling.min_p", &["min_p"], Some(false)),
        ("general.sampling.xtc_probability", &["xtc_probability"], Some(false)),
        ("general.sampling.xtc_threshold", &["xtc_threshold"], Some(false)),
        ("general.sampling.temp", &["temperature"], Some(false)),
        ("general.sampling.penalty_last_n", &["penalty_last_n"], Some(true)),
        ("general.sampling.penalty_repeat", &["penalty_repeat", "repetition_penalty"], Some(false)),
        ("general.sampling.mirostat", &["mirostat"], Some(true)),
        ("general.sampling.mirostat_tau", &["mirostat_tau"], Some(false)),
        ("general.sampling.mirostat_eta", &["mirostat_eta"], Some(false)),
    ] {
        let Some(v) = get(names) else { continue };
        let bad = || Error::format(&file, names.join(" | "), format!("{v} does not fit {key}"));
        let value = match int {
            None => Value::String(v.as_str().ok_or_else(bad)?.into()),
            // gguf-py packs '<i' (an int) and '<f' (a float, rounded from the f64).
            Some(true) => Value::I32(v.as_i64().and_then(|x| i32::try_from(x).ok()).ok_or_else(bad)?),
            Some(false) => Value::F32(v.as_f64().ok_or_else(bad)? as f32),
        };
        kv.set(key, value);
    }
    Ok(())
}

/// Writes the authorship and sampling keys into `kv`, in `Metadata.set_gguf_meta_model`'s order.
pub fn keys(hf: &HfFiles, facts: &PlanFacts, kv: &mut Kvs) -> Result<()> {
    let total = i64::try_from(facts.total_params).unwrap_or(i64::MAX);
    let readme = hf.file_name("README.md");
    let mut m = Metadata::default();
    if let Some(card) = &hf.model_card {
        apply_card(&mut m, card, total, &readme)?;
    }
    // `_name_or_path` when it is a model id rather than a path.
    if let Some(id) = hf.name_or_path.as_ref().and_then(Json::as_str).filter(|id| id.matches('/').count() <= 1) {
        apply_id(&mut m, id, total);
    }
    apply_id(&mut m, &hf.dir_name, total);
    let name = m.name.take().unwrap_or_else(|| hf.dir_name.clone());
    if m.size_label.is_none() && facts.total_params > 0 {
        m.size_label = Some(match facts.experts {
            Some((count, params)) => format!("{count}x{}", size_label(params)),
            None => size_label(facts.total_params),
        });
    }

    sampling(hf, kv)?;
    let mut s = |key: &str, v: &Option<String>| {
        if let Some(v) = v {
            kv.set(key, Value::String(v.as_str().into()));
        }
    };
    s("general.name", &Some(name));
    s("general.author", &m.author);
    s("general.version", &m.version);
    s("general.organization", &m.organization);
    s("general.finetune", &m.finetune);
    s("general.basename", &m.basename);
    s("general.description", &m.description);
    s("general.quantized_by", &m.quantized_by);
    s("general.size_label", &m.size_label);
    s("general.license", &m.license);
    s("general.license.name", &m.license_name);
    s("general.license.link", &m.license_link);
    s("general.url", &m.url);
    s("general.doi", &m.doi);
    s("general.uuid", &m.uuid);
    s("general.repo_url", &m.repo_url);
    s("general.source.url", &m.source_url);
    s("general.source.doi", &m.source_doi);
    s("general.source.uuid", &m.source_uuid);
    s("general.source.repo_url", &m.source_repo_url);
    for (group, list) in [("base_model", &m.base_models), ("dataset", &m.datasets)] {
        let Some(list) = list else { continue };
        kv.set(&format!("general.{group}.count"), Value::U32(list.len() as u32));
        for (i, entry) in list.iter().enumerate() {
            for field in ["name", "author", "version", "organization", "description", "url", "doi", "uuid", "repo_url"]
            {
                match entry.get(field) {
                    None => {}
                    Some(Json::String(v)) => {
                        kv.set(&format!("general.{group}.{i}.{field}"), Value::String(v.as_str().into()))
                    }
                    Some(v) => {
                        return Err(Error::format(
                            &readme,
                            format!("model card: {group} {i}: {field}"),
                            format!("is {v}; a string was expected"),
                        ))
                    }
                }
            }
        }
    }
    for (key, list) in [("general.tags", &m.tags), ("general.languages", &m.languages)] {
        if let Some(list) = list {
            let items = list.iter().map(|s| s.as_str().into()).collect();
            kv.set(key, Value::Array(crate::gguf::Array::String(items)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_parts_like_gguf_py_examples() {
        let c = id_components("meta-llama/Llama-3.1-8B-Instruct", 8_030_261_248);
        assert_eq!(c.organization.as_deref(), Some("meta-llama"));
        assert_eq!(c.basename.as_deref(), Some("Llama-3.1"));
        assert_eq!((c.size_label.as_deref(), c.finetune.as_deref()), (Some("8B"), Some("Instruct")));
        // A size far from the model's is a context length.
        let c = id_components("llama-2-7b-32k", 6_738_415_616);
        assert_eq!((c.size_label.as_deref(), c.finetune.as_deref()), (Some("7B"), Some("32k")));
        assert_eq!(id_components("smollm2-hf", 0).basename, None, "too ambiguous");
    }

    #[test]
    fn front_matter_as_gguf_py_reads_it() {
        let card = model_card("---\nlicense: apache-2.0\nlanguage:\n- no\n---\n# x\n", "README.md").unwrap().unwrap();
        assert_eq!(card["language"][0], "no");
        assert!(model_card("\u{feff}---\nlicense: mit\n---\n", "README.md").unwrap().is_none(), "BOM: no card");
        assert!(model_card("# title\n", "README.md").unwrap().is_none());
        assert_eq!(split_lines("a\r\nb\rc\n"), ["a", "b", "c"]);
    }
}
