"""verl's ``ToolAgentLoop`` with rollout entropy accumulated over every assistant turn.

verl's tool loop keeps only the first turn's ``extra_fields`` (``tool_agent_loop.py``), so later turns'
entropy would be lost. Here the loop's server manager is wrapped for one rollout: every generation's entropy
is recorded in call order, and at the end the values are laid onto the response where ``response_mask`` is 1
(the assistant tokens, in order); tool-response and user tokens get 0, exactly as verl pads their log probs.
The result is one value per response token, aligned with ``response_ids`` and ``response_mask``.

:class:`egpo.rollout.agent_loop.EntropyAgentLoopWorker` registers this loop under verl's own name
``tool_agent``, so data sets that ask for ``tool_agent`` get it without changes.
"""

from __future__ import annotations

import torch
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

from egpo.keys import ROLLOUT_ENTROPY


class EntropyRecordingServerManager:
    """Forwards ``generate`` to verl's server manager and records each output's entropy (None if absent)."""

    def __init__(self, inner):
        self._inner = inner
        self.turns: list[list[float] | None] = []

    async def generate(self, *args, **kwargs):
        output = await self._inner.generate(*args, **kwargs)
        self.turns.append(output.extra_fields.get(ROLLOUT_ENTROPY))
        return output

    def __getattr__(self, name):
        return getattr(self._inner, name)


def lay_entropy_on_mask(turns: list[list[float]], response_mask: list[int]) -> list[float]:
    """Assistant-turn entropies, in order, onto the positions where ``response_mask`` is 1; 0 elsewhere."""
    mask = torch.tensor(response_mask, dtype=torch.bool)
    values = torch.tensor([v for turn in turns for v in turn], dtype=torch.float32)
    needed = int(mask.sum())
    if values.numel() < needed:
        raise RuntimeError(
            f"{values.numel()} entropy values for {needed} generated response tokens: a turn's entropy is incomplete"
        )
    out = torch.zeros(len(response_mask), dtype=torch.float32)
    out[mask] = values[:needed]
    return out.tolist()


class EntropyToolAgentLoop(ToolAgentLoop):
    async def run(self, sampling_params, **kwargs):
        recorder = EntropyRecordingServerManager(self.server_manager)
        self.server_manager = recorder
        try:
            output = await super().run(sampling_params, **kwargs)
        finally:
            self.server_manager = recorder._inner
        output.extra_fields.pop(ROLLOUT_ENTROPY, None)  # verl copied only the first turn's
        if recorder.turns and all(turn is not None for turn in recorder.turns):
            output.extra_fields[ROLLOUT_ENTROPY] = lay_entropy_on_mask(recorder.turns, output.response_mask)
        return output
