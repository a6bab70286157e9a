"""sha256 of every tensor's raw bytes in the safetensors files of a folder, as mlx's loader (mx.load) reads them,
plus the folder's index weight_map if any. Usage: st_hashes.py DIR -> JSON on stdout."""
import glob
import hashlib
import json
import os
import sys

import mlx.core as mx
import numpy as np

d = sys.argv[1]
out = {"tensors": {}, "weight_map": None}
for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
    for name, a in mx.load(f).items():
        if a.dtype in (mx.bfloat16, mx.float16):
            a = a.view(mx.uint16)
        raw = np.array(a).astype(np.array(a).dtype.newbyteorder("<"), copy=False).tobytes()
        out["tensors"][name] = {"file": os.path.basename(f), "shape": list(a.shape), "sha256": hashlib.sha256(raw).hexdigest()}
idx = os.path.join(d, "model.safetensors.index.json")
if os.path.exists(idx):
    out["weight_map"] = json.load(open(idx))["weight_map"]
json.dump(out, sys.stdout)
