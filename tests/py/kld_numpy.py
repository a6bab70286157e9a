"""KL divergence of one chunk computed with NumPy in float64, the oracle of quantfarm's scoring of another runtime's
logits (`quantfarm_eval::kld::score_rows`): the reference's log-probabilities from a llama.cpp base-logits file
(`llama-perplexity --kl-divergence-base`: header `_logits_`, n_ctx, n_vocab, n_chunk, the tokens, then per chunk one
record per scored position: scale and min log-prob as f32, the log-probabilities quantized to u16), the model's from
raw float32 logits (rows for positions n_ctx/2 .., as quantfarm's mlx-lm helper writes them).

Usage: kld_numpy.py BASE CHUNK LOGITS  -> JSON {count, sum_kld, sum_nll, sum_nll_base, n_same_top}

As llama-perplexity: positions n_ctx/2 .. n_ctx-2 each predict the next token; the KLD sums p_base·(log p_base −
log q) over the vocabulary entries whose base log-probability is above −16.
"""

import json
import sys

import numpy as np


def score(raw, chunk, rows):
    """One chunk's sums, from the base file's bytes `raw` and the model's float32 logits `rows` (positions
    n_ctx/2 .., `n_vocab` each)."""
    assert raw[:8] == b"_logits_", "not a base-logits file"
    n_ctx, n_vocab, n_chunk = np.frombuffer(raw[8:20], dtype="<u4")
    n_ctx, n_vocab, n_chunk = int(n_ctx), int(n_vocab), int(n_chunk)
    tokens = np.frombuffer(raw[20 : 20 + 4 * n_ctx * n_chunk], dtype="<i4")
    first = n_ctx // 2
    scored = n_ctx - 1 - first
    record = 2 * ((n_vocab + 1) // 2) + 4
    at = 20 + 4 * n_ctx * n_chunk + chunk * scored * record * 2
    rec = np.frombuffer(raw[at : at + scored * record * 2], dtype="<u2").reshape(scored, record)
    head = rec[:, :4].copy().view("<f4")
    scale, minlp = head[:, 0].astype(np.float64), head[:, 1].astype(np.float64)
    lb = scale[:, None] * rec[:, 4 : 4 + n_vocab].astype(np.float64) + minlp[:, None]
    rows = np.asarray(rows, dtype="<f4").reshape(-1, n_vocab)[:scored].astype(np.float64)
    m = rows.max(axis=1, keepdims=True)
    logq = rows - (m + np.log(np.exp(rows - m).sum(axis=1, keepdims=True)))
    targets = tokens[chunk * n_ctx + first + 1 : (chunk + 1) * n_ctx]
    idx = np.arange(scored)
    keep = lb > -16.0
    kld = np.where(keep, np.exp(lb) * (lb - logq), 0.0).sum(axis=1)
    return {
        "count": scored,
        "sum_kld": float(kld.sum()),
        "sum_nll": float(-logq[idx, targets].sum()),
        "sum_nll_base": float(-lb[idx, targets].sum()),
        "n_same_top": int((rows.argmax(axis=1) == lb.argmax(axis=1)).sum()),
    }


def main():
    base, chunk, logits = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    raw = open(base, "rb").read()
    print(json.dumps(score(raw, chunk, np.fromfile(logits, dtype="<f4"))))


if __name__ == "__main__":
    main()
