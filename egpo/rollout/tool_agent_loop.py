"""verl's ``ToolAgentLoop`` with rollout entropy accumulated over every assistant turn.

verl's tool loop keeps only the first turn's ``extra_fields``, so later turns' entropy would be lost. Here the
loop's server manager is wrapped for one rollout and every generation's entropy is recorded; the result is one
value per response token, aligned with ``response_ids`` and ``response_mask``: each generated token's entropy where
``response_mask`` is 1, and 0 on tool-response, user and template tokens, exactly as verl pads their log probs.
How the turns are laid out follows how the installed verl builds the response (:mod:`egpo.compat.rollout`):

* verl 0.7.1 appends each turn's tokens whole: the turns' values, in order, go onto the positions where
  ``response_mask`` is 1 (:func:`lay_entropy_on_mask`);
* verl 0.9.1 merges tokens with Continuous Token, which may insert template tokens and trim generated ones at a
  turn's boundary (a GLM assistant turn's ``<|observation|>`` stop token, for one). After each merge the entropy goes
  through verl's own ``align_response_metadata`` with the same ``MergeResult`` as the log probs, the turn's entropy
  in the log probs' place, so it takes exactly the log probs' edits (:class:`MergedEntropy`).

:class:`egpo.rollout.agent_loop.EntropyAgentLoopWorker` registers this loop under verl's own name
``tool_agent``, so data sets that ask for ``tool_agent`` get it without changes.
"""

from __future__ import annotations

import torch
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

from egpo.compat.rollout import tool_loop_merges_tokens
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


class MergedEntropy:
    """The response's entropy kept through verl's Continuous Token merges, beside verl's response mask.

    ``history`` holds (response mask, entropy) after every merge: verl may drop a merge's result (a tool turn that
    would overrun ``response_length`` ends the rollout before the merged mask is kept), so the final entropy is
    the one whose mask is the response mask verl returned.
    """

    def __init__(self, builder):
        self.builder = builder
        self.entropy: list[float] = []
        self.history: list[tuple[list[int], list[float]]] = [([], [])]
        self.complete = True

    def follow(self, merge_result, response_mask: list[int], turn_entropy: list[float] | None = None) -> None:
        """Apply one merge; ``turn_entropy`` for an assistant merge (None when the server returned none)."""
        if not self.complete:
            return
        if merge_result.kind == "assistant" and turn_entropy is None:
            self.complete = False
            return
        if len(self.entropy) != len(response_mask):
            raise RuntimeError(f"egpo's rollout entropy covers {len(self.entropy)} response tokens, verl's response "
                               f"mask {len(response_mask)}: a merge was not followed")
        if merge_result.kind == "assistant" and len(turn_entropy) != merge_result.appended_token_count:
            raise RuntimeError(f"an assistant turn returned {len(turn_entropy)} entropy values for "
                               f"{merge_result.appended_token_count} generated tokens")
        mask, entropy = self.builder.align_response_metadata(
            merge_result, response_mask, self.entropy,
            **({"assistant_logprobs": list(turn_entropy)} if merge_result.kind == "assistant" else {}))
        self.entropy = entropy
        self.history.append((mask, entropy))

    def for_response(self, response_mask: list[int], response_length: int) -> list[float] | None:
        """The entropy aligned with verl's final (already cut) ``response_mask``; None when a turn had none."""
        if not self.complete:
            return None
        for mask, entropy in reversed(self.history):
            if mask[:response_length] == list(response_mask):
                return [float(v) for v in entropy[:response_length]]
        raise RuntimeError("verl's final response mask matches none of the merges egpo followed")


class EntropyToolAgentLoop(ToolAgentLoop):
    async def run(self, sampling_params, **kwargs):
        recorder = EntropyRecordingServerManager(self.server_manager)
        self.server_manager = recorder
        self._egpo_merged = MergedEntropy(getattr(self, "continuous_token_builder", None))
        try:
            output = await super().run(sampling_params, **kwargs)
        finally:
            self.server_manager = recorder._inner
        output.extra_fields.pop(ROLLOUT_ENTROPY, None)  # verl copied only the first turn's
        if not recorder.turns:
            return output
        if tool_loop_merges_tokens():
            entropy = self._egpo_merged.for_response(output.response_mask, self.response_length)
        elif all(turn is not None for turn in recorder.turns):
            entropy = lay_entropy_on_mask(recorder.turns, output.response_mask)
        else:
            entropy = None
        if entropy is not None:
            output.extra_fields[ROLLOUT_ENTROPY] = entropy
        return output

    # verl >= 0.9: every Continuous Token merge, followed by the entropy (verl 0.7.1 has no such methods)
    async def ct_merge_assistant_token(self, runtime_token_ids, assistant_token_ids, response_mask,
                                       response_logprobs=None, assistant_logprobs=None):
        result = await super().ct_merge_assistant_token(runtime_token_ids, assistant_token_ids, response_mask,
                                                        response_logprobs, assistant_logprobs=assistant_logprobs)
        self._egpo_merged.follow(result[0], response_mask, self.server_manager.turns[-1])
        return result

    async def ct_merge_context_msg(self, previous_messages, updated_messages, runtime_token_ids, response_mask,
                                   response_logprobs=None, tools=None):
        result = await super().ct_merge_context_msg(previous_messages, updated_messages, runtime_token_ids,
                                                    response_mask, response_logprobs, tools=tools)
        self._egpo_merged.follow(result[0], response_mask)
        return result
