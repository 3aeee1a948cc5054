"""Rollout entropy options across an engine's process boundary (one environment variable, JSON).

sglang's spawned scheduler processes and vLLM's engine-core and worker processes inherit the environment of the
process that starts the engine; egpo's plugins in those processes act only where the variable is set.
"""

from __future__ import annotations

import json
import os

from egpo.rollout.entropy import EntropyOptions

ENV_VAR = "EGPO_ROLLOUT_ENTROPY"


def export_options(options: EntropyOptions) -> None:
    """Set in the parent before the engine starts its processes (they inherit the environment)."""
    os.environ[ENV_VAR] = json.dumps({"top_k": options.top_k, "temperature_scaled": options.temperature_scaled})


def read_options() -> EntropyOptions:
    """Inside an engine process; the defaults (full vocabulary, raw logits) when the variable is unset."""
    raw = os.environ.get(ENV_VAR)
    if not raw:
        return EntropyOptions()
    try:
        values = json.loads(raw)
    except json.JSONDecodeError:
        raise ValueError(f"{ENV_VAR}={raw!r} is not JSON; egpo writes it, do not set it by hand") from None
    return EntropyOptions.from_config(values)
