//! Any text given as a `release.yaml` parses into a checked spec or an error naming the file, never a panic; a spec
//! that parses is written back (as the report holds it) to YAML that parses to the same spec.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quantfarm_coordinator::spec::ReleaseSpec;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match ReleaseSpec::parse(text, "fuzz.yaml") {
        Ok(spec) => {
            let yaml = serde_norway::to_string(&spec).expect("a parsed spec serializes");
            let again = ReleaseSpec::parse(&yaml, "again.yaml").expect("a written-back spec parses");
            assert_eq!(serde_norway::to_string(&again).expect("serializes"), yaml);
        }
        Err(e) => assert!(e.to_string().starts_with("fuzz.yaml"), "{e}"),
    }
});
