//! ggml's geometry, as facts with no I/O and no dependency: what the coordinator, the quantizer and the
//! dequantizer must agree on.
//!
//! - [`GgmlType`]: a tensor's element type as GGUF stores it (id, name, block size and bytes);
//! - [`FileType`]: llama-quantize's recipes (`general.file_type`) and their default tensor type;
//! - [`split`]: the names and keys of GGUF split files;
//! - [`tables`]: the value tables and small-float scale codes several formats decode with;
//! - [`grids`]: the i-quants' grids of 8- and 4-element points, as level patterns and as values;
//! - [`blocks`]: the byte layout of every quantized block quantfarm reads or writes, one `#[repr(C)]` struct per
//!   format whose size is checked against [`GgmlType::type_size`] at compile time.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]
#![warn(missing_debug_implementations)]

pub mod blocks;
pub mod ftype;
pub mod grids;
pub mod split;
pub mod tables;
pub mod types;

pub use ftype::FileType;
pub use types::{GgmlType, QK_K};

/// The tensor types quantfarm's quantizer makes (`quantfarm_quant::quantize`); its test checks the list against
/// what `quantize` accepts, so this one list is what the coordinator reads to refuse a level it cannot make.
pub const QUANTIZED_BY_QUANTFARM: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::MXFP4,
    GgmlType::NVFP4,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::Q1_0,
    GgmlType::Q2_0,
];
