"""egpo's exceptions, one small family, below every other egpo module (it imports nothing).

* :class:`EgpoConfigError`: a configuration egpo cannot run; the message names the fix.
* :class:`IncompatibleDependencyError`: the installed verl, sglang or vLLM is not one egpo was written against (an
  untested version, or a class or function egpo extends that has another shape); raised at start-up, naming the
  version and the target. The per-dependency names (``VerlShapeError``, ``SglangPatchTargetError``, ...) subclass it.
* :class:`EntropyError`: during a run, the entropy a step needs is missing or does not line up with its tokens
  (the rollout returned none, the trainer was bypassed, an engine's values miscount); the message names the cause.

``python -m egpo.main`` prints either as egpo's own lines, without a traceback (:func:`egpo.main.main`).
"""

from __future__ import annotations


class EgpoError(Exception):
    """A refusal egpo explains in its message."""


class EgpoConfigError(EgpoError, ValueError):
    """A configuration egpo cannot run; the message says what to change.

    ``fixes``: where given, the alternatives the message offers, each a tuple of Hydra overrides that together
    make the whole config pass (tested by applying them).
    """

    def __init__(self, message: str, fixes: tuple[tuple[str, ...], ...] = ()):
        super().__init__(message)
        self.fixes = fixes


class IncompatibleDependencyError(EgpoError, RuntimeError):
    """The installed dependency is not the version or shape egpo was written against."""


class EntropyError(EgpoError, RuntimeError):
    """A step's entropy is missing or does not line up with its tokens."""
