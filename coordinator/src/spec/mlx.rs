//! `outputs.mlx`: MLX checkpoints, one per bit width, one per mlx-lm mixed recipe and one per floating-point mode.

use serde::{Deserialize, Serialize};

use super::{FpMode, MixedRecipe, MlxRung};

/// MLX checkpoints, as `mlx_lm.convert -q --q-bits B --q-group-size G` writes them, as `--quant-predicate RECIPE`
/// does, and as `--q-mode MODE` does (`group_size` applies to the affine ones: a mode has its own).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MlxOutputs {
    #[serde(default)]
    pub bits: Vec<u32>,
    #[serde(default)]
    pub recipes: Vec<MixedRecipe>,
    #[serde(default)]
    pub modes: Vec<FpMode>,
    #[serde(default = "default_group_size")]
    pub group_size: u32,
}

fn default_group_size() -> u32 {
    64
}

impl MlxOutputs {
    /// The rungs: bit widths, then recipes, then modes.
    pub fn rungs(&self) -> Vec<MlxRung> {
        let bits = self.bits.iter().map(|&b| MlxRung::Bits(b));
        let recipes = self.recipes.iter().map(|&r| MlxRung::Mixed(r));
        bits.chain(recipes).chain(self.modes.iter().map(|&m| MlxRung::Mode(m))).collect()
    }

    pub(super) fn check(&self) -> Result<(), String> {
        if self.bits.is_empty() && self.recipes.is_empty() && self.modes.is_empty() {
            return Err("outputs.mlx: names no bit width (bits), no recipe (recipes) and no mode (modes)".into());
        }
        let mut recipes = std::collections::HashSet::new();
        if let Some(r) = self.recipes.iter().find(|r| !recipes.insert(**r)) {
            return Err(format!("outputs.mlx.recipes: {r} is named twice"));
        }
        let mut modes = std::collections::HashSet::new();
        if let Some(m) = self.modes.iter().find(|m| !modes.insert(**m)) {
            return Err(format!("outputs.mlx.modes: {} is named twice", m.name()));
        }
        let mut seen = std::collections::HashSet::new();
        for &b in &self.bits {
            if ![2, 3, 4, 5, 6, 8].contains(&b) || !seen.insert(b) {
                return Err(format!("outputs.mlx.bits: {b} is not one of 2, 3, 4, 5, 6, 8 (each once)"));
            }
        }
        if ![32, 64, 128].contains(&self.group_size) {
            return Err(format!("outputs.mlx.group_size: {} is not 32, 64 or 128", self.group_size));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{EvalTarget, ReleaseSpec};
    use super::*;

    /// mlx-lm's mixed recipes are rungs of their own, after the uniform ones, named `MLX-mixed_4_6`; the
    /// floating-point modes come after them (`MLX-mxfp4`).
    #[test]
    fn mlx_recipes_are_rungs() {
        let text = "name: r\nsource: ./m\noutputs:\n  mlx: {bits: [4], recipes: [mixed_4_6, mixed_2_6]}\n";
        let s = ReleaseSpec::parse(text, "r").unwrap();
        let want = [MlxRung::Bits(4), MlxRung::Mixed(MixedRecipe::Mixed4_6), MlxRung::Mixed(MixedRecipe::Mixed2_6)];
        assert_eq!(s.mlx_rungs(), want);
        let names: Vec<String> = s.levels().iter().map(EvalTarget::to_string).collect();
        assert_eq!(names, ["MLX-4bit", "MLX-mixed_4_6", "MLX-mixed_2_6"]);
        for n in &names {
            assert_eq!(EvalTarget::parse(n).map(|t| t.to_string()).as_deref(), Some(n.as_str()));
        }
        assert_eq!(EvalTarget::parse("MLX-mixed_5_6"), None);
        let text = "name: r\nsource: ./m\noutputs:\n  mlx: {modes: [nvfp4, mxfp4, mxfp8], recipes: [mixed_3_6]}\n";
        let s = ReleaseSpec::parse(text, "r").unwrap();
        let names: Vec<String> = s.levels().iter().map(EvalTarget::to_string).collect();
        assert_eq!(names, ["MLX-mixed_3_6", "MLX-nvfp4", "MLX-mxfp4", "MLX-mxfp8"]);
        for n in &names {
            assert_eq!(EvalTarget::parse(n).map(|t| t.to_string()).as_deref(), Some(n.as_str()));
        }
        for (text, want) in [
            ("modes: [mxfp4, mxfp4]", "outputs.mlx.modes: mxfp4 is named twice"),
            ("modes: [fp4]", "unknown variant `fp4`"),
        ] {
            let text = format!("name: r\nsource: ./m\noutputs:\n  mlx: {{{text}}}\n");
            let e = ReleaseSpec::parse(&text, "r").unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        // Every recipe and mode has a default limit, so its `kld` gate can pass.
        let rungs = MixedRecipe::ALL.map(MlxRung::Mixed).into_iter().chain(FpMode::ALL.map(MlxRung::Mode));
        for r in rungs {
            let name = EvalTarget::Mlx(r).to_string();
            assert!(quantfarm_report::gates::default_kld_max(&name).is_some(), "no default limit for {name}");
        }
    }
}
