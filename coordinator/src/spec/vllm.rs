//! `outputs.vllm`: the compressed-tensors checkpoints vLLM loads, as llm-compressor writes them (round to nearest,
//! no calibration data; `quantfarm_quant::vllm_file`), one per scheme.
//!
//! ```yaml
//! outputs:
//!   vllm:
//!     schemes: [FP8_DYNAMIC, W4A16]   # one checkpoint each
//!     group_size: 64                  # W4A16's input columns per scale: 32, 64 or 128 (must divide every weight)
//!     ignore: [lm_head, 're:.*mlp\.down_proj$']  # modules left unquantized, by name or `re:` pattern matched
//!                                     # from the name's start (compressed-tensors' rule; default lm_head)
//!     like: oneshot                   # or model-free: which llm-compressor entry point's bytes (default oneshot)
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

/// A vLLM scheme, as llm-compressor names it: one rung of the ladder per scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
pub enum VllmRung {
    /// 8-bit float weights with a scale per output row; activations quantized per token at run time.
    #[serde(rename = "FP8_DYNAMIC")]
    Fp8Dynamic,
    /// Symmetric 4-bit integer weights with a scale per group of input columns; 16-bit activations.
    #[serde(rename = "W4A16")]
    W4A16,
}

impl VllmRung {
    pub const ALL: [VllmRung; 2] = [VllmRung::Fp8Dynamic, VllmRung::W4A16];

    /// llm-compressor's name of the scheme.
    pub fn scheme(self) -> &'static str {
        match self {
            VllmRung::Fp8Dynamic => "FP8_DYNAMIC",
            VllmRung::W4A16 => "W4A16",
        }
    }

    pub fn parse(s: &str) -> Option<VllmRung> {
        VllmRung::ALL.into_iter().find(|r| r.scheme() == s)
    }

    /// Whether the scheme quantizes activations at run time (FP8_DYNAMIC's per-token inputs): then it also runs
    /// weight-only where the hardware has no such path.
    pub fn quantizes_activations(self) -> bool {
        match self {
            VllmRung::Fp8Dynamic => true,
            VllmRung::W4A16 => false,
        }
    }
}

impl fmt::Display for VllmRung {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.scheme())
    }
}

/// Which of llm-compressor's entry points the bytes are made like (they quantize the same weights alike).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VllmLike {
    /// `oneshot`: tensors left unquantized in the config's dtype.
    #[default]
    Oneshot,
    /// `model_free_ptq`: tensors left unquantized as stored.
    ModelFree,
}

impl VllmLike {
    pub fn name(self) -> &'static str {
        match self {
            VllmLike::Oneshot => "oneshot",
            VllmLike::ModelFree => "model-free",
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VllmOutputs {
    pub schemes: Vec<VllmRung>,
    #[serde(default = "default_group_size")]
    pub group_size: u32,
    #[serde(default = "default_ignore")]
    pub ignore: Vec<String>,
    #[serde(default)]
    pub like: VllmLike,
}

fn default_group_size() -> u32 {
    64
}

fn default_ignore() -> Vec<String> {
    vec!["lm_head".to_string()]
}

impl VllmOutputs {
    /// What the spec alone can tell; the source's shapes and dtypes are checked by the plan's pre-flight.
    pub(super) fn check(&self) -> Result<(), String> {
        if self.schemes.is_empty() {
            return Err("outputs.vllm.schemes: names no scheme (FP8_DYNAMIC, W4A16)".into());
        }
        if let Some((_, s)) = self.schemes.iter().enumerate().find(|(i, s)| self.schemes[..*i].contains(s)) {
            return Err(format!("outputs.vllm.schemes: {s} is listed twice"));
        }
        if ![32, 64, 128].contains(&self.group_size) {
            return Err(format!(
                "outputs.vllm.group_size: {} is not 32, 64 or 128 (the group sizes vLLM's W4A16 kernels take)",
                self.group_size
            ));
        }
        quantfarm_quant::vllm_ignore::Ignore::parse(&self.ignore).map_err(|e| format!("outputs.vllm.ignore: {e}"))?;
        Ok(())
    }

    /// The scheme as the tasks carry it.
    pub fn proto(&self, rung: VllmRung) -> quantfarm_proto::VllmScheme {
        quantfarm_proto::VllmScheme {
            scheme: rung.scheme().to_string(),
            group_size: match rung {
                VllmRung::Fp8Dynamic => 0,
                VllmRung::W4A16 => self.group_size,
            },
            ignore: self.ignore.clone(),
            like: self.like.name().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{EvalTarget, ReleaseSpec};

    #[test]
    fn vllm_outputs() {
        let text = "name: r\nsource: ./m\noutputs:\n  vllm: {schemes: [FP8_DYNAMIC, W4A16]}\n";
        let s = ReleaseSpec::parse(text, "release.yaml").unwrap();
        let v = s.outputs.vllm.as_ref().unwrap();
        assert_eq!((v.group_size, v.ignore.as_slice(), v.like), (64, &["lm_head".to_string()][..], VllmLike::Oneshot));
        assert!(s.converts());
        let names: Vec<String> = s.levels().iter().map(EvalTarget::to_string).collect();
        assert_eq!(names, ["vLLM-FP8_DYNAMIC", "vLLM-W4A16"]);
        assert_eq!(v.proto(VllmRung::W4A16).group_size, 64);
        assert_eq!(v.proto(VllmRung::Fp8Dynamic).group_size, 0);
        for (bad, key) in [
            (text.replace("FP8_DYNAMIC, W4A16", "FP8, W4A16"), "unknown variant `FP8`"),
            (text.replace("FP8_DYNAMIC, W4A16", ""), "outputs.vllm.schemes: names no scheme"),
            (text.replace("W4A16]", "FP8_DYNAMIC]"), "outputs.vllm.schemes: FP8_DYNAMIC is listed twice"),
            (text.replace("W4A16]}", "W4A16], group_size: 48}"), "outputs.vllm.group_size: 48"),
            (text.replace("W4A16]}", "W4A16], ignore: [lm_head.weight]}"), "outputs.vllm.ignore: \"lm_head.weight\""),
            (text.replace("W4A16]}", "W4A16], ignore: ['re:(?=x)']}"), "outputs.vllm.ignore: \"re:(?=x)\""),
            (text.replace("W4A16]}", "W4A16], like: twoshot}"), "unknown variant `twoshot`"),
            (text.replace("./m", "synthetic:tiny-llama"), "outputs.vllm: quantizes an HF bf16 checkpoint"),
        ] {
            let e = ReleaseSpec::parse(&bad, "release.yaml").unwrap_err().to_string();
            assert!(e.contains(key), "{bad}: {e}");
        }
    }
}
