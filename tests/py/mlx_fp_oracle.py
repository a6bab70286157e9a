"""mx.quantize's floating-point modes (mxfp4, nvfp4, mxfp8) on CPU, the oracle for quant/src/mlx_fp.rs.

Usage: mlx_fp_oracle.py OUT_DIR

Writes, for each dtype D in bfloat16, float16, float32: w-D.f32 (the input matrix as D values, widened to
little-endian f32, 32 columns), and for each mode M: M-D.weight (uint32 words), M-D.scales (uint8) and M-D.deq
(mx.dequantize's values as f32). Prints {"rows": {D: n}}.

The matrix holds, in bf16: every finite bf16 value v with 2^-100 <= |v| <= 2^100 as the largest magnitude of a row
(the row is v times 32 fixed factors in [-1, 1]), so every scale the modes can compute from a bf16 amax occurs; every
bf16 value in [-6, 6] and in [-448, 448] beside an anchor of 6 or 448 (scale 1 for the 4-bit modes, 2^0 for mxfp8),
so every rounding and tie of the value search occurs; a row of zeros; and random rows at scales 1e-4 to 1e2. f16 and f32 get the
rows that stay finite and in range in them.
"""

import json
import os
import sys

import mlx.core as mx
import numpy as np


def bf16_values():
    bits = np.arange(0, 1 << 16, dtype=np.uint32)
    return (bits << 16).view(np.float32)


def rows_bf16():
    v = bf16_values()
    v = v[np.isfinite(v)]
    a = np.abs(v)
    anchors = v[(a >= 2.0**-100) & (a <= 2.0**100)]
    factors = np.concatenate([[1.0], np.linspace(-1.0, 1.0, 31)]).astype(np.float32)
    rows = [anchors[:, None] * factors[None, :]]
    for anchor in (6.0, 448.0):
        vals = v[np.abs(v) <= anchor]
        n = -len(vals) % 31
        vals = np.concatenate([vals, np.zeros(n, np.float32)]).reshape(-1, 31)
        rows.append(np.concatenate([np.full((len(vals), 1), anchor, np.float32), vals], axis=1))
    # A group of zeros: scale 2^0 in the mx modes, a zero e4m3 scale (0/0 values, code 0) in nvfp4.
    rows.append(np.zeros((1, 32), np.float32))
    rng = np.random.default_rng(7)
    for scale in (1e-4, 1e-2, 1.0, 1e2):
        rows.append((rng.standard_normal((512, 32)) * scale).astype(np.float32))
    return np.concatenate(rows, axis=0)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    base = mx.array(rows_bf16())
    counts = {}
    for dname in ("bfloat16", "float16", "float32"):
        dtype = getattr(mx, dname)
        w = base.astype(mx.bfloat16).astype(dtype)
        wf = np.array(w.astype(mx.float32))
        a = np.abs(wf).max(axis=1)
        keep = np.isfinite(wf).all(axis=1) & ((a == 0) | ((a >= 2.0**-100) & (a <= 2.0**100)))
        if dname == "float16":
            keep &= (a == 0) | (a >= 2.0**-8)
        w = mx.array(wf[keep]).astype(dtype)
        counts[dname] = int(keep.sum())
        np.array(w.astype(mx.float32)).astype("<f4").tofile(os.path.join(out, f"w-{dname}.f32"))
        for mode in ("mxfp4", "nvfp4", "mxfp8"):
            wq, scales = mx.quantize(w, mode=mode)
            deq = mx.dequantize(wq, scales, mode=mode, dtype=mx.float32)
            np.array(wq).astype("<u4").tofile(os.path.join(out, f"{mode}-{dname}.weight"))
            np.array(scales).astype(np.uint8).tofile(os.path.join(out, f"{mode}-{dname}.scales"))
            np.array(deq).astype("<f4").tofile(os.path.join(out, f"{mode}-{dname}.deq"))
    print(json.dumps({"rows": counts}))


main()
