"""egpo: entropy-guided advantage (EGPO) for verl, with entropy from the actor or the rollout engine.

Importing the package imports nothing heavy (sglang's spawned processes import ``egpo.rollout.sglang`` and must not
pay for verl). :func:`register` adds the ``egpo`` advantage estimator to verl's registry; ``python -m egpo.main``
calls it in every process that computes advantages.
"""

__version__ = "0.1.0"


def register() -> None:
    """Registers the ``egpo`` estimator with verl (idempotent)."""
    from egpo.advantage.registry import register as register_estimator

    register_estimator()
