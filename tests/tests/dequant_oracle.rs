//! Oracle: our dequantization equals gguf-py's (`gguf.quants.dequantize`, numpy float32) and mlx's
//! (`mx.dequantize`, CPU) bit for bit. The reference side is `tests/py/dequant_ref.py`.

use std::ffi::OsStr;
use std::path::Path;

use quantfarm_e2e::{fixtures_dir, run_py};
use quantfarm_tensors::dequant::{dequantize_ggml, dequantize_mlx_affine};
use quantfarm_tensors::GgmlType;

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(bytes.len() % 4, 0, "{}", path.display());
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// Compares bit patterns (so NaN == NaN only with the same payload, and 0.0 != -0.0); panics on the first few
/// differences with their indices.
fn assert_same_bits(what: &str, ours: &[f32], reference: &[f32]) {
    assert_eq!(ours.len(), reference.len(), "{what}: element count");
    let diffs: Vec<String> = ours
        .iter()
        .zip(reference)
        .enumerate()
        .filter(|(_, (a, b))| a.to_bits() != b.to_bits())
        .map(|(i, (a, b))| format!("[{i}] ours {a:e} ({:#010x}) ref {b:e} ({:#010x})", a.to_bits(), b.to_bits()))
        .collect();
    assert!(
        diffs.is_empty(),
        "{what}: {} of {} differ, first: {:#?}",
        diffs.len(),
        ours.len(),
        &diffs[..diffs.len().min(8)]
    );
}

/// Dequantizes `input` (raw blocks of `ty`) with gguf-py and with ours and compares; returns the element count.
fn check_against_gguf_py(what: &str, ty: GgmlType, input: &Path, tmp: &Path) -> usize {
    let out = tmp.join("ref.f32");
    run_py("dequant_ref.py", &[OsStr::new("ggml"), OsStr::new(ty.name()), input.as_os_str(), out.as_os_str()]);
    let reference = read_f32(&out);
    let data = std::fs::read(input).expect("input readable");
    let mut ours = vec![f32::NAN; data.len() / ty.type_size() * ty.block_size()];
    dequantize_ggml(ty, &data, &mut ours).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_same_bits(what, &ours, &reference);
    ours.len()
}

/// Types gguf-py 0.19.0 cannot dequantize (Q1_0 raises NotImplementedError, Q2_0 does not exist there): their golden
/// files are compared with ggml's own `to_float` output (`<type>.deq.f32`) in `quant/tests/golden.rs` instead.
const NOT_IN_GGUF_PY: &[GgmlType] = &[GgmlType::Q1_0, GgmlType::Q2_0];

/// The ggml type of a golden file name: `<type>.bin`, `<type>_imat.bin`, `fma_<type>.bin` or `ties_<type>[_imat].bin`
/// (blocks quantized from the input full of exact ties; the README beside the files says how they were made).
fn golden_type(file_name: &str) -> Option<GgmlType> {
    let stem = file_name.strip_suffix(".bin")?;
    let stem = stem.strip_prefix("fma_").or_else(|| stem.strip_prefix("ties_")).unwrap_or(stem);
    let stem = stem.strip_suffix("_imat").unwrap_or(stem);
    GgmlType::from_name(stem)
}

#[test]
fn golden_files_match_gguf_py() {
    let dir = fixtures_dir().join("ggml-golden");
    let tmp = tempfile::tempdir().unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".bin"))
        .collect();
    names.sort();
    let mut checked = Vec::new();
    for name in &names {
        let ty = golden_type(name).unwrap_or_else(|| panic!("golden file {name} names no ggml type"));
        if NOT_IN_GGUF_PY.contains(&ty) {
            eprintln!(
                "{name}: gguf-py 0.19.0 has no {ty} dequantizer; quant/tests/golden.rs checks ours against ggml's own"
            );
            continue;
        }
        let n = check_against_gguf_py(name, ty, &dir.join(name), tmp.path());
        assert_eq!(n, 4 * 512, "{name}: the golden input is 4 rows x 512");
        checked.push(name.as_str());
    }
    eprintln!("{} golden files identical to gguf-py: {checked:?}", checked.len());
    // 12 types with and without imatrix, plus 5 fma_ variants, at the time of writing.
    assert!(checked.len() >= 29, "only {} golden files checked: {checked:?}", checked.len());
}

#[test]
fn every_f16_and_bf16_bit_pattern_matches_numpy() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("all.u16");
    let all: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
    std::fs::write(&input, all).unwrap();
    for ty in [GgmlType::F16, GgmlType::BF16] {
        assert_eq!(check_against_gguf_py(ty.name(), ty, &input, tmp.path()), 65536);
    }
}

/// Deterministic pseudo-random bytes (64-bit LCG, top byte).
fn random_bytes(n: usize, mut state: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 56) as u8
        })
        .collect()
}

/// Arbitrary bytes reach every code, every scale bit pattern and fp16 subnormals, infinities and NaNs, which the
/// golden files (made by a quantizer) never hold.
#[test]
fn random_blocks_match_gguf_py() {
    use GgmlType::*;
    let tmp = tempfile::tempdir().unwrap();
    let types = [
        Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F32, F64, I8, I16, I32, I64, IQ1_S, IQ1_M, IQ2_XXS,
        IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
    ];
    for (seed, ty) in types.into_iter().enumerate() {
        let blocks = 16384 / ty.block_size();
        let mut data = random_bytes(blocks * ty.type_size(), seed as u64 + 1);
        if matches!(ty, Q4_1 | Q5_1) {
            // Blocks whose d and m are both NaN with different payloads: numpy's `(d·q) + m` returns d's (the first
            // operand's, on x86), and so must ours, so the add must not be commuted.
            for (k, b) in data.chunks_exact_mut(ty.type_size()).take(8).enumerate() {
                b[..4].copy_from_slice(&[k as u8 + 1, 0x7e, 0x55, 0xfd]);
            }
        }
        let input = tmp.path().join(format!("{}.bin", ty.name()));
        std::fs::write(&input, &data).unwrap();
        check_against_gguf_py(&format!("random {ty}"), ty, &input, tmp.path());
    }
}

#[test]
fn mlx_affine_matches_mx_dequantize() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    run_py("dequant_ref.py", &[OsStr::new("mlx"), dir.as_os_str()]);
    let cases = std::fs::read_to_string(dir.join("cases.txt")).expect("cases.txt written");
    let mut checked = 0;
    for line in cases.lines() {
        let f: Vec<usize> = line.split_whitespace().map(|x| x.parse().expect("number")).collect();
        let [bits, g, rows, cols] = f[..] else { panic!("bad case line {line:?}") };
        let name = format!("{bits}_{g}");
        let packed = std::fs::read(dir.join(format!("{name}.wq"))).unwrap();
        let scales = read_f32(&dir.join(format!("{name}.scales")));
        let biases = read_f32(&dir.join(format!("{name}.biases")));
        let reference = read_f32(&dir.join(format!("{name}.deq")));
        assert_eq!(packed.len(), rows * cols * bits / 8, "{name}: packed size");
        assert!(scales.iter().any(|s| *s < 0.0) && scales.iter().any(|s| *s > 0.0), "{name}: both scale signs");
        let mut ours = vec![f32::NAN; rows * cols];
        dequantize_mlx_affine(bits as u32, g, &packed, &scales, &biases, &mut ours).unwrap();
        assert_same_bits(&format!("mlx {name}"), &ours, &reference);
        // Row by row gives the same as all rows at once.
        let (row_bytes, row_groups) = (cols * bits / 8, cols / g);
        let mut row = vec![0.0f32; cols];
        dequantize_mlx_affine(
            bits as u32,
            g,
            &packed[row_bytes..2 * row_bytes],
            &scales[row_groups..2 * row_groups],
            &biases[row_groups..2 * row_groups],
            &mut row,
        )
        .unwrap();
        assert_same_bits(&format!("mlx {name} row 1"), &row, &reference[cols..2 * cols]);
        checked += 1;
    }
    assert_eq!(checked, 18, "6 bit widths x 3 group sizes");
}
