"""The merge check (link 1) as PEFT and transformers' own `generate` make it, independently of the farm's helper: the
base with a PEFT adapter applied at run time (unmerged), the merged checkpoint, and the base alone, each loaded in
float32 (bf16 weights widened exactly), continue the same prompts greedily; the continuations of the first two are
compared with the merge's.

    peft_greedy_oracle.py BASE_DIR ADAPTER_DIR MERGED_DIR PROMPTS_JSON MAX_TOKENS

PROMPTS_JSON: a prompt set as `examples/prompts-20.json` (a list of strings, each one user message; or objects with
`messages`), rendered by the base's chat template with the generation prompt. Prints one JSON object: the prompts
compared `n`, how many continuations of the unmerged adapter are identical to the merge's (`adapter_identical`), and
how many of the base alone are (`base_identical`: fewer than `n` shows the adapter changes what the model says, so
the check can fail).
"""

import json
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

BASE, ADAPTER, MERGED, PROMPTS, MAX_TOKENS = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
torch.set_num_threads(2)

tokenizer = AutoTokenizer.from_pretrained(BASE)
prompts = json.load(open(PROMPTS))
if isinstance(prompts, dict):
    prompts = prompts["prompts"]
inputs = []
for p in prompts:
    messages = p["messages"] if isinstance(p, dict) else [{"role": "user", "content": p}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    inputs.append(torch.tensor([list(ids)]))


def continuations(model):
    model.eval()
    out = []
    with torch.inference_mode():
        for ids in inputs:
            g = model.generate(ids, do_sample=False, max_new_tokens=MAX_TOKENS, attention_mask=torch.ones_like(ids))
            out.append(g[0, ids.shape[1] :].tolist())
    return out


def load(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


merged = continuations(load(MERGED))
adapter = continuations(PeftModel.from_pretrained(load(BASE), ADAPTER))
base = continuations(load(BASE))
print(
    json.dumps(
        {
            "n": len(inputs),
            "adapter_identical": sum(a == m for a, m in zip(adapter, merged)),
            "base_identical": sum(b == m for b, m in zip(base, merged)),
        }
    )
)
