"""A checkpoint loaded as the farm's transformers helper loads it, for the oracles that run transformers themselves
(tf_kld_oracle.py, tf_probe_oracle.py): bf16, a compressed-tensors checkpoint decompressed
(`CompressedTensorsConfig(dequantize=True)`), its input quantization off for ACTIVATIONS `weight-only`."""

import json

import torch
from transformers import AutoModelForCausalLM


def load(path, activations):
    with open(path + "/config.json") as f:
        compressed = (json.load(f).get("quantization_config") or {}).get("quant_method") == "compressed-tensors"
    kwargs = {"dtype": torch.bfloat16}
    if compressed:
        from transformers.utils.quantization_config import CompressedTensorsConfig

        kwargs["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()
    if compressed and activations == "weight-only":
        from compressed_tensors.quantization.lifecycle.helpers import disable_quantization

        model.apply(disable_quantization)
    return model
