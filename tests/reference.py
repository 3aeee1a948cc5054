"""Independent, deliberately naive references (Python loops, float64) for the EGPO contract."""

from __future__ import annotations

import math
from collections import defaultdict

S, E = 7, 8  # <think>, </think> in the hand-worked tests


def cot_mask_ref(tokens, mask, start_id, end_id, starts_inside=None):
    """One response: a literal reading of the spec's state machine."""
    if starts_inside is None:
        markers = [t for t in tokens if t in (start_id, end_id)]
        starts_inside = bool(markers) and markers[0] == end_id
    inside = starts_inside
    out = []
    for tok, valid in zip(tokens, mask):
        if tok == start_id:
            inside = True
            out.append(False)
        elif tok == end_id:
            inside = False
            out.append(False)
        else:
            out.append(bool(inside and valid))
    return out


def grpo_ref(scores, index, eps=1e-6, norm_by_std=True):
    groups = defaultdict(list)
    for s, g in zip(scores, index):
        groups[g].append(float(s))
    out = []
    for s, g in zip(scores, index):
        vals = groups[g]
        if len(vals) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(vals) / len(vals)
            std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        out.append((float(s) - mean) / (std + eps) if norm_by_std else float(s) - mean)
    return out


def egpo_ref(rewards, mask, index, entropy, responses, lam, alpha, start_id, end_id, starts_inside=None,
             norm_by_std=True):
    """Rows of python floats in, per-response A'_i (float64) out."""
    scores = [sum(float(r) for r in row) for row in rewards]
    adv = grpo_ref(scores, index, norm_by_std=norm_by_std)
    out = []
    for i, a in enumerate(adv):
        si = None if starts_inside is None else bool(starts_inside[i])
        cot = cot_mask_ref(responses[i], mask[i], start_id, end_id, si)
        vals = [float(h) for h, c in zip(entropy[i], cot) if c and math.isfinite(float(h))]
        h = sum(vals) / len(vals) if vals else 0.0
        bound = abs(a) / alpha
        out.append(a + lam * min(max(h, -bound), bound))
    return out


def egpo_tokens_ref(rewards, mask, index, entropy, responses, lam, alpha, start_id, end_id, starts_inside=None,
                    norm_by_std=True, granularity="response", span="cot"):
    """Every variant: rows of python floats in, the (bs, L) advantages (float64 lists, 0 on padding) out.

    response: A_i + lam * clip(mean finite entropy over the span, +-|A_i|/alpha) on every valid token;
    token:    A_i + lam * clip(H_it, +-|A_i|/alpha) on the span's tokens with a finite H_it, A_i on the others.
    """
    scores = [sum(float(r) for r in row) for row in rewards]
    adv = grpo_ref(scores, index, norm_by_std=norm_by_std)
    out = []
    for i, a in enumerate(adv):
        if span == "cot":
            si = None if starts_inside is None else bool(starts_inside[i])
            reads = cot_mask_ref(responses[i], mask[i], start_id, end_id, si)
        else:
            reads = [bool(v) for v in mask[i]]
        bound = abs(a) / alpha
        values = [float(h) for h in entropy[i]]
        if granularity == "response":
            vals = [h for h, r in zip(values, reads) if r and math.isfinite(h)]
            h = sum(vals) / len(vals) if vals else 0.0
            row = [a + lam * min(max(h, -bound), bound)] * len(values)
        else:
            row = [a + lam * min(max(h, -bound), bound) if r and math.isfinite(h) else a for h, r in zip(values, reads)]
        out.append([v if m else 0.0 for v, m in zip(row, mask[i])])
    return out


def entropy_rows_ref(logits, temperature=None, top_k: int = 0) -> list[float]:
    """Float64 entropy of each row of ``logits`` from the definition (-inf entries contribute 0). ``temperature``:
    None (raw logits) or one value per row (0 = greedy: the raw row); ``top_k`` > 0: the k largest, renormalized."""
    import torch

    out = []
    for i, row in enumerate(logits.double()):
        if temperature is not None and temperature[i] > 0:
            row = row / temperature[i]
        if top_k:
            row = torch.topk(row, top_k).values
        p = torch.softmax(row, dim=0)
        out.append(-sum(float(q) * math.log(float(q)) for q in p if q > 0))
    return out


def with_declared_defaults(estimator):
    """egpo's estimator (which takes every setting as a required keyword) with the defaults egpo declares for its
    ``algorithm.*`` keys (egpo.advantage.config) and Qwen3's thinking markers, for what a test call leaves out."""
    from egpo.advantage.config import ALGORITHM_DEFAULTS
    from egpo.advantage.egpo import QWEN3_THINK_END, QWEN3_THINK_START

    defaults = {"egpo_lambda": ALGORITHM_DEFAULTS["egpo_lambda"], "egpo_alpha": ALGORITHM_DEFAULTS["egpo_alpha"],
                "granularity": ALGORITHM_DEFAULTS["egpo_granularity"], "span": ALGORITHM_DEFAULTS["egpo_span"],
                "cot_start_token_id": QWEN3_THINK_START, "cot_end_token_id": QWEN3_THINK_END}

    def call(*args, **kwargs):
        return estimator(*args, **{**defaults, **kwargs})

    return call
