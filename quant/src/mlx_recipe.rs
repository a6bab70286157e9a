//! `mlx_lm.convert --quant-predicate mixed_2_6|mixed_3_4|mixed_3_6|mixed_4_6`: mlx-lm's mixed-bit recipes, which
//! give some modules more bits as llama.cpp's Q4_K_M does (mlx-lm 0.32.2 `mlx_lm/convert.py`,
//! `mixed_quant_predicate_builder`).
//!
//! For a module at `path` (its full MLX name without `.weight`), in a model of `n` blocks:
//!
//! * its block index is the path's component at the position where the first module whose path contains
//!   `down_proj` has its first all-digit component (`model.layers.3.mlp.down_proj` → position 2); a path with fewer
//!   components (`model.embed_tokens`, `lm_head`) counts as block 0, and a path whose component there is not a
//!   number makes mlx-lm fail (`int()` of it), so it is refused here;
//! * `use_more_bits = i < n/8 || i ≥ 7n/8 || (i − n/8) mod 3 = 2` (integer divisions);
//! * the high bits go to a path containing `v_proj`, `v_a_proj` or `v_b_proj` (a fused `qkv_proj` contains
//!   `v_proj`), or `down_proj`, when `use_more_bits`, and to any path containing `lm_head`; the low bits to every other
//!   module.
//!
//! The recipe replaces the model's own `quant_predicate` (its 8-bit routers are then quantized like any module), and
//! every quantized module gets its own `{"group_size", "bits", "mode": "affine"}` entry in `config.json`, listed in
//! the order `nn.quantize` visits modules: the model's attribute order ([`module_rank`]).

use std::fmt;

/// One of mlx-lm's mixed-bit recipes (named as `--quant-predicate` takes them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Deserialize, serde::Serialize)]
pub enum MixedRecipe {
    #[serde(rename = "mixed_2_6")]
    Mixed2_6,
    #[serde(rename = "mixed_3_4")]
    Mixed3_4,
    #[serde(rename = "mixed_3_6")]
    Mixed3_6,
    #[serde(rename = "mixed_4_6")]
    Mixed4_6,
}

/// Why a recipe cannot be applied to a model (mlx-lm fails on the same models).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RecipeError {
    #[error("{recipe}: the model has no module whose name contains \"down_proj\" (mlx-lm: \"Model does not have expected keys for mixed quant.\")")]
    NoDownProj { recipe: MixedRecipe },
    #[error(
        "{recipe}: module {module:?} has {component:?} where the block index is expected (mlx-lm's int() fails on it)"
    )]
    NotABlock { recipe: MixedRecipe, module: String, component: String },
    #[error("{recipe}: module {module:?} is not one whose place in mlx-lm's module order quantfarm knows, so config.json could not list it as mlx-lm does")]
    UnknownOrder { recipe: MixedRecipe, module: String },
}

impl MixedRecipe {
    pub const ALL: [MixedRecipe; 4] =
        [MixedRecipe::Mixed2_6, MixedRecipe::Mixed3_4, MixedRecipe::Mixed3_6, MixedRecipe::Mixed4_6];

    /// The name `--quant-predicate` takes.
    pub fn name(self) -> &'static str {
        match self {
            MixedRecipe::Mixed2_6 => "mixed_2_6",
            MixedRecipe::Mixed3_4 => "mixed_3_4",
            MixedRecipe::Mixed3_6 => "mixed_3_6",
            MixedRecipe::Mixed4_6 => "mixed_4_6",
        }
    }

    pub fn parse(s: &str) -> Option<MixedRecipe> {
        MixedRecipe::ALL.into_iter().find(|r| r.name() == s)
    }

    /// `(low, high)` bits.
    pub fn bits(self) -> (u32, u32) {
        match self {
            MixedRecipe::Mixed2_6 => (2, 6),
            MixedRecipe::Mixed3_4 => (3, 4),
            MixedRecipe::Mixed3_6 => (3, 6),
            MixedRecipe::Mixed4_6 => (4, 6),
        }
    }

    /// The recipe applied to a model whose modules (every module, quantized or not: mlx-lm looks for `down_proj`
    /// among all of them) are `modules`, in any order. Its number of blocks (`len(model.layers)`) is one more than
    /// the highest `layers.N` among them.
    pub fn plan(self, modules: &[&str]) -> Result<MixedPlan, RecipeError> {
        let blocks = modules
            .iter()
            .filter_map(|m| m.split_once("layers.")?.1.split('.').next()?.parse::<u64>().ok())
            .max()
            .map_or(0, |b| b + 1);
        // mlx-lm takes the first `down_proj` module in its own module order; every family's first one is block 0's
        // (`model.layers.0.…`), whose digit is where every block's is, so the lowest-ranked one here is that one.
        let mut downs: Vec<&str> = modules.iter().copied().filter(|m| m.contains("down_proj")).collect();
        downs.sort_by_key(|m| (module_rank(m).map(|r| (r.0, r.1)), m.to_string()));
        let first = downs.first().ok_or(RecipeError::NoDownProj { recipe: self })?;
        let parts: Vec<&str> = first.split('.').collect();
        // Python's `for i, k in enumerate(...): if k.isdigit(): break` leaves `i` at the last component when none is
        // a number.
        let location = parts.iter().position(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()));
        let location = location.unwrap_or(parts.len() - 1);
        Ok(MixedPlan { recipe: self, location, blocks })
    }
}

impl fmt::Display for MixedRecipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A recipe bound to one model: which component holds the block index, and how many blocks there are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MixedPlan {
    pub recipe: MixedRecipe,
    location: usize,
    blocks: u64,
}

impl MixedPlan {
    /// The bits of module `path`.
    pub fn bits_for(&self, path: &str) -> Result<u32, RecipeError> {
        let parts: Vec<&str> = path.split('.').collect();
        let index = match parts.get(self.location) {
            None => 0,
            // Python's int() also takes surrounding whitespace and underscores; module names have neither.
            Some(c) => c.parse::<u64>().map_err(|_| RecipeError::NotABlock {
                recipe: self.recipe,
                module: path.to_string(),
                component: c.to_string(),
            })?,
        };
        let n = self.blocks;
        let more = index < n / 8 || index >= 7 * n / 8 || (index - n / 8) % 3 == 2;
        let (low, high) = self.recipe.bits();
        let v = ["v_proj", "v_a_proj", "v_b_proj"].iter().any(|k| path.contains(k));
        Ok(if (v || path.contains("down_proj")) && more || path.contains("lm_head") { high } else { low })
    }

    /// `config.json`'s entries for the modules `quantized` (in groups of `group_size`): each one's path, bits and
    /// group size, in mlx-lm's module order.
    pub fn config_entries(
        &self,
        mut quantized: Vec<String>,
        group_size: usize,
    ) -> Result<Vec<(String, u32, usize)>, RecipeError> {
        in_module_order(self.recipe, &mut quantized)?;
        quantized
            .into_iter()
            .map(|m| {
                let bits = self.bits_for(&m)?;
                Ok((m, bits, group_size))
            })
            .collect()
    }
}

/// Modules inside a block, in the order mlx-lm's model classes create them (`__init__`'s attribute order, which
/// `nn.quantize` follows): attention (fused or not, or Qwen3.5's gated delta net), then the MLP in each family's
/// layout (gpt-oss creates its experts before its router, Qwen's MoE blocks the router first).
const BLOCK_ORDER: [&str; 26] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.qkv_proj",
    "self_attn.o_proj",
    "linear_attn.in_proj_qkv",
    "linear_attn.in_proj_z",
    "linear_attn.in_proj_b",
    "linear_attn.in_proj_a",
    "linear_attn.out_proj",
    "mlp.experts.gate_proj",
    "mlp.experts.up_proj",
    "mlp.experts.down_proj",
    "mlp.router",
    "mlp.gate",
    "mlp.switch_mlp.gate_proj",
    "mlp.switch_mlp.up_proj",
    "mlp.switch_mlp.down_proj",
    "mlp.shared_expert.gate_proj",
    "mlp.shared_expert.down_proj",
    "mlp.shared_expert.up_proj",
    "mlp.shared_expert_gate",
    "mlp.gate_up_proj",
    "mlp.gate_proj",
    "mlp.down_proj",
    "mlp.up_proj",
];

/// Where module `path` comes in mlx-lm's module order, as a sort key: the embedding first, then block by block in
/// [`BLOCK_ORDER`], then the output head; `None` for a module not known. A wrapper's prefix (`language_model.`) is
/// ignored.
pub fn module_rank(path: &str) -> Option<(u8, u64, usize)> {
    if path.ends_with("embed_tokens") {
        return Some((0, 0, 0));
    }
    if path.ends_with("lm_head") {
        return Some((2, 0, 0));
    }
    let (_, rest) = path.split_once("layers.")?;
    let (block, local) = rest.split_once('.')?;
    let block = block.parse::<u64>().ok()?;
    let at = BLOCK_ORDER.iter().position(|m| *m == local)?;
    Some((1, block, at))
}

/// `modules` sorted in mlx-lm's module order (see [`module_rank`]); a module whose place is not known is an error.
pub fn in_module_order(recipe: MixedRecipe, modules: &mut [String]) -> Result<(), RecipeError> {
    if let Some(m) = modules.iter().find(|m| module_rank(m).is_none()) {
        return Err(RecipeError::UnknownOrder { recipe, module: m.clone() });
    }
    modules.sort_by_key(|m| module_rank(m));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for r in MixedRecipe::ALL {
            assert_eq!(MixedRecipe::parse(r.name()), Some(r));
        }
        assert_eq!(MixedRecipe::parse("mixed_4_8"), None);
    }

    /// mlx-lm's rule on a 16-block model: blocks 0–1 and 14–15, and every third from 2 (4, 7, 10, 13), get more
    /// bits.
    #[test]
    fn more_bits_follow_llama_cpp_s_pattern() {
        let modules: Vec<String> = (0..16).map(|i| format!("model.layers.{i}.mlp.down_proj")).collect();
        let plan = MixedRecipe::Mixed3_6.plan(&modules.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
        let high: Vec<u64> =
            (0..16).filter(|i| plan.bits_for(&format!("model.layers.{i}.mlp.down_proj")).unwrap() == 6).collect();
        assert_eq!(high, [0, 1, 4, 7, 10, 13, 14, 15]);
        assert_eq!(plan.bits_for("model.layers.4.self_attn.qkv_proj"), Ok(6), "qkv_proj contains v_proj");
        assert_eq!(plan.bits_for("model.layers.4.self_attn.q_proj"), Ok(3));
        assert_eq!(plan.bits_for("model.layers.5.mlp.down_proj"), Ok(3));
        assert_eq!(plan.bits_for("lm_head"), Ok(6));
        assert_eq!(plan.bits_for("model.embed_tokens"), Ok(3));
        assert!(matches!(plan.bits_for("model.layers.x.mlp.down_proj"), Err(RecipeError::NotABlock { .. })));
    }

    #[test]
    fn a_model_without_down_proj_is_refused() {
        let r = MixedRecipe::Mixed4_6.plan(&["model.layers.0.mlp.fc1"]);
        assert_eq!(r, Err(RecipeError::NoDownProj { recipe: MixedRecipe::Mixed4_6 }));
    }

    #[test]
    fn module_order_is_mlx_lm_s() {
        let mut m: Vec<String> = [
            "lm_head",
            "model.layers.1.mlp.up_proj",
            "model.layers.0.mlp.down_proj",
            "model.layers.0.self_attn.v_proj",
            "model.embed_tokens",
            "model.layers.0.mlp.gate_proj",
        ]
        .map(String::from)
        .to_vec();
        in_module_order(MixedRecipe::Mixed4_6, &mut m).unwrap();
        let want = [
            "model.embed_tokens",
            "model.layers.0.self_attn.v_proj",
            "model.layers.0.mlp.gate_proj",
            "model.layers.0.mlp.down_proj",
            "model.layers.1.mlp.up_proj",
            "lm_head",
        ];
        assert_eq!(m, want);
        let mut odd = vec!["model.layers.0.mlp.fc9".to_string()];
        assert!(matches!(in_module_order(MixedRecipe::Mixed4_6, &mut odd), Err(RecipeError::UnknownOrder { .. })));
    }
}
