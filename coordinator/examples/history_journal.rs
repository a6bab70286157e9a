//! Writes a coordinator journal with a long history: N finished releases (`quantfarm_coordinator::history`), for
//! `bench/coordinator-history`.
//!
//! ```sh
//! cargo run --release -p quantfarm-coordinator --example history_journal -- JOURNAL [N] [REPORT_BYTES]
//! ```

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: history_journal JOURNAL [N=10000] [REPORT_BYTES=50000]");
        std::process::exit(2);
    };
    let n = args.get(1).map_or(Ok(10_000), |s| s.parse()).unwrap_or_else(|e| panic!("N: {e}"));
    let bytes = args.get(2).map_or(Ok(50_000), |s| s.parse()).unwrap_or_else(|e| panic!("REPORT_BYTES: {e}"));
    if let Err(e) = quantfarm_coordinator::history::fill(std::path::Path::new(path), n, bytes) {
        eprintln!("{e}");
        std::process::exit(1);
    }
}
