"""Synthetic LoRA adapters for an HF base, and their reference merge computed independently in float64.

usage: lora_adapters.py FORMAT BASE_DIR ADAPTER_DIR EXPECTED_FILE [FLAW]
FORMAT: peft | peft-attn | mlx | mlx-lora
FLAW (optional): misspelled | shape | base | transposed-a (peft: every lora_A's bytes are its transpose's, a
      layout bug that still loads)  (the adapter is broken that way; no reference is written)

peft: LoRA r=8, lora_alpha=16 on q/k/v/o_proj of every layer (alpha_pattern gives v_proj alpha 32), rsLoRA off,
      plus an embedding LoRA on embed_tokens (lora_embedding_A (r, vocab), lora_embedding_B (dim, r)).
peft-attn: the same without the embedding LoRA (on Phi-3: qkv_proj and o_proj, its fused attention projections).
mlx:  mlx-lm DoRA (fine_tune_type dora, scale 2.0) on q_proj and v_proj of the last 4 layers, LoRA factors
      lora_a (in, r) / lora_b (r, out); DoRA magnitudes m (out,).
mlx-lora: mlx-lm LoRA (scale 2.0) on q_proj, v_proj and mlp.down_proj of the last 4 layers.

The reference follows the formulas of docs/formats.md §3 (PEFT peft/tuners/lora/layer.py; mlx-lm
mlx_lm/tuner/lora.py and dora.py) in numpy float64:
  PEFT   W + (alpha/r) * (B @ A);   embedding E + (alpha/r) * (B_emb @ A_emb).T
  mlx    W + scale * (lora_b.T @ lora_a.T);  DoRA: V = W + delta, W' = V * (m / ||V||_row)
and rounds each value to the nearest bfloat16 (ties to even) by comparing the exact distances to the candidate
bfloat16 neighbours. EXPECTED_FILE (safetensors, BF16) holds every tensor the merge changes, including lm_head.weight
(the untied copy of the original embedding) when the embedding changes in a tied base.
"""

import json
import sys
from pathlib import Path

import numpy as np

FORMAT, BASE, OUT, EXPECTED = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
FLAW = sys.argv[5] if len(sys.argv) > 5 else None
RECORDED_BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
rng = np.random.default_rng(7 if FORMAT == "peft" else 11)


def read_safetensors(path):
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        buf = np.frombuffer(data[b:end], dtype={"BF16": np.uint16, "F32": np.float32, "F16": np.float16}[e["dtype"]])
        if e["dtype"] == "BF16":
            buf = (buf.astype(np.uint32) << 16).view(np.float32)
        out[name] = buf.astype(np.float64).reshape(e["shape"])
    return out


def write_safetensors(path, tensors, dtype):
    """tensors: name -> array (float32 for F32, uint16 bit patterns for BF16)."""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name in tensors:
        a = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for name in tensors:
            f.write(np.ascontiguousarray(tensors[name]).tobytes())


def nearest_bf16(x):
    """Bit patterns of the bfloat16 values nearest to float64 x (ties to even), chosen by exact distance."""
    x = np.asarray(x, dtype=np.float64)
    trunc = (x.astype(np.float32).view(np.uint32) >> 16).astype(np.int64)
    best, best_d = None, None
    for delta in (-1, 0, 1):
        c = (trunc + delta) & 0xFFFF
        v = (c.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        d = np.abs(v - x)
        d = np.where(np.isnan(d), np.inf, d)  # a neighbour of ±0 or of the largest values can be a NaN pattern
        if best is None:
            best, best_d = c, d
        else:
            better = (d < best_d) | ((d == best_d) & (c % 2 == 0) & (best % 2 == 1))
            best, best_d = np.where(better, c, best), np.where(better, d, best_d)
    return best.astype(np.uint16)


base = {}
for f in sorted(BASE.glob("*.safetensors")):
    base.update(read_safetensors(f))
config = json.loads((BASE / "config.json").read_text())
# A multimodal checkpoint (Gemma3ForConditionalGeneration as transformers 5 saves it) nests its text model's
# config and names its layers under model.language_model.
layers = config.get("text_config", config)["num_hidden_layers"]
LM = "model.language_model." if any(k.startswith("model.language_model.layers.") for k in base) else "model."
OUT.mkdir(parents=True, exist_ok=True)
R = 8


def factor(*shape):
    return (rng.standard_normal(shape) * 0.05).astype(np.float32)


expected = {}
if FORMAT in ("peft", "peft-attn"):
    alpha, alpha_v = 16.0, 32.0
    tensors = {}
    # Phi-3's fused qkv_proj is adapted as PEFT adapts it: one LoRA over the fused projection.
    # Hybrids (Qwen3.5) have attention in some layers only: those are adapted.
    projs = [p for p in ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj")
             if any(f"{LM}layers.{b}.self_attn.{p}.weight" in base for b in range(layers))]
    for b in range(layers):
        for proj in projs:
            w = f"{LM}layers.{b}.self_attn.{proj}.weight"
            if w not in base:
                continue
            out_f, in_f = base[w].shape
            A, B = factor(R, in_f), factor(out_f, R)
            key = f"base_model.model.{LM}layers.{b}.self_attn.{proj}"
            tensors[f"{key}.lora_A.weight"], tensors[f"{key}.lora_B.weight"] = A, B
            s = (alpha_v if proj == "v_proj" else alpha) / R
            expected[w] = base[w] + s * (B.astype(np.float64) @ A.astype(np.float64))
    if FORMAT == "peft":
        emb = "model.embed_tokens.weight"
        vocab, dim = base[emb].shape
        EA, EB = factor(R, vocab), factor(dim, R)
        tensors["base_model.model.model.embed_tokens.lora_embedding_A"] = EA
        tensors["base_model.model.model.embed_tokens.lora_embedding_B"] = EB
        expected[emb] = base[emb] + (alpha / R) * (EB.astype(np.float64) @ EA.astype(np.float64)).T
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": RECORDED_BASE, "r": R,
           "lora_alpha": alpha, "alpha_pattern": {"v_proj": alpha_v}, "rank_pattern": {}, "lora_dropout": 0.0,
           "target_modules": projs + (["embed_tokens"] if FORMAT == "peft" else []),
           "use_rslora": False,
           "use_dora": False, "fan_in_fan_out": False, "bias": "none", "modules_to_save": None,
           "inference_mode": True}
    if FLAW == "misspelled":
        k = "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"
        tensors[k.replace("q_proj", "q_prj")] = tensors.pop(k)
    elif FLAW == "shape":
        k = "base_model.model.model.layers.5.self_attn.k_proj.lora_A.weight"
        tensors[k] = factor(R, tensors[k].shape[1] + 1)
    elif FLAW == "base":
        cfg["base_model_name_or_path"] = "Qwen/Qwen3-0.6B"
    elif FLAW == "transposed-a":
        # A layout bug that loads: every lora_A holds the bytes of its transpose, read back in the (r, in) shape.
        for k in [k for k in tensors if k.endswith("lora_A.weight")]:
            tensors[k] = np.ascontiguousarray(tensors[k].T).reshape(tensors[k].shape)
    write_safetensors(OUT / "adapter_model.safetensors", tensors, "F32")
    (OUT / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
elif FORMAT in ("mlx", "mlx-lora"):
    dora = FORMAT == "mlx"
    scale = 2.0
    tensors = {}
    modules = ("self_attn.q_proj", "self_attn.v_proj") if dora else ("self_attn.q_proj", "self_attn.v_proj",
                                                                      "mlp.down_proj")
    for b in range(layers - 4, layers):
        for mod in modules:
            w = f"model.layers.{b}.{mod}.weight"
            out_f, in_f = base[w].shape
            la, lb = factor(in_f, R), factor(R, out_f)
            key = f"model.layers.{b}.{mod}"
            tensors[f"{key}.lora_a"], tensors[f"{key}.lora_b"] = la, lb
            v = base[w] + scale * (lb.astype(np.float64).T @ la.astype(np.float64).T)
            if dora:
                m = (np.linalg.norm(base[w], axis=1) * (1.0 + 0.1 * rng.standard_normal(out_f))).astype(np.float32)
                tensors[f"{key}.m"] = m
                v = v * (m.astype(np.float64) / np.linalg.norm(v, axis=1))[:, None]
            expected[w] = v
    cfg = {"fine_tune_type": "dora" if dora else "lora", "model": RECORDED_BASE, "num_layers": 4,
           "lora_parameters": {"rank": R, "scale": scale, "dropout": 0.0, "keys": list(modules)},
           "iters": 100, "learning_rate": 1e-5, "seed": 0}
    if FLAW == "misspelled":
        k = f"model.layers.{layers - 1}.self_attn.v_proj.lora_b"
        tensors[k.replace("lora_b", "lora_bb")] = tensors.pop(k)
    elif FLAW == "shape":
        k = f"model.layers.{layers - 2}.self_attn.q_proj.lora_a"
        tensors[k] = factor(tensors[k].shape[0] - 1, R)
    elif FLAW == "base":
        cfg["model"] = "mlx-community/Qwen3-0.6B-bf16"
    write_safetensors(OUT / "adapters.safetensors", tensors, "F32")
    (OUT / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
else:
    sys.exit(f"unknown format {FORMAT!r}")

if FLAW is None:
    out = {name: nearest_bf16(v) for name, v in expected.items()}
    emb = "model.embed_tokens.weight"
    if emb in expected and "lm_head.weight" not in base and config.get("tie_word_embeddings", True):
        # The untied output layer keeps the original embedding.
        out["lm_head.weight"] = nearest_bf16(base[emb])
    write_safetensors(EXPECTED, out, "BF16")
print(len(expected))
