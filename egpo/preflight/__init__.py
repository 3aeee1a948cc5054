"""Preflight: what a run will cost and whether it can run, known before any GPU work.

``python -m egpo.preflight --config-path=... --config-name=... [overrides]`` prints every finding for a recipe plus
overrides (egpo's start-up refusals, data files and prompt lengths, tokens and generations per step, validation's
share of the run, what egpo adds per GPU, on the driver and on disk at the model's real
scale, loggers, batch arithmetic, the actor entropy's precision, replica seeds, which servers a reward
model or teacher gets) and exits non-zero on an error. ``python -m egpo.main`` runs the cheap
ones (everything but tokenizing the prompts) before Ray starts and refuses a run with an error. Every step of that
pass is one entry of :data:`egpo.preflight.checks.STEPS`, reading the run's facts
(:mod:`egpo.preflight.run_facts`); :mod:`egpo.preflight.prepare` runs them.
"""

from __future__ import annotations

from egpo.preflight.findings import Finding

__all__ = ["Finding"]
