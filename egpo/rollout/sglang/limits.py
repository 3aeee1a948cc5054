"""Rollout settings under which sglang 0.5.6.post2 returns no, or wrong, per-token entropy.

Checked at start-up (before Ray starts) and again by the server before sglang launches. No sglang import here.
"""

from __future__ import annotations


class UnsupportedRolloutSettingError(ValueError):
    """A rollout setting under which sglang cannot return per-token entropy."""


def refuse_unsupported_settings(config) -> None:
    problems = []
    if int(config.data_parallel_size) > 1:
        problems.append(
            f"actor_rollout_ref.rollout.data_parallel_size={config.data_parallel_size}: sglang's data-parallel "
            "controller starts schedulers through a function bound before egpo can patch it; use 1 (more replicas "
            "instead)"
        )
    if int(config.pipeline_model_parallel_size) > 1:
        problems.append(
            f"actor_rollout_ref.rollout.pipeline_model_parallel_size={config.pipeline_model_parallel_size}: "
            "pipeline parallel rebuilds the logits output and drops the entropy; use 1"
        )
    mtp = getattr(config, "mtp", None)
    if mtp is not None and getattr(mtp, "enable", False) and getattr(mtp, "enable_rollout", False):
        problems.append(
            "actor_rollout_ref.rollout.mtp.enable_rollout=true: speculative decoding samples inside the verify "
            "kernel, not the sampler, so there is no per-token entropy; disable MTP rollout"
        )
    if problems:
        raise UnsupportedRolloutSettingError("rollout entropy from sglang cannot be produced: " + "; ".join(problems))
