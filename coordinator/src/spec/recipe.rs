//! The rungs of a GGUF ladder: a llama-quantize file type (`Q4_K_M`), or a named recipe — a base file type with
//! llama-quantize's `--tensor-type` entries and output/embedding types (`{name: Q4_K_XL, base: Q4_K_M,
//! tensor_types: {ffn_down: Q6_K}}`), made, verified and measured like any file type.
//!
//! [`Level`] is a rung's identity in task ids, artifact names, gates and the report: `Copy`, so task keys stay
//! plain values, and parsed back from its name without the spec (a recipe's name is never a file type's, a ggml
//! type's, an MLX checkpoint's or a subject's).

use std::fmt;

use quantfarm_ggml::{FileType, GgmlType};
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::search::{SearchFields, SearchRung};

/// A recipe's name: 1–[`RecipeName::MAX`] ASCII letters, digits, `_` and `-`, starting with a letter; stored
/// inline so that it is `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecipeName {
    len: u8,
    bytes: [u8; RecipeName::MAX],
}

/// Names a recipe cannot take: the words task ids and the report give their own meaning (a peer's base run, the
/// greedy subjects, the merged checkpoint).
const RESERVED: [&str; 5] = ["base", "reference", "adapter", "merged", "merged-f32"];

impl RecipeName {
    pub const MAX: usize = 32;

    /// Checks `s` as a recipe's name; the error says what a name may be.
    pub fn new(s: &str) -> Result<RecipeName, String> {
        let well_formed = !s.is_empty()
            && s.len() <= RecipeName::MAX
            && s.starts_with(|c: char| c.is_ascii_alphabetic())
            && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
        if !well_formed {
            return Err(format!(
                "recipe name {s:?}: expected 1–{} letters, digits, '_' and '-', starting with a letter",
                RecipeName::MAX
            ));
        }
        if FileType::from_name(s).is_some() || GgmlType::from_name(s).is_some() {
            return Err(format!("recipe name {s:?} is a file or tensor type's name; give the recipe its own"));
        }
        if s.len() >= 4 && s[..4].eq_ignore_ascii_case("MLX-") {
            return Err(format!("recipe name {s:?}: names starting with MLX- are the MLX checkpoints'"));
        }
        if RESERVED.iter().any(|r| r.eq_ignore_ascii_case(s)) {
            return Err(format!("recipe name {s:?} is reserved (not one of {})", RESERVED.join(", ")));
        }
        let mut bytes = [0; RecipeName::MAX];
        bytes[..s.len()].copy_from_slice(s.as_bytes());
        Ok(RecipeName { len: s.len() as u8, bytes })
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII is ever stored (`new`).
        std::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or_default()
    }
}

impl fmt::Display for RecipeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for RecipeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// A rung's identity: what task ids, file names, gates and the report call it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    File(FileType),
    Recipe(RecipeName),
}

impl Level {
    /// The inverse of `Display`: a file type's exact name, else a recipe's name.
    pub fn parse(s: &str) -> Option<Level> {
        match FileType::from_name(s) {
            Some(f) => (f.name() == s).then_some(Level::File(f)),
            None => RecipeName::new(s).ok().map(Level::Recipe),
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Level::File(t) => f.write_str(t.name()),
            Level::Recipe(n) => f.write_str(n.as_str()),
        }
    }
}

impl From<FileType> for Level {
    fn from(f: FileType) -> Level {
        Level::File(f)
    }
}

/// One `--tensor-type PATTERN=TYPE` entry of a recipe. The pattern is checked here as a regex and lower-cased, as
/// llama-quantize does; the worker compiles it with the quantizer's own parser (`quantfarm_quant::mixture::
/// TensorType`), which this check mirrors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorTypeRule {
    pub pattern: String,
    pub ty: GgmlType,
}

impl TensorTypeRule {
    fn new(pattern: &str, ty: &str) -> Result<TensorTypeRule, String> {
        let at = format!("tensor_types: {pattern:?}");
        if pattern.is_empty() || pattern.contains('=') {
            return Err(format!("{at}: a pattern is a non-empty regex without '=' (PATTERN=TYPE splits at the first)"));
        }
        let pattern = pattern.to_ascii_lowercase();
        regex::Regex::new(&pattern).map_err(|e| format!("{at}: not a valid regex: {e}"))?;
        Ok(TensorTypeRule { pattern, ty: writable_type(&at, ty)? })
    }

    /// As llama-quantize's command line writes it (`PATTERN=TYPE`).
    pub fn arg(&self) -> String {
        format!("{}={}", self.pattern, self.ty.name())
    }
}

/// A ggml type llama-quantize can write, by name in any case.
fn writable_type(at: &str, name: &str) -> Result<GgmlType, String> {
    let ty = GgmlType::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = GgmlType::ALL.iter().filter(|t| t.llama_quantize_writes()).map(|t| t.name()).collect();
        format!("{at}: unknown tensor type {name:?} (one of {})", known.join(", "))
    })?;
    if !ty.llama_quantize_writes() {
        return Err(format!("{at}: {ty} is not a type llama-quantize writes"));
    }
    Ok(ty)
}

/// A named recipe: `base`'s mixture rules, overridden as llama-quantize's `--tensor-type` (first match wins),
/// `--output-tensor-type` and `--token-embedding-type` override them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recipe {
    pub name: RecipeName,
    pub base: FileType,
    pub tensor_types: Vec<TensorTypeRule>,
    pub output_tensor_type: Option<GgmlType>,
    pub token_embedding_type: Option<GgmlType>,
}

impl Recipe {
    /// Every ggml type the recipe names explicitly.
    pub fn named_types(&self) -> impl Iterator<Item = GgmlType> + '_ {
        let flags = [self.output_tensor_type, self.token_embedding_type];
        self.tensor_types.iter().map(|r| r.ty).chain(flags.into_iter().flatten())
    }

    /// The recipe as llama-quantize's flags, then the base file type: what `llama-quantize` runs to make the same
    /// bytes (less the input and output files and an imatrix).
    pub fn args(&self) -> Vec<String> {
        let mut a = Vec::new();
        for r in &self.tensor_types {
            a.push("--tensor-type".to_string());
            a.push(r.arg());
        }
        if let Some(t) = self.output_tensor_type {
            a.extend(["--output-tensor-type".to_string(), t.name().to_string()]);
        }
        if let Some(t) = self.token_embedding_type {
            a.extend(["--token-embedding-type".to_string(), t.name().to_string()]);
        }
        a.push(self.base.name().to_string());
        a
    }
}

/// A rung of the GGUF ladder.
#[derive(Clone, Debug, PartialEq)]
pub enum Rung {
    File(FileType),
    Recipe(Recipe),
    /// A recipe the search chooses to a budget (spec/search.rs).
    Search(SearchRung),
}

impl Rung {
    pub fn level(&self) -> Level {
        match self {
            Rung::File(f) => Level::File(*f),
            Rung::Recipe(r) => Level::Recipe(r.name),
            Rung::Search(s) => Level::Recipe(s.name),
        }
    }

    /// The file type whose mixture rules the rung starts from (its own for a plain file type).
    pub fn base(&self) -> FileType {
        match self {
            Rung::File(f) => *f,
            Rung::Recipe(r) => r.base,
            Rung::Search(_) => SearchRung::BASE,
        }
    }

    /// Whether llama-quantize may refuse the rung without an importance matrix: its base needs one, or the recipe
    /// names a type ggml cannot quantize without one. Checked at submission, so conservatively: a recipe whose
    /// pattern matches no such tensor is refused too, and says so. (A search rung's candidates are checked with
    /// the search's settings.)
    pub fn needs_imatrix(&self) -> bool {
        match self {
            Rung::File(f) => f.needs_imatrix(),
            Rung::Recipe(r) => r.base.needs_imatrix() || r.named_types().any(|t| t.quantize_requires_imatrix()),
            Rung::Search(_) => false,
        }
    }

    /// The recipe written in release.yaml (a search rung's is chosen at run time).
    pub fn recipe(&self) -> Option<&Recipe> {
        match self {
            Rung::File(_) | Rung::Search(_) => None,
            Rung::Recipe(r) => Some(r),
        }
    }

    pub fn search(&self) -> Option<&SearchRung> {
        match self {
            Rung::File(_) | Rung::Recipe(_) => None,
            Rung::Search(s) => Some(s),
        }
    }
}

/// `quants:` entries written as a mapping: a recipe's fields, or a search rung's (`target_bpw`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RungFields {
    name: String,
    #[serde(default)]
    base: Option<String>,
    #[serde(default)]
    tensor_types: TensorTypes,
    #[serde(default)]
    output_tensor_type: Option<String>,
    #[serde(default)]
    token_embedding_type: Option<String>,
    #[serde(default)]
    target_bpw: Option<serde_norway::Value>,
    #[serde(default)]
    kld: Option<serde_norway::Value>,
}

impl TryFrom<RungFields> for Rung {
    type Error = String;

    fn try_from(f: RungFields) -> Result<Rung, String> {
        let searched = f.target_bpw.is_some() || f.kld.is_some();
        match (f.base, searched) {
            (Some(base), false) => Recipe::try_from(RecipeFields {
                name: f.name,
                base,
                tensor_types: f.tensor_types,
                output_tensor_type: f.output_tensor_type,
                token_embedding_type: f.token_embedding_type,
            })
            .map(Rung::Recipe),
            (None, true) => {
                if !f.tensor_types.is_empty() || f.output_tensor_type.is_some() || f.token_embedding_type.is_some() {
                    return Err(format!(
                        "rung {}: a searched rung's types are chosen by the search; give no tensor_types, \
                         output_tensor_type or token_embedding_type (or give a base and no target_bpw: a recipe)",
                        f.name
                    ));
                }
                let target: Option<super::search::TargetField> = f
                    .target_bpw
                    .map(serde_norway::from_value)
                    .transpose()
                    .map_err(|_| format!("rung {}: target_bpw: expected a number or a rung's name", f.name))?;
                let kld: Option<super::search::KldFields> = f
                    .kld
                    .map(serde_norway::from_value)
                    .transpose()
                    .map_err(|e| format!("rung {}: kld: expected {{metric: kld.p99_9, max: 0.5}} ({e})", f.name))?;
                SearchRung::try_from(SearchFields::new(f.name, target, kld)).map(Rung::Search)
            }
            (Some(_), true) => Err(format!(
                "rung {}: either a recipe (base, tensor_types) or a searched rung (target_bpw or kld), not both",
                f.name
            )),
            (None, false) => Err(format!(
                "rung {}: expected a recipe {{name, base, tensor_types}} or a searched rung {{name, target_bpw}} or \
                 {{name, kld: {{metric, max}}}}",
                f.name
            )),
        }
    }
}

/// A recipe's fields.
#[derive(Serialize)]
struct RecipeFields {
    name: String,
    base: String,
    #[serde(default, skip_serializing_if = "TensorTypes::is_empty")]
    tensor_types: TensorTypes,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output_tensor_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    token_embedding_type: Option<String>,
}

/// `tensor_types:` in document order (the first match wins): a mapping `{PATTERN: TYPE, …}`, or a list of
/// `PATTERN=TYPE` strings as `--tensor-type` takes them (where a pattern repeats, or to paste a command line).
#[derive(Default)]
struct TensorTypes(Vec<(String, String)>);

impl TensorTypes {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'de> Deserialize<'de> for TensorTypes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TensorTypes;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping {PATTERN: TYPE} or a list of PATTERN=TYPE strings")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<TensorTypes, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = m.next_entry::<String, String>()? {
                    v.push(e);
                }
                Ok(TensorTypes(v))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<TensorTypes, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = s.next_element::<String>()? {
                    let (p, t) = e.split_once('=').ok_or_else(|| {
                        de::Error::custom(format!("tensor_types: {e:?}: expected PATTERN=TYPE, e.g. ffn_down=q6_K"))
                    })?;
                    v.push((p.to_string(), t.to_string()));
                }
                Ok(TensorTypes(v))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for TensorTypes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // A list, which keeps repeated patterns.
        s.collect_seq(self.0.iter().map(|(p, t)| format!("{p}={t}")))
    }
}

impl TryFrom<RecipeFields> for Recipe {
    type Error = String;

    fn try_from(f: RecipeFields) -> Result<Recipe, String> {
        let name = RecipeName::new(&f.name)?;
        let at = format!("recipe {name}");
        let base = FileType::from_name(&f.base)
            .filter(|b| b.is_quantized())
            .ok_or_else(|| format!("{at}: base {:?} is not a quantized llama-quantize file type", f.base))?;
        let tensor_types = f
            .tensor_types
            .0
            .iter()
            .map(|(p, t)| TensorTypeRule::new(p, t).map_err(|e| format!("{at}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let flag =
            |key: &str, v: &Option<String>| v.as_deref().map(|t| writable_type(&format!("{at}: {key}"), t)).transpose();
        Ok(Recipe {
            name,
            base,
            tensor_types,
            output_tensor_type: flag("output_tensor_type", &f.output_tensor_type)?,
            token_embedding_type: flag("token_embedding_type", &f.token_embedding_type)?,
        })
    }
}

impl From<&Recipe> for RecipeFields {
    fn from(r: &Recipe) -> RecipeFields {
        RecipeFields {
            name: r.name.to_string(),
            base: r.base.name().to_string(),
            tensor_types: TensorTypes(r.tensor_types.iter().map(|t| (t.pattern.clone(), t.ty.name().into())).collect()),
            output_tensor_type: r.output_tensor_type.map(|t| t.name().to_string()),
            token_embedding_type: r.token_embedding_type.map(|t| t.name().to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for Rung {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Rung;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a llama-quantize file type (Q4_K_M), a recipe {name, base, tensor_types} or a searched rung \
                     {name, target_bpw}",
                )
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Rung, E> {
                let ft = FileType::from_name(s).ok_or_else(|| {
                    let names: Vec<&str> = FileType::ALL.iter().map(|f| f.name()).collect();
                    E::custom(format!(
                        "unknown quant type {s:?}, expected one of {} or a recipe {{name, base, tensor_types}}",
                        names.join(", ")
                    ))
                })?;
                Ok(Rung::File(ft))
            }

            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Rung, A::Error> {
                let fields = RungFields::deserialize(de::value::MapAccessDeserializer::new(m))?;
                Rung::try_from(fields).map_err(de::Error::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for Rung {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Rung::File(f) => s.serialize_str(f.name()),
            Rung::Recipe(r) => RecipeFields::from(r).serialize(s),
            Rung::Search(r) => SearchFields::from(r).serialize(s),
        }
    }
}

/// The recipe as the report records it.
impl From<&Recipe> for quantfarm_report::model::RecipeDoc {
    fn from(r: &Recipe) -> Self {
        quantfarm_report::model::RecipeDoc {
            base: r.base.name().to_string(),
            tensor_types: r.tensor_types.iter().map(|t| t.arg()).collect(),
            output_tensor_type: r.output_tensor_type.map(|t| t.name().to_string()),
            token_embedding_type: r.token_embedding_type.map(|t| t.name().to_string()),
            llama_quantize_args: r.args(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rung(yaml: &str) -> Result<Rung, String> {
        serde_norway::from_str(yaml).map_err(|e| e.to_string())
    }

    #[test]
    fn a_recipe_reads_in_order_and_writes_back_the_same() {
        let r = rung(
            "{name: Q4_K_XL, base: Q4_K_M, tensor_types: {'blk\\.[0-3]\\.ffn_down': q6_k, Attn_V: Q8_0}, \
                      output_tensor_type: q8_0, token_embedding_type: Q6_K}",
        )
        .unwrap();
        let Rung::Recipe(rec) = &r else { panic!("{r:?}") };
        assert_eq!(rec.name.as_str(), "Q4_K_XL");
        assert_eq!(rec.base, FileType::Q4_K_M);
        let args: Vec<String> = rec.tensor_types.iter().map(TensorTypeRule::arg).collect();
        assert_eq!(args, ["blk\\.[0-3]\\.ffn_down=Q6_K", "attn_v=Q8_0"], "lower-cased patterns, in order");
        assert_eq!(
            rec.args()[4..],
            ["--output-tensor-type", "Q8_0", "--token-embedding-type", "Q6_K", "Q4_K_M"].map(String::from)
        );
        let again = rung(&serde_norway::to_string(&r).unwrap()).unwrap();
        assert_eq!(again, r);
        // The list form keeps a repeated pattern.
        let l = rung("{name: R, base: Q4_K_M, tensor_types: ['ffn_down=q6_k', 'ffn_down=q8_0']}").unwrap();
        assert_eq!(l.recipe().unwrap().tensor_types.len(), 2);
        assert_eq!(l.level().to_string(), "R");
        assert_eq!(rung("Q4_K_M").unwrap(), Rung::File(FileType::Q4_K_M));
    }

    #[test]
    fn bad_recipes_are_named() {
        for (yaml, says) in [
            ("{name: Q4_K_M, base: Q4_K_M}", "is a file or tensor type's name"),
            ("{name: q6_k, base: Q4_K_M}", "is a file or tensor type's name"),
            ("{name: MLX-4bit, base: Q4_K_M}", "MLX-"),
            ("{name: base, base: Q4_K_M}", "reserved"),
            ("{name: a/b, base: Q4_K_M}", "letters, digits"),
            ("{name: R, base: BF16}", "base \"BF16\" is not a quantized"),
            ("{name: R, base: Q9}", "base \"Q9\""),
            ("{name: R, base: Q4_K_M, tensor_types: {'ffn_(down': q6_k}}", "not a valid regex"),
            ("{name: R, base: Q4_K_M, tensor_types: {ffn_down: q7_k}}", "unknown tensor type \"q7_k\""),
            ("{name: R, base: Q4_K_M, tensor_types: {ffn_down: q8_k}}", "Q8_K is not a type llama-quantize writes"),
            ("{name: R, base: Q4_K_M, tensor_types: ['ffn_down']}", "expected PATTERN=TYPE"),
            ("{name: R, base: Q4_K_M, output_tensor_type: q3}", "output_tensor_type: unknown tensor type"),
            ("{name: R, base: Q4_K_M, tensor_type: {a: q8_0}}", "unknown field `tensor_type`"),
            ("Q9_X", "unknown quant type \"Q9_X\""),
        ] {
            let e = rung(yaml).unwrap_err();
            assert!(e.contains(says), "{yaml}: {e}");
        }
    }

    #[test]
    fn levels_parse_back_from_their_names() {
        for s in ["Q4_K_M", "IQ2_XXS", "Q4_K_XL", "UD-Q2_K_XL"] {
            assert_eq!(Level::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(Level::parse("Q4_K"), None, "an alias is not a level's name");
        assert_eq!(Level::parse("MLX-4bit"), None);
        assert_eq!(Level::parse("reference"), None);
        let r = Rung::Recipe(
            Recipe::try_from(RecipeFields {
                name: "R".into(),
                base: "IQ4_XS".into(),
                tensor_types: TensorTypes(vec![("ffn_down".into(), "iq1_s".into())]),
                output_tensor_type: None,
                token_embedding_type: None,
            })
            .unwrap(),
        );
        assert!(r.needs_imatrix(), "IQ1_S is quantized only with an importance matrix");
        assert!(!Rung::File(FileType::IQ4_XS).needs_imatrix());
    }
}
