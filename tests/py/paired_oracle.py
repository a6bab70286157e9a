"""The oracle of a report's `paired` section: everything recomputed with NumPy (and mpmath for Student's t) from the
per-token values file published beside report.json, and compared with the report.

    paired_oracle.py REPORT_JSON
    paired_oracle.py --diff OLD_REPORT NEW_REPORT DIFF_JSON   (`quantfarm report diff --json`'s paired ΔKLD)

Checks: the values file's sha256 is the report's; it holds one F32 tensor `kld/FILE_TYPE` per rung of
`paired.means`, whose mean is the rung's llama-perplexity Mean KLD (to f32's precision: the file stores f32 values,
the report's Mean KLD sums f64 ones); each rung's mean, per-token and chunk-clustered standard errors and interval;
each pair (the rungs by size, each against the next larger) as the mean of the per-token differences, its errors
and interval, and whether it leaves 0 out. Exit status 0 when all hold; prints what it compared.

Run with the convert venv (numpy, safetensors, mpmath).
"""

import hashlib
import json
import os
import sys

import mpmath as mp
import numpy as np
from safetensors import safe_open


def t_quantile(p: float, dof: int) -> float:
    f = lambda t: 1 - 0.5 * mp.betainc(dof / 2, 0.5, 0, dof / (dof + t * t), regularized=True) - p
    return float(mp.findroot(f, 2.0))


def interval(values: np.ndarray, tokens: list, confidence: float) -> dict:
    """The chunk-clustered interval of the mean (CR1, t on C - 1 degrees of freedom)."""
    n, c = values.size, len(tokens)
    mean = values.sum(dtype=np.float64) / n
    bounds = np.cumsum([0] + tokens)
    sums = np.array([values[bounds[i] : bounds[i + 1]].sum(dtype=np.float64) for i in range(c)])
    counts = np.array(tokens, dtype=np.float64)
    se_tokens = np.sqrt(((values - mean) ** 2).sum() / (n - 1) / n)
    se_chunks = np.sqrt(c / (c - 1) * ((sums - counts * mean) ** 2).sum()) / n
    t = t_quantile((1 + confidence) / 2, c - 1)
    return {"n_tokens": n, "n_chunks": c, "mean": mean, "se_tokens": se_tokens, "se_chunks": se_chunks,
            "low": mean - t * se_chunks, "high": mean + t * se_chunks}


def close(a, b, rel=1e-9, abs_=1e-12) -> bool:
    return abs(a - b) <= max(abs_, rel * max(abs(a), abs(b)))


def values_of(report_path: str) -> tuple:
    report = json.load(open(report_path))
    path = os.path.join(os.path.dirname(report_path), os.path.basename(report["paired"]["values"]["url"]))
    f = safe_open(path, "np")
    tokens = json.loads(f.metadata()["chunk_tokens"])
    return {k[len("kld/"):]: f.get_tensor(k).astype(np.float64) for k in f.keys()}, tokens


def diff_main(old_report: str, new_report: str, diff_json: str) -> None:
    """`--diff OLD NEW DIFF_JSON`: each rung's paired ΔKLD (new - old) of `quantfarm report diff --json`."""
    (old, tokens), (new, tokens_new) = values_of(old_report), values_of(new_report)
    d = json.load(open(diff_json))
    problems = [] if tokens == tokens_new else ["different chunks"]
    n = 0
    for r in d["rungs"]:
        ty = r["file_type"]
        if ty not in old or ty not in new:
            continue
        ours = interval(new[ty] - old[ty], tokens, d["confidence"])
        for k in ["mean", "se_tokens", "se_chunks", "low", "high"]:
            if not close(ours[k], r["delta"][k]):
                problems.append(f"{ty}: delta {k} {r['delta'][k]} but NumPy gives {ours[k]}")
        n += 1
        print(f"{ty}: new - old {ours['mean']:+.3e} [{ours['low']:+.3e}, {ours['high']:+.3e}]")
    for p in problems:
        print("PROBLEM:", p)
    print(f"{n} rungs paired, {len(problems)} problems")
    sys.exit(1 if problems else 0)


def main() -> None:
    if sys.argv[1] == "--diff":
        return diff_main(*sys.argv[2:5])
    report_path = sys.argv[1]
    report = json.load(open(report_path))
    paired = report["paired"]
    path = os.path.join(os.path.dirname(report_path), os.path.basename(paired["values"]["url"]))
    data = open(path, "rb").read()
    problems = []
    if hashlib.sha256(data).hexdigest() != paired["values"]["sha256"]:
        problems.append("the values file's sha256 is not the report's")
    f = safe_open(path, "np")
    meta = f.metadata()
    tokens = json.loads(meta["chunk_tokens"])
    conf = paired["confidence"]
    values = {k[len("kld/"):]: f.get_tensor(k).astype(np.float64) for k in f.keys()}
    by_type = {a["file_type"]: a for a in report["artifacts"]}
    order = [m["file_type"] for m in paired["means"]]
    if sorted(values) != sorted(order):
        problems.append(f"the file's rungs {sorted(values)} are not the report's {sorted(order)}")
    sizes = [(by_type[t]["bytes"], t) for t in order]
    if sizes != sorted(sizes):
        problems.append(f"the rungs are not by size: {sizes}")
    fields = ["mean", "se_tokens", "se_chunks", "low", "high"]
    for m in paired["means"]:
        ours = interval(values[m["file_type"]], tokens, conf)
        for k in fields:
            if not close(ours[k], m["kld"][k]):
                problems.append(f"{m['file_type']}: {k} {m['kld'][k]} but NumPy gives {ours[k]}")
        for k in ["n_tokens", "n_chunks"]:
            if ours[k] != m["kld"][k]:
                problems.append(f"{m['file_type']}: {k} {m['kld'][k]} but the file has {ours[k]}")
        llama = by_type[m["file_type"]]["kld"]["mean_kld"]
        if not close(ours["mean"], llama, rel=1e-6):
            problems.append(f"{m['file_type']}: the values' mean {ours['mean']} is not its Mean KLD {llama}")
    pairs = paired["pairs"]
    if [(p["smaller"], p["larger"]) for p in pairs] != list(zip(order, order[1:])):
        problems.append(f"the pairs are not each rung against the next larger: {pairs}")
    for p in pairs:
        d = values[p["smaller"]] - values[p["larger"]]
        ours = interval(d, tokens, conf)
        for k in fields:
            if not close(ours[k], p["diff"][k]):
                problems.append(f"{p['smaller']} vs {p['larger']}: {k} {p['diff'][k]} but NumPy gives {ours[k]}")
        if (ours["low"] > 0 or ours["high"] < 0) != p["distinguishable"]:
            problems.append(f"{p['smaller']} vs {p['larger']}: distinguishable says {p['distinguishable']}")
        print(f"{p['smaller']} - {p['larger']}: {ours['mean']:+.6f} [{ours['low']:+.6f}, {ours['high']:+.6f}] "
              f"se {ours['se_chunks']:.6f} (per token {ours['se_tokens']:.6f}, unpaired {p['se_unpaired']:.6f})")
    for p in problems:
        print("PROBLEM:", p)
    print(f"{len(order)} rungs, {len(pairs)} pairs compared, {len(problems)} problems")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
