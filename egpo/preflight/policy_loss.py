"""egpo's policy loss (GRPO-S's, ``actor_rollout_ref.actor.policy_loss.loss_mode=grpo_s``) where a run asks for it:
how it reaches verl's actor workers on this stack, and the settings the paper pairs it with."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf, open_dict

from egpo.preflight.findings import Finding, error, fact, warning

LOSS_MODE_KEY = "actor_rollout_ref.actor.policy_loss.loss_mode"
AGG_KEY = "actor_rollout_ref.actor.loss_agg_mode"
HOOK_KEY = "ray_kwargs.ray_init.runtime_env.worker_process_setup_hook"
HOOK = "egpo.advantage.loss_plugin.setup"
SEQUENCE_MEAN = "seq-mean-token-mean"


def check_policy_loss(config: DictConfig, run) -> list[Finding]:
    """GRPO-S's advantage without its loss, or its loss with another aggregation: warned, with the fix. Where the
    loss runs on a verl without a plugin group (0.7.1), Ray's worker setup hook registers it in every worker."""
    from egpo.advantage.sequence_loss import LOSS_MODE

    loss_mode = OmegaConf.select(config, LOSS_MODE_KEY, default="vanilla")
    method = (config.get("algorithm", None) or {}).get("egpo_method", "egpo")
    found: list[Finding] = []
    if method == LOSS_MODE and loss_mode != LOSS_MODE:
        found.append(warning("loss", f"algorithm.egpo_method=grpo_s shapes GRPO-S's advantages, but the loss is "
                                     f"verl's {loss_mode!r}, not GRPO-S's sequence-ratio loss (Eqs. 10-11): "
                                     f"{LOSS_MODE_KEY}={LOSS_MODE} {AGG_KEY}={SEQUENCE_MEAN}"))
    if loss_mode != LOSS_MODE:
        return found
    agg = OmegaConf.select(config, AGG_KEY, default="token-mean")
    if agg != SEQUENCE_MEAN:
        found.append(warning("loss", f"the grpo_s loss averages over responses in the paper (1/G): {AGG_KEY}="
                                     f"{SEQUENCE_MEAN} (now {agg!r})"))
    if run.stack.loads_verl_plugins:
        return found  # verl imports egpo.advantage.loss_plugin in every process (pyproject's verl.plugins)
    hook = OmegaConf.select(config, HOOK_KEY, default=None)
    if hook not in (None, HOOK):
        found.append(error("loss", f"the grpo_s loss reaches verl's actor workers on this verl through Ray's worker "
                                   f"setup hook, and {HOOK_KEY}={hook!r} holds Ray's one hook: call {HOOK}() at the "
                                   "start of yours, or leave yours out"))
        return found
    with open_dict(config):
        OmegaConf.update(config, HOOK_KEY, HOOK, force_add=True)
    found.append(fact("loss", f"grpo_s reaches verl's actor workers through Ray's worker setup hook ({HOOK_KEY}="
                              f"{HOOK}): this verl has no plugin group"))
    return found
