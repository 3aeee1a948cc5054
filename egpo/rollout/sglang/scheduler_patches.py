"""Scheduler-process patches: carry each sampled token's entropy from the sampler to the detokenizer.

Applied inside sglang's scheduler process (by :mod:`egpo.rollout.sglang.process_entries`), on the original
classes, each after its target's shape is checked:

* ``GenerationBatchResult.copy_to_cpu``: starts a non-blocking copy of ``logits_output.next_token_entropy``
  *before* the original records ``copy_done``, so the overlap scheduler's existing event covers it (no extra
  sync, no ``.item()``).
* ``process_batch_result_prefill`` / ``process_batch_result_decode``: the first token is sampled in prefill,
  the rest in decode; each appends ``req.output_token_entropy_val`` for exactly the requests whose
  ``output_ids`` the original appends to (same skip conditions), before the original runs, so the value is in
  place when the original streams the output (decode streams inside itself). One ``.tolist()`` per batch.
* ``stream_output_generation``: fills ``BatchTokenIDOutput.output_token_entropy_val`` (which sglang sends
  as None) with each request's values from its send offset on, the way ``output_token_logprobs_val`` is
  sliced; the values live on the ``Req`` object, so finished, aborted or retracted requests leave nothing
  behind, and a finished request's list is dropped once it has been sent.

Speculative decoding samples outside ``Sampler`` and is refused at launch (:mod:`egpo.rollout.sglang.server`).
"""

from __future__ import annotations

from egpo.patching import Patch, apply_all
from egpo.rollout.entropy import EntropyOptions
from egpo.rollout.sglang.versions import SglangPatchTargetError, check_parameters, import_target, sglang_version
from egpo.rollout.sglang.sampler_patch import ENTROPY_ATTR, apply_sampler_patch

REQ_VALUES = "output_token_entropy_val"  # on Req: every value appended so far
REQ_OFFSET = "egpo_entropy_sent_offset"  # on Req: how many of them were already sent


def _values(req) -> list:
    values = getattr(req, REQ_VALUES, None)
    if values is None:
        values = []
        setattr(req, REQ_VALUES, values)
    return values


def _batch_entropy(result) -> list | None:
    logits_output = getattr(result, "logits_output", None)
    entropy = getattr(logits_output, ENTROPY_ATTR, None) if logits_output is not None else None
    return None if entropy is None else entropy.tolist()


# ---------------------------------------------------------------------------------------------- patched methods
def copy_to_cpu_with_entropy(original, self, return_logprob, *args, **kwargs):
    logits_output = self.logits_output
    entropy = getattr(logits_output, ENTROPY_ATTR, None) if logits_output is not None else None
    if entropy is not None:
        setattr(logits_output, ENTROPY_ATTR, entropy.to("cpu", non_blocking=True))
    return original(self, return_logprob, *args, **kwargs)


def process_batch_result_prefill_with_entropy(original, self, batch, result):
    if getattr(self, "is_generation", True):
        if result.copy_done is not None:
            result.copy_done.synchronize()
        entropy = _batch_entropy(result)
        if entropy is not None:
            for req, value in zip(batch.reqs, entropy):
                # the original appends output_ids for exactly these requests
                if not (req.finished() or req.is_retracted) and req.is_chunked <= 0:
                    _values(req).append(value)
    return original(self, batch, result)


def process_batch_result_decode_with_entropy(original, self, batch, result):
    if result.copy_done is not None:
        result.copy_done.synchronize()
    entropy = _batch_entropy(result)
    if entropy is not None:
        # the original's skip rule (sglang 0.5.12 adds its MLX overlap flag; SglangTargets.decode_skip_rule)
        overlap = self.enable_overlap or getattr(self, "enable_overlap_mlx", False)
        for req, value in zip(batch.reqs, entropy):
            if overlap and (req.finished() or req.is_retracted):
                continue
            _values(req).append(value)
    return original(self, batch, result)


class _EntropyAttachingSender:
    """Stands in for ``send_to_detokenizer`` during one ``stream_output_generation`` call."""

    def __init__(self, sender, reqs):
        self._sender = sender
        self._reqs = {req.rid: req for req in reqs}

    def send_output(self, output, *args, **kwargs):
        if type(output).__name__ == "BatchTokenIDOutput" and output.output_token_entropy_val is None:
            column = []
            for rid in output.rids:
                req = self._reqs[rid]
                values = getattr(req, REQ_VALUES, None) or []
                offset = getattr(req, REQ_OFFSET, 0)
                column.append(values[offset:])
                setattr(req, REQ_OFFSET, len(values))
                if req.finished() and getattr(req, "finished_output", False):
                    setattr(req, REQ_VALUES, None)  # sent for the last time
            output.output_token_entropy_val = column
        return self._sender.send_output(output, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._sender, name)


def stream_output_generation_with_entropy(original, self, reqs, return_logprob, skip_req=None, *args, **kwargs):
    sender = self.send_to_detokenizer
    self.send_to_detokenizer = _EntropyAttachingSender(sender, reqs)
    try:
        return original(self, reqs, return_logprob, skip_req, *args, **kwargs)
    finally:
        self.send_to_detokenizer = sender


# ---------------------------------------------------------------------------------------------- install
_MIXIN = "sglang.srt.managers.scheduler_output_processor_mixin:SchedulerOutputProcessorMixin"
COPY_TO_CPU = Patch("sglang.srt.managers.utils:GenerationBatchResult.copy_to_cpu", copy_to_cpu_with_entropy)
PREFILL = Patch(f"{_MIXIN}.process_batch_result_prefill", process_batch_result_prefill_with_entropy)
DECODE = Patch(f"{_MIXIN}.process_batch_result_decode", process_batch_result_decode_with_entropy)
STREAM = Patch(f"{_MIXIN}.stream_output_generation", stream_output_generation_with_entropy)
PATCHES = (COPY_TO_CPU, PREFILL, DECODE, STREAM)  # the sampler's own: egpo.rollout.sglang.sampler_patch


def _targets() -> list[tuple[Patch, tuple[str, ...]]]:
    """Each scheduler-side patch with the parameters its target has in the installed sglang's table."""
    from egpo.rollout.sglang.versions import sglang_targets

    version = sglang_targets()
    BatchTokenIDOutput = import_target("sglang.srt.managers.io_struct").BatchTokenIDOutput
    import_target("sglang.srt.managers.scheduler_output_processor_mixin")
    import_target("sglang.srt.managers.utils")
    if "output_token_entropy_val" not in getattr(BatchTokenIDOutput, "__dataclass_fields__", {}):
        raise SglangPatchTargetError(f"sglang {sglang_version()}: BatchTokenIDOutput has no output_token_entropy_val "
                                     "field, which egpo fills")
    return [(COPY_TO_CPU, version.copy_to_cpu_params), (PREFILL, ("batch", "result")), (DECODE, ("batch", "result")),
            (STREAM, version.stream_output_params)]


def _check_decode_skip_rule(decode) -> None:
    """The decode patch appends a request's entropy exactly when the original appends its token."""
    import inspect

    from egpo.rollout.sglang.versions import sglang_targets

    rule = sglang_targets().decode_skip_rule
    if rule not in inspect.getsource(decode):
        raise SglangPatchTargetError(
            f"sglang {sglang_version()}: process_batch_result_decode no longer skips requests with {rule!r}; egpo's "
            "entropy would not line up with the output tokens"
        )


def check_scheduler_patch_targets() -> list[Patch]:
    """Every scheduler-side target's shape (also run in the parent, so a mismatch stops start-up there); the
    patches, the sampler's last."""
    from egpo.rollout.sglang.sampler_patch import FORWARD_PARAMS, SAMPLER_FORWARD

    targets = _targets() + [(SAMPLER_FORWARD, FORWARD_PARAMS)]
    for patch, params in targets:
        check_parameters(patch.original(), params, patch.dotted)
    _check_decode_skip_rule(DECODE.original())
    return [patch for patch, _ in targets]


def apply_scheduler_patches(options: EntropyOptions) -> None:
    """Sampler + scheduler patches in this process. Every target is checked before any is changed; idempotent."""
    check_scheduler_patch_targets()
    apply_sampler_patch(options)
    apply_all(PATCHES)
