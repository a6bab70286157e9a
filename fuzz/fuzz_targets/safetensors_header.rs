//! Any bytes given to the safetensors header parser give a header or an error, never a panic; every tensor of a
//! header that parses lies inside the file and overlaps no other.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quantfarm_tensors::safetensors::StHeader;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = StHeader::parse_file(data, "fuzz.safetensors") {
        let data_len = data.len() as u64 - h.data_offset;
        let mut last_end = 0;
        for t in &h.tensors {
            assert!(t.begin >= last_end && t.end <= data_len && t.begin <= t.end);
            last_end = t.end;
        }
    }
});
