"""An MXFP4 gpt-oss checkpoint dequantized by transformers itself (`Mxfp4Config(dequantize=True)`, its CPU path) and
saved as transformers saves a fine-tune of it: bf16 experts in GptOssExperts' (experts, in, out) layout, with the
checkpoint's tokenizer files copied beside them.

Usage: transformers_mxfp4_dequant.py SRC_DIR OUT_DIR   -> prints "dequantized N" (N expert tensors in bf16)
"""
import os
import shutil
import sys

import torch
from transformers import AutoModelForCausalLM, Mxfp4Config


def main():
    src, out = sys.argv[1], sys.argv[2]
    model = AutoModelForCausalLM.from_pretrained(
        src, quantization_config=Mxfp4Config(dequantize=True), dtype=torch.bfloat16
    )
    model.save_pretrained(out)
    for name in os.listdir(src):
        if name.startswith("tokenizer") or name == "chat_template.jinja":
            shutil.copy(os.path.join(src, name), os.path.join(out, name))
    n = sum(1 for k, v in model.state_dict().items() if ".experts." in k and v.dtype == torch.bfloat16)
    print(f"dequantized {n}")


if __name__ == "__main__":
    main()
