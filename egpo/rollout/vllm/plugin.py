"""egpo's ``vllm.general_plugins`` entry point: the sampler patches inside vLLM's engine-core and worker processes.

vLLM runs every function registered under ``vllm.general_plugins`` (``pyproject.toml``) in each of its processes
(front end, engine core, workers). This one acts only where ``EGPO_ROLLOUT_ENTROPY`` is set: egpo's vLLM server
exports the entropy options (:mod:`egpo.rollout.engine_options`) before vLLM starts its processes, which inherit
them, so any other vLLM user of the environment is left untouched. It patches the sampler of V1's model runner and,
where the installed vLLM's table serves it, Model Runner V2's: whichever runner vLLM picks for the model samples
through egpo's patch. The patches check their targets first (:mod:`egpo.rollout.vllm.versions`); the server checked
them before launching too, so a mismatch stops start-up.

On egpo's CPU platform a second entry point, :func:`egpo.cpu.vllm_rollout.load`, prepares each vLLM process for
verl's vLLM path on a CPU, whatever the entropy source.
"""

from __future__ import annotations

import os

from egpo.rollout.engine_options import ENV_VAR


def load() -> None:
    if not os.environ.get(ENV_VAR):
        return
    from egpo.rollout.engine_options import read_options
    from egpo.rollout.vllm.runner_v2_patch import apply_runner_v2_patch
    from egpo.rollout.vllm.sampler_patch import apply_sampler_patch
    from egpo.rollout.vllm.versions import vllm_targets

    options = read_options()
    apply_sampler_patch(options)
    if vllm_targets().serves_runner_v2:
        apply_runner_v2_patch(options)
