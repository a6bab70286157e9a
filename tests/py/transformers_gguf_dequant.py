"""Compare an HF checkpoint made from a GGUF with transformers' own dequantization of that GGUF.

Usage:
  transformers_gguf_dequant.py GGUF HF_DIR   -> loads GGUF with transformers (AutoModelForCausalLM.from_pretrained
     with gguf_file=, which dequantizes through gguf-py, in torch.bfloat16) and compares every tensor of its state
     dict with HF_DIR's safetensors, by name, shape, dtype and value; prints JSON {"same": N, "differ": [names],
     "only_transformers": [names], "only_ours": [names]} on stdout.
"""
import glob
import json
import os
import sys

import torch
import transformers
from safetensors import safe_open


def main():
    gguf, hf = sys.argv[1], sys.argv[2]
    folder, name = os.path.split(gguf)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    theirs = model.state_dict()
    ours = {}
    for f in sorted(glob.glob(os.path.join(hf, "*.safetensors"))):
        with safe_open(f, "pt") as s:
            for k in s.keys():
                ours[k] = f
    same, differ = 0, []
    for k, b in theirs.items():
        if k not in ours:
            continue
        with safe_open(ours[k], "pt") as s:
            a = s.get_tensor(k)
        if a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b):
            same += 1
        else:
            differ.append(k)
    # A tied output (lm_head sharing the embedding) is one tensor in a checkpoint: transformers' state dict names
    # it twice, the checkpoint once.
    tied = getattr(model.config, "tie_word_embeddings", False)
    only_t = [k for k in theirs if k not in ours and not (tied and k == "lm_head.weight")]
    only_o = [k for k in ours if k not in theirs]
    print(json.dumps({"same": same, "differ": differ, "only_transformers": only_t, "only_ours": only_o}))


if __name__ == "__main__":
    main()
