"""The ``<think>`` and ``</think>`` ids EGPO's chain-of-thought span needs, read from the model's tokenizer into
``algorithm.cot_*_token_id`` in the driver before Ray starts; every error names the fix."""

from __future__ import annotations

import logging

from omegaconf import DictConfig, open_dict

from egpo.advantage.variants import ESTIMATOR_NAME
from egpo.errors import EgpoConfigError, EgpoError
from egpo.preflight.findings import Finding, refused
from egpo.settings import estimator_name

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
        if algorithm.get("egpo_span", "cot") == "response" or algorithm.get("egpo_method", "egpo") != "egpo":
            logger.info("egpo_span=response (or GTPO, GRPO-S: every response token) on a tokenizer without "
                        "<think>/</think>: no CoT figures are logged")
            return
        raise
    with open_dict(algorithm):
        if algorithm.get("cot_start_token_id") is None:
            algorithm.cot_start_token_id = start_id
        if algorithm.get("cot_end_token_id") is None:
            algorithm.cot_end_token_id = end_id


def load_tokenizer(config):
    """The tokenizer of ``actor_rollout_ref.model.path``, loaded as verl loads it."""
    from verl.utils import hf_tokenizer
    from verl.utils.fs import copy_to_local

    path = copy_to_local(config.actor_rollout_ref.model.path, use_shm=False)
    return hf_tokenizer(path, trust_remote_code=config.data.get("trust_remote_code", False))


def read_tokenizer(config: DictConfig, use: str):
    """-> (the tokenizer of ``actor_rollout_ref.model.path``, or None; the finding that says why not, or None).
    ``use``: what it is read for, said in the finding."""
    from egpo.preflight.model_source import model_source_problem

    path = config.actor_rollout_ref.model.path
    problem = model_source_problem(path)
    if problem:
        return None, refused("model", EgpoConfigError(f"{problem}; {use}"))
    try:
        return load_tokenizer(config), None
    except EgpoError as err:
        return None, refused("model", err)
    except Exception as err:  # noqa: BLE001 - a model that cannot be read is a finding, whatever the loader raised
        return None, refused("model", EgpoConfigError(
            f"cannot load the tokenizer of actor_rollout_ref.model.path={path} ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); {use}: give a local model folder, or the hub id on a "
            "machine that reaches the hub"))


def read_tokenizer_step(config: DictConfig, run) -> list[Finding]:
    """The model's tokenizer read for the prompt lengths (into ``run.tokenizer``), or the finding that says why not."""
    run.tokenizer, problem = read_tokenizer(config, "the prompt lengths were not measured")
    return [] if problem is None else [problem]


def think_token_findings(config: DictConfig, run) -> list[Finding]:
    """An egpo run's markers filled from its model's tokenizer (:func:`resolve_think_token_ids`), or the refusal of a
    model whose tokenizer cannot be read here or lacks them."""
    if not run.settings.enabled:
        return []
    tokenizer, problem = read_tokenizer(config, "egpo reads the <think> ids from its tokenizer")
    if problem is not None:
        return [problem]
    try:
        resolve_think_token_ids(config, tokenizer)
    except EgpoError as err:
        return [refused("model", err)]
    return []
