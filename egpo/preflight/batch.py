"""Batch arithmetic that verl checks only once workers are up, or not at all before the first update.

verl's own ``validate_config`` (run inside its task runner, after Ray starts) is run here too, and the token
budgets of dynamic batching: ``rearrange_micro_batches`` asserts that one sequence fits a micro-batch at the
first update, after a whole rollout.
"""

from __future__ import annotations

from egpo.preflight.findings import Finding, error, warning


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
    from egpo.preflight.scale import sequence_length

    ref = config.actor_rollout_ref
    length = sequence_length(config)
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


def engine_context(config) -> tuple[int, str]:
    """The context verl gives a vLLM engine (rollout.max_model_len, else the model's max_position_embeddings) and
    where it comes from; a model whose config this machine cannot read: the run's own sequence, a lower bound."""
    from egpo.preflight.scale import model_shape, sequence_length

    rollout = config.actor_rollout_ref.rollout
    if rollout.get("max_model_len"):
        return int(rollout.max_model_len), "actor_rollout_ref.rollout.max_model_len"
    shape = model_shape(config)
    if shape is not None and shape.max_positions:
        return shape.max_positions, "the model's max_position_embeddings, verl's max_model_len when it is unset"
    return sequence_length(config), "data.max_prompt_length + data.max_response_length, at least"


def prefill_budget_findings(config, stack=None) -> list[Finding]:
    """vLLM without chunked prefill takes a prompt's whole prefill in one step, so it refuses a
    ``max_num_batched_tokens`` under its ``max_model_len`` at engine start, after Ray and the weights' load (verl 0.7.1
    passes the pair through); verl 0.9.1 raises the budget to ``max_model_len`` first, so a step's batch then holds
    that many tokens, not the number set. ``stack``: the installed verl's table entry (read here where not given)."""
    from egpo.compat.versions import verl_stack
    from egpo.preflight.scale import sequence_length

    rollout = config.actor_rollout_ref.rollout
    if rollout.get("name") != "vllm" or rollout.get("enable_chunked_prefill", True):
        return []
    budget = int(rollout.get("max_num_batched_tokens") or 8192)
    context, whence = engine_context(config)
    if budget >= context:
        return []
    # what the run needs of the engine: its own sequence, within the model's context
    sequence = min(sequence_length(config), context)
    said = (f"actor_rollout_ref.rollout.max_num_batched_tokens={budget} is under the engine's context of {context} "
            f"({whence}) with actor_rollout_ref.rollout.enable_chunked_prefill=false")
    bound = (f"actor_rollout_ref.rollout.max_model_len={sequence}", f"actor_rollout_ref.rollout.max_num_batched_tokens="
             f"{max(budget, sequence)}")
    if (stack or verl_stack()).raises_prefill_budget:
        return [warning("batch", f"{said}: verl raises the budget to {context} at engine start, so a prefill step "
                                 f"holds up to {context} tokens' activations; bound both to the run's sequence with "
                                 f"{' '.join(bound)}, or set actor_rollout_ref.rollout.enable_chunked_prefill=true")]
    return [error("batch", f"{said}: vLLM refuses the pair at engine start, after Ray and the weights' load; set "
                           f"actor_rollout_ref.rollout.enable_chunked_prefill=true, or {' '.join(bound)}",
                  fixes=(("actor_rollout_ref.rollout.enable_chunked_prefill=true",), bound))]


def batch_findings(config, run) -> list[Finding]:
    return [*token_budget_findings(config), *parallel_findings(config), *prefill_budget_findings(config, run.stack),
            *verl_validate_findings(config)]
