"""Whether two `quantization_config` blocks say the same to compressed-tensors' own parser (the one vLLM and
transformers read a checkpoint's format with): each folder's config.json block parsed by
`QuantizationConfig.model_validate`, config groups compared by content (their names are labels), and the args'
`observer`, which says how scales were observed and nothing about the stored format, left out.

    ct_config_check.py OURS_DIR THEIRS_DIR [OURS_DIR THEIRS_DIR ...]

Prints the differences of each pair as JSON, one line a pair (`{}` when there are none). Run with
scripts/install-llm-compressor's venv.
"""

import json
import sys

from compressed_tensors.quantization import QuantizationConfig


def parsed(folder: str) -> dict:
    block = json.load(open(f"{folder}/config.json"))["quantization_config"]
    cfg = QuantizationConfig.model_validate(block).model_dump()
    groups = []
    for g in cfg.pop("config_groups").values():
        for side in ("weights", "input_activations", "output_activations"):
            if g.get(side):
                g[side].pop("observer", None)
        groups.append(g)
    cfg["config_groups"] = sorted(groups, key=json.dumps)
    cfg.pop("version", None)
    cfg["ignore"] = sorted(cfg.get("ignore") or [])
    return cfg


pairs = sys.argv[1:]
if not pairs or len(pairs) % 2:
    sys.exit(__doc__)
for i in range(0, len(pairs), 2):
    ours, theirs = parsed(pairs[i]), parsed(pairs[i + 1])
    keys = sorted(set(ours) | set(theirs))
    print(json.dumps({k: [ours.get(k), theirs.get(k)] for k in keys if ours.get(k) != theirs.get(k)}))
