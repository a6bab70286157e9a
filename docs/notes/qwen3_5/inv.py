import sys, json, os, shutil, glob
import numpy as np
from gguf import GGUFReader
import mlx.core as mx

def kv(r, key):
    f = r.fields[key]; v = f.contents(); return v

def unperm(x, axis, nk, nvpk, hd):
    """llama.cpp tiled -> HF grouped. stored layout (nvpk, nk, hd) -> natural (nk, nvpk, hd)."""
    x = np.moveaxis(x, axis, 0)
    s = x.shape
    x = x.reshape(nvpk, nk, hd, *s[1:]).transpose(1, 0, 2, *range(3, x.ndim + 2)).reshape(s)
    return np.moveaxis(x, 0, axis)

def convert(gguf_path, out, moe, nested=True, quant=None):
    r = GGUFReader(gguf_path)
    arch = kv(r, "general.architecture")
    g = lambda k, d=None: kv(r, f"{arch}.{k}") if f"{arch}.{k}" in r.fields else d
    block_count = g("block_count"); nextn = g("nextn_predict_layers", 0)
    L = block_count - nextn
    hidden = g("embedding_length"); H = g("attention.head_count"); Hkv = g("attention.head_count_kv")
    hd = g("attention.key_length")
    nk = g("ssm.group_count"); nv = g("ssm.time_step_rank"); dk = g("ssm.state_size")
    dv = g("ssm.inner_size") // nv; K = g("ssm.conv_kernel")
    nvpk = nv // nk; key_dim = nk * dk
    T = {t.name: np.array(t.data, dtype=np.float32).reshape(list(reversed([int(x) for x in t.shape]))) for t in r.tensors}
    W = {}
    P = "language_model."
    W[P + "model.embed_tokens.weight"] = T["token_embd.weight"]
    W[P + "model.norm.weight"] = T["output_norm.weight"]
    tied = "output.weight" not in T
    if not tied: W[P + "lm_head.weight"] = T["output.weight"]
    for name, a in T.items():
        if not name.startswith("blk."): continue
        i = int(name.split(".")[1]); suf = name.split(".", 2)[2]
        if i >= L: continue   # MTP/NextN drop
        p = f"{P}model.layers.{i}."
        m = {
          "attn_norm.weight": "input_layernorm.weight",
          "post_attention_norm.weight": "post_attention_layernorm.weight",
          "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
          "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
          "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
          "ssm_norm.weight": "linear_attn.norm.weight",
          "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
          "ffn_gate_inp.weight": "mlp.gate.weight",
          "ffn_gate_exps.weight": "mlp.switch_mlp.gate_proj.weight", "ffn_up_exps.weight": "mlp.switch_mlp.up_proj.weight",
          "ffn_down_exps.weight": "mlp.switch_mlp.down_proj.weight",
          "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight", "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
          "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
        }
        if suf in m: W[p + m[suf]] = a; continue
        if suf == "ffn_gate_inp_shexp.weight": W[p + "mlp.shared_expert_gate.weight"] = a.reshape(1, hidden); continue
        if suf == "attn_qkv.weight":
            W[p + "linear_attn.in_proj_qkv.weight"] = np.concatenate([a[:2*key_dim], unperm(a[2*key_dim:], 0, nk, nvpk, dv)], 0); continue
        if suf == "attn_gate.weight": W[p + "linear_attn.in_proj_z.weight"] = unperm(a, 0, nk, nvpk, dv); continue
        if suf == "ssm_beta.weight": W[p + "linear_attn.in_proj_b.weight"] = unperm(a, 0, nk, nvpk, 1); continue
        if suf == "ssm_alpha.weight": W[p + "linear_attn.in_proj_a.weight"] = unperm(a, 0, nk, nvpk, 1); continue
        if suf == "ssm_out.weight": W[p + "linear_attn.out_proj.weight"] = unperm(a, 1, nk, nvpk, dv); continue
        if suf == "ssm_dt.bias": W[p + "linear_attn.dt_bias"] = unperm(a, 0, nk, nvpk, 1); continue
        if suf == "ssm_a": W[p + "linear_attn.A_log"] = np.log(-unperm(a, 0, nk, nvpk, 1)); continue
        if suf == "ssm_conv1d.weight":   # numpy (C, K)
            c = np.concatenate([a[:2*key_dim], unperm(a[2*key_dim:], 0, nk, nvpk, dv)], 0)
            W[p + "linear_attn.conv1d.weight"] = c.reshape(c.shape[0], K, 1); continue
        raise SystemExit(f"unhandled {name}")
    tc = dict(model_type="qwen3_5_moe_text" if moe else "qwen3_5_text",
        hidden_size=hidden, num_hidden_layers=L, vocab_size=T["token_embd.weight"].shape[0],
        num_attention_heads=H, num_key_value_heads=Hkv, head_dim=hd,
        linear_num_value_heads=nv, linear_num_key_heads=nk, linear_key_head_dim=dk, linear_value_head_dim=dv,
        linear_conv_kernel_dim=K, full_attention_interval=g("full_attention_interval", 4),
        tie_word_embeddings=tied, rms_norm_eps=float(g("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=g("context_length"), attention_bias=False,
        rope_parameters=dict(rope_type="default", rope_theta=float(g("rope.freq_base")),
            partial_rotary_factor=g("rope.dimension_count") / hd, mrope_section=list(g("rope.dimension_sections"))[:3], mrope_interleaved=True))
    if moe:
        tc.update(num_experts=g("expert_count"), num_experts_per_tok=g("expert_used_count"),
                  moe_intermediate_size=g("expert_feed_forward_length"),
                  shared_expert_intermediate_size=g("expert_shared_feed_forward_length"), norm_topk_prob=True)
    else:
        tc.update(intermediate_size=g("feed_forward_length"))
    mt = "qwen3_5_moe" if moe else "qwen3_5"
    cfg = dict(model_type=mt, architectures=["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
               tie_word_embeddings=tied, text_config=tc) if nested else dict(tc, model_type=mt)
    W = {k: mx.array(v) for k, v in W.items()}
    if quant:
        bits, gs = quant
        q = {"group_size": gs, "bits": bits, "mode": "affine"}
        Q = {}
        for k, v in W.items():
            mod = k.rsplit(".", 1)[0]
            is_lin = k.endswith(".weight") and v.ndim >= 2 and "conv1d" not in k
            if not is_lin: Q[k] = v; continue
            b = bits
            if mod.endswith("mlp.gate") or mod.endswith("shared_expert_gate"):
                b = 8; q[mod] = {"group_size": 64, "bits": 8}
            w, s, bi = mx.quantize(v, group_size=gs, bits=b)
            Q[k] = w; Q[mod + ".scales"] = s; Q[mod + ".biases"] = bi
        W = Q
        cfg["quantization"] = q; cfg["quantization_config"] = q
    shutil.rmtree(out, ignore_errors=True); os.makedirs(out)
    mx.save_safetensors(f"{out}/model.safetensors", W, metadata={"format": "mlx"})
    json.dump(cfg, open(f"{out}/config.json", "w"), indent=1)
    for f in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]:
        shutil.copy(f"/root/.cache/quantfarm/models/smollm2/smollm2-hf/{f}", out)
    return cfg

def ref_dir(hf, out, moe):
    shutil.rmtree(out, ignore_errors=True); os.makedirs(out)
    os.symlink(f"{hf}/model.safetensors", f"{out}/model.safetensors")
    c = json.load(open(f"{hf}/config.json")); c["model_type"] = "qwen3_5_moe" if moe else "qwen3_5"
    json.dump(c, open(f"{out}/config.json", "w"))

if __name__ == "__main__":
    from mlx_lm.utils import load_model
    from pathlib import Path
    ids = mx.array([[1, 500, 1200, 33, 7, 42, 9000, 3]])
    for kind, moe in [("dense", False), ("moe", True)]:
        ref_dir(f"/tmp/q35/hf_{kind}", f"/tmp/q35/ref_{kind}", moe)
        mr, _ = load_model(Path(f"/tmp/q35/ref_{kind}"))
        lr = mr(ids)
        for nested in (True, False):
            convert(f"/tmp/q35/{kind}.gguf", f"/tmp/q35/mlx_{kind}_{'n' if nested else 'f'}", moe, nested)
            m, _ = load_model(Path(f"/tmp/q35/mlx_{kind}_{'n' if nested else 'f'}"))
            l = m(ids)
            print(kind, "nested" if nested else "flat", "max|dlogits| vs HF-via-mlx:", float(mx.abs(l - lr).max()), "scale", float(mx.abs(lr).max()))
        convert(f"/tmp/q35/{kind}.gguf", f"/tmp/q35/mlxq_{kind}", moe, True, quant=(4, 64))
        import mlx_lm
        mq, tok = mlx_lm.load(f"/tmp/q35/mlxq_{kind}")
        lq = mq(ids)
        print(kind, "q4 max|dlogits|:", float(mx.abs(lq - lr).max()), "types:", type(mq.language_model.model.layers[0].linear_attn.in_proj_qkv).__name__,
              type(mq.language_model.model.layers[0].mlp.gate).__name__ if moe else "", 
              (mq.language_model.model.layers[0].mlp.gate.bits, mq.language_model.model.layers[0].mlp.shared_expert_gate.bits, mq.language_model.model.layers[0].mlp.switch_mlp.gate_proj.bits) if moe else "")
        print(mlx_lm.generate(mq, tok, "hello", max_tokens=4))
