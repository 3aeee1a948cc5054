"""egpo: entropy-guided advantage (EGPO) for verl, with entropy from the actor or the rollout engine.

Importing the package registers the ``egpo`` advantage estimator with verl.
"""

from egpo.advantage.registry import register as _register_estimator

_register_estimator()

__version__ = "0.1.0"
