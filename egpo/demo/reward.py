"""Rule-based reward for the demo task: the answer comes after ``</think>``.

    1.0  the text after the last ``</think>`` starts with the correct answer
    0.5  the response closes its thinking (``</think>``) but the answer is wrong or missing
    0.0  the response never closes its thinking

The middle grade makes rewards differ within a group even for a random-weight model, so the GRPO
advantage (and with it the EGPO bonus, bounded by |A|) is non-zero from the first step.
"""

from __future__ import annotations

END_THINK = "</think>"


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    if END_THINK not in solution_str:
        return 0.0
    answer = solution_str.rsplit(END_THINK, 1)[1].strip()
    return 1.0 if answer.startswith(str(ground_truth).strip()) and answer else 0.5
