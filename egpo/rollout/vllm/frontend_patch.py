"""Front-end side: the entropy column taken off vLLM's sampled-token log probs and attached to each output.

vLLM's ``LogprobsProcessor._update_sample_logprobs`` keeps only ``num_logprobs + 1`` columns of every position, so
the column :mod:`egpo.rollout.vllm.sampler_patch` appended (always the last, marked:
:mod:`egpo.rollout.vllm.entropy_column`) is taken off first: its values are kept on the request's
``LogprobsProcessor`` (``egpo_entropy``, one per generated token, in vLLM's order) and the rest goes to vLLM's own
processing unchanged. Rows without the mark (a worker that ran without the sampler patch) are left whole and the
request gets no entropy, so egpo's server stops with its message instead of vLLM's output handler failing.
``RequestState._new_completion_output`` attaches the values to the ``CompletionOutput`` as ``egpo_entropy`` as vLLM
attaches its log probs: the request's own list, by reference (cumulative and final-only outputs: no copy per engine
step), or the new tokens' values in ``DELTA`` mode. Only for an engine whose workers run the sampler patch: egpo's
vLLM server applies both.
"""

from __future__ import annotations

from egpo.rollout.vllm.entropy_column import split_entropy_column
from egpo.patching import Patch, apply_all

ENTROPY_FIELD = "egpo_entropy"
UNMARKED = "egpo_entropy_unmarked"  # set on a request's LogprobsProcessor once a step came without egpo's column


def entropy_update_sample_logprobs(original, self, logprobs_lists):
    entropy, ids, logprobs = split_entropy_column(logprobs_lists.logprob_token_ids, logprobs_lists.logprobs)
    if entropy is None:
        setattr(self, UNMARKED, True)  # an unpatched worker: vLLM's log probs go on whole, no entropy is attached
        return original(self, logprobs_lists)
    store = getattr(self, ENTROPY_FIELD, None)
    if store is None:
        store = []
        setattr(self, ENTROPY_FIELD, store)
    store.extend(entropy.tolist())  # one call per engine step and request, as vLLM's own tolist
    return original(self, logprobs_lists._replace(logprob_token_ids=ids, logprobs=logprobs))


def entropy_new_completion_output(original, self, token_ids, finish_reason, stop_reason):
    from vllm.sampling_params import RequestOutputKind

    output = original(self, token_ids, finish_reason, stop_reason)
    processor = self.logprobs_processor
    entropy = getattr(processor, ENTROPY_FIELD, None) if processor is not None else None
    if entropy is not None and not getattr(processor, UNMARKED, False):
        if self.output_kind == RequestOutputKind.DELTA:
            entropy = entropy[-len(output.token_ids):] if output.token_ids else []
        setattr(output, ENTROPY_FIELD, entropy)  # the request's own list (vLLM passes its log probs the same way)
    return output


UPDATE = Patch("vllm.v1.engine.logprobs:LogprobsProcessor._update_sample_logprobs", entropy_update_sample_logprobs)
NEW_OUTPUT = Patch("vllm.v1.engine.output_processor:RequestState._new_completion_output", entropy_new_completion_output)
PATCHES = (UPDATE, NEW_OUTPUT)


def apply_frontend_patch() -> None:
    """Idempotent. The targets are checked first."""
    from egpo.rollout.vllm.versions import check_targets

    if not UPDATE.applied():
        check_targets()
        apply_all(PATCHES)
