"""Quantizes an f32 matrix with the peer build's own ggml (`ggml_quantize_chunk` in libggml-base, through ctypes):
the oracle for quantfarm's quantizers on inputs made on the spot.

    ggml_quantize_chunk.py LIBGGML_BASE N_PER_ROW INPUT.f32 IMATRIX.f32 OUT_DIR JOB...

Each JOB is `TYPE_ID` (no imatrix) or `TYPE_ID+i` (with the imatrix, one weight per column) and writes
`OUT_DIR/JOB.bin`. The whole input is quantized in one call (start 0, every row), as llama-quantize does per chunk.
"""
import ctypes
import sys
from pathlib import Path

import numpy as np


def main():
    lib_path, n_per_row, src_path, imatrix_path, out_dir, *jobs = sys.argv[1:]
    n_per_row = int(n_per_row)
    lib = ctypes.CDLL(lib_path)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p
    ]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    src = np.fromfile(src_path, dtype="<f4")
    if src.size % n_per_row:
        sys.exit(f"{src_path}: {src.size} values are not whole rows of {n_per_row}")
    rows = src.size // n_per_row
    imatrix = np.fromfile(imatrix_path, dtype="<f4")
    if imatrix.size != n_per_row:
        sys.exit(f"{imatrix_path}: {imatrix.size} weights, expected {n_per_row}")
    for job in jobs:
        type_id, with_imatrix = int(job.removesuffix("+i")), job.endswith("+i")
        out = np.zeros(rows * lib.ggml_row_size(type_id, n_per_row), dtype=np.uint8)
        written = lib.ggml_quantize_chunk(
            type_id, src.ctypes.data, out.ctypes.data, 0, rows, n_per_row,
            imatrix.ctypes.data if with_imatrix else None,
        )
        if written != out.size:
            sys.exit(f"type {type_id}: ggml wrote {written} bytes, expected {out.size}")
        out.tofile(Path(out_dir) / f"{job}.bin")


if __name__ == "__main__":
    main()
