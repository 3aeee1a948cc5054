"""egpo's ``vllm.general_plugins`` entry point: the sampler patch inside vLLM's engine-core and worker processes.

vLLM runs every function registered under ``vllm.general_plugins`` (``pyproject.toml``) in each of its processes
(front end, engine core, workers). This one acts only where ``EGPO_ROLLOUT_ENTROPY`` is set: egpo's vLLM server
exports the entropy options (:mod:`egpo.rollout.engine_options`) before vLLM starts its processes, which inherit
them, so any other vLLM user of the environment is left untouched. The patch checks its targets first
(:mod:`egpo.rollout.vllm.versions`); the server checked them before launching too, so a mismatch stops start-up.
"""

from __future__ import annotations

import os

from egpo.rollout.engine_options import ENV_VAR


def load() -> None:
    if not os.environ.get(ENV_VAR):
        return
    from egpo.rollout.engine_options import read_options
    from egpo.rollout.vllm.sampler_patch import apply_sampler_patch

    apply_sampler_patch(read_options())
