"""The KL divergence of a model run in transformers against llama.cpp's base logits: the model's logits computed here
by torch over the base file's tokens (each chunk's first token overwritten with BOS, as llama-perplexity decodes it),
scored by `kld_numpy.py`'s NumPy float64 computation; an oracle for the farm's `transformers/kld` tasks, which score
the helper's logits with llama-perplexity's procedure in Rust.

    tf_kld_oracle.py MODEL_DIR ACTIVATIONS BASE_FILE BOS [MODEL_DIR ACTIVATIONS BASE_FILE BOS ...]

MODEL_DIR: an HF or compressed-tensors checkpoint, loaded as transformers loads it (a compressed one decompressed to
bf16; ACTIVATIONS `weight-only` turns its input quantization off, `as-saved` keeps it); BASE_FILE: a llama-perplexity
base-logits file; BOS: the token id written first in every chunk, or -1. Prints one JSON object per model (one
process for several, torch imported once): the mean KL divergence (nats), the percentage of positions whose most
likely token is the same, and the positions scored.
"""

import json
import struct
import sys

import numpy as np
import torch
from kld_numpy import score
from tf_load import load


def measure(path, activations, base_file, bos):
    model = load(path, activations)
    raw = open(base_file, "rb").read()
    n_ctx, _, n_chunk = struct.unpack_from("<Iii", raw, 8)
    tokens = np.frombuffer(raw, "<i4", n_chunk * n_ctx, 20)
    count = sum_kld = same = 0
    for c in range(n_chunk):
        ids = tokens[c * n_ctx : (c + 1) * n_ctx].astype(np.int64).copy()
        if bos >= 0:
            ids[0] = bos
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor(ids[None]), use_cache=False).logits[0, n_ctx // 2 :].float().numpy()
        s = score(raw, c, logits)
        count, sum_kld, same = count + s["count"], sum_kld + s["sum_kld"], same + s["n_same_top"]
    return {"mean_kld": sum_kld / count, "same_top_p": 100.0 * same / count, "n": count}


args = sys.argv[1:]
if not args or len(args) % 4:
    sys.exit(__doc__)
for i in range(0, len(args), 4):
    print(json.dumps(measure(args[i], args[i + 1], args[i + 2], int(args[i + 3]))))
