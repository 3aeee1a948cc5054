"""Where each verl takes a rollout replica's sampling seed, so that a run's seed reaches every replica as verl derives
it (``replica_rank + seed``) instead of one engine seed shared by all replicas.

* ``VerlStack.rollout_seed_key`` (:mod:`egpo.compat.versions`): verl's own rollout seed (0.9.1: ``actor_rollout_ref.rollout.seed``, which its vLLM server
  turns into ``replica_rank + seed``); 0.7.1 has none (its vLLM server seeds each replica with its rank).
* sglang: neither verl seeds sglang's servers; egpo's sglang server sets ``random_seed`` to ``replica_rank + base``
  (:func:`sglang_replica_seed`), the base being verl's rollout seed where it exists and egpo's
  ``rollout.custom.seed`` otherwise, unless ``engine_kwargs.sglang.random_seed`` is set.

A seed in ``engine_kwargs`` (``vllm.seed``, ``sglang.random_seed``) is one value for every replica: copies of a
prompt on two replicas can draw the same noise. The preflight warns about it where a run has more than one replica.
"""

from __future__ import annotations

from egpo.compat.versions import verl_stack
from egpo.engines import ENGINES
from egpo.options import config_get as _get, rollout_custom

# engine_kwargs.<engine>.<key>: one seed for all replicas
SHARED_ENGINE_SEEDS = {engine.name: engine.shared_seed_key for engine in ENGINES.values() if engine.shared_seed_key}


def run_seed_overrides(seed: int, version: str | None = None) -> tuple[str, ...]:
    """The overrides that make ``seed`` the run's rollout seed on this verl (each replica's seed derived from it)."""
    key = verl_stack(version).rollout_seed_key
    return (f"actor_rollout_ref.rollout.custom.seed={seed}", *((f"++{key}={seed}",) if key else ()))


def sglang_replica_seed(rollout_config, replica_rank: int) -> int | None:
    """``random_seed`` for egpo's sglang server of ``replica_rank``: None where ``engine_kwargs.sglang.random_seed``
    is set (the user's value is kept)."""
    engine = _get(_get(rollout_config, "engine_kwargs"), "sglang")
    if _get(engine, "random_seed") is not None:
        return None
    base = _get(rollout_config, "seed")
    if base is None:
        base = rollout_custom(rollout_config).seed
    return int(replica_rank) + int(base or 0)


def shared_engine_seeds(rollout_config) -> list[str]:
    """The ``engine_kwargs`` keys that set one engine seed for every replica."""
    engine_kwargs = _get(rollout_config, "engine_kwargs") or {}
    return [f"actor_rollout_ref.rollout.engine_kwargs.{engine}.{key}" for engine, key in SHARED_ENGINE_SEEDS.items()
            if _get(_get(engine_kwargs, engine), key) is not None]
