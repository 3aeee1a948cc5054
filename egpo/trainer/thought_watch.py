"""Says once when a run reads the thinking span of a model that does not think.

With ``egpo_span=cot`` a response without a thinking span gets no bonus: a model that never opens ``<think>``
(an Instruct model whose tokenizer has the markers, or a policy that learned to close its thought at once)
trains plain GRPO while the run says EGPO. :class:`NeverThinksWatch` reads each step's ``egpo/no_cot_frac`` and
warns once, naming ``egpo_span``, after ``steps`` consecutive steps in which no response had a span.
"""

from __future__ import annotations

import sys

NO_COT = "egpo/no_cot_frac"
STEPS = 5


class NeverThinksWatch:
    def __init__(self, active: bool, steps: int = STEPS):
        self.active = active
        self.steps = steps
        self.run = 0  # consecutive steps without a single thinking span
        self.warned = False

    def observe(self, step_metrics: dict, step: int | None = None) -> str | None:
        """The warning (printed to stderr) the first time the run reaches ``steps``; None otherwise."""
        if not self.active or self.warned or NO_COT not in step_metrics:
            return None
        self.run = self.run + 1 if step_metrics[NO_COT] >= 1.0 else 0
        if self.run < self.steps:
            return None
        self.warned = True
        message = (
            f"[egpo] warning: no response had a thinking span (<think> ... </think>) for {self.run} consecutive "
            f"steps (up to step {step}), so the entropy bonus is 0 and this run trains GRPO. A model that does not "
            "think gets EGPO's bonus from every response token with algorithm.egpo_span=response; egpo/no_cot_frac "
            "and egpo/cot_tokens_mean show whether a thinking model stopped thinking."
        )
        print(message, file=sys.stderr, flush=True)
        return message
