"""The oracle of quantfarm's vLLM checkpoints: llm-compressor's own, on the CPU (its eager torch path).

    llmc_oracle.py ENTRY SCHEME GROUP HF_DIR OUT_DIR [IGNORE,...]
    llmc_oracle.py --jobs ENTRY SCHEME GROUP HF_DIR OUT_DIR IGNORE [ENTRY SCHEME GROUP HF_DIR OUT_DIR IGNORE ...]

The second form runs several jobs in one process (torch, transformers and llm-compressor imported once: seconds a
job on this project's machine); IGNORE may then be empty ("").

ENTRY is `oneshot` (the model loaded in transformers, QuantizationModifier(targets="Linear", ignore=["lm_head",
*IGNORE]), saved compressed) or `model_free` (model_free_ptq over the safetensors files, ignoring the embeddings and
lm_head, as its examples do, and the extra entries IGNORE gives: a mixture of experts' routers, patterns). IGNORE:
entries separated by commas (module names, or `re:` patterns). SCHEME is FP8_DYNAMIC or W4A16 (GROUP: its group
size; 0 for FP8_DYNAMIC).

Run with scripts/install-llm-compressor's venv (llmcompressor 0.14.0.1, compressed-tensors 0.19.0,
transformers 5.17.0, torch 2.11.0). Prints the versions it ran.
"""

import json
import sys

import compressed_tensors
import llmcompressor
import torch
import transformers
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme


def scheme_of(name: str, group: int):
    if name == "FP8_DYNAMIC":
        return "FP8_DYNAMIC"
    if name == "W4A16":
        weights = QuantizationArgs(num_bits=4, type="int", strategy="group", group_size=group, symmetric=True)
        return QuantizationScheme(targets=["Linear"], weights=weights)
    raise SystemExit(f"unknown scheme {name!r}")


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--jobs"]:
        jobs = args[1:]
        if not jobs or len(jobs) % 6:
            raise SystemExit(__doc__)
        for i in range(0, len(jobs), 6):
            run(*jobs[i : i + 5], jobs[i + 5])
    else:
        run(*args[:5], args[5] if len(args) > 5 else "")


def run(entry, scheme_name, group, hf, out, ignore) -> None:
    group = int(group)
    extra = [m for m in ignore.split(",") if m]
    scheme = scheme_of(scheme_name, group)
    torch.manual_seed(0)
    if entry == "oneshot":
        from llmcompressor import oneshot
        from llmcompressor.modifiers.quantization import QuantizationModifier

        # A multimodal checkpoint (`*ForConditionalGeneration`: Gemma 3 4B+, Mistral 3) loads whole, vision tower
        # included, as llm-compressor's multimodal examples load it.
        with open(f"{hf}/config.json", encoding="utf-8") as f:
            architectures = json.load(f).get("architectures") or [""]
        auto = (
            transformers.AutoModelForImageTextToText
            if architectures[0].endswith("ForConditionalGeneration")
            else transformers.AutoModelForCausalLM
        )
        model = auto.from_pretrained(hf, dtype=torch.bfloat16)
        if isinstance(scheme, str):
            recipe = QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head", *extra])
        else:
            recipe = QuantizationModifier(config_groups={"group_0": scheme}, ignore=["lm_head", *extra])
        oneshot(model=model, recipe=recipe)
        model.save_pretrained(out, save_compressed=True)
    elif entry == "model_free":
        from llmcompressor import model_free_ptq

        model_free_ptq(
            model_stub=hf,
            save_directory=out,
            scheme=scheme,
            ignore=["model.embed_tokens", "lm_head", *extra],
            max_workers=1,
            device="cpu",
        )
    else:
        raise SystemExit(f"unknown entry {entry!r}")
    print(
        f"llmcompressor {llmcompressor.__version__}, compressed-tensors {compressed_tensors.__version__}, "
        f"transformers {transformers.__version__}, torch {torch.__version__}"
    )


if __name__ == "__main__":
    main()
