"""pass@k of each validation, from the n samples verl draws per problem (``actor_rollout_ref.rollout.val_kwargs.n``).

The unbiased estimator of Chen et al. (2107.03374): a problem with n samples of which c are solved has
pass@k = 1 - C(n - c, k) / C(n, k), the chance that k of its n samples drawn without replacement hold a solved one;
the metric is its mean over problems. A sample is solved when its score (verl's validation reward, summed over the
response) is at least ``egpo.pass_at_k.solved_score`` (default 1.0: a full score for 0/1 and +-1 rewards; the demo's
0.5 for a wrong answer is not solved). A problem is one validation prompt: verl gives its n samples one ``uid``.

Logged with verl's validation metrics as ``val-egpo/pass@k`` for k = 1, 2, 4, ... and n (every problem with at least
k samples), and per data source as ``val-egpo/<data_source>/pass@k`` where the validation set has several.
"""

from __future__ import annotations

import math
from collections import Counter

from egpo.options import PassAtKOptions

SOLVED_SCORE_KEY = "egpo.pass_at_k.solved_score"
DEFAULT_SOLVED_SCORE = PassAtKOptions().solved_score  # declared in egpo.options


def unbiased_pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n - c, k) / C(n, k), exactly (integers); ``k <= n``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks_for(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself (as verl's best@k / mean@k)."""
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return sorted(set(ks + [n])) if n >= 1 else []


def pass_at_k_metrics(data_sources, uids, scores, solved_score: float = DEFAULT_SOLVED_SCORE) -> dict[str, float]:
    """``val-egpo/pass@k`` from one validation's samples (one entry each in ``data_sources``, ``uids``, ``scores``)."""
    if not len(uids) == len(scores) == len(data_sources):
        raise ValueError(f"pass@k needs one data source, uid and score per sample (got {len(data_sources)}, "
                         f"{len(uids)}, {len(scores)})")
    samples, solved, source_of = Counter(), Counter(), {}
    for source, uid, score in zip(data_sources, uids, scores):
        key = (str(source), str(uid))
        samples[key] += 1
        solved[key] += float(score) >= solved_score
        source_of[key] = str(source)
    metrics: dict[str, float] = {}
    if not samples:
        return metrics
    sources = sorted(set(source_of.values()))
    groups = {"val-egpo": list(samples)}
    if len(sources) > 1:
        groups.update({f"val-egpo/{source}": [key for key in samples if source_of[key] == source] for source in sources})
    for prefix, problems in groups.items():
        for k in ks_for(max(samples[key] for key in problems)):
            values = [unbiased_pass_at_k(samples[key], solved[key], k) for key in problems if samples[key] >= k]
            metrics[f"{prefix}/pass@{k}"] = sum(values) / len(values)
    return metrics


_EXPECTED_PARAMS = ("data_sources", "sample_uids", "reward_extra_infos_dict", "sample_turns")


def check_verl_shape(trainer_cls) -> None:
    """verl's ``_val_metrics_update`` (the method egpo's trainer extends to add pass@k) still takes the validation's
    per-sample data sources, uids and rewards (verl 0.7.1 and 0.9.1 do)."""
    from egpo.compat.versions import TESTED_VERL, install_hint
    from egpo.patching import parameters
    from egpo.trainer.advantage_step import VerlShapeError

    target = getattr(trainer_cls, "_val_metrics_update", None)
    params = parameters(target) if target is not None else None
    if params != _EXPECTED_PARAMS:
        raise VerlShapeError(
            f"verl's RayPPOTrainer._val_metrics_update has parameters {params}, egpo expects {_EXPECTED_PARAMS} "
            f"(verl {' and '.join(TESTED_VERL)}) to log pass@k. {install_hint()}")
