"""Probe answers as transformers' own `generate` gives them: an oracle for the farm's `transformers/probe` tasks, whose
helper renders and decodes on its own loop.

    tf_probe_oracle.py PROBES_JSON MODEL_DIR ACTIVATIONS [MODEL_DIR ACTIVATIONS ...]

PROBES_JSON: a list of {"name", "messages", "kwargs", "max_tokens"} (the suite as quantfarm parsed it; temperature 0
only: greedy). MODEL_DIR: an HF or compressed-tensors checkpoint, loaded in bf16 as transformers loads it (a
compressed one decompressed; ACTIVATIONS `weight-only` turns its input quantization off). Each chat is rendered by
the checkpoint's chat template with the generation prompt and the probe's kwargs, then `generate(do_sample=False,
max_new_tokens=...)`. Prints one JSON line per model: a list of {"probe", "content", "finish"} ("stop" when an
end-of-sequence id ended it, not in the content; "length" at the cap), the content decoded without special tokens.
"""

import json
import sys

import torch
from tf_load import load
from transformers import AutoTokenizer

torch.set_num_threads(2)


def answers(model, tokenizer, probes):
    eos = model.generation_config.eos_token_id
    stop = set(eos if isinstance(eos, list) else [eos])
    out = []
    for p in probes:
        ids = tokenizer.apply_chat_template(
            p["messages"], add_generation_prompt=True, tokenize=True, return_dict=False, **p["kwargs"]
        )
        ids = torch.tensor([list(ids)])
        with torch.inference_mode():
            g = model.generate(
                ids, do_sample=False, max_new_tokens=p["max_tokens"], attention_mask=torch.ones_like(ids)
            )[0, ids.shape[1] :].tolist()
        finish = "length"
        for i, t in enumerate(g):
            if t in stop:
                g, finish = g[:i], "stop"
                break
        out.append({"probe": p["name"], "content": tokenizer.decode(g, skip_special_tokens=True), "finish": finish})
    return out


probes = json.load(open(sys.argv[1]))
args = sys.argv[2:]
if not args or len(args) % 2:
    sys.exit(__doc__)
for i in range(0, len(args), 2):
    model, tokenizer = load(args[i], args[i + 1]), AutoTokenizer.from_pretrained(args[i])
    print(json.dumps(answers(model, tokenizer, probes)))
