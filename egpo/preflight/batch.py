"""Batch arithmetic that verl checks only once workers are up, or not at all before the first update.

verl's own ``validate_config`` (run inside its task runner, after Ray starts) is run here too, and the token
budgets of dynamic batching: ``rearrange_micro_batches`` asserts that one sequence fits a micro-batch at the
first update, after a whole rollout.
"""

from __future__ import annotations

from egpo.preflight.findings import Finding, error


def verl_validate_findings(config) -> list[Finding]:
    import contextlib
    import io
    import warnings

    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from egpo.console import quiet_driver

    try:
        # verl's own lines stay out of the preflight's: its "All configuration checks passed" (it runs again, and
        # prints it, in the task runner) and the warnings egpo.console silences in every process
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            quiet_driver()
            validate_config(config, use_reference_policy=need_reference_policy(config),
                            use_critic=need_critic(config))
    except Exception as err:  # noqa: BLE001 - whatever verl raises here, it would raise after Ray started
        text = " ".join(str(err).split())
        return [error("batch", f"verl's validate_config refuses this config ({type(err).__name__}): {text}")]
    return []


def token_budget_findings(config) -> list[Finding]:
    data, ref = config.data, config.actor_rollout_ref
    length = int(data.max_prompt_length) + int(data.max_response_length)
    budgets = []
    if ref.actor.get("use_dynamic_bsz", False):
        budgets.append(("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", ref.actor.get("ppo_max_token_len_per_gpu")))
    if ref.rollout.get("log_prob_use_dynamic_bsz", False):
        budgets.append(("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                        ref.rollout.get("log_prob_max_token_len_per_gpu")))
    findings = []
    for key, value in budgets:
        if value is None or int(value) < length:
            findings.append(error("batch", f"{key}={value} is smaller than one sequence (data.max_prompt_length + "
                                           f"data.max_response_length = {length}); verl stops at the first update; set "
                                           f"{key}={2 * length}"))
    return findings


def parallel_findings(config) -> list[Finding]:
    gpus = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    tp = int(config.actor_rollout_ref.rollout.get("tensor_model_parallel_size", 1) or 1)
    if gpus % tp:
        return [error("batch", f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} does not divide the "
                               f"{gpus} GPUs (trainer.n_gpus_per_node x trainer.nnodes); use a divisor of {gpus}")]
    return []


def batch_findings(config) -> list[Finding]:
    return [*token_budget_findings(config), *parallel_findings(config), *verl_validate_findings(config)]
