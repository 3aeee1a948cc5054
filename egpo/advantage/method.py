"""The method, composed in one place: what ``algorithm.adv_estimator=egpo`` computes from a step's batch, for both of
its callers (egpo's trainer, :mod:`egpo.trainer.advantage_step`, and verl's registry, :mod:`egpo.advantage.registry`).

In order:

1. **The advantage** of ``algorithm.egpo_method``: EGPO's (GRPO's plus the clipped entropy bonus,
   :mod:`egpo.advantage.egpo`), or GTPO's or GRPO-S's (:mod:`egpo.advantage.gtpo`). EGPO's entropy figures are
   computed for every method alike, so that the arms of an ablation log the same ones.
2. **STARE** (``egpo_token_reweighting=stare``, :mod:`egpo.advantage.stare`): the top-surprisal tokens' advantages
   reweighted while entropy is low; it reads verl's ``old_log_probs``.
3. **The 80/20 selection** (``egpo_token_selection``, :mod:`egpo.advantage.token_selection`): the mask the actor
   update trains on, from the same entropy.

:func:`compose_method` returns the advantages, the update mask (None: every valid token) and the method's metrics;
:func:`unhandable` names, in one line, what a caller that cannot hand an input or take back an output cannot have.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from egpo.advantage.cot import prompt_ends_inside_think
from egpo.advantage.token_selection import SELECTING
from egpo.errors import EntropyError


class MethodInputError(EntropyError):
    """The method needs an input its caller did not hand it, or gives an output its caller cannot take."""


@dataclass
class MethodOutcome:
    advantages: torch.Tensor
    returns: torch.Tensor
    update_mask: torch.Tensor | None  # the 80/20 selection's (None: the actor trains on every valid token)
    metrics: dict[str, float]


def unhandable(algo, *, old_log_probs: bool, solved_score: bool, update_mask: bool) -> str | None:
    """Why ``algo``'s method cannot run for a caller that has (True) or lacks (False) verl's ``old_log_probs``, the
    run's solved score, and a way to hand the update mask on to the actor; None where it can."""
    if algo.egpo_method != "egpo" and not solved_score:
        return (f"algorithm.egpo_method={algo.egpo_method} counts a response correct at the run's solved score "
                "(egpo.pass_at_k.solved_score), which this caller does not hand it")
    if algo.egpo_token_reweighting == "stare" and not old_log_probs:
        return ("algorithm.egpo_token_reweighting=stare reads each token's surprisal from verl's old_log_probs, "
                "which this caller does not hand it")
    if algo.egpo_token_selection in SELECTING and not update_mask:
        return (f"algorithm.egpo_token_selection={algo.egpo_token_selection} makes the mask the actor update trains "
                "on, which this caller cannot hand on to the actor")
    return None


def compose_method(algo, *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                   entropy: torch.Tensor, responses: torch.Tensor, norm_adv_by_std_in_grpo: bool = True,
                   prompts: torch.Tensor | None = None, starts_inside: torch.Tensor | None = None,
                   old_log_probs: torch.Tensor | None = None, solved_score: float | None = None) -> MethodOutcome:
    """The whole method (the module's docstring) with the run's settings ``algo``
    (:class:`egpo.advantage.config.EgpoAlgorithmConfig`). ``entropy``: the per-token entropy of the run's source,
    aligned with ``responses``. ``prompts`` (with both thinking markers set): which prompts end inside ``<think>``,
    unless ``starts_inside`` says it. A missing input the settings need is refused (:func:`unhandable`)."""
    from egpo.advantage.egpo import egpo_advantage
    from egpo.advantage.gtpo import shaped_advantage
    from egpo.advantage.stare import stare_weights
    from egpo.advantage.token_selection import top_entropy_mask

    why = unhandable(algo, old_log_probs=old_log_probs is not None, solved_score=solved_score is not None,
                     update_mask=True)
    if why:
        raise MethodInputError(why)
    markers = algo.cot_start_token_id is not None and algo.cot_end_token_id is not None
    if starts_inside is None and prompts is not None and markers:
        starts_inside = prompt_ends_inside_think(prompts, algo.cot_start_token_id, algo.cot_end_token_id)
    shaped = None
    if algo.egpo_method != "egpo":
        shaped = shaped_advantage(algo, token_level_rewards=token_level_rewards, response_mask=response_mask,
                                  index=index, entropy=entropy, solved_score=solved_score,
                                  norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    advantages, returns, diagnostics = egpo_advantage(
        algo if shaped is None else replace(algo, egpo_method="egpo", egpo_lambda=0.0),
        token_level_rewards=token_level_rewards, response_mask=response_mask, index=index,
        token_level_entropy=entropy, responses=responses, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        starts_inside=starts_inside)
    metrics = diagnostics.as_metrics()  # an undefined figure (no span, no markers) is left out
    if shaped is not None:
        advantages = returns = shaped.advantages.to(token_level_rewards.dtype)
        metrics.update(shaped.metrics(f"egpo/{algo.egpo_method}"))
    if algo.egpo_token_reweighting == "stare":
        reweighted = stare_weights(advantages, old_log_probs, entropy, response_mask, variant=algo.stare_variant,
                                   top_ratio=algo.stare_top_ratio, w=algo.stare_w, m=algo.stare_m,
                                   target_entropy=algo.stare_target_entropy)
        advantages = returns = advantages * reweighted.weights
        metrics.update(reweighted.metrics())
    update_mask = None
    if algo.egpo_token_selection in SELECTING:
        selection = top_entropy_mask(entropy, response_mask, algo.egpo_top_entropy_quantile,
                                     per_response=algo.egpo_token_selection == "top_entropy_per_response")
        update_mask = selection.mask
        metrics.update(selection.metrics())
    metrics["egpo/starts_inside_frac"] = float(starts_inside.float().mean()) if starts_inside is not None else 0.0
    return MethodOutcome(advantages, returns, update_mask, metrics)
