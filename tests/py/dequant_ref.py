"""Reference dequantization for the oracle tests (peer venv: gguf-py 0.19.0, numpy, mlx).

Modes:
  ggml TYPE IN_BIN OUT_F32   dequantize the raw blocks of ggml type TYPE (a GGMLQuantizationType name, e.g. Q4_K)
                             in IN_BIN with gguf-py `gguf.quants.dequantize`, writing little-endian f32 to OUT_F32.
                             Plain types gguf-py does not handle (F64, I8, I16, I32, I64) use numpy astype(float32).
  mlx OUT_DIR                quantize seeded random float32 matrices with `mx.quantize` (CPU, float32 so scales and
                             biases are float32) at every bits x group size, and write for each case `<b>_<g>.wq`
                             (uint32 words, LE), `.scales`, `.biases` and `.deq` (`mx.dequantize`, f32 LE), plus
                             `cases.txt` with one line `bits group_size rows cols` per case.
"""

import sys
from pathlib import Path

import numpy as np

PLAIN = {"F64": "<f8", "I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8"}


def ggml(type_name: str, src: str, dst: str) -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    raw = np.fromfile(src, dtype=np.uint8)
    if type_name in PLAIN:
        out = raw.view(PLAIN[type_name]).astype(np.float32)
    else:
        out = dequantize(raw, GGMLQuantizationType[type_name])
    np.ascontiguousarray(out, dtype="<f4").tofile(dst)


def mlx(out_dir: str) -> None:
    import mlx.core as mx

    mx.set_default_device(mx.cpu)
    out = Path(out_dir)
    rng = np.random.default_rng(20240501)
    cases = []
    for bits in (2, 3, 4, 5, 6, 8):
        for g in (32, 64, 128):
            rows, cols = 8, 512
            w = rng.standard_normal((rows, cols), dtype=np.float32)
            # Groups that are all negative or all positive exercise both signs of the scale and the q0 == 0 path.
            w[1] = -np.abs(w[1])
            w[2] = np.abs(w[2]) * 3
            w[3, :g] = 0.0
            wq, scales, biases = mx.quantize(mx.array(w), group_size=g, bits=bits)
            assert scales.dtype == mx.float32 and biases.dtype == mx.float32
            deq = mx.dequantize(wq, scales, biases, group_size=g, bits=bits)
            name = f"{bits}_{g}"
            np.array(wq).astype("<u4").tofile(out / f"{name}.wq")
            np.array(scales).astype("<f4").tofile(out / f"{name}.scales")
            np.array(biases).astype("<f4").tofile(out / f"{name}.biases")
            np.array(deq).astype("<f4").tofile(out / f"{name}.deq")
            cases.append(f"{bits} {g} {rows} {cols}")
    (out / "cases.txt").write_text("\n".join(cases) + "\n")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "ggml" and len(sys.argv) == 5:
        ggml(*sys.argv[2:])
    elif mode == "mlx" and len(sys.argv) == 3:
        mlx(sys.argv[2])
    else:
        sys.exit(__doc__)
