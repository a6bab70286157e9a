"""mlx-lm run directly, the oracle for quantfarm's mlx-lm helper (worker/mlx/quantfarm_mlx.py), which the tests
drive through the worker's client:

  versions                          -> {"mlx": ..., "mlx_lm": ...} (the installed distributions)
  logits MODEL OUT FIRST ID...      -> mlx_lm.load + one forward pass; the logits of positions FIRST.. as
                                       little-endian f32 in OUT
  generate MODEL MAX ID...          -> {"tokens": [...], "text": ..., "eos": [...]}: without the end id: mlx_lm.stream_generate at its default (greedy) sampler,
                                       the ids it yields before an end-of-sequence id
  break-lm-head HF OUT              -> mlx_lm.convert -q (4-bit) of HF into OUT, then lm_head.scales removed from
                                       its weights: the checkpoint the parity method's seeds saw crash at load
"""

import json
import os
import sys

os.environ.setdefault("MLX_DISABLE_COMPILE", "1")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "versions":
        import importlib.metadata as md

        print(json.dumps({"mlx": md.version("mlx"), "mlx_lm": md.version("mlx-lm")}))
    elif cmd == "logits":
        import mlx.core as mx
        from mlx_lm import load

        model, _ = load(args[0])
        first = int(args[2])
        ids = [int(t) for t in args[3:]]
        out = model(mx.array(ids)[None])[0, first:, :].astype(mx.float32)
        mx.eval(out)
        with open(args[1], "wb") as f:
            f.write(memoryview(out).tobytes())
    elif cmd == "generate":
        from mlx_lm import load, stream_generate

        model, tokenizer = load(args[0])
        ids = [int(t) for t in args[2:]]
        tokens = [r.token for r in stream_generate(model, tokenizer, ids, max_tokens=int(args[1]))]
        eos = set(tokenizer.eos_token_ids)
        kept = [t for t in tokens if t not in eos]
        print(json.dumps({"tokens": kept, "text": tokenizer.decode(kept), "eos": sorted(eos)}))
    elif cmd == "break-lm-head":
        import mlx.core as mx
        from mlx_lm import convert

        convert(args[0], mlx_path=args[1], quantize=True, q_bits=4, q_group_size=64)
        path = os.path.join(args[1], "model.safetensors")
        tensors = mx.load(path)
        del tensors["lm_head.scales"]
        mx.save_safetensors(path, tensors, metadata={"format": "mlx"})
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
