//! Any JSON given as an MLX checkpoint's `config.json` gives its quantization settings (every module's bits and
//! group size within MLX's ranges, or one of its floating-point modes) or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quantfarm_tensors::mlx::{ModuleQuant, QuantConfig};

fuzz_target!(|data: &[u8]| {
    let Ok(serde_json::Value::Object(config)) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    if let Ok(Some(q)) = QuantConfig::from_config(&config, "config.json") {
        let keys: Vec<String> = config.keys().cloned().collect();
        for path in keys.iter().map(String::as_str).chain(["model.layers.0.self_attn.q_proj", "lm_head", ""]) {
            match q.for_module(path) {
                Some(ModuleQuant::Affine(p)) => {
                    assert!(matches!(p.bits, 2 | 3 | 4 | 5 | 6 | 8) && matches!(p.group_size, 32 | 64 | 128), "{path}: {p:?}")
                }
                Some(ModuleQuant::Fp(m)) => assert!(matches!((m.bits(), m.group_size()), (4, 16) | (4, 32) | (8, 32))),
                None => {}
            }
        }
    }
});
