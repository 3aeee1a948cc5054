"""Rule-based reward for the demo task, following the chain-of-thought span rules.

    1.0  exactly one ``</think>``, and the text after it starts with the correct number
    0.5  exactly one ``</think>``, but the answer after it is wrong or missing
    0.0  the response never closes its thinking, or closes it more than once

The middle grade makes rewards differ within a group even for a random-weight model, so the GRPO
advantage (and with it the EGPO bonus, bounded by |A|) is non-zero from the first step.
"""

from __future__ import annotations

import re

END_THINK = "</think>"
LEADING_NUMBER = re.compile(r"\s*(-?\d+)")


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    if solution_str.count(END_THINK) != 1:
        return 0.0
    match = LEADING_NUMBER.match(solution_str.split(END_THINK, 1)[1])
    return 1.0 if match and match.group(1) == str(ground_truth).strip() else 0.5


def compute_score_no_thinking(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """The same task for a model without thinking markers (``build_tokenizer(with_think_tokens=False)``): 1.0 when
    the response starts with the correct number, 0.5 when it starts with another number, 0.0 otherwise."""
    match = LEADING_NUMBER.match(solution_str)
    if not match:
        return 0.0
    return 1.0 if match.group(1) == str(ground_truth).strip() else 0.5


def compute_score_solved(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """The demo's outcome as GTPO and GRPO-S count it (``egpo.pass_at_k.solved_score=1.0``): 1.0 for a correct answer
    after one ``</think>``, 0.0 for anything else (no half credit for the format). ``custom_reward_function.name=
    compute_score_solved`` trains GRPO on it, to tell their shaping apart from their outcome (docs/gtpo.md)."""
    return 1.0 if compute_score(data_source, solution_str, ground_truth, extra_info) == 1.0 else 0.0
