"""Rollout settings under which vLLM would return no, or wrong, per-token entropy.

Checked before Ray starts (:mod:`egpo.preflight.rollout_path`) and again by egpo's vLLM server before vLLM launches
(in the server's own environment). No vLLM import here. verl passes ``engine_kwargs.vllm`` to vLLM's engine
arguments, so the same settings are refused there, each with the key to remove.
"""

from __future__ import annotations

import os

from egpo.errors import EgpoConfigError

ENGINE_KWARGS_PREFIX = "actor_rollout_ref.rollout.engine_kwargs.vllm"
SPECULATIVE = ("speculative decoding samples through vLLM's rejection sampler, which calls the sampler for the bonus "
               "token only, so most tokens would have no entropy")
# the environment variable that selects vLLM's Model Runner V2 (its own sampler, which egpo patches where the installed
# vLLM's table serves it: egpo.rollout.vllm.versions)
V2_RUNNER = "VLLM_USE_V2_MODEL_RUNNER"
# vLLM's allow-list of plugins (comma-separated entry-point names; unset: all), and egpo's entry point (pyproject.toml)
PLUGINS_VAR = "VLLM_PLUGINS"
PLUGIN_NAME = "egpo_rollout_entropy"


class UnsupportedVllmSettingError(EgpoConfigError):
    """A rollout setting under which vLLM cannot return per-token entropy."""


def _is_set(value) -> bool:
    return value not in (None, "", {}, "None", "none")


def _engine_kwargs(config) -> dict:
    engine_kwargs = getattr(config, "engine_kwargs", None) or {}
    vllm = engine_kwargs.get("vllm", None) if hasattr(engine_kwargs, "get") else getattr(engine_kwargs, "vllm", None)
    return dict(vllm or {})


def unsupported_settings(config, environ=None, vllm_version: str | None = None) -> list[str]:
    """Every problem, each with its fix; ``config`` is ``actor_rollout_ref.rollout``, ``vllm_version`` the vLLM the
    rollout runs (default: the installed one)."""
    from egpo.rollout.vllm.versions import VllmPatchTargetError, vllm_targets

    environ = os.environ if environ is None else environ
    try:  # a tested version's table, or an untested one's inside a range (the version itself is checked elsewhere)
        targets = vllm_targets(vllm_version)
    except VllmPatchTargetError:
        targets = None
    problems = []
    kwargs = _engine_kwargs(config)
    if bool(kwargs.get("enable_batch_sharded_sampling") or False):
        problems.append(f"{ENGINE_KWARGS_PREFIX}.enable_batch_sharded_sampling: Model Runner V2 gathers each rank's "
                        "sampled log probs at the width vLLM asked for, without the entropy column; remove it "
                        f"(~{ENGINE_KWARGS_PREFIX}.enable_batch_sharded_sampling)")
    if _is_set(kwargs.get("speculative_config")):
        problems.append(f"{ENGINE_KWARGS_PREFIX}.speculative_config: {SPECULATIVE}; remove it "
                        f"(~{ENGINE_KWARGS_PREFIX}.speculative_config)")
    if kwargs.get("max_logprobs") is not None and int(kwargs["max_logprobs"]) < 0:
        problems.append(f"{ENGINE_KWARGS_PREFIX}.max_logprobs={kwargs['max_logprobs']}: full-vocabulary log probs "
                        "replace the sampled-token log probs the entropy rides beside; remove it "
                        f"(~{ENGINE_KWARGS_PREFIX}.max_logprobs)")
    mtp = getattr(config, "mtp", None)
    if mtp is not None and getattr(mtp, "enable", False) and getattr(mtp, "enable_rollout", False):
        problems.append(f"actor_rollout_ref.rollout.mtp.enable_rollout=true: {SPECULATIVE}; disable MTP rollout "
                        "(actor_rollout_ref.rollout.mtp.enable_rollout=false)")
    if int(getattr(config, "pipeline_model_parallel_size", 1) or 1) > 1:
        problems.append(f"actor_rollout_ref.rollout.pipeline_model_parallel_size="
                        f"{config.pipeline_model_parallel_size}: not covered by egpo's tests; use 1")
    disaggregation = getattr(config, "disaggregation", None)
    if disaggregation is not None and bool(getattr(disaggregation, "enabled", False)):
        problems.append("actor_rollout_ref.rollout.disaggregation.enabled=true: the prefill server samples each "
                        "response's first token, and the decode server, which returns the response, has no entropy "
                        "for it; set actor_rollout_ref.rollout.disaggregation.enabled=false")
    allowed = environ.get(PLUGINS_VAR)
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        problems.append(f"{PLUGINS_VAR}={allowed}: vLLM loads only the plugins it names, so its workers would run "
                        f"without egpo's sampler patch; add egpo's ({PLUGINS_VAR}={allowed + ',' if allowed else ''}"
                        f"{PLUGIN_NAME}) or unset it")
    if str(environ.get(V2_RUNNER, "")).strip().lower() in ("1", "true") and targets is not None \
            and not targets.serves_runner_v2:
        problems.append(f"{V2_RUNNER}={environ[V2_RUNNER]}: this vLLM's Model Runner V2 samples with a sampler egpo "
                        f"does not patch (egpo serves V2 from vLLM 0.24.0); unset it (vLLM's V1 model runner, "
                        f"{V2_RUNNER}=0)")
    return problems


def refuse_unsupported_settings(config, environ=None) -> None:
    problems = unsupported_settings(config, environ)
    if problems:
        raise UnsupportedVllmSettingError("rollout entropy from vLLM cannot be produced: " + "; ".join(problems))


def refuse_unpatched(config) -> None:
    """Before Ray (egpo.engines: the vLLM descriptor's limits): a vLLM version egpo patches (package metadata only:
    vLLM itself is imported by its server), and none of the settings above."""
    from egpo.rollout.vllm.versions import vllm_targets

    vllm_targets()
    refuse_unsupported_settings(config)
