"""Rollout settings under which sglang returns no, or wrong, per-token entropy.

Checked at start-up (before Ray starts) and again by the server before sglang launches. No sglang import here.
verl spreads ``engine_kwargs.sglang`` last into sglang's server arguments, so the same settings are refused there
too (``dp_size``, ``pp_size``, ``enable_dp_attention``, ``speculative_*``), each with the key to remove.
"""

from __future__ import annotations

from egpo.errors import EgpoConfigError


class UnsupportedRolloutSettingError(EgpoConfigError):
    """A rollout setting under which sglang cannot return per-token entropy."""


ENGINE_KWARGS_PREFIX = "actor_rollout_ref.rollout.engine_kwargs.sglang"
DATA_PARALLEL = ("sglang 0.5.6.post2's data-parallel controller starts schedulers through a function bound before egpo "
                 "can patch it")
DP_ATTENTION = "data-parallel attention is not covered by egpo's tests"
SPECULATIVE = "speculative decoding samples inside the verify kernel, not the sampler, so there is no per-token entropy"
# engine_kwargs.sglang keys that reach sglang's ServerArgs and break per-token entropy: (is it set?, why)
ENGINE_KWARGS_LIMITS = {
    "dp_size": (lambda v: v is not None and int(v) > 1, DATA_PARALLEL),
    "enable_dp_attention": (bool, DP_ATTENTION),
    "pp_size": (lambda v: v is not None and int(v) > 1, "pipeline parallel rebuilds the logits output and drops the "
                                                        "entropy"),
    "speculative_algorithm": (lambda v: v not in (None, "", "None", "none"), SPECULATIVE),
    "speculative_draft_model_path": (lambda v: v not in (None, ""), SPECULATIVE),
}


# sglang 0.5.20+: egpo's SamplingObserver takes the entropy after penalties and before the grammar mask, logit_bias,
# temperature and custom logit processors (egpo.rollout.sglang.observer); settings under which the sampled
# distribution would then differ from the one the entropy describes, or under which sglang runs no observer
AFTER_OBSERVER = ("apply after egpo's SamplingObserver takes the entropy, so it would not describe the distribution "
                  "the tokens are drawn from")
GRAMMAR_OR_BIAS_KEYS = ("logit_bias", "json_schema", "regex", "ebnf", "structural_tag", "custom_params")
OBSERVER_LIMITS = {
    "enable_custom_logit_processor": (bool, f"custom logit processors {AFTER_OBSERVER}"),
    "preferred_sampling_params": (lambda v: any(key in str(v) for key in GRAMMAR_OR_BIAS_KEYS),
                                  f"default grammars and logit_bias {AFTER_OBSERVER}"),
    "dllm_algorithm": (lambda v: v not in (None, "", "None", "none"),
                       "sglang runs no SamplingObserver for diffusion language models"),
}


def _installed_targets():
    """The installed sglang's table, as far as it is known without importing sglang."""
    from egpo.rollout.sglang.versions import targets_without_import

    return targets_without_import()


def _data_parallel_reaches_schedulers(targets) -> bool:
    """Whether this sglang's data-parallel controller runs egpo's scheduler entry."""
    return targets is not None and targets.data_parallel_reaches_schedulers


def _engine_kwargs_problems(config, targets) -> list[str]:
    engine_kwargs = getattr(config, "engine_kwargs", None) or {}
    sglang = (engine_kwargs.get("sglang", None) if hasattr(engine_kwargs, "get") else
              getattr(engine_kwargs, "sglang", None)) or {}
    allowed = {"dp_size"} if _data_parallel_reaches_schedulers(targets) else set()
    limits = {**ENGINE_KWARGS_LIMITS, **(OBSERVER_LIMITS if targets is not None and targets.entropy_via_observer
                                         else {})}
    return [
        f"{ENGINE_KWARGS_PREFIX}.{key}={sglang[key]}: {why}; remove it (~{ENGINE_KWARGS_PREFIX}.{key})"
        for key, (is_set, why) in limits.items()
        if key in sglang and key not in allowed and is_set(sglang[key])
    ]


def refuse_unsupported_settings(config) -> None:
    problems = []
    targets = _installed_targets()
    if int(config.data_parallel_size) > 1 and not _data_parallel_reaches_schedulers(targets):
        problems.append(
            f"actor_rollout_ref.rollout.data_parallel_size={config.data_parallel_size}: {DATA_PARALLEL}; use 1 (more "
            "replicas instead), or sglang 0.5.12 (verl 0.9.1)"
        )
    if int(config.pipeline_model_parallel_size) > 1:
        problems.append(
            f"actor_rollout_ref.rollout.pipeline_model_parallel_size={config.pipeline_model_parallel_size}: "
            "pipeline parallel rebuilds the logits output and drops the entropy; use 1"
        )
    problems += _engine_kwargs_problems(config, targets)
    mtp = getattr(config, "mtp", None)
    if mtp is not None and getattr(mtp, "enable", False) and getattr(mtp, "enable_rollout", False):
        problems.append(
            "actor_rollout_ref.rollout.mtp.enable_rollout=true: speculative decoding samples inside the verify "
            "kernel, not the sampler, so there is no per-token entropy; disable MTP rollout"
        )
    disaggregation = getattr(config, "disaggregation", None)  # verl >= 0.9: prefill-decode disaggregation
    if disaggregation is not None and bool(getattr(disaggregation, "enabled", False)):
        problems.append(
            "actor_rollout_ref.rollout.disaggregation.enabled=true: the prefill server samples each response's first "
            "token, and the decode server, which returns the response, has no entropy for it; set "
            "actor_rollout_ref.rollout.disaggregation.enabled=false"
        )
    if problems:
        raise UnsupportedRolloutSettingError("rollout entropy from sglang cannot be produced: " + "; ".join(problems))
