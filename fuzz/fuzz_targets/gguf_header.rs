//! Any bytes given to the GGUF header parser give a header or an error, never a panic, a hang, or an allocation
//! beyond the input's size; a header that parses re-encodes to the same header bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quantfarm_tensors::gguf::GgufHeader;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = GgufHeader::parse(data, data.len() as u64, "fuzz.gguf") {
        let layout = h.layout().expect("a parsed header re-encodes");
        let reparsed =
            GgufHeader::parse(&layout.header, layout.file_len, "re-encoded.gguf").expect("a re-encoded header parses");
        assert_eq!(reparsed.layout().expect("re-encodes").header, layout.header);
    }
});
