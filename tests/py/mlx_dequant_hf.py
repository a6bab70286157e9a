"""Oracle for MLX checkpoint -> GGUF: MLX itself dequantizes every affine triple (and every
floating-point mode's pair) of an MLX checkpoint.

Usage: mlx_dequant_hf.py MLX_DIR OUT_DIR

Loads MLX_DIR's weights with mx.load, replaces each quantized module's `P.weight`/`P.scales`/`P.biases` by
`mx.dequantize` of them (scales and biases widened to float32 first, so the result is the exact f32 `scale*q + bias`
and not rounded to the checkpoint's dtype), keeps every other tensor as it is, and writes a plain Hugging Face folder
(`model.safetensors`, config.json without the quantization blocks, the tokenizer files). Prints one line per
dequantized module count.
"""
import json
import pathlib
import shutil
import sys

import mlx.core as mx

src, dst = map(pathlib.Path, sys.argv[1:3])
dst.mkdir(parents=True, exist_ok=True)
config = json.loads((src / "config.json").read_text())
quant = config.get("quantization") or {}
weights = {}
for f in sorted(src.glob("model*.safetensors")):
    weights.update(mx.load(str(f)))

out = {}
dequantized = 0
for name, arr in weights.items():
    if name.endswith(".scales") or name.endswith(".biases"):
        continue
    module = name[: -len(".weight")] if name.endswith(".weight") else None
    if module is not None and f"{module}.scales" in weights:
        params = quant.get(module) if isinstance(quant.get(module), dict) else quant
        scales = weights[f"{module}.scales"]
        if scales.dtype == mx.uint8:
            # A floating-point mode (mxfp4, nvfp4, mxfp8): an entry without `mode` is affine, so the global one
            # applies only where the module has no entry (mlx-lm infers it from the shapes there).
            mode = params.get("mode", "affine") if params is not quant else quant["mode"]
            out[name] = mx.dequantize(arr, scales, mode=mode, dtype=mx.float32)
        else:
            biases = weights[f"{module}.biases"].astype(mx.float32)
            scales = scales.astype(mx.float32)
            out[name] = mx.dequantize(arr, scales, biases, group_size=params["group_size"], bits=params["bits"])
        dequantized += 1
    else:
        out[name] = arr
mx.eval(out)
mx.save_safetensors(str(dst / "model.safetensors"), out, metadata={"format": "pt"})
config.pop("quantization", None)
config.pop("quantization_config", None)
(dst / "config.json").write_text(json.dumps(config, indent=2))
for f in src.iterdir():
    if f.name not in ("config.json", "model.safetensors.index.json") and not f.name.endswith(".safetensors"):
        shutil.copy(f, dst / f.name)
print(f"dequantized {dequantized}")
