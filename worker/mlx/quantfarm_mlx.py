#!/usr/bin/env python3
"""quantfarm's mlx-lm helper: runs a model in mlx-lm, the runtime MLX users load their checkpoints in, for a
quantfarm worker (issue 26: the parity method's cross-runtime link, and MLX rungs measured where they will run).

The worker starts this program in a Python environment with pinned `mlx` and `mlx-lm` and talks to it over
stdin/stdout, one JSON object per line each way, one answer per request, in order. Requests:

  {"op": "hello", "protocol": 1}
      -> {"ok": true, "protocol": 1, "mlx": VERSION, "mlx_lm": VERSION, "device": "cpu" | "gpu", "device_name": ...}
      The version handshake: the worker advertises the runtime only when this answers with its protocol.
  {"op": "load", "model": PATH, "upcast_quantized": BOOL}
      -> {"ok": true, "quantized": BOOL, "upcast": BOOL, "vocab": N}
      `mlx_lm.load(PATH)` (the checkpoint as users load it). With `upcast_quantized` (the CPU build), a quantized
      model's floating parameters (scales, biases, norms, embeddings) are made float32 (`set_dtype`), so activations
      are f32: the CPU build's quantized matmul accumulates in bf16 otherwise (see the issue's measurements); so is
      a model with mixture-of-experts layers (mlx_lm.models.switch_layers), quantized or not, since the CPU build's
      GatherMM runs float32 only. The answer says so, and the report records it.
  {"op": "logits", "tokens": [ID, ...], "first": K, "out": PATH}
      -> {"ok": true, "rows": N, "vocab": V}
      One forward pass over the token ids as given (never re-tokenized: the ids come from the KLD plan), batch 1, no
      cache; writes the logits of positions K .. len-1 to PATH as little-endian float32, row after row (rows =
      len - K). The worker computes the KL divergence against the llama.cpp base logits itself.
  {"op": "greedy", "tokens": [ID, ...], "max_tokens": N, "stop": [ID, ...] | null}
      -> {"ok": true, "tokens": [ID, ...], "margins": [F, ...]}
      `mlx_lm.generate.generate_step` with its default (greedy, temperature 0) sampler, as `mlx_lm.generate` runs it:
      up to N tokens, ending at the first stop id, which is returned as the last token (as llama.cpp's greedy
      continuations end with their end-of-generation token, so the two compare token for token); without `stop`,
      the tokenizer's `eos_token_ids`, where `mlx_lm.generate` stops. `margins[i]` is the top-1 minus top-2 log-probability of step i
      (generate_step's log-probabilities; equal to the logit margin up to rounding).
  {"op": "decode", "sequences": [[ID, ...], ...]}
      -> {"ok": true, "texts": [TEXT, ...]}
      The loaded model's tokenizer's `decode` of each sequence (continuations are compared as text too).

Run as `quantfarm_mlx.py serve --model PATH --host HOST --port PORT [--upcast]`, it is `mlx_lm.server` itself (its
own argument parsing, request handling and generation; what users serve MLX checkpoints with), with one change when
`--upcast` is given: a quantized (or mixture-of-experts) model's floating parameters are made float32 right after
`mlx_lm.load`, as the `load` request above does on the CPU build, so the probes see the same model the other tasks measured.

A failure answers {"ok": false, "error": TEXT, "kind": "input" | "runtime"}: "input" when the request or the model
is at fault (a missing file, a checkpoint mlx-lm cannot load: TEXT is mlx-lm's own message), "runtime" otherwise.
MLX_DISABLE_COMPILE=1 is set before mlx loads, so no compiler is needed at run time (logits are bitwise repeatable
either way).
"""

import json
import os
import sys

os.environ.setdefault("MLX_DISABLE_COMPILE", "1")

PROTOCOL = 1


class InputError(Exception):
    """The request or the model is at fault: not worth retrying elsewhere."""


class Helper:
    def __init__(self):
        import mlx.core as mx

        self.mx = mx
        self.model = None
        self.tokenizer = None

    def hello(self, req):
        import importlib.metadata as md

        mx = self.mx
        if req.get("protocol") != PROTOCOL:
            raise InputError(f"protocol {req.get('protocol')!r} asked, this helper speaks {PROTOCOL}")
        device = mx.default_device()
        kind = "gpu" if device.type == mx.DeviceType.gpu else "cpu"
        name = kind
        try:
            info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
            name = info.get("device_name", kind)
        except Exception:  # the CPU build has no device information
            pass
        return {
            "protocol": PROTOCOL,
            "mlx": md.version("mlx"),
            "mlx_lm": md.version("mlx-lm"),
            "device": kind,
            "device_name": name,
        }

    def load(self, req):
        from mlx_lm import load

        path = req["model"]
        if not os.path.isdir(path):
            raise InputError(f"{path}: not a folder")
        try:
            model, tokenizer = load(path)
        except Exception as e:  # mlx-lm's own message names what it could not load
            raise InputError(f"mlx_lm.load({path}): {type(e).__name__}: {e}") from e
        quantized = any(k.endswith(".scales") for k, _ in _flat(model.parameters()))
        upcast = bool(req.get("upcast_quantized")) and needs_upcast(model)
        if upcast:
            model.set_dtype(self.mx.float32)
        self.model, self.tokenizer = model, tokenizer
        vocab = _vocab(model)
        return {"quantized": quantized, "upcast": upcast, "vocab": vocab}

    def _need_model(self):
        if self.model is None:
            raise InputError("no model loaded (send a load request first)")
        return self.model

    def logits(self, req):
        mx = self.mx
        model = self._need_model()
        tokens = _ids(req, "tokens")
        first = req.get("first", 0)
        if not isinstance(first, int) or not 0 <= first < len(tokens):
            raise InputError(f"first: {first!r} is not a position of the {len(tokens)} tokens")
        out = model(mx.array(tokens)[None])[0, first:, :].astype(mx.float32)
        mx.eval(out)
        rows, vocab = out.shape
        tmp = req["out"] + ".partial"
        with open(tmp, "wb") as f:
            f.write(memoryview(out).tobytes())
        os.replace(tmp, req["out"])
        return {"rows": rows, "vocab": vocab}

    def greedy(self, req):
        from mlx_lm.generate import generate_step

        mx = self.mx
        model = self._need_model()
        tokens = _ids(req, "tokens")
        max_tokens = req.get("max_tokens")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise InputError(f"max_tokens: {max_tokens!r} is not a positive count")
        if req.get("stop") is None:
            stop = set(self.tokenizer.eos_token_ids)
        else:
            stop = set(_ids(req, "stop", allow_empty=True))
        out, margins = [], []
        for token, logprobs in generate_step(mx.array(tokens), model, max_tokens=max_tokens):
            token = int(token.item() if hasattr(token, "item") else token)
            top2 = mx.topk(logprobs, 2)
            mx.eval(top2)
            a, b = sorted(top2.tolist(), reverse=True)
            out.append(token)
            margins.append(a - b)
            if token in stop:
                break
        return {"tokens": out, "margins": margins}

    def decode(self, req):
        self._need_model()
        seqs = req.get("sequences")
        if not isinstance(seqs, list):
            raise InputError("sequences: expected a list of token id lists")
        texts = []
        for i, ids in enumerate(seqs):
            texts.append(self.tokenizer.decode(_ids({"s": ids}, "s", allow_empty=True)))
        return {"texts": texts}


def _flat(params, prefix=""):
    if isinstance(params, dict):
        for k, v in params.items():
            yield from _flat(v, f"{prefix}{k}.")
    elif isinstance(params, list):
        for i, v in enumerate(params):
            yield from _flat(v, f"{prefix}{i}.")
    else:
        yield prefix[:-1], params


def _vocab(model):
    args = getattr(model, "args", None)
    return getattr(args, "vocab_size", None)


def _ids(req, key, allow_empty=False):
    ids = req.get(key)
    if not isinstance(ids, list) or not all(isinstance(t, int) and t >= 0 for t in ids):
        raise InputError(f"{key}: expected a list of token ids")
    if not ids and not allow_empty:
        raise InputError(f"{key}: empty")
    return ids


def needs_upcast(model):
    """Whether the CPU build runs `model` in float32: quantized (bf16 accumulation otherwise), or holding
    mixture-of-experts layers (`GatherMM` supports float32 only)."""
    if any(k.endswith(".scales") for k, _ in _flat(model.parameters())):
        return True
    return any(type(m).__module__.endswith("switch_layers") for m in model.modules())


def serve(argv):
    """`mlx_lm.server` on the given arguments, upcasting quantized models with `--upcast`."""
    import mlx.core as mx
    import mlx_lm.server as server

    upcast = "--upcast" in argv
    args = [a for a in argv if a != "--upcast"]
    if upcast:
        load = server.load

        def load_upcast(*a, **kw):
            out = load(*a, **kw)
            model = out[0]
            if needs_upcast(model):
                model.set_dtype(mx.float32)
            return out

        server.load = load_upcast
    sys.argv = ["mlx_lm.server", *args]
    server.main()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        return serve(sys.argv[2:])
    helper = Helper()
    ops = {
        "hello": helper.hello,
        "load": helper.load,
        "logits": helper.logits,
        "greedy": helper.greedy,
        "decode": helper.decode,
    }
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            op = ops.get(req.get("op")) if isinstance(req, dict) else None
            if op is None:
                raise InputError(f"op: expected one of {sorted(ops)}")
            answer = {"ok": True, **op(req)}
        except InputError as e:
            answer = {"ok": False, "error": str(e), "kind": "input"}
        except (KeyError, TypeError, ValueError) as e:
            answer = {"ok": False, "error": f"bad request: {type(e).__name__}: {e}", "kind": "input"}
        except Exception as e:
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}", "kind": "runtime"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
