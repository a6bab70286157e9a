"""The oracle of quantfarm's compressed-tensors numerics (quant/src/compressed_tensors.rs): torch's own casts, and
compressed-tensors' own scale, quantize and pack functions (its eager torch path, on the CPU).

    ct_oracle.py values OUT_DIR
        For all 65,536 bf16 bit patterns v (NaN and inf included): `fp8.bin`, torch's
        `clamp(v, -448, 448).to(float8_e4m3fn)` (one byte each); `int4.bin`, `round(clamp(v, -8, 7))` as int8;
        and `div.bin`, bf16 quotients `a / b` of the pairs in `div_in.bin` (u16 a, u16 b, little-endian; written
        here, seeded), as u16.
    ct_oracle.py weights OUT_DIR ROWS COLS GROUP
        A seeded bf16 weight `w.bin` [ROWS, COLS] with the cases that matter (an all-zero row, exact -0.0 values,
        a row's amax at both signs, values on rounding ties) and, from compressed-tensors' functions:
        `fp8_scale.bin` (bf16 [ROWS]), `fp8_oneshot.bin` (e4m3fn bytes, quantized with the symmetric zero point as
        `oneshot` does: -0.0 becomes +0), `fp8_model_free.bin` (without one, as `model_free_ptq`: -0.0 stays),
        `w4_scale.bin` (bf16 [ROWS, COLS/GROUP]) and `w4_packed.bin` (i32 [ROWS, ceil(COLS/8)]).

Run with the converter's venv and scripts/install-compressed-tensors's folder on PYTHONPATH.
"""

import sys
from pathlib import Path

import numpy as np
import torch


def values(out: Path) -> None:
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    v = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)
    fp8 = torch.clamp(v, -448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    (out / "fp8.bin").write_bytes(fp8.numpy().tobytes())
    int4 = torch.round(torch.clamp(v, -8.0, 7.0)).to(torch.int8)
    (out / "int4.bin").write_bytes(int4.numpy().tobytes())
    rng = np.random.default_rng(20261206)
    pairs = rng.integers(0, 65536, size=(200_000, 2), dtype=np.uint32).astype(np.uint16)
    # Finite, nonzero divisors: as scales are.
    b = pairs[:, 1]
    finite = ((b >> 7) & 0xFF) != 0xFF
    pairs = pairs[finite & ((b & 0x7FFF) != 0)]
    (out / "div_in.bin").write_bytes(pairs.astype("<u2").tobytes())
    a = torch.from_numpy(pairs[:, 0].view(np.int16).copy()).view(torch.bfloat16)
    d = torch.from_numpy(pairs[:, 1].view(np.int16).copy()).view(torch.bfloat16)
    (out / "div.bin").write_bytes((a / d).view(torch.int16).numpy().astype("<i2").tobytes())


def weights(out: Path, rows: int, cols: int, group: int) -> None:
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    g = torch.Generator().manual_seed(20261206)
    w = (torch.randn(rows, cols, generator=g) * 0.05).to(torch.bfloat16)
    w[0] = 0.0  # an all-zero row: the scale is bf16's eps
    w[1, ::7] = -0.0  # exact negative zeros
    w[2, 3], w[2, 5] = 1.5, -1.5  # the row's amax at both signs
    w[3] = torch.arange(cols, dtype=torch.float32).remainder(16).sub(8).mul(0.125).to(torch.bfloat16)  # ties
    (out / "w.bin").write_bytes(w.view(torch.int16).numpy().astype("<i2").tobytes())

    fp8 = QuantizationArgs(num_bits=8, type="float", strategy="channel", symmetric=True, dynamic=False)
    scale, zp = calculate_qparams(w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True), fp8)
    assert scale.dtype == torch.bfloat16 and scale.shape == (rows, 1), (scale.dtype, scale.shape)
    (out / "fp8_scale.bin").write_bytes(scale.view(torch.int16).numpy().astype("<i2").tobytes())
    oneshot = quantize(w, scale, zp, fp8, dtype=torch.float8_e4m3fn)
    (out / "fp8_oneshot.bin").write_bytes(oneshot.view(torch.uint8).numpy().tobytes())
    model_free = quantize(w, scale, None, fp8, dtype=torch.float8_e4m3fn)
    (out / "fp8_model_free.bin").write_bytes(model_free.view(torch.uint8).numpy().tobytes())

    w4 = QuantizationArgs(num_bits=4, type="int", strategy="group", group_size=group, symmetric=True)
    grouped = w.reshape(rows, cols // group, group)
    scale4, zp4 = calculate_qparams(grouped.amin(dim=2), grouped.amax(dim=2), w4)
    assert scale4.dtype == torch.bfloat16 and scale4.shape == (rows, cols // group), (scale4.dtype, scale4.shape)
    (out / "w4_scale.bin").write_bytes(scale4.view(torch.int16).numpy().astype("<i2").tobytes())
    q = quantize(w, scale4, zp4, w4, dtype=torch.int8)
    packed = pack_to_int32(q, 4)
    (out / "w4_packed.bin").write_bytes(packed.numpy().astype("<i4").tobytes())


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    if mode == "values":
        values(out)
    elif mode == "weights":
        weights(out, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
