"""Whether two safetensors folders hold the same tensors: the same names, dtypes, shapes and raw bytes (whatever the
files' order or headers). Run with llm-compressor's venv (torch, safetensors).

    st_same.py DIR_A DIR_B   -> prints `same N` or the first difference, exits 1 on a difference
"""

import glob
import hashlib
import os
import sys

from safetensors import safe_open


def tensors(d):
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with safe_open(f, framework="pt") as st:
            for name in st.keys():
                t = st.get_tensor(name)
                raw = t.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes()
                out[name] = (str(t.dtype), tuple(t.shape), hashlib.sha256(raw).hexdigest())
    return out


a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
if a.keys() != b.keys():
    sys.exit(f"names differ: {sorted(set(a) ^ set(b))[:5]}")
for name in a:
    if a[name] != b[name]:
        sys.exit(f"{name}: {a[name]} vs {b[name]}")
print(f"same {len(a)}")
