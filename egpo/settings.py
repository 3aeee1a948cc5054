"""What egpo reads from ``algorithm.*``, validated: shared by ``rollout/`` and ``trainer/`` (below both).

Runs in the driver before Ray or any worker starts, and in the workers that need the settings; every error
names the fix.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from egpo.advantage.config import EgpoAlgorithmConfig
from egpo.advantage.token_selection import SELECTING
from egpo.advantage.variants import ESTIMATOR_NAME
from egpo.engines import ENGINES
from egpo.entropy_sources import LOG_PROBS, SOURCES, EntropySource  # noqa: F401 - egpo.settings.LOG_PROBS, as callers import it
from egpo.errors import EgpoConfigError  # noqa: F401 - egpo.settings.EgpoConfigError, as callers import it

ENTROPY_ROLLOUTS = tuple(ENGINES)  # the rollout engines egpo makes return per-token entropy
ROLLOUT_NAME = "actor_rollout_ref.rollout.name"
SOURCE_WORDS = {name: source.words for name, source in SOURCES.items()}  # algorithm.entropy_source, in the start-up line
BYPASS = "algorithm.rollout_correction.bypass_mode"


def rollout_name(config) -> str | None:
    """``actor_rollout_ref.rollout.name`` of a config (None while unset or ``???``: verl itself asks for it later)."""
    from omegaconf import OmegaConf

    return OmegaConf.select(config, ROLLOUT_NAME, default=None, throw_on_missing=False)


def fix_text(fixes: tuple[tuple[str, ...], ...]) -> str:
    return ", or ".join(" ".join(fix) for fix in fixes)


def bypass_with_actor_entropy_error(rollout_name: str | None) -> EgpoConfigError:
    """entropy_source=actor under bypass mode. The fixes account for the engine: entropy_source=rollout alone
    is no fix where the engine returns no entropy."""
    fixes = [(f"++{BYPASS}=false",)]
    if rollout_name in ENTROPY_ROLLOUTS or rollout_name is None:
        fixes.insert(0, ("++algorithm.entropy_source=rollout",))
    else:
        fixes.append((f"{ROLLOUT_NAME}=sglang", "++algorithm.entropy_source=rollout"))
    fixes = tuple(fixes)
    return EgpoConfigError(
        "algorithm.entropy_source=actor needs the actor's old-log-prob recompute, which "
        f"{BYPASS}=true skips (the point of bypass mode is to avoid that forward pass); rollout entropy is free "
        f"from sglang and vLLM (and egpo's hf server on a CPU). Fix: {fix_text(fixes)}.",
        fixes,
    )


def estimator_name(adv_estimator) -> str:
    return getattr(adv_estimator, "value", adv_estimator)


# EgpoSettings.of: a live node's id -> (a weak reference to it, its settings); an entry goes with its node
_READ: dict[int, tuple[weakref.ref, "EgpoSettings"]] = {}


@dataclass(frozen=True)
class EgpoSettings:
    """What a run's egpo does: its ``algorithm.*`` keys as declared and checked
    (:class:`egpo.advantage.config.EgpoAlgorithmConfig`, under their own names: ``settings.algo.egpo_lambda``), with
    whether the estimator is egpo and whether verl skips the recompute (bypass mode). Read once per process: the
    driver's pass, the trainer, each agent-loop worker."""

    algo: EgpoAlgorithmConfig
    enabled: bool  # algorithm.adv_estimator == egpo
    bypass_mode: bool  # algorithm.rollout_correction.bypass_mode

    @property
    def selects_tokens(self) -> bool:
        """The actor update trains on the top-entropy tokens only (the batch's, or each response's)."""
        return self.enabled and self.algo.egpo_token_selection in SELECTING

    @property
    def selects_per_response(self) -> bool:
        """The top-entropy tokens are each response's own (``top_entropy_per_response``)."""
        return self.selects_tokens and self.algo.egpo_token_selection == "top_entropy_per_response"

    @property
    def source(self) -> EntropySource:
        """``algorithm.entropy_source``'s descriptor (:mod:`egpo.entropy_sources`)."""
        return SOURCES[self.algo.entropy_source]

    @property
    def entropy_key(self) -> str:
        return self.source.batch_key

    @property
    def reads_actor_recompute(self) -> bool:
        """The advantage reads the actor's recompute entropy (kept in the batch until the advantage)."""
        return self.enabled and self.source.from_recompute

    @property
    def reads_rollout_entropy(self) -> bool:
        """The advantage reads the rollout engine's entropy (the batch must carry ``rollout_entropy``)."""
        return self.enabled and self.source.from_engine

    @property
    def reads_surprisal(self) -> bool:
        """The advantage reads verl's rollout log probs (the sampled tokens' surprisal, their negation)."""
        return self.enabled and self.source.needs_log_probs

    @property
    def actor_entropy_use(self) -> str:
        """What the actor's recompute entropy is for in this run, in words."""
        return self.source.actor_entropy_use

    @property
    def variant(self) -> str:
        """Which estimator runs, in words (start-up log)."""
        if not self.enabled:
            return "not egpo"
        algo = self.algo
        if algo.egpo_method == "gtpo":
            return (f"egpo_method=gtpo: GTPO's token rewards (Tan et al., Eqs. 3, 5; gtpo_alpha1={algo.gtpo_alpha1} "
                    f"gtpo_alpha2={algo.gtpo_alpha2}), gtpo_norm={algo.gtpo_norm}, every response token's entropy "
                    f"from the {SOURCE_WORDS[algo.entropy_source]}")
        if algo.egpo_method == "grpo_s":
            return (f"egpo_method=grpo_s: GRPO-S's response rewards (Tan et al., Eqs. 8, 9; grpo_s_beta1="
                    f"{algo.grpo_s_beta1} grpo_s_beta2={algo.grpo_s_beta2}), each response's mean entropy from the "
                    f"{SOURCE_WORDS[algo.entropy_source]}")
        form = "per-token bonus (Cheng et al.)" if algo.egpo_granularity == "token" else "per-response bonus"
        where = "the thinking span" if algo.egpo_span == "cot" else "every response token"
        scope = "each response's" if self.selects_per_response else "the batch's"
        selection = (f"; policy gradient on the top {algo.egpo_top_entropy_quantile:g} of {scope} tokens by "
                     f"entropy (egpo_token_selection={algo.egpo_token_selection})" if self.selects_tokens else "")
        return (f"egpo_granularity={algo.egpo_granularity} egpo_span={algo.egpo_span}: {form}, entropy read over "
                f"{where}, from the {SOURCE_WORDS[algo.entropy_source]}, egpo_lambda={algo.egpo_lambda} "
                f"egpo_alpha={algo.egpo_alpha}{selection}")

    @classmethod
    def of(cls, algorithm) -> "EgpoSettings":
        """The settings of a run's ``algorithm`` node, read once in this process: the trainer, its advantage step
        and the choice of rollout replicas share one reading (a run's node does not change once the run started)."""
        key = id(algorithm)
        held = _READ.get(key)
        if held is not None and held[0]() is algorithm:
            return held[1]
        settings = cls.from_algorithm(algorithm)
        try:
            _READ[key] = (weakref.ref(algorithm, lambda _, key=key: _READ.pop(key, None)), settings)
        except TypeError:  # a node that takes no weak reference is read each time
            pass
        return settings

    @classmethod
    def from_algorithm(cls, algorithm, rollout_name: str | None = None) -> "EgpoSettings":
        """Reads and validates the algorithm node (the settings egpo needs, independent of a tokenizer).
        ``rollout_name`` (where known) tailors the suggested fixes to the engine."""
        try:
            algo = EgpoAlgorithmConfig.from_node(algorithm)
        except ValueError as err:
            raise EgpoConfigError(str(err)) from None
        correction = algorithm.get("rollout_correction", None) or {}
        settings = cls(algo=algo, enabled=estimator_name(algorithm.get("adv_estimator")) == ESTIMATOR_NAME,
                       bypass_mode=bool(correction.get("bypass_mode", False)))
        if settings.reads_actor_recompute and settings.bypass_mode:
            raise bypass_with_actor_entropy_error(rollout_name)
        return settings
