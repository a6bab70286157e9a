import json, os, shutil, sys, torch
from safetensors.torch import save_file
torch.manual_seed(0)
from transformers import Qwen3_5TextConfig, Qwen3_5ForCausalLM
from transformers import Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM
TOK = "/root/.cache/quantfarm/models/smollm2/smollm2-hf"
V = 49152
common = dict(vocab_size=V, hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=32,
    linear_value_head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
    rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=False,
    rope_parameters={"rope_type":"default","rope_theta":10000000.0,"partial_rotary_factor":0.25,
                     "mrope_section":[2,1,1],"mrope_interleaved":True})
def build(kind):
    out = f"/tmp/q35/hf_{kind}"
    shutil.rmtree(out, ignore_errors=True)
    if kind == "dense":
        cfg = Qwen3_5TextConfig(intermediate_size=128, **common)
        m = Qwen3_5ForCausalLM(cfg)
    else:
        cfg = Qwen3_5MoeTextConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
              shared_expert_intermediate_size=64, **common)
        m = Qwen3_5MoeForCausalLM(cfg)
    sd = {k: v.detach().clone().contiguous() for k, v in m.state_dict().items()}
    # perturb every param so norms/A_log/dt_bias are non-trivial
    for k, v in sd.items():
        if v.dtype.is_floating_point:
            sd[k] = (v + 0.05 * torch.randn_like(v)).contiguous()
    H = 64
    ex = next(k for k in sd if k.startswith("model.layers.3."))
    # synthetic MTP block: copy layer 3 (a full-attention layer) + fc/norms
    mtp = {}
    for k, v in sd.items():
        if k.startswith("model.layers.3."):
            mtp["mtp.layers.0." + k[len("model.layers.3."):]] = v.clone()
    mtp["mtp.fc.weight"] = torch.randn(H, 2 * H) * 0.02
    for n in ["pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"]:
        mtp[f"mtp.{n}.weight"] = torch.randn(H) * 0.02
    sd.update(mtp)
    os.makedirs(out)
    save_file(sd, f"{out}/model.safetensors", metadata={"format": "pt"})
    c = cfg.to_dict()
    c["architectures"] = ["Qwen3_5ForCausalLM" if kind == "dense" else "Qwen3_5MoeForCausalLM"]
    c["mtp_num_hidden_layers"] = 1
    c["full_attention_interval"] = 4
    json.dump(c, open(f"{out}/config.json", "w"), indent=1)
    for f in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]:
        shutil.copy(f"{TOK}/{f}", out)
    print(kind, len(sd), "tensors;", sorted(k for k in sd if "layers.0." in k or "layers.3." in k or not "layers" in k))
    for k in sorted(sd):
        if "layers.0." in k or "layers.3." in k and not k.startswith("mtp"):
            print("  ", k, tuple(sd[k].shape))
for kind in sys.argv[1:]:
    build(kind)
