//! Any bytes given to the imatrix readers (llama-quantize's reading of a GGUF or legacy `.dat` imatrix, and the raw
//! sums of a GGUF imatrix or a farm part) give a value or an error naming the file, never a panic or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quantfarm_quant::imatrix::sums::ImatrixSums;
use quantfarm_quant::imatrix::Imatrix;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = Imatrix::from_bytes(data, "fuzz.imatrix") {
        assert!(e.to_string().contains("fuzz.imatrix"), "{e}");
    }
    if let Ok(s) = ImatrixSums::from_bytes(data, "fuzz.gguf") {
        for (name, st) in &s.entries {
            assert!(!st.counts.is_empty() && st.values.len() % st.counts.len() == 0, "{name}");
        }
    }
});
