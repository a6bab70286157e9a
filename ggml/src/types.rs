//! ggml's tensor element types: ids as stored in GGUF, block geometry, and names.
//!
//! Every type a GGUF file may hold is listed, including those quantfarm never produces (IQ*, TQ*, MXFP4…), so that
//! such files can be inspected and copied. Geometry from `ggml/src/ggml.c::type_traits` at llama.cpp 0c1e570
//! and `ggml/include/ggml.h` (`enum ggml_type`).

use std::fmt;

/// Elements per super-block of the K-quants.
pub const QK_K: usize = 256;

macro_rules! ggml_types {
    ($( $variant:ident = $id:literal, $name:literal, $block:literal, $bytes:literal; )*) => {
        /// A ggml tensor type. Removed ids (4, 5, 31–33, 36–38) have no variant, so they cannot be represented.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(non_camel_case_types)]
        pub enum GgmlType {
            $( $variant = $id, )*
        }

        impl GgmlType {
            /// All types, in id order.
            pub const ALL: &'static [GgmlType] = &[ $( GgmlType::$variant, )* ];

            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id {
                    $( $id => Some(GgmlType::$variant), )*
                    _ => None,
                }
            }

            /// The name gguf-py uses (`GGMLQuantizationType.name`), e.g. `Q4_K`, `BF16`.
            pub const fn name(self) -> &'static str {
                match self { $( GgmlType::$variant => $name, )* }
            }

            /// Elements per block.
            pub const fn block_size(self) -> usize {
                match self { $( GgmlType::$variant => $block, )* }
            }

            /// Bytes per block.
            pub const fn type_size(self) -> usize {
                match self { $( GgmlType::$variant => $bytes, )* }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 18;
    Q4_1 = 3, "Q4_1", 32, 20;
    Q5_0 = 6, "Q5_0", 32, 22;
    Q5_1 = 7, "Q5_1", 32, 24;
    Q8_0 = 8, "Q8_0", 32, 34;
    Q8_1 = 9, "Q8_1", 32, 36;
    Q2_K = 10, "Q2_K", 256, 84;
    Q3_K = 11, "Q3_K", 256, 110;
    Q4_K = 12, "Q4_K", 256, 144;
    Q5_K = 13, "Q5_K", 256, 176;
    Q6_K = 14, "Q6_K", 256, 210;
    Q8_K = 15, "Q8_K", 256, 292;
    IQ2_XXS = 16, "IQ2_XXS", 256, 66;
    IQ2_XS = 17, "IQ2_XS", 256, 74;
    IQ3_XXS = 18, "IQ3_XXS", 256, 98;
    IQ1_S = 19, "IQ1_S", 256, 50;
    IQ4_NL = 20, "IQ4_NL", 32, 18;
    IQ3_S = 21, "IQ3_S", 256, 110;
    IQ2_S = 22, "IQ2_S", 256, 82;
    IQ4_XS = 23, "IQ4_XS", 256, 136;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    IQ1_M = 29, "IQ1_M", 256, 56;
    BF16 = 30, "BF16", 1, 2;
    TQ1_0 = 34, "TQ1_0", 256, 54;
    TQ2_0 = 35, "TQ2_0", 256, 66;
    MXFP4 = 39, "MXFP4", 32, 17;
    NVFP4 = 40, "NVFP4", 64, 36;
    Q1_0 = 41, "Q1_0", 128, 18;
    Q2_0 = 42, "Q2_0", 64, 18;
}

impl GgmlType {
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// Bits per weight, e.g. 4.5 for Q4_0.
    pub fn bits_per_weight(self) -> f64 {
        (self.type_size() * 8) as f64 / self.block_size() as f64
    }

    /// Bytes of one row of `n` elements, or `None` if `n` is not a whole number of blocks or overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let block = self.block_size() as u64;
        if !n.is_multiple_of(block) {
            return None;
        }
        (n / block).checked_mul(self.type_size() as u64)
    }

    /// Whether ggml cannot quantize to this type without an importance matrix (`ggml_quantize_requires_imatrix`:
    /// IQ2_XXS, IQ2_XS and IQ1_S; `ggml_quantize_chunk` aborts without one). llama-quantize refuses more
    /// (`quantfarm_quant::mixture::requires_imatrix`).
    pub const fn quantize_requires_imatrix(self) -> bool {
        matches!(self, GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ1_S)
    }

    /// Whether llama-quantize can write a tensor of this type (`--tensor-type`, `--output-tensor-type`): every type
    /// but the integer ones and the dot-product helpers Q8_1 and Q8_K, which ggml has no quantizer for.
    pub const fn llama_quantize_writes(self) -> bool {
        !matches!(self, GgmlType::Q8_1 | GgmlType::Q8_K | GgmlType::I8 | GgmlType::I16 | GgmlType::I32 | GgmlType::I64)
    }

    /// Parses a gguf-py style name, case-insensitively (`q4_k`, `Q4_K`, `bf16`).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL.iter().copied().find(|t| t.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_removed_ids_are_absent() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(*t));
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000] {
            assert_eq!(GgmlType::from_id(removed), None, "id {removed}");
        }
    }

    #[test]
    fn geometry_matches_ggml() {
        assert_eq!(GgmlType::Q4_K.bits_per_weight(), 4.5);
        assert_eq!(GgmlType::Q6_K.bits_per_weight(), 6.5625);
        assert_eq!(GgmlType::Q8_0.row_bytes(64), Some(68));
        assert_eq!(GgmlType::Q8_0.row_bytes(65), None);
        assert_eq!(GgmlType::from_name("q4_k"), Some(GgmlType::Q4_K));
    }
}
