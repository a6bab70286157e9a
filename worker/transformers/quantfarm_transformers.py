#!/usr/bin/env python3
"""quantfarm's transformers helper: runs a model in Hugging Face transformers (with compressed-tensors for a vLLM
checkpoint, and PEFT for an adapter), the library fine-tunes are trained with, for a quantfarm worker: the
parity method's third runtime (issue 38).

The worker starts this program in a Python environment with pinned `torch`, `transformers` and `compressed-tensors`
(and `peft` for adapters) and talks to it over stdin/stdout, one JSON object per line each way, one answer per
request, in order: the protocol of the mlx-lm helper (`worker/mlx/quantfarm_mlx.py`), so one client speaks to both.

  {"op": "hello", "protocol": 1}
      -> {"ok": true, "protocol": 1, "torch": V, "transformers": V, "compressed_tensors": V | "", "peft": V | "",
          "device": "cpu" | "cuda", "device_name": ...}
      The version handshake: the worker advertises the runtime only when this answers with its protocol.
  {"op": "load", "model": PATH, "activations": "as-saved" | "weight-only", "adapter": PATH | null,
   "dtype": "bfloat16" | "float32" | null, "threads": N}
      -> {"ok": true, "quantized": BOOL, "scheme": TEXT, "dtype": TEXT, "vocab": N}
      `AutoModelForCausalLM.from_pretrained(PATH, dtype=DTYPE)` (bfloat16 unless asked: float32 widens the
      weights exactly, for the merge check) on the CPU, run on N threads (the worker's share
      of the machine: torch's own default takes every core, and two such helpers side by side slow each other
      several times over). A compressed-tensors checkpoint is
      decompressed as transformers does it with `CompressedTensorsConfig(dequantize=True)` (each weight
      `bf16(code × scale)`); "as-saved" keeps compressed-tensors' forward, which quantizes each Linear's input as the
      scheme says (FP8_DYNAMIC: per token to e4m3 and back: vLLM's W8A8 path, emulated), "weight-only" turns it off
      (`disable_quantization`: the decompressed weights with bf16 inputs: vLLM's weight-only path, and W4A16's only
      one). With `adapter`, the PEFT adapter is applied at run time, unmerged (`PeftModel.from_pretrained`): the
      parity method's link 1.
  {"op": "logits", "tokens": [ID, ...], "first": K, "out": PATH}
      -> {"ok": true, "rows": N, "vocab": V}
      One forward pass over the token ids as given (never re-tokenized), batch 1, no cache; the logits of positions
      K .. len-1 written to PATH as little-endian float32, row after row.
  {"op": "greedy", "tokens": [ID, ...], "max_tokens": N, "stop": [ID, ...] | null}
      -> {"ok": true, "tokens": [ID, ...], "margins": [F, ...]}
      Greedy decoding (temperature 0, one token at a time with the model's cache): up to N tokens, ending at the
      first stop id, returned as the last token; without `stop`, the generation config's end-of-sequence ids.
      `margins[i]` is the top-1 minus top-2 log-probability of step i.
  {"op": "decode", "sequences": [[ID, ...], ...]}
      -> {"ok": true, "texts": [TEXT, ...]}
  {"op": "chat", "messages": [{"role": R, "content": TEXT}, ...], "kwargs": {...}, "max_tokens": N,
   "temperature": T, "seed": S}
      -> {"ok": true, "content": TEXT, "finish": "stop" | "length", "prompt_tokens": N}
      One answer of a probe, as vLLM's chat endpoint makes it: the messages rendered by the checkpoint's chat
      template with the generation prompt and `kwargs` as the template's variables (`enable_thinking`), then up to N
      tokens: the most likely one at temperature 0, else drawn from softmax(logits / T) by a torch generator seeded
      with S; ending at the generation config's end-of-sequence ids ("stop", the id not in the content) or at N
      ("length"). The content is the new tokens decoded without special tokens. No penalty or sampling default of
      `generation_config.json` applies: the probe's temperature alone, as in the farm's other runtimes.

A failure answers {"ok": false, "error": TEXT, "kind": "input" | "runtime"}: "input" when the request or the model
is at fault (a missing file, a checkpoint transformers cannot load: TEXT is its own message), "runtime" otherwise.
"""

import json
import os
import sys

PROTOCOL = 1


class InputError(Exception):
    """The request or the model is at fault: not worth retrying elsewhere."""


def _version(dist):
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return ""


class Helper:
    def __init__(self):
        import torch

        self.torch = torch
        self.model = None
        self.tokenizer = None
        self.path = None

    def hello(self, req):
        if req.get("protocol") != PROTOCOL:
            raise InputError(f"protocol {req.get('protocol')!r} asked, this helper speaks {PROTOCOL}")
        import transformers  # noqa: F401  (fails here, not at the first load, when it is missing)

        return {
            "protocol": PROTOCOL,
            "torch": _version("torch"),
            "transformers": _version("transformers"),
            "compressed_tensors": _version("compressed-tensors"),
            "peft": _version("peft"),
            "device": "cpu",
            "device_name": "cpu",
        }

    def load(self, req):
        torch = self.torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = req["model"]
        threads = req.get("threads")
        if threads is not None:
            if not isinstance(threads, int) or threads < 1:
                raise InputError(f"threads: {threads!r} is not a positive count")
            torch.set_num_threads(threads)
        if not os.path.isdir(path):
            raise InputError(f"{path}: not a folder")
        activations = req.get("activations", "as-saved")
        if activations not in ("as-saved", "weight-only"):
            raise InputError(f"activations: {activations!r} is not as-saved or weight-only")
        dtype_name = req.get("dtype") or "bfloat16"
        if dtype_name not in ("bfloat16", "float32"):
            raise InputError(f"dtype: {dtype_name!r} is not bfloat16 or float32")
        dtype = getattr(torch, dtype_name)
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
        qc = config.get("quantization_config") or {}
        compressed = qc.get("quant_method") == "compressed-tensors"
        kwargs = {"dtype": dtype}
        if compressed:
            from transformers.utils.quantization_config import CompressedTensorsConfig

            kwargs["quantization_config"] = CompressedTensorsConfig(dequantize=True)
        elif qc:
            raise InputError(f"{path}: quantization_config {qc.get('quant_method')!r} is not compressed-tensors")
        try:
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
            tokenizer = AutoTokenizer.from_pretrained(path)
        except Exception as e:  # transformers' own message names what it could not load
            raise InputError(f"from_pretrained({path}): {type(e).__name__}: {e}") from e
        scheme = ""
        if compressed:
            groups = qc.get("config_groups") or {}
            weights = [g.get("weights") or {} for g in groups.values()]
            scheme = ", ".join(f"{w.get('type')}{w.get('num_bits')}/{w.get('strategy')}" for w in weights)
            if activations == "weight-only":
                from compressed_tensors.quantization.lifecycle.helpers import disable_quantization

                model.apply(disable_quantization)
        adapter = req.get("adapter")
        if adapter:
            try:
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, adapter)
            except Exception as e:
                raise InputError(f"PeftModel.from_pretrained({adapter}): {type(e).__name__}: {e}") from e
        model.eval()
        self.model, self.tokenizer, self.path = model, tokenizer, path
        vocab = model.get_output_embeddings().weight.shape[0]
        return {"quantized": compressed, "scheme": scheme, "dtype": dtype_name, "vocab": int(vocab)}

    def _need_model(self):
        if self.model is None:
            raise InputError("no model loaded (send a load request first)")
        return self.model

    def logits(self, req):
        torch = self.torch
        model = self._need_model()
        tokens = _ids(req, "tokens")
        first = req.get("first", 0)
        if not isinstance(first, int) or not 0 <= first < len(tokens):
            raise InputError(f"first: {first!r} is not a position of the {len(tokens)} tokens")
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0, first:, :].float()
        rows, vocab = out.shape
        tmp = req["out"] + ".partial"
        with open(tmp, "wb") as f:
            f.write(out.contiguous().numpy().astype("<f4").tobytes())
        os.replace(tmp, req["out"])
        return {"rows": int(rows), "vocab": int(vocab)}

    def _generate(self, tokens, max_tokens, stop, choose):
        """Feeds `tokens`, then each chosen token (`choose(logits) -> id`, the step's float32 logits) back, with the
        model's cache, up to `max_tokens`; returns the chosen ids (a stop id last when one ended it) and whether one
        did."""
        torch = self.torch
        model = self._need_model()
        out, past = [], None
        step_input = torch.tensor([tokens])
        with torch.inference_mode():
            for _ in range(max_tokens):
                r = model(input_ids=step_input, past_key_values=past, use_cache=True)
                past = r.past_key_values
                token = choose(r.logits[0, -1, :].float())
                out.append(token)
                if token in stop:
                    return out, True
                step_input = torch.tensor([[token]])
        return out, False

    def _eos(self):
        eos = getattr(self._need_model().generation_config, "eos_token_id", None)
        return set(eos if isinstance(eos, list) else [] if eos is None else [eos])

    def greedy(self, req):
        torch = self.torch
        tokens = _ids(req, "tokens")
        max_tokens = _count(req, "max_tokens")
        stop = self._eos() if req.get("stop") is None else set(_ids(req, "stop", allow_empty=True))
        margins = []

        def top1(logits):
            top = torch.topk(torch.log_softmax(logits, dim=-1), 2)
            margins.append(float(top.values[0] - top.values[1]))
            return int(top.indices[0])

        out, _ = self._generate(tokens, max_tokens, stop, top1)
        return {"tokens": out, "margins": margins}

    def decode(self, req):
        self._need_model()
        seqs = req.get("sequences")
        if not isinstance(seqs, list):
            raise InputError("sequences: expected a list of token id lists")
        return {"texts": [self.tokenizer.decode(_ids({"s": ids}, "s", allow_empty=True)) for ids in seqs]}


    def chat(self, req):
        torch = self.torch
        self._need_model()
        messages = req.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InputError("messages: expected a non-empty list of chat messages")
        kwargs = req.get("kwargs") or {}
        if not isinstance(kwargs, dict):
            raise InputError("kwargs: expected an object of template variables")
        max_tokens = _count(req, "max_tokens")
        temperature = float(req.get("temperature") or 0.0)
        generator = torch.Generator().manual_seed(int(req.get("seed") or 0))
        try:
            prompt = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
            )
        except Exception as e:  # the template's own message names what it could not render
            raise InputError(f"{self.path}: chat template: {type(e).__name__}: {e}") from e
        prompt = [int(t) for t in prompt]

        def pick(logits):
            if temperature <= 0.0:
                return int(torch.argmax(logits))
            return int(torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=generator))

        out, stopped = self._generate(prompt, max_tokens, self._eos(), pick)
        content = self.tokenizer.decode(out[:-1] if stopped else out, skip_special_tokens=True)
        return {"content": content, "finish": "stop" if stopped else "length", "prompt_tokens": len(prompt)}


def _count(req, key):
    n = req.get(key)
    if not isinstance(n, int) or n < 1:
        raise InputError(f"{key}: {n!r} is not a positive count")
    return n


def _ids(req, key, allow_empty=False):
    ids = req.get(key)
    if not isinstance(ids, list) or not all(isinstance(t, int) and t >= 0 for t in ids):
        raise InputError(f"{key}: expected a list of token ids")
    if not ids and not allow_empty:
        raise InputError(f"{key}: empty")
    return ids


def main():
    helper = Helper()
    ops = {
        "hello": helper.hello,
        "load": helper.load,
        "logits": helper.logits,
        "greedy": helper.greedy,
        "decode": helper.decode,
        "chat": helper.chat,
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
        except (KeyError, TypeError, ValueError, OSError) as e:
            answer = {"ok": False, "error": f"bad request: {type(e).__name__}: {e}", "kind": "input"}
        except Exception as e:
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}", "kind": "runtime"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
