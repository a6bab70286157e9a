"""Qwen3.5 / Qwen3.5-MoE hybrids (gated-delta-net + attention layers) for the GGUF -> MLX / HF tests, built and
judged by the real tools: transformers makes the checkpoint, llama.cpp's convert_hf_to_gguf.py the GGUF, mlx-lm the
reference MLX checkpoint it makes from the same HF checkpoint.

usage:
  qwen35.py make dense|moe OUT TOKENIZER_DIR     (venv-convert) a tiny random HF checkpoint: bf16 weights, A_log in
                                                 f32, a synthetic multi-token-prediction block, real tokenizer files
  qwen35.py nest HF OUT                          the same checkpoint as Qwen3_5ForConditionalGeneration saves it (the
                                                 released models' layout, which mlx-lm loads): the text model under
                                                 model.language_model., its config under text_config; no vision tower
  qwen35.py gguf HF OUT OUTTYPE LLAMA_SRC PRE    (venv-convert) convert_hf_to_gguf.py, told the pre-tokenizer is PRE
                                                 (smollm: SmolLM2's own; qwen35: Qwen3.5's regex over SmolLM2's vocab)
  qwen35.py golden HF OUT BITS                   (venv-peers) mlx_lm.convert (BITS 0: bf16, not quantized)
  qwen35.py compare OURS GOLDEN                  (venv-peers) the same tensors, bytes and quantization as mlx-lm's;
                                                 mlx_lm.load runs ours and gives mlx-lm's logits
  qwen35.py compare_hf OURS HF                   (venv-convert) GGUF -> HF gave back the HF checkpoint's tensors

Dimensions exercise every transform: 2 key-head groups of 2 value heads (the v-head reorder is not the identity),
4 layers with a full-attention layer every 4th, conv kernel 4, in-dims multiples of 64 (quantizable).
"""

import json
import shutil
import sys
from pathlib import Path

CMD = sys.argv[1]


def make(kind, out, tok):
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig, Qwen3_5ForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=49152, hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=32,
                  linear_value_head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, rms_norm_eps=1e-6,
                  max_position_embeddings=4096, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                   "mrope_section": [2, 1, 1], "mrope_interleaved": True})
    if kind == "moe8":
        # Rows that are whole 256-element super-blocks, and 8 experts: llama-quantize's n_expert == 8 rules and its
        # per-layer parsing of expert tensor names apply, and the i-quants keep their types.
        common.update(hidden_size=256, head_dim=128, linear_key_head_dim=128, linear_value_head_dim=128)
    if kind == "dense":
        cfg = Qwen3_5TextConfig(intermediate_size=128, **common)
        model = Qwen3_5ForCausalLM(cfg)
    elif kind == "moe8":
        cfg = Qwen3_5MoeTextConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
                                   shared_expert_intermediate_size=256, **common)
        model = Qwen3_5MoeForCausalLM(cfg)
    else:
        cfg = Qwen3_5MoeTextConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                                   shared_expert_intermediate_size=64, **common)
        model = Qwen3_5MoeForCausalLM(cfg)
    sd = {}
    for k, v in model.state_dict().items():
        # Perturbed so that norms, A_log and dt_bias are not their initial constants.
        v = v.detach().float() + 0.05 * torch.randn(v.shape)
        sd[k] = (v if k.endswith("A_log") else v.to(torch.bfloat16)).contiguous()
    # A multi-token-prediction block (a copy of full-attention layer 3 plus its fc and norms), as Qwen3.5 ships.
    for k in [k for k in sd if k.startswith("model.layers.3.")]:
        sd["mtp.layers.0." + k[len("model.layers.3."):]] = sd[k].clone()
    h = common["hidden_size"]
    sd["mtp.fc.weight"] = (torch.randn(h, 2 * h) * 0.02).to(torch.bfloat16)
    for n in ["pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"]:
        sd[f"mtp.{n}.weight"] = (torch.randn(h) * 0.02).to(torch.bfloat16)
    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    save_file(sd, out / "model.safetensors", metadata={"format": "pt"})
    c = cfg.to_dict()
    c["architectures"] = ["Qwen3_5ForCausalLM" if kind == "dense" else "Qwen3_5MoeForCausalLM"]
    c["mtp_num_hidden_layers"] = 1
    c["full_attention_interval"] = 4
    c["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(c, indent=1))
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(Path(tok) / f, out)


def nest(hf, out):
    from safetensors.numpy import load_file, save_file
    import numpy as np  # noqa: F401  (safetensors.numpy needs it)
    hf, out = Path(hf), Path(out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    # bf16 stays bf16: safetensors' numpy reader cannot hold it, so the bytes are moved as they are.
    import json as _json
    import struct
    raw = (hf / "model.safetensors").read_bytes()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = _json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", None)
    renamed = {}
    for k, v in header.items():
        renamed[k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k] = v
    order = sorted(renamed)
    blobs, offset, new_header = [], 0, {}
    for k in order:
        v = renamed[k]
        b = data[v["data_offsets"][0]:v["data_offsets"][1]]
        new_header[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    if meta is not None:
        new_header = {"__metadata__": meta, **new_header}
    text = _json.dumps(new_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    (out / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    c = json.loads((hf / "config.json").read_text())
    moe = c["model_type"] == "qwen3_5_moe_text"
    top = {"architectures": ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
           "model_type": "qwen3_5_moe" if moe else "qwen3_5", "tie_word_embeddings": c["tie_word_embeddings"],
           "text_config": {k: v for k, v in c.items() if k != "architectures"}, "dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(top, indent=1))
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(hf / f, out)


def gguf(hf, out, outtype, src, pre, *flags):
    import runpy
    sys.path.insert(0, src)
    import conversion.base as base
    # SmolLM2's tokenizer stands in for Qwen's (49k tokens, not 248k); the converter knows tokenizers by hash only.
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    sys.argv = ["convert_hf_to_gguf.py", hf, "--outtype", outtype, "--outfile", out, *flags]
    runpy.run_path(str(Path(src) / "convert_hf_to_gguf.py"), run_name="__main__")


def mlx_ready(hf, tmp):
    """The HF folder as mlx-lm reads it: the multimodal model_type (mlx_lm.models.qwen3_5[_moe])."""
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(hf, tmp)
    c = json.loads((Path(tmp) / "config.json").read_text())
    c["model_type"] = c["model_type"].removesuffix("_text")
    (Path(tmp) / "config.json").write_text(json.dumps(c))
    return tmp


def golden(hf, out, bits):
    from mlx_lm.convert import convert
    src = mlx_ready(hf, str(out) + ".hf")
    shutil.rmtree(out, ignore_errors=True)
    if int(bits):
        convert(src, out, quantize=True, q_bits=int(bits), q_group_size=64)
    else:
        convert(src, out, dtype="bfloat16")


def compare(ours, gold):
    import mlx.core as mx
    import numpy as np
    from mlx_lm import generate, load
    from mlx_lm.utils import load_model
    a = mx.load(str(Path(ours) / "model.safetensors"))
    b = mx.load(str(Path(gold) / "model.safetensors"))
    assert sorted(a) == sorted(b), f"names: ours only {sorted(set(a) - set(b))}, mlx-lm only {sorted(set(b) - set(a))}"
    worst_a_log = 0.0
    for k in sorted(a):
        x, y = a[k], b[k]
        assert x.shape == y.shape and x.dtype == y.dtype, f"{k}: ours {x.shape} {x.dtype}, mlx-lm {y.shape} {y.dtype}"
        if k.endswith("A_log"):
            # log(-(-exp(a))) in f32 comes back within an ulp.
            d = float(mx.max(mx.abs(x - y) / mx.maximum(mx.abs(y), 1e-30)))
            assert d < 1e-6, f"{k}: relative difference {d}"
            worst_a_log = max(worst_a_log, d)
            continue
        assert mx.array_equal(x, y).item(), f"{k}: values differ (max |d| {float(mx.max(mx.abs(x.astype(mx.float32) - y.astype(mx.float32))))})"
    ca = json.loads((Path(ours) / "config.json").read_text())
    cb = json.loads((Path(gold) / "config.json").read_text())
    assert ca.get("quantization") == cb.get("quantization"), f"quantization: {ca.get('quantization')} vs {cb.get('quantization')}"
    assert ca["model_type"] == cb["model_type"], (ca["model_type"], cb["model_type"])
    text = ca["text_config"]
    # mlx-lm re-saves rope_parameters' rope_type as `type`; both load.
    rope = cb.get("rope_parameters", {})
    if "type" in rope:
        rope["rope_type"] = rope.pop("type")
    for k, v in text.items():
        if k in cb and k not in ("architectures", "model_type", "torch_dtype", "dtype", "bos_token_id", "eos_token_id"):
            assert cb[k] == v, f"text_config.{k}: ours {v!r}, mlx-lm's {cb[k]!r}"
    m1, _ = load_model(Path(ours))
    m2, _ = load_model(Path(gold))
    model, tokenizer = load(ours)
    if "quantization" not in ca:
        # mlx's CPU expert matmul (GatherMM) runs in float32 only.
        for m in (m1, m2, model):
            m.set_dtype(mx.float32)
    ids = mx.array([[1, 520, 3402, 314, 260, 1345, 28, 30, 2000, 77]])
    l1, l2 = m1(ids).astype(mx.float32), m2(ids).astype(mx.float32)
    diff = float(mx.max(mx.abs(l1 - l2)))
    scale = float(mx.max(mx.abs(l2)))
    assert diff <= 1e-3 * scale, f"logits differ by {diff} (scale {scale})"
    text = generate(model, tokenizer, prompt="The capital of France is", max_tokens=6)
    print(json.dumps({"tensors": len(a), "a_log_rel": worst_a_log, "logit_diff": diff, "generated": text}))


def compare_hf(ours, hf):
    import torch
    from safetensors.torch import load_file
    a = load_file(str(Path(ours) / "model.safetensors"))
    b = {k: v for k, v in load_file(str(Path(hf) / "model.safetensors")).items() if not k.startswith("mtp.")}
    assert sorted(a) == sorted(b), f"names: ours only {sorted(set(a) - set(b))}, HF only {sorted(set(b) - set(a))}"
    for k in sorted(a):
        x, y = a[k], b[k]
        assert x.shape == y.shape, f"{k}: {tuple(x.shape)} vs {tuple(y.shape)}"
        if k.endswith("A_log"):
            assert x.dtype == torch.float32 and torch.allclose(x, y, rtol=1e-6, atol=0), k
            continue
        assert x.dtype == y.dtype and torch.equal(x, y), f"{k}: values differ"
    ca = json.loads((Path(ours) / "config.json").read_text())
    cb = json.loads((Path(hf) / "config.json").read_text())
    for k, v in ca.items():
        if k in cb and k not in ("torch_dtype", "dtype", "bos_token_id", "eos_token_id"):
            assert cb[k] == v, f"config {k}: ours {v!r}, the checkpoint's {cb[k]!r}"
    print(json.dumps({"tensors": len(a)}))


{"make": lambda: make(*sys.argv[2:5]), "nest": lambda: nest(*sys.argv[2:4]), "gguf": lambda: gguf(*sys.argv[2:]), "golden": lambda: golden(*sys.argv[2:5]),
 "compare": lambda: compare(*sys.argv[2:4]), "compare_hf": lambda: compare_hf(*sys.argv[2:4])}[CMD]()
