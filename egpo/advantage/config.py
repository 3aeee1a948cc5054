"""egpo's keys under verl's ``algorithm`` node, declared once: name, type, default, allowed values and a one-line doc.

Everything else derives from :class:`EgpoAlgorithmConfig`: the YAML that merges the keys into verl's config
(``egpo/config/egpo/algorithm.yaml``, tested equal), the unknown-key check's list, :class:`egpo.settings.EgpoSettings`
and the registered estimator's arguments. The estimator itself (:mod:`egpo.advantage.egpo`) takes every setting as a
required keyword argument and keeps no default of its own; the checks' messages name the defaults declared here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from egpo.advantage.gtpo import GTPO_NORMS, METHODS, SHAPING_WEIGHTS, validate_method
from egpo.advantage.variants import GRANULARITIES, SPANS, validate_egpo_coefficients, validate_egpo_variant
from egpo.advantage.stare import STARE_VARIANTS, TOKEN_REWEIGHTINGS, validate_stare
from egpo.advantage.token_selection import TOKEN_SELECTIONS, validate_token_selection
from egpo.entropy_sources import DEFAULT_SOURCE, ENTROPY_SOURCES, source_help
from egpo.typos import did_you_mean


def _key(default: Any, doc: str, choices: tuple = ()) -> Any:
    return field(default=default, metadata={"doc": doc, "choices": choices})


@dataclass(frozen=True)
class EgpoAlgorithmConfig:
    egpo_method: str = _key("egpo", "egpo: GRPO's advantage plus EGPO's clipped entropy bonus (the egpo_* keys); gtpo: "
                                    "GTPO's token rewards shaped by each token's entropy share, each outcome's "
                                    "z-scored (Tan et al. 2508.04349, Eqs. 3, 5, 6); grpo_s: GRPO-S's response "
                                    "rewards shaped by each response's mean entropy share, GRPO's z-score (Eqs. 8, 9)",
                            METHODS)
    entropy_source: str = _key(DEFAULT_SOURCE, source_help(), ENTROPY_SOURCES)
    egpo_lambda: float = _key(0.4, "weight of the clipped entropy bonus; 0 <= egpo_lambda < egpo_alpha")
    egpo_alpha: float = _key(2.0, "the bonus is clipped to |A| / egpo_alpha (> 0)")
    egpo_granularity: str = _key("response", "response: one bonus per response from the span's mean entropy (EGPO); "
                                             "token: one bonus per token (Cheng et al. 2506.14758)", GRANULARITIES)
    egpo_span: str = _key("cot", "cot: the entropy inside <think> ... </think>; response: over every valid response "
                                 "token (no thinking markers needed)", SPANS)
    egpo_token_selection: str = _key("all", "all: the policy gradient over every valid response token; top_entropy: "
                                            "the 80/20 rule (Wang et al. 2506.01939), the batch's top tokens by "
                                            "entropy; top_entropy_per_response: each response's own top tokens",
                                     TOKEN_SELECTIONS)
    egpo_top_entropy_quantile: float = _key(0.2, "the fraction of the batch's (or each response's) valid response "
                                                 "tokens top_entropy keeps, in (0, 1]")
    egpo_token_reweighting: str = _key("none", "none: the advantages as computed; stare: the highest-surprisal "
                                               "tokens' advantages reweighted while the batch entropy is below a "
                                               "target (Luo et al. 2606.19236)", TOKEN_REWEIGHTINGS)
    stare_variant: str = _key("O1", "O1: the positive set's top tokens times stare_w; C2: also the negative set's "
                                    "times stare_m", STARE_VARIANTS)
    stare_top_ratio: float = _key(0.1, "the share of each advantage-sign set's valid tokens, by surprisal, that STARE "
                                       "reweights, in (0, 1]")
    stare_w: float = _key(1.1, "STARE's weight on the positive set's top-surprisal tokens (> 0)")
    stare_m: float = _key(0.9, "STARE's weight on the negative set's top-surprisal tokens, variant C2 (> 0)")
    stare_target_entropy: float = _key(0.3, "STARE reweights only while the batch's mean token entropy is below "
                                            "this")
    gtpo_alpha1: float = _key(1.0, "GTPO's weight on the outcome (Eqs. 3, 5; >= 0)")
    gtpo_alpha2: float = _key(0.1, "GTPO's weight on a token's entropy share (Eqs. 3, 5; >= 0)")
    gtpo_norm: str = _key("per_sign", "per_sign: the correct and the failed responses' token rewards z-scored each "
                                      "over the batch (Eq. 6); joint: one z-score over both (not the paper's)",
                          GTPO_NORMS)
    grpo_s_beta1: float = _key(1.0, "GRPO-S's weight on the outcome (Eq. 9; >= 0)")
    grpo_s_beta2: float = _key(0.1, "GRPO-S's weight on a response's entropy share (Eq. 9; >= 0)")
    cot_start_token_id: int | None = _key(None, "id of <think>; null: looked up from the tokenizer")
    cot_end_token_id: int | None = _key(None, "id of </think>; null: looked up from the tokenizer")

    def __post_init__(self):
        for key in ("egpo_lambda", "egpo_alpha", *SHAPING_WEIGHTS):  # the quantile's own check names its own
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"algorithm.{key} must be a number (got {value!r}); the default is "
                                 f"{ALGORITHM_DEFAULTS[key]}")
        if self.entropy_source not in ENTROPY_SOURCES:
            raise ValueError(
                f"algorithm.entropy_source={self.entropy_source!r} is not one of "
                f"{', '.join(repr(s) for s in ENTROPY_SOURCES)}"
                f"{did_you_mean(self.entropy_source, ENTROPY_SOURCES)} ({source_help()})")
        validate_method(self, ALGORITHM_DEFAULTS)
        validate_egpo_coefficients(self.egpo_lambda, self.egpo_alpha, ALGORITHM_DEFAULTS)
        validate_egpo_variant(self.egpo_granularity, self.egpo_span, ALGORITHM_DEFAULTS)
        validate_token_selection(self.egpo_token_selection, self.egpo_top_entropy_quantile)
        validate_stare(self.egpo_token_reweighting, self.stare_variant, self.stare_top_ratio, self.stare_w,
                       self.stare_m, self.stare_target_entropy)
        for key in ("cot_start_token_id", "cot_end_token_id"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"algorithm.{key} must be a token id (int >= 0) or null (got {value!r})")
        if self.cot_start_token_id is not None and self.cot_start_token_id == self.cot_end_token_id:
            raise ValueError("algorithm.cot_start_token_id and algorithm.cot_end_token_id must differ")

    @classmethod
    def from_node(cls, node) -> "EgpoAlgorithmConfig":
        """egpo's keys from an ``algorithm`` node (any mapping; a key it lacks takes its declared default), checked."""
        node = node if node is not None else {}
        values = {}
        for f in fields(cls):
            value = node.get(f.name, f.default)
            if f.type == "float" and not isinstance(value, bool) and isinstance(value, int):
                value = float(value)
            elif f.type == "str" and value is not None:
                value = str(value)
            values[f.name] = value
        return cls(**values)


ALGORITHM_KEYS = tuple(f.name for f in fields(EgpoAlgorithmConfig))
ALGORITHM_DEFAULTS = {f.name: f.default for f in fields(EgpoAlgorithmConfig)}
