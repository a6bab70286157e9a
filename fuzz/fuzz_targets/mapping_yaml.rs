//! Any text given as an architecture mapping (`mappings/*.yaml`) parses into a checked mapping or an error, never a
//! panic or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quantfarm_tensors::convert::mapping::parse_mapping;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = parse_mapping("fuzz.yaml", text);
});
