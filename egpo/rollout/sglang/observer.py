"""Rollout entropy through sglang's official hook (sglang >= 0.5.20): a ``SamplingObserver`` on each ``ModelRunner``.

No private sglang method is patched on these versions. egpo's ``sglang.srt.plugins`` entry point
(:mod:`egpo.rollout.sglang.plugin`) registers, through sglang's ``HookRegistry``, a hook after
``ModelRunner.__init__`` that installs :class:`EntropyObserver` on the runner (``ModelRunner.sampling_observer``),
only in the processes of an engine egpo launched. Then, per forward batch, sglang itself:

1. calls ``before_grammar(logits, sampling_info)`` on the ``[batch, vocab]`` logits after penalties and before the
   grammar mask, ``logit_bias``, custom logit processors and temperature: the entropy is taken there, with the options
   of :class:`egpo.rollout.entropy.EntropyOptions` (``temperature_scaled`` divides by the batch's own temperatures;
   greedy rows get the raw distribution's entropy);
2. hands the result to ``after_sample`` and, as a device output, to ``copy_to_host`` with its own copy function, on
   the overlap scheduler's copy event (no synchronisation of egpo's own);
3. calls ``consume(batch, commits)`` after the sampled tokens are committed to each request and before streaming:
   each newly visible token's value goes to ``Req.customized_info["output_token_entropy"]`` at that token's output
   index, so the list stays aligned with ``Req.output_ids`` (a retracted request's re-prefill overwrites from its
   index on), and lives and dies with the request;
4. streams ``customized_info`` per token from each request's send offset, and its ``TokenizerManager`` accumulates
   it into ``meta_info["output_token_entropy"]``: one value per generated token, the whole response.

Where this differs from the 0.5.6.post2 / 0.5.12 patch: the value is taken **before** the grammar mask and
``logit_bias`` (the patch saw them applied). verl's rollout requests carry neither (no structured output, no logit
bias), so the two agree there; a caller that sends either gets the entropy of the distribution before it. sglang
itself refuses an observer under speculative decoding (``supports_sampling_observer``), which egpo refuses before
Ray (:mod:`egpo.rollout.sglang.limits`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from egpo.errors import EntropyError
from egpo.rollout.entropy import EntropyOptions, token_entropy, warm_compiled_kernel
from egpo.rollout.sglang import META_KEY  # also the Req.customized_info key: sglang copies it over

MODEL_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
INIT_TARGET = f"{MODEL_RUNNER}.__init__"


class EntropyObserver:
    """sglang's ``SamplingObserver`` protocol (duck-typed: nothing is imported from sglang)."""

    def __init__(self, options: EntropyOptions):
        self.options = options
        self.warmed = False

    def is_active(self, sampling_info) -> bool:
        return True

    def before_grammar(self, logits: torch.Tensor, sampling_info) -> torch.Tensor:
        # computed now: the grammar mask, logit bias and the sampler's temperature division change logits in place
        options = self.options
        compiled = logits.is_cuda
        if compiled and not self.warmed:
            self.warmed = True
            warm_compiled_kernel(options.kernel_width(logits.shape[-1]), logits.device,
                                 temperature_scaled=options.temperature_scaled)
        temperature = None
        if options.temperature_scaled and getattr(sampling_info, "temperatures", None) is not None:
            temperature = sampling_info.temperatures.reshape(-1)
        return token_entropy(logits, top_k=options.top_k, temperature=temperature, compiled=compiled)

    def after_sample(self, state: torch.Tensor, token_ids) -> "EntropyDeviceOutput":
        return EntropyDeviceOutput(state)


@dataclass(frozen=True)
class EntropyDeviceOutput:
    entropy: torch.Tensor  # (batch,) fp32, a fresh tensor (never a CUDA-graph buffer)

    def copy_to_host(self, copy_tensor) -> "EntropyHostOutput":
        return EntropyHostOutput(copy_tensor(self.entropy))


class ObserverCommitError(EntropyError):
    pass


@dataclass(frozen=True)
class EntropyHostOutput:
    entropy: torch.Tensor  # on the host, after sglang's copy event

    def consume(self, batch, commits) -> None:
        values = self.entropy.tolist()  # one conversion per batch, after sglang synchronised its copy
        for req, value, commit in zip(batch.reqs, values, commits, strict=True):
            if commit is None:
                continue  # no newly visible token (a prefill chunk that is not the last)
            if len(commit.token_ids) != 1:
                raise ObserverCommitError(
                    f"sglang committed {len(commit.token_ids)} tokens for one sampled row (request {req.rid}): "
                    "egpo's entropy covers one token per forward; speculative decoding is not supported")
            info = req.customized_info
            if info is None:
                info = req.customized_info = {}
            seq = info.setdefault(META_KEY, [])
            del seq[commit.output_index:]  # a re-prefill after retraction restarts from its index
            if len(seq) != commit.output_index:
                raise ObserverCommitError(
                    f"request {req.rid}: sglang committed output index {commit.output_index} with "
                    f"{len(seq)} entropy values before it")
            seq.append(value)


def install_observer(model_runner, options: EntropyOptions) -> None:
    """On one ``ModelRunner`` (in the scheduler process); sglang's setter refuses a sampling path it cannot observe."""
    try:
        model_runner.sampling_observer = EntropyObserver(options)
    except ValueError as err:
        from egpo.rollout.sglang.versions import SglangPatchTargetError

        raise SglangPatchTargetError(
            f"sglang refused egpo's entropy observer ({err}): speculative decoding and dLLM sampling have no "
            "per-token observer; egpo's start-up checks refuse them for rollout entropy") from None


def check_observer_targets() -> None:
    """The official hook's shape in the installed sglang (in the launching process, before sglang starts)."""
    import inspect

    from egpo.rollout.sglang.versions import SglangPatchTargetError, import_target, sglang_version

    model_runner = import_target("sglang.srt.model_executor.model_runner").ModelRunner
    sampling_info = import_target("sglang.srt.sampling.sampling_batch_info").SamplingBatchInfo
    tokenizer_manager = import_target("sglang.srt.managers.tokenizer_manager").TokenizerManager
    import_target("sglang.srt.sampling.sampling_observer")
    problems = []
    prop = inspect.getattr_static(model_runner, "sampling_observer", None)
    if not isinstance(prop, property) or prop.fset is None:
        problems.append("ModelRunner.sampling_observer is not a settable property")
    if not callable(getattr(model_runner, "supports_sampling_observer", None)):
        problems.append("ModelRunner.supports_sampling_observer is gone")
    hook = getattr(sampling_info, "apply_logits_bias_with_observer", None)
    if hook is None or tuple(inspect.signature(hook).parameters)[1:] != ("logits", "observer"):
        problems.append("SamplingBatchInfo.apply_logits_bias_with_observer(logits, observer) is gone")
    if not hasattr(tokenizer_manager, "_accumulate_request_meta_info"):
        problems.append("TokenizerManager no longer accumulates customized_info into meta_info")
    if problems:
        raise SglangPatchTargetError(f"sglang {sglang_version()}: " + "; ".join(problems) +
                                     ". egpo.rollout.sglang.observer was written against sglang 0.5.20-0.5.23.")
