//! llama-quantize's file types (`llama_ftype`, written as `general.file_type`) and their default tensor types
//! (`llama_ftype_get_default_type`), from llama.cpp 0c1e570's `include/llama.h` (`enum llama_ftype`) and
//! `src/llama-quant.cpp`.

use crate::GgmlType;

macro_rules! file_types {
    ($( $variant:ident = $id:literal, $name:literal, $default:ident; )*) => {
        /// A llama-quantize file type: the recipe for a whole model.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        pub enum FileType {
            $( $variant = $id, )*
        }

        impl FileType {
            pub const ALL: &'static [FileType] = &[ $( FileType::$variant, )* ];

            /// The name llama-quantize prints and accepts (`Q4_K_M`).
            pub fn name(self) -> &'static str {
                match self { $( FileType::$variant => $name, )* }
            }

            /// The type most tensors get.
            pub fn default_type(self) -> GgmlType {
                match self { $( FileType::$variant => GgmlType::$default, )* }
            }
        }
    };
}

file_types! {
    F32 = 0, "F32", F32;
    F16 = 1, "F16", F16;
    Q4_0 = 2, "Q4_0", Q4_0;
    Q4_1 = 3, "Q4_1", Q4_1;
    Q8_0 = 7, "Q8_0", Q8_0;
    Q5_0 = 8, "Q5_0", Q5_0;
    Q5_1 = 9, "Q5_1", Q5_1;
    Q2_K = 10, "Q2_K", Q2_K;
    Q3_K_S = 11, "Q3_K_S", Q3_K;
    Q3_K_M = 12, "Q3_K_M", Q3_K;
    Q3_K_L = 13, "Q3_K_L", Q3_K;
    Q4_K_S = 14, "Q4_K_S", Q4_K;
    Q4_K_M = 15, "Q4_K_M", Q4_K;
    Q5_K_S = 16, "Q5_K_S", Q5_K;
    Q5_K_M = 17, "Q5_K_M", Q5_K;
    Q6_K = 18, "Q6_K", Q6_K;
    IQ2_XXS = 19, "IQ2_XXS", IQ2_XXS;
    IQ2_XS = 20, "IQ2_XS", IQ2_XS;
    Q2_K_S = 21, "Q2_K_S", Q2_K;
    IQ3_XS = 22, "IQ3_XS", IQ3_S;
    IQ3_XXS = 23, "IQ3_XXS", IQ3_XXS;
    IQ1_S = 24, "IQ1_S", IQ1_S;
    IQ4_NL = 25, "IQ4_NL", IQ4_NL;
    IQ3_S = 26, "IQ3_S", IQ3_S;
    IQ3_M = 27, "IQ3_M", IQ3_S;
    IQ2_S = 28, "IQ2_S", IQ2_XS;
    IQ2_M = 29, "IQ2_M", IQ2_S;
    IQ4_XS = 30, "IQ4_XS", IQ4_XS;
    IQ1_M = 31, "IQ1_M", IQ1_M;
    BF16 = 32, "BF16", BF16;
    TQ1_0 = 36, "TQ1_0", TQ1_0;
    TQ2_0 = 37, "TQ2_0", TQ2_0;
    MXFP4_MOE = 38, "MXFP4_MOE", MXFP4;
    Q1_0 = 40, "Q1_0", Q1_0;
    Q2_0 = 41, "Q2_0", Q2_0;
}

impl FileType {
    /// The `general.file_type` value.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Parses a name case-insensitively, with llama-quantize's aliases `Q4_K` = Q4_K_M, `Q5_K` = Q5_K_M,
    /// `Q3_K` = Q3_K_M.
    pub fn from_name(s: &str) -> Option<FileType> {
        let s = s.to_ascii_uppercase();
        let s = match s.as_str() {
            "Q4_K" => "Q4_K_M",
            "Q5_K" => "Q5_K_M",
            "Q3_K" => "Q3_K_M",
            other => other,
        };
        FileType::ALL.iter().copied().find(|f| f.name() == s)
    }

    /// Whether llama-quantize makes this file type only with an importance matrix, whatever the model's widths
    /// (its default type, or the rules' choice for attention and ffn_down, is one `tensor_requires_imatrix` refuses
    /// without one: the IQ1/IQ2 families, IQ3_XXS, and Q2_K under Q2_K_S). IQ3_XS needs one too when a tensor keeps
    /// IQ3_XXS (widths that are multiples of 256), which only the model can tell.
    pub fn needs_imatrix(self) -> bool {
        matches!(
            self,
            FileType::IQ2_XXS
                | FileType::IQ2_XS
                | FileType::IQ2_S
                | FileType::IQ2_M
                | FileType::IQ1_S
                | FileType::IQ1_M
                | FileType::IQ3_XXS
                | FileType::Q2_K_S
        )
    }

    /// Whether the type rules apply at all (they do not for the float file types).
    pub fn is_quantized(self) -> bool {
        !matches!(self, FileType::F32 | FileType::F16 | FileType::BF16)
    }
}

impl std::fmt::Display for FileType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
