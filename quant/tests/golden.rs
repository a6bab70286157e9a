//! Byte-for-byte comparison with `ggml_quantize_chunk` output from llama.cpp 0c1e570 (x86-64, no FMA), stored in
//! `shared/fixtures/ggml-golden/` (see its README): 4 rows × 512 f32, quantized without and with `imatrix.f32`.

use std::path::PathBuf;

use quantfarm_quant::{quantize, supported, GgmlType, QuantError};
use quantfarm_tensors::dequant::dequantize_ggml;

const N_PER_ROW: usize = 512;
const ROWS: usize = 4;

/// Every type this crate supports that has a golden file, with the file stem ggml's tests use.
const GOLDEN: &[(GgmlType, &str)] = &[
    (GgmlType::F16, "f16"),
    (GgmlType::BF16, "bf16"),
    (GgmlType::Q8_0, "q8_0"),
    (GgmlType::Q4_0, "q4_0"),
    (GgmlType::Q4_1, "q4_1"),
    (GgmlType::Q5_0, "q5_0"),
    (GgmlType::Q5_1, "q5_1"),
    (GgmlType::Q2_K, "q2_K"),
    (GgmlType::Q3_K, "q3_K"),
    (GgmlType::Q4_K, "q4_K"),
    (GgmlType::Q5_K, "q5_K"),
    (GgmlType::Q6_K, "q6_K"),
];

/// How a type treats an importance matrix, which decides its golden files.
#[derive(Clone, Copy, PartialEq)]
enum Imatrix {
    /// `<t>.bin` and `<t>_imat.bin` differ (ties: `ties_<t>.bin` and `ties_<t>_imat.bin`).
    Optional,
    /// Ignored: `<t>.bin` and `<t>_imat.bin` are identical (ties: `ties_<t>.bin` only).
    Ignored,
    /// Required (ggml aborts without one): only `<t>_imat.bin` and `ties_<t>_imat.bin` exist, and quantizing
    /// without an imatrix is refused.
    Required,
}

/// The types added with the rest of llama-quantize's ladder (`ggml-golden/README.md`): their `.bin` files (plain,
/// `_imat`, `ties_`), and ggml's own `to_float` of the plain and `_imat` ones (`.deq.f32`).
const NEW_GOLDEN: &[(GgmlType, &str, Imatrix)] = &[
    (GgmlType::IQ2_XXS, "iq2_xxs", Imatrix::Required),
    (GgmlType::IQ2_XS, "iq2_xs", Imatrix::Required),
    (GgmlType::IQ2_S, "iq2_s", Imatrix::Optional),
    (GgmlType::IQ4_NL, "iq4_nl", Imatrix::Optional),
    (GgmlType::IQ4_XS, "iq4_xs", Imatrix::Optional),
    (GgmlType::IQ3_XXS, "iq3_xxs", Imatrix::Optional),
    (GgmlType::IQ3_S, "iq3_s", Imatrix::Optional),
    (GgmlType::IQ1_S, "iq1_s", Imatrix::Required),
    (GgmlType::IQ1_M, "iq1_m", Imatrix::Optional),
    (GgmlType::MXFP4, "mxfp4", Imatrix::Ignored),
    (GgmlType::NVFP4, "nvfp4", Imatrix::Ignored),
    (GgmlType::TQ1_0, "tq1_0", Imatrix::Ignored),
    (GgmlType::TQ2_0, "tq2_0", Imatrix::Ignored),
    (GgmlType::Q1_0, "q1_0", Imatrix::Ignored),
    (GgmlType::Q2_0, "q2_0", Imatrix::Ignored),
];

fn golden_dir() -> PathBuf {
    let shared = match std::env::var_os("QUANTFARM_SHARED") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
    };
    shared.join("fixtures/ggml-golden")
}

fn read(name: &str) -> Vec<u8> {
    let path = golden_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn read_f32(name: &str) -> Vec<f32> {
    read(name).chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn quantized(ty: GgmlType, src: &[f32], imatrix: Option<&[f32]>) -> Vec<u8> {
    let mut dst = vec![0u8; ROWS * ty.row_bytes(N_PER_ROW as u64).expect("whole blocks") as usize];
    quantize(ty, src, N_PER_ROW, imatrix, &mut dst).unwrap_or_else(|e| panic!("{ty}: {e}"));
    dst
}

/// Names the first differing block, so a failure points at the step to inspect.
fn assert_same_bytes(ty: GgmlType, file: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{file}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        let bs = ty.type_size();
        let block = i / bs;
        let range = block * bs..(block + 1) * bs;
        let differing = got.iter().zip(want).filter(|(a, b)| a != b).count();
        panic!(
            "{file}: {differing} bytes differ; first at byte {i} (block {block})\n got  {:02x?}\n want {:02x?}",
            &got[range.clone()],
            &want[range]
        );
    }
}

#[test]
fn fixtures_are_the_documented_shape() {
    assert_eq!(read_f32("input.f32").len(), ROWS * N_PER_ROW);
    assert_eq!(read_f32("imatrix.f32").len(), N_PER_ROW);
}

#[test]
fn matches_ggml_without_imatrix() {
    let input = read_f32("input.f32");
    for &(ty, stem) in GOLDEN {
        assert!(supported(ty), "{ty}");
        let file = format!("{stem}.bin");
        assert_same_bytes(ty, &file, &quantized(ty, &input, None), &read(&file));
    }
}

#[test]
fn matches_ggml_with_imatrix() {
    let input = read_f32("input.f32");
    let imatrix = read_f32("imatrix.f32");
    for &(ty, stem) in GOLDEN {
        let file = format!("{stem}_imat.bin");
        assert_same_bytes(ty, &file, &quantized(ty, &input, Some(&imatrix)), &read(&file));
    }
}

/// The imatrix must change the legacy and K-quants (otherwise the `_imat` comparison would prove nothing about
/// `_impl`).
#[test]
fn imatrix_changes_the_quants() {
    for (_, stem) in &GOLDEN[3..] {
        assert_ne!(read(&format!("{stem}.bin")), read(&format!("{stem}_imat.bin")), "{stem}");
    }
}

/// The `fma_` files come from a `-march=haswell` build that fuses multiply-adds. For Q2_K and Q5_K they differ from
/// the plain build, and our (never-fusing) output must be the plain one; for Q3_K, Q4_K and Q6_K both builds agree on
/// this input.
#[test]
fn k_quants_match_the_non_fma_build() {
    let input = read_f32("input.f32");
    for (ty, stem) in [(GgmlType::Q2_K, "q2_K"), (GgmlType::Q5_K, "q5_K")] {
        let q = quantized(ty, &input, None);
        assert_eq!(q, read(&format!("{stem}.bin")), "{stem}");
        assert_ne!(q, read(&format!("fma_{stem}.bin")), "fma_{stem}.bin should differ, or this test proves nothing");
    }
    for (ty, stem) in [(GgmlType::Q3_K, "q3_K"), (GgmlType::Q4_K, "q4_K"), (GgmlType::Q6_K, "q6_K")] {
        assert_eq!(read(&format!("fma_{stem}.bin")), read(&format!("{stem}.bin")), "{stem}");
        assert_eq!(quantized(ty, &input, None), read(&format!("{stem}.bin")), "{stem}");
    }
}

#[test]
fn f32_is_a_little_endian_copy() {
    let input = read_f32("input.f32");
    assert_eq!(quantized(GgmlType::F32, &input, None), read("input.f32"));
}

/// Dequantizing our output gives back the input to within one quantization step for the affine and symmetric
/// formats (half a step for the `_ref` rounding, the fp16-rounded scale adds a little more), and exactly for F32.
#[test]
fn round_trip_error_is_bounded() {
    let input = read_f32("input.f32");
    let imatrix = read_f32("imatrix.f32");
    for &(ty, _) in GOLDEN {
        for imat in [None, Some(imatrix.as_slice())] {
            let bytes = quantized(ty, &input, imat);
            let mut back = vec![0f32; input.len()];
            dequantize_ggml(ty, &bytes, &mut back).unwrap_or_else(|e| panic!("{ty}: {e}"));
            // Legacy formats are judged per 32-element block, K-quants per 256-element super-block (their sub-block
            // scales are quantized against the super-block's largest one).
            let chunk = ty.block_size().max(32);
            for (b, (xs, ys)) in input.chunks(chunk).zip(back.chunks(chunk)).enumerate() {
                let (min, max) = xs.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
                let amax = xs.iter().fold(0f32, |m, x| m.max(x.abs()));
                // One step of each format's grid, with the step sizes the `_ref` quantizers choose.
                let step = match ty {
                    GgmlType::F16 => amax * 2f32.powi(-10),
                    GgmlType::BF16 => amax * 2f32.powi(-7),
                    GgmlType::Q8_0 => amax / 127.0,
                    GgmlType::Q4_0 => amax / 8.0 * 2.0,
                    GgmlType::Q5_0 => amax / 16.0 * 2.0,
                    GgmlType::Q4_1 => (max - min) / 15.0,
                    GgmlType::Q5_1 => (max - min) / 31.0,
                    GgmlType::Q2_K => (max - min) / 3.0,
                    GgmlType::Q3_K => amax / 4.0 * 2.0,
                    GgmlType::Q4_K => (max - min) / 15.0,
                    GgmlType::Q5_K => (max - min) / 31.0,
                    GgmlType::Q6_K => amax / 32.0 * 2.0,
                    _ => unreachable!(),
                };
                // Half a step for rounding (a full one where Q4_0/Q5_0 cap the top level, covered by their doubled
                // step); the imatrix search may pick a scale ~10% off and clip the extreme element, hence 3 steps.
                // Q2_K and Q3_K also quantize their 16 sub-block scales (and Q2_K's mins) to 4 and 6 bits, and Q2_K's
                // `_ref` search minimises the absolute error, which may clip: a whole step either way.
                let steps = match (imat.is_some(), ty) {
                    (true, _) => 3.0,
                    (false, GgmlType::Q2_K | GgmlType::Q3_K) => 1.0,
                    (false, _) => 0.5 * 1.01,
                };
                // The scale (and Q4_1/Q5_1 offset) are stored as fp16: up to 2^-11 relative error each.
                let fp16_slack = if matches!(ty, GgmlType::F16 | GgmlType::BF16) { 0.0 } else { amax * 2f32.powi(-9) };
                let bound = steps * step + fp16_slack + 1e-6;
                for (j, (x, y)) in xs.iter().zip(ys).enumerate() {
                    assert!(
                        (x - y).abs() <= bound,
                        "{ty} imatrix={} block {b} elem {j}: {x} → {y}, bound {bound}",
                        imat.is_some()
                    );
                }
            }
        }
    }
}

/// Every golden file of the new types, byte for byte: from `input.f32` with and without the imatrix, and from
/// `ties_input.f32` (exact ties, MXFP4 midpoints, all-zero sub-blocks).
#[test]
fn new_types_match_ggml() {
    let input = read_f32("input.f32");
    let ties = read_f32("ties_input.f32");
    let imatrix = read_f32("imatrix.f32");
    for &(ty, stem, mode) in NEW_GOLDEN {
        assert!(supported(ty), "{ty}");
        for (prefix, src) in [("", &input), ("ties_", &ties)] {
            let file = format!("{prefix}{stem}.bin");
            let with = quantized(ty, src, Some(&imatrix));
            if mode == Imatrix::Required {
                let mut dst = vec![0u8; with.len()];
                let refused = quantize(ty, src, N_PER_ROW, None, &mut dst);
                assert!(matches!(refused, Err(QuantError::ImatrixRequired(t)) if t == ty), "{ty}: {refused:?}");
                assert!(!golden_dir().join(&file).exists(), "{file}: ggml made one without an imatrix?");
                let file = format!("{prefix}{stem}_imat.bin");
                assert_same_bytes(ty, &file, &with, &read(&file));
                continue;
            }
            assert_same_bytes(ty, &file, &quantized(ty, src, None), &read(&file));
            match mode {
                Imatrix::Required => unreachable!("handled above"),
                Imatrix::Optional => {
                    let file = format!("{prefix}{stem}_imat.bin");
                    assert_same_bytes(ty, &file, &with, &read(&file));
                    assert_ne!(
                        read(&file),
                        read(&format!("{prefix}{stem}.bin")),
                        "{file} should differ from the plain one"
                    );
                }
                Imatrix::Ignored => assert_same_bytes(ty, &format!("{file} (imatrix ignored)"), &with, &read(&file)),
            }
        }
    }
}

/// ggml's own dequantization of every new golden file (`<t>.deq.f32`, `<t>_imat.deq.f32`), bit for bit.
#[test]
fn new_types_dequantize_as_ggml() {
    for &(ty, stem, mode) in NEW_GOLDEN {
        let suffixes: &[&str] = if mode == Imatrix::Required { &["_imat"] } else { &["", "_imat"] };
        for suffix in suffixes {
            let bytes = read(&format!("{stem}{suffix}.bin"));
            let want = read_f32(&format!("{stem}{suffix}.deq.f32"));
            let mut got = vec![f32::NAN; want.len()];
            dequantize_ggml(ty, &bytes, &mut got).unwrap_or_else(|e| panic!("{ty}: {e}"));
            let differ: Vec<usize> = (0..want.len()).filter(|&i| got[i].to_bits() != want[i].to_bits()).collect();
            assert!(
                differ.is_empty(),
                "{stem}{suffix}.deq.f32: {} values differ, first at {}: {} against ggml's {}",
                differ.len(),
                differ[0],
                got[differ[0]],
                want[differ[0]]
            );
        }
    }
}
