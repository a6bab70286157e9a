"""Run mx.quantize (affine, CPU) on the cases a Rust test wrote, and write what it returns.

Usage: mlx_quantize_ref.py DIR
  DIR/cases.json: [{"name", "rows", "cols", "dtype": "float32"|"bfloat16"|"float16", "bits", "group_size"}]
  DIR/<name>.in: rows*cols little-endian float32 values (exactly representable in dtype)
Writes DIR/<name>.q (uint32 words, little-endian), DIR/<name>.s and DIR/<name>.b (scales and biases, raw
little-endian bytes of dtype).
"""
import json
import os
import sys

import mlx.core as mx
import numpy as np

mx.set_default_device(mx.cpu)
d = sys.argv[1]
RAW = {"float32": mx.uint32, "bfloat16": mx.uint16, "float16": mx.uint16}
for c in json.load(open(os.path.join(d, "cases.json"))):
    a = np.fromfile(os.path.join(d, c["name"] + ".in"), dtype="<f4").reshape(c["rows"], c["cols"])
    w = mx.array(a).astype(getattr(mx, c["dtype"]))
    # The input must survive the cast unchanged, or the test would compare different inputs.
    assert np.array_equal(np.array(w.astype(mx.float32)), a), c["name"]
    q, s, b = mx.quantize(w, group_size=c["group_size"], bits=c["bits"])
    mx.eval(q, s, b)
    assert q.dtype == mx.uint32 and s.dtype == w.dtype and b.dtype == w.dtype
    np.array(q).astype("<u4").tofile(os.path.join(d, c["name"] + ".q"))
    fmt = "<u4" if c["dtype"] == "float32" else "<u2"
    np.array(s.view(RAW[c["dtype"]])).astype(fmt).tofile(os.path.join(d, c["name"] + ".s"))
    np.array(b.view(RAW[c["dtype"]])).astype(fmt).tofile(os.path.join(d, c["name"] + ".b"))
