//! MLX's floating-point modes (`quant/src/mlx_fp.rs`: mxfp4, nvfp4, mxfp8) against `mx.quantize` and
//! `mx.dequantize` run here (mlx's CPU build, the peers' Python): every finite bf16 value as a group's largest
//! magnitude, every bf16 value within a group of scale one (each tie of the value search), and random rows, in
//! bf16, f16 and f32 (`tests/py/mlx_fp_oracle.py` says which rows each dtype keeps). Words, scale bytes and the
//! dequantized values must be the same bits.

use std::path::Path;

use quantfarm_quant::mlx_fp::{dequantize_fp, quantize_fp, FpMode};
use quantfarm_tensors::Dtype;

fn read_f32(p: &Path) -> Vec<f32> {
    std::fs::read(p).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn read_u32(p: &Path) -> Vec<u32> {
    std::fs::read(p).unwrap().chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

#[test]
fn fp_modes_equal_mx_quantize_on_every_bf16_value() {
    let dir = tempfile::tempdir().unwrap();
    let printed = quantfarm_e2e::run_py("mlx_fp_oracle.py", &[dir.path().as_os_str()]);
    eprintln!("{}", printed.trim());
    let cols = 32;
    for (dname, dtype) in [("bfloat16", Dtype::BF16), ("float16", Dtype::F16), ("float32", Dtype::F32)] {
        let w = read_f32(&dir.path().join(format!("w-{dname}.f32")));
        assert!(w.len() >= 29_000 * cols, "{dname}: only {} rows", w.len() / cols);
        for mode in FpMode::ALL {
            let file = |ext: &str| dir.path().join(format!("{}-{dname}.{ext}", mode.name()));
            let (words, scales) = (read_u32(&file("weight")), std::fs::read(file("scales")).unwrap());
            let ours = quantize_fp(&w, cols, mode, dtype).unwrap_or_else(|e| panic!("{} {dname}: {e}", mode.name()));
            assert_eq!(ours.scales.len(), scales.len(), "{} {dname}: scale count", mode.name());
            let bad_scale = ours.scales.iter().zip(&scales).position(|(a, b)| a != b);
            if let Some(i) = bad_scale {
                let g = mode.group_size();
                panic!(
                    "{} {dname}: group {i} (row {}) scale {:#04x}, mlx {:#04x}; values {:?}",
                    mode.name(),
                    i * g / cols,
                    ours.scales[i],
                    scales[i],
                    &w[i * g..(i + 1) * g]
                );
            }
            let per_word = 32 / mode.bits() as usize;
            if let Some(i) = ours.packed.iter().zip(&words).position(|(a, b)| a != b) {
                panic!(
                    "{} {dname}: word {i} (row {}) {:#010x}, mlx {:#010x}; values {:?}",
                    mode.name(),
                    i * per_word / cols,
                    ours.packed[i],
                    words[i],
                    &w[i * per_word..(i + 1) * per_word]
                );
            }
            assert_eq!(ours.packed.len(), words.len(), "{} {dname}: word count", mode.name());
            let deq = read_f32(&file("deq"));
            let back = dequantize_fp(&words, &scales, mode);
            let differ = back.iter().zip(&deq).position(|(a, b)| a.to_bits() != b.to_bits());
            assert!(differ.is_none(), "{} {dname}: dequantized value {differ:?} differs", mode.name());
            eprintln!(
                "{} {dname}: {} words, {} scales identical to mx.quantize",
                mode.name(),
                words.len(),
                scales.len()
            );
        }
    }
}
