//! quantfarm's compressed-tensors numerics (`quant/src/compressed_tensors.rs`) against their oracles, run here on
//! the same machine: torch 2.11's own casts over every bf16 value, and compressed-tensors 0.20.1's own
//! `calculate_qparams`, `quantize` and `pack_to_int32` (its eager torch path on the CPU, the one llm-compressor takes
//! there) on a weight with the cases that matter (`tests/py/ct_oracle.py`).

use std::path::Path;
use std::process::Command;

use quantfarm_quant::compressed_tensors as ct;

/// Runs `tests/py/ct_oracle.py ARGS` with the converter's venv and compressed-tensors on its path.
fn oracle(args: &[&str]) {
    let out = Command::new(quantfarm_e2e::convert_python())
        .arg(quantfarm_e2e::repo_root().join("tests/py/ct_oracle.py"))
        .args(args)
        .env("PYTHONPATH", quantfarm_e2e::compressed_tensors_site())
        .output()
        .expect("run ct_oracle.py");
    assert!(out.status.success(), "ct_oracle.py {args:?}:\n{}", String::from_utf8_lossy(&out.stderr));
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn u16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
}

#[test]
fn every_bf16_value_casts_and_rounds_as_torch() {
    let dir = tempfile::tempdir().unwrap();
    oracle(&["values", dir.path().to_str().unwrap()]);
    let (fp8, int4) = (read(dir.path(), "fp8.bin"), read(dir.path(), "int4.bin"));
    let mut checked = 0;
    for bits in 0..=u16::MAX {
        let v = ct::bf16_value(bits);
        let i = usize::from(bits);
        if v.is_nan() {
            // torch's clamp keeps NaN; the cast makes it e4m3fn's NaN. (Weights are never NaN: refused first.)
            assert_eq!(fp8[i] & 0x7F, 0x7F, "NaN {bits:#06x}");
            continue;
        }
        assert_eq!(ct::fp8_e4m3fn_bits(v.clamp(-ct::FP8_MAX, ct::FP8_MAX)), fp8[i], "fp8 of bf16 {bits:#06x} = {v}");
        assert_eq!(v.clamp(-8.0, 7.0).round_ties_even() as i8, int4[i] as i8, "int4 of bf16 {bits:#06x} = {v}");
        checked += 1;
    }
    assert_eq!(checked, 65536 - 254, "every non-NaN bf16 value");
    // bf16 ÷ bf16: the f32 quotient rounded to bf16, on torch's own pairs.
    let (pairs, quotients) = (u16s(&read(dir.path(), "div_in.bin")), u16s(&read(dir.path(), "div.bin")));
    assert!(quotients.len() > 100_000);
    for (p, q) in pairs.chunks_exact(2).zip(&quotients) {
        let (a, b) = (ct::bf16_value(p[0]), ct::bf16_value(p[1]));
        let ours = ct::bf16_bits(a / b);
        // Any NaN is the same NaN to torch's readers; compare the rest bit for bit.
        if ct::bf16_value(*q).is_nan() {
            assert!(ct::bf16_value(ours).is_nan(), "{:#06x} / {:#06x}", p[0], p[1]);
        } else {
            assert_eq!(ours, *q, "{:#06x} / {:#06x}", p[0], p[1]);
        }
    }
}

#[test]
fn fp8_dynamic_and_w4a16_are_compressed_tensors_own() {
    let dir = tempfile::tempdir().unwrap();
    let (rows, cols, group) = (64usize, 576usize, 64usize);
    oracle(&["weights", dir.path().to_str().unwrap(), &rows.to_string(), &cols.to_string(), &group.to_string()]);
    let w: Vec<f32> = u16s(&read(dir.path(), "w.bin")).into_iter().map(ct::bf16_value).collect();
    let fp8_scale = u16s(&read(dir.path(), "fp8_scale.bin"));
    let (oneshot, model_free) = (read(dir.path(), "fp8_oneshot.bin"), read(dir.path(), "fp8_model_free.bin"));
    let w4_scale = u16s(&read(dir.path(), "w4_scale.bin"));
    let w4_packed: Vec<i32> = read(dir.path(), "w4_packed.bin")
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let words = ct::packed_words(cols);
    let mut negative_zeros = 0;
    for (r, row) in w.chunks_exact(cols).enumerate() {
        // FP8_DYNAMIC: the row's scale, then each weight.
        let scale = ct::fp8_row_scale(row);
        assert_eq!(ct::bf16_bits(scale), fp8_scale[r], "row {r}'s FP8 scale");
        let mut q = vec![0u8; cols];
        ct::fp8_row(row, scale, &mut q);
        assert_eq!(q, model_free[r * cols..(r + 1) * cols], "row {r}: model_free_ptq's bytes");
        for (c, (&ours, &theirs)) in q.iter().zip(&oneshot[r * cols..(r + 1) * cols]).enumerate() {
            if ours == 0x80 {
                // oneshot adds the symmetric zero point: an exact -0.0 comes out +0.
                assert_eq!(theirs, 0x00, "row {r} col {c}");
                negative_zeros += 1;
            } else {
                assert_eq!(ours, theirs, "row {r} col {c}: oneshot's byte");
            }
        }
        // W4A16: each group's scale and the packed row.
        let mut ints = vec![0i8; cols];
        for (gi, g) in row.chunks_exact(group).enumerate() {
            let s = ct::int4_group_scale(g);
            assert_eq!(ct::bf16_bits(s), w4_scale[r * (cols / group) + gi], "row {r} group {gi}'s W4A16 scale");
            for (k, &x) in g.iter().enumerate() {
                ints[gi * group + k] = ct::int4_value(x, s);
            }
        }
        let mut packed = vec![0i32; words];
        ct::pack_int4_row(&ints, &mut packed);
        assert_eq!(packed, w4_packed[r * words..(r + 1) * words], "row {r}: the packed int4 words");
    }
    assert!(negative_zeros > 0, "the weight has exact negative zeros, whose sign the two anchors treat apart");
}
