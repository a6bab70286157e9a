"""Runs llama.cpp's own LlamaModel.generate_extra_tensors (conversion/llama.py, with torch) on rope parameters, as
the oracle of quantfarm's llama3_rope_factors operator.

usage: llama3_rope_factors.py LLAMA_CPP_SRC CASES_JSON
CASES_JSON: a list of {"head_dim": D, "rope": {rope_theta, factor, low_freq_factor, high_freq_factor,
original_max_position_embeddings, rope_type}}. Prints a JSON list: per case, the little-endian f32 bytes of
rope_freqs.weight in hex.
"""

import json
import sys
import types

sys.path.insert(0, sys.argv[1])
from conversion.llama import LlamaModel  # noqa: E402

out = []
for case in json.loads(sys.argv[2]):
    # The method reads only these attributes of the model object.
    stub = types.SimpleNamespace(rope_parameters=case["rope"], hparams={"head_dim": case["head_dim"]},
                                 format_tensor_name=lambda key: "rope_freqs.weight")
    tensors = list(LlamaModel.generate_extra_tensors(stub))
    assert [n for n, _ in tensors] == ["rope_freqs.weight"], tensors
    out.append(tensors[0][1].numpy().astype("<f4").tobytes().hex())
print(json.dumps(out))
