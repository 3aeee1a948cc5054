"""The sglang versions egpo patches, and each one's patch targets: the one place where they differ.

* **0.5.6.post2** (verl 0.7.1): egpo reaches sglang's scheduler processes by swapping the module attributes
  ``sglang.srt.entrypoints.engine.run_scheduler_process`` / ``run_detokenizer_process`` that its launcher starts
  them from (:mod:`egpo.rollout.sglang.process_entries`); the scheduler entry applies the patches.
* **0.5.12** (verl 0.9.1): sglang runs ``load_plugins()`` first thing in every scheduler process, loading the
  ``sglang.srt.plugins`` entry-point group: egpo's plugin (:mod:`egpo.rollout.sglang.plugin`) applies the same
  patches there, through sglang's own mechanism, and nothing of sglang's is swapped for that. Only on a CPU-only
  machine are the children's entries still swapped (the module attributes verl 0.9.1 passes to
  ``Engine._launch_subprocesses``, and ``Engine``'s class attributes for a plain ``sglang.Engine``): the CPU
  stand-ins must be installed before the child imports sglang, which happens while it unpickles its target, before
  any plugin loads, and the detokenizer loads no plugins at all.

* **0.5.20, 0.5.23** (verl's next pin is 0.5.20): sglang's official ``SamplingObserver``, installed by the same plugin
  entry point through ``HookRegistry`` (:mod:`egpo.rollout.sglang.observer`); no private method is patched. On a
  CPU-only machine the children's entries are still swapped, for the stand-ins only.

The tested versions form ranges (:data:`RANGES`; CI runs both ends of each on real engines). A version inside a range
that is not itself tested runs with the table of the bracketing tested version whose process entries it matches
(:mod:`egpo.compat.version_ranges`), and then passes the same shape checks; any other sglang stops start-up naming the
ranges.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from functools import lru_cache

from egpo.compat.version_ranges import bracket_note, candidates, describe
from egpo.compat.versions import VERL, pinned_by
from egpo.errors import IncompatibleDependencyError
from egpo.patching import parameters, resolve


@dataclass(frozen=True)
class SglangTargets:
    scheduler_entry_params: tuple[str, ...]  # sglang.srt.managers.scheduler.run_scheduler_process
    copy_to_cpu_params: tuple[str, ...]  # GenerationBatchResult.copy_to_cpu
    stream_output_params: tuple[str, ...]  # SchedulerOutputProcessorMixin.stream_output_generation
    decode_skip_rule: str  # process_batch_result_decode skips a request exactly under this condition (source text)
    patches_via_plugin: bool  # scheduler patches from sglang's sglang.srt.plugins entry point (else: process entry)
    engine_entries_on_class: bool  # Engine.run_scheduler_process_func / run_detokenizer_process_func exist
    cpu_requirements: str  # what its real engine needs on a CPU besides sglang itself (installed --no-deps)
    cpu_engine_args: tuple[tuple[str, object], ...] = ()  # engine settings a CPU run needs on top of device=cpu
    # the data-parallel controller (dp_size > 1) starts its schedulers from the entry the engine hands it, which
    # egpo reaches; 0.5.6.post2's controller binds sglang's own at import, out of egpo's reach
    data_parallel_reaches_schedulers: bool = False
    # sglang.srt.managers.data_parallel_controller.run_data_parallel_controller_process (CPU stand-in entry)
    data_parallel_controller_params: tuple[str, ...] = ("server_args", "port_args", "pipe_writer",
                                                        "run_scheduler_process_func")
    # the entropy comes from sglang's official SamplingObserver (egpo.rollout.sglang.observer): no scheduler, sampler or
    # tokenizer-manager patch; the copy_to_cpu / stream_output / decode-skip entries above are then unused
    entropy_via_observer: bool = False
    # sglang allocates pinned host tensors in its logits processor, which a CPU-only torch cannot (standins)
    pins_host_tensors: bool = True


TARGETS = {
    "0.5.6.post2": SglangTargets(
        scheduler_entry_params=("server_args", "port_args", "gpu_id", "tp_rank", "moe_ep_rank", "pp_rank", "dp_rank",
                                "pipe_writer"),
        copy_to_cpu_params=("return_logprob",),
        stream_output_params=("reqs", "return_logprob", "skip_req"),
        decode_skip_rule="if self.enable_overlap and (req.finished() or req.is_retracted):",
        patches_via_plugin=False,
        engine_entries_on_class=False,
        cpu_requirements=".ci/sglang-cpu-requirements.txt",
    ),
    "0.5.12": SglangTargets(
        scheduler_entry_params=("server_args", "port_args", "gpu_id", "tp_rank", "attn_cp_rank", "moe_dp_rank",
                                "moe_ep_rank", "pp_rank", "dp_rank", "pipe_writer"),
        copy_to_cpu_params=("return_logprob", "return_hidden_states"),
        stream_output_params=("reqs", "return_logprob", "skip_req", "is_idle_batch"),
        decode_skip_rule="if (self.enable_overlap or self.enable_overlap_mlx) and (",
        patches_via_plugin=True,
        engine_entries_on_class=True,
        cpu_requirements=".ci/sglang-0.5.12-cpu-requirements.txt",
        # piecewise CUDA graphs are on by default and turn off by themselves only with SGLANG_USE_CPU_ENGINE=1
        cpu_engine_args=(("disable_piecewise_cuda_graph", True),),
        data_parallel_reaches_schedulers=True,
    ),
}
# verl's next pin (verl main after 0.9.1; its servers are not released yet): sglang's official SamplingObserver
TARGETS["0.5.20"] = SglangTargets(
    scheduler_entry_params=("server_args", "port_args", "gpu_id", "tp_rank", "attn_cp_rank", "moe_dp_rank",
                            "moe_ep_rank", "pp_rank", "dp_rank", "pipe_writer", "display_tp_rank", "display_dp_rank",
                            "display_moe_ep_rank"),
    copy_to_cpu_params=(),
    stream_output_params=(),
    decode_skip_rule="",
    patches_via_plugin=True,
    engine_entries_on_class=True,
    cpu_requirements=".ci/sglang-0.5.20-cpu-requirements.txt",
    data_parallel_reaches_schedulers=True,
    entropy_via_observer=True,
    pins_host_tensors=False,
)
# 0.5.23: the scheduler entry lost its attention-CP / MoE-DP / EP ranks, the data-parallel controller gained
# prelaunched schedulers; the observer is the same
TARGETS["0.5.23"] = replace(
    TARGETS["0.5.20"],
    scheduler_entry_params=("server_args", "port_args", "gpu_id", "tp_rank", "pp_rank", "dp_rank", "pipe_writer",
                            "display_tp_rank", "display_dp_rank", "display_moe_ep_rank"),
    cpu_requirements=".ci/sglang-0.5.23-cpu-requirements.txt",
    data_parallel_controller_params=("server_args", "port_args", "pipe_writer", "run_scheduler_process_func",
                                     "prelaunched_schedulers"),
)
SUPPORTED = tuple(TARGETS)
RANGES = (("0.5.6.post2", "0.5.6.post2"), ("0.5.12", "0.5.12"), ("0.5.20", "0.5.23"))
STACK_PINS = tuple(stack.sglang for stack in VERL.values())  # the sglang of each released verl stack


class UnsupportedSglangError(IncompatibleDependencyError):
    pass


def installed_sglang() -> str:
    """sglang's version from its package metadata, without importing it (or "not installed")."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return "not installed"


def stack_name(sglang: str) -> str:
    """Which verl pins this sglang (egpo.compat.versions states the pins)."""
    return pinned_by("sglang", sglang) or "pinned by no verl"


def install_line(sglang: str) -> str:
    return f"pip install --no-deps sglang=={sglang} && pip install -r {TARGETS[sglang].cpu_requirements}"


def sglang_targets(version: str | None = None) -> SglangTargets:
    """The installed (or given) sglang's targets; outside the tested ranges it stops here, naming them."""
    version = version or installed_sglang()
    found = candidates(version, TARGETS, RANGES)
    if not found:
        supported = ", ".join(f"{v} ({stack_name(v)})" for v in TARGETS)
        raise UnsupportedSglangError(
            f"egpo's sglang rollout entropy supports sglang {describe(RANGES)} (tested: {supported}); this "
            f"environment has sglang {version}. Install the one your verl pins, e.g. {install_line(STACK_PINS[-1])}"
        )
    return TARGETS[found[0]] if len(found) == 1 else _matching_table(version, found)


def targets_without_import(version: str | None = None) -> SglangTargets | None:
    """What is decided before sglang is imported (the same for every version of one range); None outside them."""
    found = candidates(version or installed_sglang(), TARGETS, RANGES)
    return TARGETS[found[0]] if found else None


def untested_note(version: str | None = None) -> str | None:
    """Said once at start-up for a version inside a range that is not itself tested."""
    return bracket_note("sglang", version or installed_sglang(), TARGETS, RANGES)


def _parameters(function) -> tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


@lru_cache(maxsize=None)
def _matching_table(version: str, found: tuple[str, ...]) -> SglangTargets:
    """Of the bracketing tested versions, the first whose process entries the installed sglang has (the same answer
    in every process of one installation)."""
    scheduler = import_target("sglang.srt.managers.scheduler").run_scheduler_process
    controller = import_target("sglang.srt.managers.data_parallel_controller").run_data_parallel_controller_process
    shapes = (_parameters(scheduler), _parameters(controller))
    for tested in found:
        table = TARGETS[tested]
        if shapes == (table.scheduler_entry_params, table.data_parallel_controller_params):
            return table
    raise UnsupportedSglangError(
        f"sglang {version} lies between the tested {' and '.join(found)}, but its run_scheduler_process{shapes[0]} / "
        f"run_data_parallel_controller_process{shapes[1]} match neither table (egpo.rollout.sglang.versions). Install "
        f"a tested sglang, e.g. {install_line(found[-1])}"
    )


# sglang's switch for chunked log-prob processing (both versions: sglang.srt.environ.Envs, chunks of
# SGLANG_LOGITS_PROCESSER_CHUNK_SIZE=2048 rows). egpo always asks for log probs, so a retracted request's re-prefill
# computes input log probs over every token it had generated, unchunked by default: up to chunked_prefill_size x
# vocabulary logits in fp32, allocated exactly when the KV pool ran out. egpo's server turns chunking on.
CHUNKED_LOGPROBS_ENV = "SGLANG_ENABLE_LOGITS_PROCESSER_CHUNK"


def chunked_logprob_env() -> dict[str, str]:
    """The environment that bounds sglang's log-prob memory, for egpo's server to export before sglang starts (a value
    already set is kept); stops if the installed sglang no longer reads the variable."""
    from sglang.srt.environ import envs

    if not hasattr(envs, CHUNKED_LOGPROBS_ENV):
        raise UnsupportedSglangError(
            f"sglang {installed_sglang()} has no {CHUNKED_LOGPROBS_ENV} (sglang.srt.environ): egpo cannot bound the "
            f"log-prob memory of re-prefilled requests; egpo supports sglang {', '.join(SUPPORTED)}")
    return {CHUNKED_LOGPROBS_ENV: "1"}


# Shape checks for every sglang patch target: a mismatch stops start-up naming the version and the target.
class SglangPatchTargetError(IncompatibleDependencyError):
    """An sglang function or attribute egpo patches no longer has the shape egpo was written against."""


def sglang_version() -> str:
    return installed_sglang()


def check_parameters(target, expected: tuple[str, ...], name: str) -> None:
    """``target``'s parameters (after ``self``) must be exactly ``expected``, in order."""
    try:
        params = parameters(target)
    except (TypeError, ValueError) as err:
        raise SglangPatchTargetError(f"{name}: cannot read its signature ({err})") from None
    if params != expected:
        raise SglangPatchTargetError(
            f"sglang {sglang_version()}: {name} has parameters {params}, egpo's patch expects {expected}. egpo "
            f"patches sglang {', '.join(SUPPORTED)} (egpo.rollout.sglang.versions); install one of them or update "
            "that table."
        )


def import_target(module: str):
    """An sglang module egpo patches; a moved or missing one stops start-up with this guard's message, naming the
    installed and the supported versions (not an ImportError from deep inside egpo)."""
    return resolve(module, SglangPatchTargetError, prefix=f"sglang {sglang_version()}: ",
                   advice=f"; egpo patches sglang {', '.join(SUPPORTED)} (egpo.rollout.sglang.versions)")
