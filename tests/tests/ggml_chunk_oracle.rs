//! Oracle: every type quantfarm quantizes equals the peer build's own ggml (`ggml_quantize_chunk` in
//! `libggml-base`, called through `tests/py/ggml_quantize_chunk.py`) byte for byte, on inputs made here to reach the
//! corners the golden files may miss: an all-zero sub-block inside a non-zero super-block (ggml's IQ3_S then writes
//! the later groups one slot early), whole zero and constant rows, values rounded to bf16 (ties everywhere), one
//! huge outlier per row, tiny magnitudes near the i-quants' zero thresholds, all-negative rows; each with and without
//! an importance matrix (where the type takes one), on the same machine.

use std::ffi::OsStr;
use std::path::Path;

use quantfarm_e2e::{llama_bin, run_py};
use quantfarm_quant::{quantize, GgmlType};

const N_PER_ROW: usize = 1024;

/// A fixed stream of pseudo-random values in [−1, 1) (64-bit LCG).
fn uniform(mut state: u64) -> impl FnMut() -> f32 {
    move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Rows of `N_PER_ROW`, each a corner case (see the module doc).
fn input() -> Vec<f32> {
    let mut r = uniform(0x5eed);
    let mut rows: Vec<Vec<f32>> = Vec::new();
    let gauss = |r: &mut dyn FnMut() -> f32| (0..4).map(|_| r()).sum::<f32>() * 0.05;
    // Plain weights.
    rows.push((0..N_PER_ROW).map(|_| gauss(&mut r)).collect());
    // A zero 32-sub-block (and a zero 16-sub-block) inside non-zero super-blocks.
    let mut row: Vec<f32> = (0..N_PER_ROW).map(|_| gauss(&mut r)).collect();
    row[64..96].fill(0.0);
    row[256 + 16..256 + 32].fill(0.0);
    rows.push(row);
    // Values rounded to bf16: exact ties in every block.
    rows.push((0..N_PER_ROW).map(|_| f32::from_bits(gauss(&mut r).to_bits() & 0xffff_0000)).collect());
    // One outlier.
    let mut row: Vec<f32> = (0..N_PER_ROW).map(|_| gauss(&mut r)).collect();
    row[300] = 3.5;
    rows.push(row);
    // Tiny values (near the 1e-8 … 1e-15 thresholds).
    rows.push((0..N_PER_ROW).map(|i| gauss(&mut r) * if i < 512 { 1e-9 } else { 1e-14 }).collect());
    // All negative, then a constant, then zero.
    rows.push((0..N_PER_ROW).map(|_| -gauss(&mut r).abs() - 0.01).collect());
    rows.push(vec![0.125; N_PER_ROW]);
    rows.push(vec![0.0; N_PER_ROW]);
    rows.concat()
}

fn imatrix() -> Vec<f32> {
    let mut r = uniform(0x1a7e);
    (0..N_PER_ROW).map(|i| (r() + 1.0) * if i % 97 == 0 { 50.0 } else { 1.0 } + 1e-3).collect()
}

fn write_f32(path: &Path, v: &[f32]) {
    std::fs::write(path, v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
}

#[test]
fn every_quantized_type_equals_ggml_on_corner_cases() {
    let lib = llama_bin().join("libggml-base.so");
    assert!(lib.exists(), "{} is missing (scripts/test installs the peer tools)", lib.display());
    let tmp = tempfile::tempdir().unwrap();
    let (src, imat) = (input(), imatrix());
    let (src_path, imat_path) = (tmp.path().join("in.f32"), tmp.path().join("imatrix.f32"));
    write_f32(&src_path, &src);
    write_f32(&imat_path, &imat);
    let n_str = N_PER_ROW.to_string();
    // One ggml run for every (type, imatrix) job.
    let mut jobs: Vec<(GgmlType, bool)> = Vec::new();
    for &ty in quantfarm_ggml::QUANTIZED_BY_QUANTFARM {
        for with in [false, true] {
            if with || !ty.quantize_requires_imatrix() {
                jobs.push((ty, with));
            }
        }
    }
    let job_name = |ty: GgmlType, with: bool| format!("{}{}", ty.id(), if with { "+i" } else { "" });
    let names: Vec<String> = jobs.iter().map(|&(t, w)| job_name(t, w)).collect();
    let mut args: Vec<&OsStr> =
        vec![lib.as_os_str(), OsStr::new(&n_str), src_path.as_os_str(), imat_path.as_os_str(), tmp.path().as_os_str()];
    args.extend(names.iter().map(OsStr::new));
    run_py("ggml_quantize_chunk.py", &args);
    let mut checked = Vec::new();
    for &(ty, with) in &jobs {
        let row_bytes = ty.row_bytes(N_PER_ROW as u64).expect("whole blocks") as usize;
        let what = format!("{ty}{}", if with { " with an imatrix" } else { "" });
        let want = std::fs::read(tmp.path().join(format!("{}.bin", job_name(ty, with)))).unwrap();
        let mut ours = vec![0u8; want.len()];
        quantize(ty, &src, N_PER_ROW, with.then_some(imat.as_slice()), &mut ours)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        if let Some(i) = ours.iter().zip(&want).position(|(a, b)| a != b) {
            let (row, block) = (i / row_bytes, i % row_bytes / ty.type_size());
            let at = row * row_bytes + block * ty.type_size();
            panic!(
                "{what}: {} bytes differ; first in row {row}, block {block}\n ours {:02x?}\n ggml {:02x?}",
                ours.iter().zip(&want).filter(|(a, b)| a != b).count(),
                &ours[at..at + ty.type_size()],
                &want[at..at + ty.type_size()]
            );
        }
        checked.push(what);
    }
    eprintln!("identical to ggml_quantize_chunk: {checked:?}");
}
