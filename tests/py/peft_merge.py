"""The real PEFT merge, as an oracle for quantfarm's: the base loaded in bf16 with transformers, the adapter with
peft.PeftModel, then merge_and_unload() and save_pretrained (safetensors).

usage: peft_merge.py BASE_DIR ADAPTER_DIR OUT_DIR
"""

import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

base, adapter, out = sys.argv[1:4]
model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
merged.save_pretrained(out, safe_serialization=True)
print(f"tie_word_embeddings={merged.config.tie_word_embeddings}")
