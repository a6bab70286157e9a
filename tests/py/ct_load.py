"""Loads a compressed-tensors checkpoint the way a user's transformers does on the CPU (compressed-tensors
decompressing it to the model's dtype: `run_compressed=False`) and writes every quantized Linear's weight as it
ends up in the model, bf16, into DUMP (a safetensors file), for quantfarm's own dequantization to be compared with.

    ct_load.py CHECKPOINT DUMP

Run with scripts/install-llm-compressor's venv. Prints the module count and the versions.
"""

import sys

import compressed_tensors
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
from transformers.utils.quantization_config import CompressedTensorsConfig

path, dump = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(
    path, quantization_config=CompressedTensorsConfig(run_compressed=False), dtype=torch.bfloat16
)
out = {}
for name, module in model.named_modules():
    if isinstance(module, torch.nn.Linear) and name != "lm_head":
        w = module.weight.detach()
        assert w.dtype == torch.bfloat16, (name, w.dtype)
        out[f"{name}.weight"] = w.contiguous()
save_file(out, dump)
print(f"{len(out)} modules; transformers {transformers.__version__}, compressed-tensors {compressed_tensors.__version__}")
