//! Single-core throughput of every block quantizer: `cargo bench -p quantfarm-quant`.
//!
//! Quantizes 256 rows × 4096 pseudo-random f32 (every 97th value an outlier ×8, as in the golden input) on a
//! 1-thread rayon pool, with and without an importance matrix, and prints MB/s of f32 input per core. Plain
//! `Instant` timing: each case repeats until it has run for at least `QUANTFARM_BENCH_SECS` (default 1) seconds.

use std::time::{Duration, Instant};

use quantfarm_quant::quantize;

const ROWS: usize = 256;
const N_PER_ROW: usize = 4096;

/// The same LCG stream as the crate's tests (`test_uniform`), every 97th value an outlier ×8.
fn input() -> Vec<f32> {
    let mut state = 0x0123_4567_89ab_cdefu64;
    (0..ROWS * N_PER_ROW)
        .map(|i| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let x = ((state >> 40) as i32 - 8_388_608) as f32 / 8_388_608.0;
            if i % 97 == 0 {
                x * 8.0
            } else {
                x
            }
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `cargo bench` passes `--bench` (and any filter); a filter selects types by name, e.g. `cargo bench -- Q2_K`.
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let secs: f64 = std::env::var("QUANTFARM_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let min_time = Duration::from_secs_f64(secs);

    let src = input();
    let imatrix: Vec<f32> = (0..N_PER_ROW).map(|j| ((j * 37) % 101 + 1) as f32 / 64.0).collect();
    let mb = (src.len() * 4) as f64 / 1e6;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;

    println!("{ROWS} rows x {N_PER_ROW} f32 ({mb:.1} MB) per pass, 1 thread");
    println!("{:<6} {:>14} {:>14}", "type", "MB/s", "MB/s imatrix");
    // Every block type the quantizer makes (the float types are conversions, not blocks).
    let types = quantfarm_ggml::QUANTIZED_BY_QUANTFARM.iter().copied().filter(|t| t.block_size() > 1);
    for ty in types {
        if !filters.is_empty() && !filters.iter().any(|f| ty.name().eq_ignore_ascii_case(f)) {
            continue;
        }
        let row_bytes = ty.row_bytes(N_PER_ROW as u64).ok_or("rows are whole blocks")? as usize;
        let mut dst = vec![0u8; ROWS * row_bytes];
        let mut rates = Vec::new();
        for imat in [None, Some(imatrix.as_slice())] {
            // ggml quantizes IQ2_XXS, IQ2_XS and IQ1_S only with an importance matrix, and so does `quantize`.
            if imat.is_none() && ty.quantize_requires_imatrix() {
                rates.push(None);
                continue;
            }
            let (passes, elapsed) = pool.install(|| -> Result<(u32, Duration), quantfarm_quant::QuantError> {
                quantize(ty, &src, N_PER_ROW, imat, &mut dst)?; // warm-up
                let start = Instant::now();
                let mut passes = 0;
                while passes == 0 || start.elapsed() < min_time {
                    quantize(ty, std::hint::black_box(&src), N_PER_ROW, imat, &mut dst)?;
                    std::hint::black_box(&dst);
                    passes += 1;
                }
                Ok((passes, start.elapsed()))
            })?;
            rates.push(Some(mb * f64::from(passes) / elapsed.as_secs_f64()));
        }
        let rate = |r: Option<f64>| r.map_or_else(|| "-".to_string(), |r| format!("{r:.1}"));
        println!("{:<6} {:>14} {:>14}", ty.name(), rate(rates[0]), rate(rates[1]));
    }
    Ok(())
}
