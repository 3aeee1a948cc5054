"""The verl versions egpo is tested with, one table: what egpo relies on in each and the engines each pins. Any other
verl stops start-up naming them.

The sglang and vLLM tables (``egpo/rollout/sglang/versions.py``, ``egpo/rollout/vllm/versions.py``) hold what egpo
patches in each engine; which verl pins which engine is stated here, once, and their messages are built from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from egpo.errors import IncompatibleDependencyError

_ACTOR = "actor_rollout_ref.actor"


@dataclass(frozen=True)
class ActorEntropyKeys:
    """Where one verl FSDP actor reads the settings of its old-policy entropy (:mod:`egpo.preflight.actor_entropy`)."""

    chunked: str  # turns on the chunked fp32 entropy (read on the remove-padding path only)
    compile: tuple[str, ...]  # compile that function (``torch.compile(..., dynamic=True)``)
    follows_param_dtype: bool  # the forward autocasts to ``mixed_precision.param_dtype`` (else bf16 always)


@dataclass(frozen=True)
class WorkerFamily:
    """One family of verl's actor/rollout workers on one verl (:mod:`egpo.compat.workers`), and egpo's for it."""

    verl_worker: str  # verl's FSDP actor/rollout worker
    cpu_worker: str  # egpo's worker extending it on a CPU
    probe_worker: str | None  # egpo's probe worker (None: the probe hooks no worker of this family)
    actor_entropy: ActorEntropyKeys
    cpu_needs_fsdp2: bool  # on a CPU its FSDP config's strategy must be fsdp2 (FSDP1 there wants a GPU device id)
    # actor strategies whose engine reads its entropy settings from a config of its own, not the FSDP actor's
    # (actor.strategy -> its keys); fsdp, fsdp2 read actor_entropy, megatron has fp32 logits (no key to set)
    strategy_entropy: tuple[tuple[str, ActorEntropyKeys], ...] = ()

    def entropy_keys(self, strategy: str) -> ActorEntropyKeys | None:
        """Where an actor of this strategy reads its entropy settings; None for a strategy egpo has no entry for."""
        if strategy in ("fsdp", "fsdp2"):
            return self.actor_entropy
        return dict(self.strategy_entropy).get(strategy)


_ENGINE = "verl.workers.engine_workers.ActorRolloutRefWorker"
_CPU_ENGINE = "egpo.cpu.engine_worker.CpuEngineActorRolloutRefWorker"
# 0.7.1's legacy actor reads the actor's keys and autocasts to param_dtype; 0.7.1's engine reads its FSDP config's
# keys (not linked to the actor's) and autocasts to bf16 whatever param_dtype says; 0.9.1's engine reads the FSDP
# config's, which default to the actor's. The chunked function loops over the token count, so a compiled one
# specializes on it: 8 recompiles per worker under dynamic batching, then eager for the rest of the run.
_WORKERS_071 = {
    "legacy": WorkerFamily(
        "verl.workers.fsdp_workers.AsyncActorRolloutRefWorker", "egpo.cpu.worker.CpuActorRolloutRefWorker",
        "egpo.probe.worker.ProbeActorRolloutRefWorker",
        ActorEntropyKeys(f"{_ACTOR}.entropy_from_logits_with_chunking",
                         (f"{_ACTOR}.use_torch_compile", f"{_ACTOR}.fsdp_config.use_torch_compile"), True),
        cpu_needs_fsdp2=False),
    "engine": WorkerFamily(
        _ENGINE, _CPU_ENGINE, None,
        ActorEntropyKeys(f"{_ACTOR}.fsdp_config.entropy_from_logits_with_chunking",
                         (f"{_ACTOR}.fsdp_config.use_torch_compile",), False),
        cpu_needs_fsdp2=True),
}
_WORKERS_091 = {
    "engine": WorkerFamily(
        _ENGINE, _CPU_ENGINE, "egpo.probe.engine_worker.ProbeEngineActorRolloutRefWorker",
        ActorEntropyKeys(f"{_ACTOR}.entropy_from_logits_with_chunking", (f"{_ACTOR}.fsdp_config.use_torch_compile",),
                         True),
        cpu_needs_fsdp2=False,
        # VeOmni's and TorchTitan's engines read their own config (actor.veomni, actor.torchtitan: verl 0.9.1
        # workers/engine/{veomni,torchtitan}/transformer_impl.py), whose actor configs have no FSDP keys; the
        # chunked function casts each chunk to fp32 whatever their forward's dtype
        strategy_entropy=tuple(
            (name, ActorEntropyKeys(f"{_ACTOR}.{name}.entropy_from_logits_with_chunking",
                                    (f"{_ACTOR}.{name}.use_torch_compile",), False))
            for name in ("veomni", "torchtitan"))),
}


@dataclass(frozen=True)
class VerlStack:
    install: str  # egpo's install line for this stack
    sglang: str  # the sglang verl pins (egpo patches it, or observes it from 0.5.20)
    vllm: str  # the vLLM verl pins
    runner_module: str  # the module of verl's task runner (egpo.compat.entry)
    runner_base: str  # the task runner class egpo's extends
    manager_owns_replicas: bool  # the agent-loop manager builds the rollout replicas (egpo.compat.rollout)
    tool_loop_merges_tokens: bool  # the tool-agent loop's response is one merged token list (egpo.compat.rollout)
    rollout_seed_key: str | None  # verl's own rollout seed, which its vLLM server offsets by replica (egpo.compat.seeds)
    has_v1_trainer: bool  # trainer.use_v1 (verl's TransferQueue trainer) exists
    legacy_worker_settings: tuple[str, ...]  # trainer.use_legacy_worker_impl values building the legacy workers
    padding_needs_flash_attn: bool  # verl.utils.attention_utils imports flash-attn off an NPU (egpo.cpu.padding)
    note: str  # what else the stack holds, for the install hint
    transformers: str  # the transformers versions the stack runs with (a pip specifier; egpo's extra pins the same)
    undeclared_imports: tuple[str, ...]  # what verl's trainer imports without declaring it (egpo declares them)
    flash_attn_install: str  # on a GPU: the line that brings the flash-attn verl's default attention needs
    gpu_engine_install: dict[str, str]  # on a GPU: the line that installs each rollout engine beside this stack
    empty_server_manager: str | None  # verl's way to build no rollout servers (egpo.compat.rollout), where it has one
    workers: dict[str, WorkerFamily]  # its actor/rollout worker families (egpo.compat.workers), by name
    vllm_on_cpu: bool  # verl's vLLM path runs on a CPU with vLLM's CPU build (egpo.cpu.vllm_rollout)
    # with chunked prefill off, verl raises rollout.max_num_batched_tokens to max_model_len before vLLM sees it (else
    # vLLM refuses the pair at engine start: egpo.preflight.batch.prefill_budget_findings)
    raises_prefill_budget: bool
    loads_verl_plugins: bool  # verl imports the "verl.plugins" entry points in every process (egpo's policy loss)


VERL = {
    "0.7.1": VerlStack(install="pip install -e '.[verl071]'", sglang="0.5.6.post2", vllm="0.12.0",
                       runner_module="verl.trainer.main_ppo", runner_base="TaskRunner", manager_owns_replicas=True,
                       tool_loop_merges_tokens=False, rollout_seed_key=None, has_v1_trainer=False,
                       legacy_worker_settings=("auto", "enable"), padding_needs_flash_attn=True,
                       note="transformers 4.57.1", transformers="==4.57.1", undeclared_imports=(),
                       # verl[gpu] leaves it unpinned: the release verl 0.9.1 pins, built against this stack's torch
                       flash_attn_install="MAX_JOBS=4 pip install flash-attn==2.8.3 --no-build-isolation",
                       gpu_engine_install={"sglang": "pip install -e '.[verl071,sglang]'",  # egpo's extra: verl's pin
                                           "vllm": "pip install vllm==0.12.0"},
                       empty_server_manager=None,  # the agent-loop manager builds its replicas itself
                       workers=_WORKERS_071, vllm_on_cpu=False,
                       raises_prefill_budget=False,  # its vLLM pin has no CPU build for its torch
                       loads_verl_plugins=False),
    "0.9.1": VerlStack(install="pip install -e '.[verl091]'", sglang="0.5.12", vllm="0.24.0",
                       runner_module="verl.trainer.main_ppo_v0", runner_base="BaseTaskRunner",
                       manager_owns_replicas=False, tool_loop_merges_tokens=True,
                       rollout_seed_key="actor_rollout_ref.rollout.seed", has_v1_trainer=True,
                       legacy_worker_settings=(), padding_needs_flash_attn=False,
                       note="transformers 5.x, numpy 2", transformers=">=5.5.3,<5.11,!=5.6.0",
                       undeclared_imports=("uvicorn", "fastapi"),
                       # the flash-attn verl[fsdp] pins; PyPI has its source only, whose build imports torch
                       flash_attn_install="MAX_JOBS=4 pip install flash-attn==2.8.3 --no-build-isolation",
                       # verl[sglang]==0.9.1 does not resolve (sglang pins transformers 5.6.0, which verl excludes): its
                       # own dependencies without that pin (requirements/, checked against sglang's metadata)
                       gpu_engine_install={"sglang": "pip install --no-deps sglang==0.5.12 && pip install -r "
                                                     "requirements/sglang-0.5.12-gpu.txt",
                                           "vllm": "pip install vllm==0.24.0"},
                       empty_server_manager="verl.trainer.ppo.ray_trainer:LLMServerManager.create_empty",
                       workers=_WORKERS_091, vllm_on_cpu=True,
                       raises_prefill_budget=True, loads_verl_plugins=True),
}
# the engines verl's next release pins (verl main after 0.9.1; no verl stack of egpo's yet)
NEXT_VERL_PINS = {"sglang": "0.5.20", "vllm": "0.29.0"}
TESTED_VERL = tuple(VERL)


class UnsupportedVerlError(IncompatibleDependencyError):
    pass


def verl_version() -> str:
    """The installed verl's version, checked against :data:`TESTED_VERL`."""
    try:
        found = version("verl")
    except PackageNotFoundError:
        found = None
    if found not in TESTED_VERL:
        raise UnsupportedVerlError(f"egpo is tested with verl {' and '.join(TESTED_VERL)}; this environment has verl "
                                   f"{found}. {install_hint()}")
    return found


def environment_problems() -> list[str]:
    """What keeps the installed environment from running verl's trainer, read from package metadata alone (nothing
    is imported, so a mismatch is named before an import fails deep inside verl)."""
    import importlib.util

    from packaging.specifiers import SpecifierSet

    try:
        verl = verl_version()
    except UnsupportedVerlError as err:
        return [str(err)]
    stack, problems = VERL[verl], []
    try:
        transformers = version("transformers")
    except PackageNotFoundError:
        transformers = None
    if transformers is None or transformers not in SpecifierSet(stack.transformers):
        problems.append(f"verl {verl} runs with transformers{stack.transformers}; this environment has transformers "
                        f"{transformers}: pip install 'transformers{stack.transformers}' (or {stack.install})")
    missing = [name for name in stack.undeclared_imports if importlib.util.find_spec(name) is None]
    if missing:
        problems.append(f"verl {verl}'s trainer imports {' and '.join(missing)}, which verl does not declare and this "
                        f"environment lacks: pip install {' '.join(missing)}")
    return problems


def install_hint() -> str:
    """How to install a tested verl, built from :data:`VERL`."""
    return ("Install a tested one: " + " or ".join(f"{stack.install} (verl {v}, {stack.note})" for v, stack in
                                                  reversed(VERL.items())) + " (README, 'Install')")


def verl_stack(version: str | None = None) -> VerlStack:
    """The table entry of the installed (or given) verl."""
    return VERL[version or verl_version()]


def pinned_by(engine: str, engine_version: str) -> str | None:
    """Which verl pins this sglang or vLLM version, in words ("verl 0.9.1", "verl's next release, ..."), or None."""
    for verl, stack in VERL.items():
        if getattr(stack, engine) == engine_version:
            return f"verl {verl}"
    if NEXT_VERL_PINS.get(engine) == engine_version:
        return "verl's next release, no verl stack yet"
    return None
