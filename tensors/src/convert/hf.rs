//! The small JSON/text files of an HF checkpoint folder that conversion reads besides tensor headers.

use serde_json::{Map, Value as Json};

use crate::error::{Error, Result};
use quantfarm_store::Blob;
use quantfarm_store::Location;

/// Files are small; a bigger one is not what we think it is.
const MAX_FILE: u64 = 256 << 20;

pub struct HfFiles {
    /// The folder, for messages.
    pub dir: String,
    /// The folder's own name (`general.name` comes from it).
    pub dir_name: String,
    pub config: Map<String, Json>,
    /// config.json's own top-level `_name_or_path` (gguf-py's metadata heuristics read the file, not the
    /// converter's view of it, where a nested text config's would show through).
    pub name_or_path: Option<Json>,
    pub tokenizer: Option<Json>,
    pub tokenizer_config: Option<Json>,
    pub chat_template_jinja: Option<String>,
    pub chat_template_json: Option<Json>,
    /// A SentencePiece model (`tokenizer.model`, protobuf).
    pub sentencepiece: Option<Vec<u8>>,
    /// `added_tokens.json` (SentencePiece vocabularies' extra tokens).
    pub added_tokens: Option<Json>,
    /// Names of the files in the folder.
    pub names: Vec<String>,
    /// README.md's YAML front matter (the model card), which gguf-py's `Metadata.load` reads.
    pub model_card: Option<Map<String, Json>>,
    /// `generation_config.json`, when it is valid JSON (gguf-py ignores one that is not).
    pub generation_config: Option<Json>,
}

impl HfFiles {
    pub async fn read(dir: &Location) -> Result<HfFiles> {
        let names = dir.list().await?;
        let has = |n: &str| names.iter().any(|x| x == n);
        let config = match read_json(dir, "config.json", has("config.json")).await? {
            Some(Json::Object(m)) => m,
            Some(_) => return Err(Error::format(format!("{dir}/config.json"), "config.json", "is not a JSON object")),
            None => return Err(Error::format(format!("{dir}/config.json"), "config.json", "missing")),
        };
        let chat_template_jinja = match read_bytes(dir, "chat_template.jinja", has("chat_template.jinja")).await? {
            Some(b) => Some(String::from_utf8(b).map_err(|_| {
                Error::format(format!("{dir}/chat_template.jinja"), "chat_template.jinja", "is not UTF-8")
            })?),
            None => None,
        };
        Ok(HfFiles {
            dir: dir.to_string(),
            dir_name: dir.file_name().to_string(),
            name_or_path: config.get("_name_or_path").cloned(),
            config,
            tokenizer: read_json(dir, "tokenizer.json", has("tokenizer.json")).await?,
            tokenizer_config: read_json(dir, "tokenizer_config.json", has("tokenizer_config.json")).await?,
            chat_template_jinja,
            chat_template_json: read_json(dir, "chat_template.json", has("chat_template.json")).await?,
            sentencepiece: read_bytes(dir, "tokenizer.model", has("tokenizer.model")).await?,
            added_tokens: read_json(dir, "added_tokens.json", has("added_tokens.json")).await?,
            model_card: match read_bytes(dir, "README.md", has("README.md")).await? {
                Some(b) => {
                    let file = format!("{dir}/README.md");
                    let text = String::from_utf8(b).map_err(|_| Error::format(&file, "README.md", "is not UTF-8"))?;
                    super::authorship::model_card(&text, &file)?
                }
                None => None,
            },
            generation_config: read_bytes(dir, "generation_config.json", has("generation_config.json"))
                .await?
                .and_then(|b| serde_json::from_slice(&b).ok()),
            names,
        })
    }

    /// `DIR/name`, for messages.
    pub fn file_name(&self, name: &str) -> String {
        format!("{}/{name}", self.dir.trim_end_matches('/'))
    }

    /// A config value by dotted path (`rope_scaling.rope_type`); JSON null counts as absent.
    pub fn config_value(&self, path: &str) -> Option<&Json> {
        dotted(&self.config, path)
    }

    /// A tokenizer_config.json value by dotted path; JSON null counts as absent.
    pub fn tokenizer_config_value(&self, path: &str) -> Option<&Json> {
        dotted(self.tokenizer_config.as_ref()?.as_object()?, path)
    }

    pub fn has_file(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }
}

fn dotted<'a>(root: &'a Map<String, Json>, path: &str) -> Option<&'a Json> {
    let mut parts = path.split('.');
    let mut v = root.get(parts.next()?)?;
    for p in parts {
        v = v.as_object()?.get(p)?;
    }
    (!v.is_null()).then_some(v)
}

async fn read_bytes(dir: &Location, name: &str, present: bool) -> Result<Option<Vec<u8>>> {
    if !present {
        return Ok(None);
    }
    let blob = Blob::open(&dir.child(name)?).await?;
    if blob.len() > MAX_FILE {
        return Err(Error::format(blob.name(), name, format!("{} bytes is too large", blob.len())));
    }
    Ok(Some(blob.read_vec(0, blob.len()).await?))
}

async fn read_json(dir: &Location, name: &str, present: bool) -> Result<Option<Json>> {
    match read_bytes(dir, name, present).await? {
        None => Ok(None),
        Some(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| Error::format(format!("{dir}/{name}"), name, format!("not JSON: {e}"))),
    }
}
