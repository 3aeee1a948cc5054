"""What egpo runs on each verl stack, and the start-up refusal (before Ray) of what a stack cannot run.

Both stacks run egpo's CPU backend, the entropy probe, multi-turn rollout entropy (:mod:`egpo.compat.workers`,
:mod:`egpo.compat.rollout`) and sglang rollout entropy, each with the sglang its verl pins
(:mod:`egpo.compat.versions` says which, :mod:`egpo.rollout.sglang.versions` how it is installed). Refused here: verl 0.9.1's TransferQueue trainer, and an sglang other than
the one egpo patches for the installed verl.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from egpo.compat.versions import VERL
from egpo.errors import EgpoError
from egpo.preflight.findings import Finding, error, refused, warning


def stack_problems(config: DictConfig, version: str, described) -> list[str]:
    """What verl ``version`` cannot run of this config, whose rollout engine is ``described``
    (:class:`egpo.engines.Engine`, None: not one egpo reads entropy from)."""
    problems = []
    if VERL[version].has_v1_trainer and OmegaConf.select(config, "trainer.use_v1", default=False):
        problems.append("trainer.use_v1=true selects verl's TransferQueue trainer, whose advantage step never sees "
                        "the entropy or the responses EGPO needs; set ++trainer.use_v1=false (egpo's configs do)")
    if described is not None and described.must_match_verl_pin:  # egpo patches the version this verl pins
        import importlib

        table = importlib.import_module(described.versions)
        name = described.name
        installed, expected = getattr(table, f"installed_{name}")(), getattr(VERL[version], name)
        if installed not in (None, "not installed", expected):
            problems.append(f"actor_rollout_ref.rollout.name={name}: on verl {version} egpo patches {name} {expected} "
                            f"(the one verl {version} pins); this environment has {name} {installed}. Install it: "
                            f"{table.install_line(expected)} (on a GPU: {name}=={expected} with its dependencies)")
    return problems


def engine_installed_finding(config: DictConfig, run):
    """The rollout engine the config names is installed: verl imports it only as its workers start, after Ray started
    and the actor loaded. Not installed: an error on a CPU run and on a machine with a GPU (its workers run from this
    environment), with the install line for this verl; a warning on a machine without one (the GPU nodes may run
    their own image). None: installed, or egpo's own (hf)."""
    import importlib

    name, described = run.rollout, run.engine
    if described is None or described.versions is None:
        return None
    table = importlib.import_module(described.versions)
    if getattr(table, f"installed_{name}")() not in (None, "not installed"):
        return None
    version, stack, on_cpu = run.verl, run.stack, run.on_cpu
    if on_cpu and name == "vllm":
        return None  # the CPU build's own check names its install (egpo.preflight.cpu_backend)
    cuda_here = not on_cpu and run.cuda_here
    fix = table.install_line(stack.sglang) if on_cpu else stack.gpu_engine_install[name]
    text = (f"actor_rollout_ref.rollout.name={name}, and {name} is not installed "
            f"{'here' if on_cpu or cuda_here else 'on this machine'}: verl imports it as its workers start, after Ray "
            f"started and the actor loaded. Fix{' (a CPU run)' if on_cpu else f' (verl {version} on a GPU)'}: {fix}")
    if on_cpu or cuda_here:
        return error("engine", text)
    return warning("engine", text + " (where the GPU nodes run another image, check it there)")


FLASH_ATTENTION = "flash_attention_2"
ATTENTION_KEY = "actor_rollout_ref.model.override_config.attn_implementation"
# actor strategies whose engine reads the attention from its own config (verl 0.9.1 VeOmniEngineConfig's
# attn_implementation, default flash_attention_2), and those whose attention needs no flash_attn package
# (TorchTitan's attn_type: flex or sdpa, PyTorch's own)
STRATEGY_ATTENTION_KEYS = {"veomni": "actor_rollout_ref.actor.veomni.attn_implementation"}
STRATEGIES_WITHOUT_FLASH_ATTN = ("torchtitan",)


def attention_finding(config: DictConfig, run):
    """A GPU run's actor and reference load with verl's default attention, flash-attention 2, unless the config names
    another (verl 0.9.1 ``workers/config/model.py``, 0.7.1 ``fsdp_workers.py``: ``attn_implementation`` from
    ``override_config``); transformers refuses it at the model's load where the ``flash_attn`` package is missing, on
    every worker, after Ray started them. Stated with the install line and the other attention: an error where this
    machine has a GPU (its workers load from this environment), a warning where it has none (the run may go to GPU
    nodes of their own image). None: a CPU run, another attention, or flash_attn installed."""
    import importlib.util

    if run.on_cpu:
        return None
    strategy = run.strategy
    if strategy in STRATEGIES_WITHOUT_FLASH_ATTN:
        return None
    key = STRATEGY_ATTENTION_KEYS.get(strategy, ATTENTION_KEY)
    attention = OmegaConf.select(config, key, default=None) or FLASH_ATTENTION
    if attention != FLASH_ATTENTION or importlib.util.find_spec("flash_attn") is not None:
        return None
    cuda_here, version = run.cuda_here, run.verl
    set_or_not = f"{key}={attention}" if OmegaConf.select(config, key, default=None) else f"{key} is not set"
    text = (f"the actor loads with attention {FLASH_ATTENTION} (verl's default; {set_or_not}), and the "
            f"flash_attn package is not installed {'here' if cuda_here else 'on this machine'} (egpo's "
            f"'.[verl{version.replace('.', '')}]' does not bring it): every worker would fail at the model's load. "
            f"Fix: {run.stack.flash_attn_install} (PyPI has its source only: it compiles against the "
            "installed torch, 3-5 minutes on 64 cores with ninja by flash-attn's own account, and each compile job "
            "takes gigabytes of memory, so MAX_JOBS caps them), or PyTorch's attention, which attends over each packed "
            "micro-batch whole under a mask (on a CPU 3.4x the time of attending within each sequence, at two "
            "sequences a micro-batch: docs/benchmarks.md), instead: "
            f"{'++' if key == ATTENTION_KEY else ''}{key}=sdpa")
    return error("attention", text) if cuda_here else warning("attention", text + " (where the GPU nodes run "
                                                                                  "another image, check it there)")


def check_stack(config: DictConfig, run) -> list[Finding]:
    """The installed verl (a tested one: :func:`egpo.preflight.run_facts.read_run` refuses any other) is shaped as
    egpo relies on (:mod:`egpo.compat.verl_shapes`), and this config is one its egpo runs."""
    from egpo.compat.verl_shapes import check_verl_shapes

    try:
        check_verl_shapes(run.verl)
    except EgpoError as err:
        return [refused("stack", err)]
    problems = stack_problems(config, run.verl, run.engine)
    if problems:
        return [error("stack", f"on verl {run.verl}: " + "; ".join(problems) + ". Nothing was started.")]
    return []
