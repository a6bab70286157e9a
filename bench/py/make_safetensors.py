"""Write a synthetic sharded safetensors checkpoint (bf16, llama-like tensor names and sizes) of a given total size.

Usage: make_safetensors.py OUT_DIR --gib 2.1 [--shards 3]
Stdlib only. Tensor bytes are a deterministic pattern: the benchmark measures reading, not the values. One tensor is
256 MiB, larger than the 64 MiB budget the benchmark reads with, so chunked reads of one tensor are exercised.
"""
import argparse
import json
import os
import struct


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--gib", type=float, default=2.1)
    ap.add_argument("--shards", type=int, default=3)
    a = ap.parse_args()
    total = int(a.gib * (1 << 30))
    tensors = [("model.embed_tokens.weight", [32768, 4096])]  # 256 MiB
    size = 32768 * 4096 * 2
    layer = 0
    while size < total:
        for name, shape in [
            ("self_attn.q_proj.weight", [2048, 2048]),
            ("self_attn.k_proj.weight", [512, 2048]),
            ("self_attn.v_proj.weight", [512, 2048]),
            ("self_attn.o_proj.weight", [2048, 2048]),
            ("mlp.gate_proj.weight", [5632, 2048]),
            ("mlp.up_proj.weight", [5632, 2048]),
            ("mlp.down_proj.weight", [2048, 5632]),
            ("input_layernorm.weight", [2048]),
        ]:
            tensors.append((f"model.layers.{layer}.{name}", shape))
            n = 2
            for d in shape:
                n *= d
            size += n
        layer += 1
    os.makedirs(a.out, exist_ok=True)
    per = -(-len(tensors) // a.shards)
    block = bytes(range(256)) * 4096  # 1 MiB
    weight_map = {}
    for s in range(a.shards):
        part = tensors[s * per:(s + 1) * per]
        fname = f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name, shape in part:
            n = 2
            for d in shape:
                n *= d
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
            off += n
            weight_map[name] = fname
        hj = json.dumps(header).encode()
        hj += b" " * (-len(hj) % 8)
        tmp = os.path.join(a.out, "." + fname + ".partial")
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(hj)))
            f.write(hj)
            left = off
            while left > 0:
                k = min(left, len(block))
                f.write(block[:k])
                left -= k
        os.replace(tmp, os.path.join(a.out, fname))
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": size}, "weight_map": weight_map}, f, indent=2)
    print(f"{a.out}: {len(tensors)} tensors, {size / (1 << 30):.2f} GiB in {a.shards} shards")


main()
