"""sha256 of every tensor of a GGUF file dequantized by gguf-py (`gguf.quants.dequantize`), as little-endian f32.

Usage: gguf_dequant_hashes.py FILE -> JSON {name: sha256} on stdout.
"""
import hashlib
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

r = GGUFReader(sys.argv[1])
out = {}
for t in r.tensors:
    v = dequantize(t.data, t.tensor_type).astype("<f4", copy=False)
    out[t.name] = hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()
json.dump(out, sys.stdout)
