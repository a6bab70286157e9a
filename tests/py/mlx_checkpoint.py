"""Make an MLX affine checkpoint with mlx_lm.convert and hash what mlx reads back from it.

Usage:
  mlx_checkpoint.py convert HF_DIR OUT_DIR BITS GROUP [DTYPE]   -> runs mlx_lm.convert -q (CPU); BITS may be a mixed
     recipe's name (mixed_4_6: --quant-predicate mixed_4_6, no --q-bits) or a floating-point mode (mxfp4: --q-mode mxfp4)
  mlx_checkpoint.py dequantize MLX_DIR OUT_DIR DTYPE   -> runs mlx_lm.convert --dequantize --dtype DTYPE
  mlx_checkpoint.py prefix MLX_DIR OUT_DIR PREFIX   -> a copy of the checkpoint with every tensor renamed PREFIX + name
     (as multimodal checkpoints wrap their text model, e.g. language_model.), the index renamed to match
  mlx_checkpoint.py rename HF_DIR OUT_DIR OLD=NEW...   -> a copy of the checkpoint with each tensor name's prefix
     OLD replaced by NEW (the first that matches), e.g. a transformers 5 Gemma 3 checkpoint's model.language_model.
     → language_model.model., the layout Google's own Gemma 3 repositories ship and mlx-lm loads
  mlx_checkpoint.py stored DIR   -> JSON {tensor: {"dtype", "shape", "sha256" of the stored bytes}} of DIR's
     model*.safetensors files, read as raw safetensors (no mlx)
  mlx_checkpoint.py hashes MLX_DIR                      -> JSON {tensor: {"shape": [...], "sha256": ...}} on stdout,
     where a quantized module's weight is mx.dequantize'd with its scales and biases upcast to float32 (so the
     values are exact f32 affine results), and any other tensor is cast to float32.
"""
import glob
import hashlib
import json
import os
import sys

import mlx.core as mx
import numpy as np


def convert(hf, out, bits, group, dtype=None):
    from mlx_lm import convert as mlx_convert

    if bits in ("mxfp4", "nvfp4", "mxfp8"):
        # --q-mode MODE, the mode's own bits and group size
        mlx_convert(hf_path=hf, mlx_path=out, quantize=True, q_mode=bits, dtype=dtype)
        return
    if bits.startswith("mixed_"):
        # --quant-predicate RECIPE --q-group-size GROUP, without --q-bits
        mlx_convert(hf_path=hf, mlx_path=out, quantize=True, q_group_size=int(group), quant_predicate=bits, dtype=dtype)
        return
    mlx_convert(hf_path=hf, mlx_path=out, quantize=True, q_bits=int(bits), q_group_size=int(group), dtype=dtype)


def dequantize(src, out, dtype):
    from mlx_lm import convert as mlx_convert

    mlx_convert(hf_path=src, mlx_path=out, dequantize=True, dtype=dtype)


def prefix(src, out, pre):
    import shutil

    os.makedirs(out)
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if name.endswith(".safetensors"):
            weights = mx.load(path)
            mx.save_safetensors(os.path.join(out, name), {pre + k: v for k, v in weights.items()}, metadata={"format": "mlx"})
        elif name == "model.safetensors.index.json":
            index = json.load(open(path))
            index["weight_map"] = {pre + k: v for k, v in index["weight_map"].items()}
            json.dump(index, open(os.path.join(out, name), "w"), indent=4)
        else:
            shutil.copy(path, os.path.join(out, name))


def rename(src, out, pairs):
    import shutil

    pairs = [p.split("=", 1) for p in pairs]

    def renamed(k):
        for old, new in pairs:
            if k.startswith(old):
                return new + k[len(old):]
        return k

    os.makedirs(out)
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if name.endswith(".safetensors"):
            weights = mx.load(path)
            mx.save_safetensors(os.path.join(out, name), {renamed(k): v for k, v in weights.items()},
                                metadata={"format": "pt"})
        elif os.path.isfile(path):
            shutil.copy(path, os.path.join(out, name))


def stored(d):
    import struct

    out = {}
    for f in sorted(glob.glob(os.path.join(d, "model*.safetensors"))):
        b = open(f, "rb").read()
        n = struct.unpack("<Q", b[:8])[0]
        header = json.loads(b[8 : 8 + n])
        for name, t in header.items():
            if name == "__metadata__":
                continue
            s, e = t["data_offsets"]
            data = b[8 + n + s : 8 + n + e]
            out[name] = {"dtype": t["dtype"], "shape": t["shape"], "sha256": hashlib.sha256(data).hexdigest()}
    json.dump(out, sys.stdout)


def hashes(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    q = cfg.get("quantization", {})
    weights = {}
    for f in sorted(glob.glob(os.path.join(d, "model*.safetensors"))):
        weights.update(mx.load(f))
    out = {}
    for name, w in weights.items():
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        mod = name[: -len(".weight")] if name.endswith(".weight") else None
        if mod and mod + ".scales" in weights:
            p = q.get(mod, q)
            v = mx.dequantize(
                w,
                weights[mod + ".scales"].astype(mx.float32),
                weights[mod + ".biases"].astype(mx.float32),
                group_size=p["group_size"],
                bits=p["bits"],
            )
        else:
            v = w.astype(mx.float32)
        a = np.array(v, dtype="<f4")
        out[name] = {"shape": list(a.shape), "sha256": hashlib.sha256(a.tobytes()).hexdigest()}
    json.dump(out, sys.stdout)


if sys.argv[1] == "convert":
    convert(*sys.argv[2:7])
elif sys.argv[1] == "dequantize":
    dequantize(sys.argv[2], sys.argv[3], sys.argv[4])
elif sys.argv[1] == "prefix":
    prefix(sys.argv[2], sys.argv[3], sys.argv[4])
elif sys.argv[1] == "rename":
    rename(sys.argv[2], sys.argv[3], sys.argv[4:])
elif sys.argv[1] == "stored":
    stored(sys.argv[2])
else:
    hashes(sys.argv[2])
