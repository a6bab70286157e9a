"""gguf-py's own model-id heuristics, the oracle for quantfarm's (tensors/src/convert/authorship.rs).

Usage: gguf_metadata.py LLAMA_CPP_SRC TOTAL_PARAMS ID...
  -> a JSON list, per id: gguf-py Metadata.get_model_id_components(id, TOTAL_PARAMS) as {name, organization,
     basename, finetune, version, size_label}, from the llama.cpp tree's gguf-py
"""
import json
import sys

sys.path.insert(0, sys.argv[1] + "/gguf-py")
from gguf.metadata import Metadata  # noqa: E402

total = int(sys.argv[2])
out = []
for model_id in sys.argv[3:]:
    name, org, basename, finetune, version, size_label = Metadata.get_model_id_components(model_id, total)
    out.append({"name": name, "organization": org, "basename": basename, "finetune": finetune, "version": version,
                "size_label": size_label})
print(json.dumps(out))
