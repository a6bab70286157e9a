"""Loads a compressed-tensors checkpoint the way a user's transformers does on the CPU (compressed-tensors
decompressing it to the model's dtype: `run_compressed=False`) and writes every tensor of the model's state as it
ends up there, bf16 (the quantized Linears' decompressed weights among them; a tied lm_head left out, as the
checkpoint leaves it), into DUMP (a safetensors file), for quantfarm's own dequantization to be compared with.

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
linears = 0
tied = model.config.get_text_config().tie_word_embeddings
for name, module in model.named_modules():
    if isinstance(module, torch.nn.Linear) and name != "lm_head":
        assert module.weight.dtype == torch.bfloat16, (name, module.weight.dtype)
        linears += 1
# The quantization parameters compressed-tensors keeps on each module after decompressing (its scales) are not the
# model's weights: left out.
QPARAMS = ("weight_scale", "weight_zero_point", "weight_global_scale", "weight_shape", "weight_packed", "input_scale")
for name, t in model.state_dict().items():
    if (name == "lm_head.weight" and tied) or name.rsplit(".", 1)[-1] in QPARAMS:
        continue
    assert t.dtype == torch.bfloat16, (name, t.dtype)
    out[name] = t.detach().contiguous()
save_file(out, dump)
print(f"{linears} Linear modules, {len(out)} tensors; transformers {transformers.__version__}, compressed-tensors {compressed_tensors.__version__}")
