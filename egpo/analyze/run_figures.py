"""A finished ablation run's token figures, read from its generation folders (``egpo.ablation --generate``:
:mod:`egpo.runs.ablation_dir` names them), for ``egpo.report`` to pair by seed like every other metric."""

from __future__ import annotations

from pathlib import Path

from egpo.runs.ablation_dir import BASE_SCORED, GENERATED, ON_BASE
from egpo.runs.state import DONE

# per-run figures the report compares (name -> title), all at the run's last step
TOKEN_METRICS = {
    "token/entropy_mean": "token entropy after training, mean (nats)",
    "token/entropy_p80": "token entropy after training, 80th percentile (the 80/20 threshold)",
    "token/frac_below_0.01": "share of tokens below 0.01 nats after training",
    "token/thought_entropy_mean": "thought token entropy after training, mean (nats)",
    "token/base_tokens_entropy_shift": "entropy shift on the base model's tokens (trained - base, nats)",
    "token/top20_overlap_with_base": "top-20% entropy positions kept from the base model (of the base's; 0.2 by chance)",
}


def token_metrics(root: Path, work: Path) -> dict[str, float]:
    """A finished run's figures from its generation folders (none where they are missing). The base side of the
    shift and the overlap is the base model's recompute of its own responses (``generate_base_scored``), read once
    for all the runs of an ablation."""
    import numpy as np

    from egpo.analyze.stats import top20_overlap
    from egpo.analyze.tokens import aligned_order, load_run

    found: dict[str, float] = {}
    if (work / GENERATED / DONE).exists():
        own = load_run(work / GENERATED)
        if len(own.entropy):
            found["token/entropy_mean"] = float(own.entropy.mean())
            found["token/entropy_p80"] = float(np.percentile(own.entropy, 80))
            found["token/frac_below_0.01"] = float((own.entropy < 0.01).mean())
            if own.thought is not None and own.thought.any():
                found["token/thought_entropy_mean"] = float(own.entropy[own.thought].mean())
    if (work / ON_BASE / DONE).exists() and (root / BASE_SCORED / DONE).exists():
        base, base_order = _base_scored(root / BASE_SCORED)
        scored = load_run(work / ON_BASE)
        if len(base.entropy):
            shift = scored.entropy[aligned_order(scored, scored.row_keys())] - base.entropy[base_order]
            found["token/base_tokens_entropy_shift"] = float(shift.mean())
            found["token/top20_overlap_with_base"] = top20_overlap(base, scored)["overlap"]
    return found


_BASE_CACHE: dict[tuple[str, float], tuple] = {}


def _base_scored(folder: Path):
    """The base's recompute and its row order, loaded once per folder (and again only where it was rewritten)."""
    from egpo.analyze.tokens import aligned_order, load_run

    key = (str(folder.resolve()), (folder / DONE).stat().st_mtime)
    if key not in _BASE_CACHE:
        _BASE_CACHE.clear()  # one base held at a time
        base = load_run(folder)
        _BASE_CACHE[key] = (base, aligned_order(base, base.row_keys()))
    return _BASE_CACHE[key]
