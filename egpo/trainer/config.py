"""The ``<think>`` token-id lookup and the temperature check (the settings themselves: :mod:`egpo.settings`).

Everything here runs in the driver before Ray or any worker starts, and every error names the fix.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig, open_dict

from egpo.advantage.variants import ESTIMATOR_NAME
from egpo.rollout.entropy import EntropyOptions
from egpo.settings import EgpoConfigError, EgpoSettings, estimator_name

logger = logging.getLogger(__name__)

THINK_START_TOKEN = "<think>"
THINK_END_TOKEN = "</think>"


def lookup_think_token_ids(tokenizer) -> tuple[int, int]:
    """Ids of ``<think>`` and ``</think>``, each required to be one token of the tokenizer's vocabulary."""
    vocab = tokenizer.get_vocab()
    ids = []
    for token in (THINK_START_TOKEN, THINK_END_TOKEN):
        if token not in vocab:
            raise EgpoConfigError(
                f"the tokenizer ({getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)}) has no {token!r} "
                "token, so EGPO cannot find the chain-of-thought span. For a model that does not think, read the "
                "entropy over the whole response: algorithm.egpo_span=response. Otherwise use a thinking model's "
                "tokenizer (Qwen3: 151667/151668) or set both ids explicitly: ++algorithm.cot_start_token_id=ID "
                "++algorithm.cot_end_token_id=ID."
            )
        ids.append(vocab[token])
    return ids[0], ids[1]


def resolve_think_token_ids(config: DictConfig, tokenizer) -> None:
    """Fills null ``algorithm.cot_*_token_id`` from the tokenizer (only when EGPO is the estimator).

    ``egpo_span=cot`` needs the markers: a tokenizer without them is refused. ``egpo_span=response`` reads every
    response token and needs none: the ids are filled where the tokenizer has the markers (the CoT figures are
    then logged too) and left null where it has not.
    """
    algorithm = config.algorithm
    if estimator_name(algorithm.get("adv_estimator")) != ESTIMATOR_NAME:
        return
    if algorithm.get("cot_start_token_id") is not None and algorithm.get("cot_end_token_id") is not None:
        return
    try:
        start_id, end_id = lookup_think_token_ids(tokenizer)
    except EgpoConfigError:
        if algorithm.get("egpo_span", "cot") == "response":
            logger.info("egpo_span=response on a tokenizer without <think>/</think>: no CoT figures are logged")
            return
        raise
    with open_dict(algorithm):
        if algorithm.get("cot_start_token_id") is None:
            algorithm.cot_start_token_id = start_id
        if algorithm.get("cot_end_token_id") is None:
            algorithm.cot_end_token_id = end_id


def warn_on_temperature_mismatch(config: DictConfig, settings: EgpoSettings) -> str | None:
    """When a run compares rollout and actor entropy, both must describe the same distribution.

    The actor's entropy is taken on temperature-scaled logits; the rollout's on raw logits unless
    ``actor_rollout_ref.rollout.custom.entropy.temperature_scaled`` is true. They agree only at temperature 1.
    """
    rollout = config.actor_rollout_ref.rollout
    temperature = float(rollout.get("temperature", 1.0))
    scaled = EntropyOptions.from_rollout_config(rollout).temperature_scaled
    compares = not settings.bypass_mode  # both entropies exist whenever the actor recomputes
    if settings.enabled and compares and temperature != 1.0 and not scaled:
        message = (
            f"rollout temperature is {temperature}: the rollout entropy is taken on raw logits while the actor's "
            "entropy is taken on temperature-scaled logits, so egpo/entropy_rollout_vs_actor/* compares two different "
            "distributions. For the ablation set ++actor_rollout_ref.rollout.custom.entropy.temperature_scaled=true "
            "or sample at temperature 1.0."
        )
        logger.warning(message)
        return message
    return None


def load_tokenizer(config):
    """The tokenizer of ``actor_rollout_ref.model.path``, loaded as verl loads it."""
    from verl.utils import hf_tokenizer
    from verl.utils.fs import copy_to_local

    path = copy_to_local(config.actor_rollout_ref.model.path, use_shm=False)
    return hf_tokenizer(path, trust_remote_code=config.data.get("trust_remote_code", False))
