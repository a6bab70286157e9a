"""Dump a GGUF file as gguf-py's GGUFReader sees it: metadata (key -> value) and tensors (name, type, ne).

Usage: gguf_dump.py FILE  -> JSON on stdout. The reference for `quantfarm inspect`.
"""
import json
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType


def scalar(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode("utf-8", errors="replace")
    if isinstance(v, np.generic):
        v = v.item()
    return v


def field_value(field):
    types = field.types
    if not types:
        return None
    if types[0] == GGUFValueType.ARRAY:
        return array_value(field, 1, [field.data])
    part = field.parts[field.data[0]]
    if types[0] == GGUFValueType.STRING:
        return bytes(part).decode("utf-8", errors="replace")
    v = part[0]
    if types[0] == GGUFValueType.BOOL:
        return bool(v)
    return scalar(v)


def array_value(field, depth, _):
    # gguf-py flattens arrays into parts; contents() rebuilds them (nested ones too).
    return to_plain(field.contents())


def to_plain(v):
    if isinstance(v, list):
        return [to_plain(x) for x in v]
    return scalar(v)


def main():
    r = GGUFReader(sys.argv[1])
    meta = {}
    for name, field in r.fields.items():
        if name.startswith("GGUF."):
            continue
        meta[name] = field_value(field)
    tensors = [
        {"name": t.name, "type": t.tensor_type.name, "ne": [int(x) for x in t.shape], "bytes": int(t.n_bytes)}
        for t in r.tensors
    ]
    json.dump({"metadata": meta, "tensors": tensors}, sys.stdout)


main()
