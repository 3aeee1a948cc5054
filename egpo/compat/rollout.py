"""Where rollout replicas are chosen, and what egpo's agent-loop manager presets, per verl version.

* 0.7.1: ``AgentLoopManager`` owns the replicas; its ``__init__`` keeps a preset ``rollout_replica_class`` and
  ``agent_loop_workers_class``, so egpo's manager presets both.
* 0.9.1: ``LLMServerManager`` owns them (built by the trainer before the agent-loop manager, from
  ``get_rollout_replica_class(name)``); egpo registers its replicas in verl's ``RolloutReplicaRegistry`` in the
  trainer's process, and its manager presets only ``agent_loop_workers_class``.

A run that never samples (``egpo.generate --score``: the actor's recompute only) builds no rollout servers where verl
has a way to build none (``VerlStack.empty_server_manager``: 0.9.1's ``LLMServerManager.create_empty``, which verl
uses for trainers whose rollout runs elsewhere): :func:`no_rollout_servers`. On 0.7.1 the agent-loop manager builds
its replicas itself, and a score run starts them as a training run does.

How verl's tool-agent loop builds a multi-turn response (``VerlStack.tool_loop_merges_tokens``): 0.7.1 appends each turn
whole; 0.9.1 merges turns with Continuous Token (``AgentLoopBase.ct_merge_assistant_token`` /
``ct_merge_context_msg``, edits applied by ``ContinuousTokenBuilder.align_response_metadata``), which egpo's loop
follows (:mod:`egpo.rollout.tool_agent_loop`); :func:`check_tool_loop_shape` guards those methods' signatures.
"""

from __future__ import annotations

import importlib
import inspect
from contextlib import contextmanager
from typing import Iterator

from egpo.compat.versions import verl_stack, verl_version
from egpo.engines import ENGINES
from egpo.errors import IncompatibleDependencyError

# the Continuous Token methods egpo's tool loop wraps or calls, and the parameters it passes (verl >= 0.9)
CT_SIGNATURES = {
    "verl.experimental.agent_loop.agent_loop:AgentLoopBase.ct_merge_assistant_token":
        ("self", "runtime_token_ids", "assistant_token_ids", "response_mask", "response_logprobs", "assistant_logprobs"),
    "verl.experimental.agent_loop.agent_loop:AgentLoopBase.ct_merge_context_msg":
        ("self", "previous_messages", "updated_messages", "runtime_token_ids", "response_mask", "response_logprobs",
         "tools"),
    "verl.utils.tokenizer.continuous_token:ContinuousTokenBuilder.align_response_metadata":
        ("self", "merge_result", "response_mask", "response_logprobs", "assistant_logprobs"),
}
# egpo's replica for each rollout name it serves (0.9.1: registered in verl's registry under that name)
REGISTERED = {engine.name: engine.replica for engine in ENGINES.values()}
# served by egpo's replica only in a run that reads the rollout's entropy: any other run on those keeps verl's own
# replica (and any version verl accepts); the others are always egpo's under egpo's manager
ONLY_FOR_ROLLOUT_ENTROPY = tuple(engine.name for engine in ENGINES.values() if engine.only_for_rollout_entropy)


class VerlRolloutShapeError(IncompatibleDependencyError):
    pass


@contextmanager
def no_rollout_servers() -> Iterator[bool]:
    """Inside: verl's trainer builds its rollout-server manager empty (no replica launched, no engine started), where
    this verl has a way to (yields whether it had). The trainer's module-level name is rebound to a subclass whose
    ``create`` is verl's ``create_empty`` for the scope, and put back after."""
    from egpo.patching import resolve

    path = verl_stack().empty_server_manager
    if path is None:
        yield False
        return
    module_name, _, qualname = path.partition(":")
    owner_name, _, method = qualname.partition(".")
    module = importlib.import_module(module_name)
    manager = resolve(f"{module_name}:{owner_name}",
                      prefix=f"verl {verl_version()}: egpo builds a score run's rollout servers empty through ",
                      advice=" (egpo.compat.versions: empty_server_manager)")
    if not inspect.ismethod(getattr(manager, method, None)):
        raise VerlRolloutShapeError(f"verl {verl_version()}: {module_name}.{qualname} is not a class method; egpo "
                                    "builds a score run's rollout servers empty through it "
                                    "(egpo.compat.versions: empty_server_manager)")
    empty = type(f"NoServers{owner_name}", (manager,), {"create": getattr(manager, method)})
    setattr(module, owner_name, empty)
    try:
        yield True
    finally:
        setattr(module, owner_name, manager)


def served_replicas(config) -> dict[str, str]:
    """The rollout names egpo's replicas serve in the run ``config`` describes (``None``: every name)."""
    from egpo.settings import EgpoSettings

    if config is None or EgpoSettings.of(config.algorithm).reads_rollout_entropy:
        return dict(REGISTERED)
    return {name: target for name, target in REGISTERED.items() if name not in ONLY_FOR_ROLLOUT_ENTROPY}


def serves_the_policy(replica) -> bool:
    """The replica rolls out the policy: not a generative reward model's or a distillation teacher's, which verl
    builds from the same registry (``is_reward_model``; 0.9.1 adds ``is_teacher_model``). Those keep verl's own
    server: no entropy patches, forced log probs or egpo launch refusals on a config egpo's checks never saw."""
    return not (getattr(replica, "is_reward_model", False) or getattr(replica, "is_teacher_model", False))


def _load_target(target: str):
    import importlib

    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def replica_class(rollout_name: str, config=None):
    """egpo's replica for the names it serves in this run (:func:`served_replicas`), verl's for every other."""
    target = served_replicas(config).get(rollout_name)
    if target is not None:
        return _load_target(target)
    return verl_replica_class(rollout_name)


def check_manager_extension_points(version: str | None = None) -> None:
    """verl's manager keeps the classes egpo presets before its ``__init__`` and has ``generate_sequences(prompts)``
    (one rollout); the worker has ``_postprocess`` and ``_run_agent_loop(sampling_params, trajectory)``."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker

    version = version or verl_version()
    source = inspect.getsource(AgentLoopManager.__init__)
    kept = ["agent_loop_workers_class", *(["rollout_replica_class"] if verl_stack(version).manager_owns_replicas else [])]
    missing = [name for name in kept if f'hasattr(self, "{name}")' not in source]
    if missing:
        raise VerlRolloutShapeError(
            f"verl {version}: AgentLoopManager.__init__ no longer keeps a preset {', '.join(missing)}; egpo's rollout "
            "entropy path cannot plug in"
        )
    if "_postprocess" not in AgentLoopWorker.__dict__:
        raise VerlRolloutShapeError(f"verl {version}: AgentLoopWorker has no _postprocess; egpo cannot add rollout entropy")
    run = AgentLoopWorker.__dict__.get("_run_agent_loop")
    if run is None or list(inspect.signature(run).parameters)[:3] != ["self", "sampling_params", "trajectory"]:
        raise VerlRolloutShapeError(
            f"verl {version}: AgentLoopWorker._run_agent_loop no longer takes (sampling_params, trajectory); egpo "
            "cannot give hf rollout requests their row's seed"
        )
    generate = inspect.unwrap(getattr(AgentLoopManager, "generate_sequences", None) or (lambda: None))
    if not inspect.iscoroutinefunction(generate) or list(inspect.signature(generate).parameters) != ["self", "prompts"]:
        raise VerlRolloutShapeError(
            f"verl {version}: AgentLoopManager.generate_sequences is no longer a coroutine taking one rollout's prompts; "
            "egpo cannot announce each rollout's request count to the hf rollout server"
        )
    check_tool_loop_shape(version)


def prepare_manager(manager, config) -> None:
    """In egpo's manager, before verl's ``__init__``: the checks, and the replica class where the manager owns it."""
    version = verl_version()
    check_manager_extension_points(version)
    if verl_stack(version).manager_owns_replicas:
        manager.rollout_replica_class = replica_class(config.actor_rollout_ref.rollout.name, config)


def register_replicas(config=None) -> None:
    """In the trainer's process, before its workers start (0.9.1: the replicas' owner resolves them by name): egpo's
    replicas for the names it serves in this run, verl's own loader back for the others."""
    if verl_stack().manager_owns_replicas:
        return
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    served = served_replicas(config)
    for name, target in REGISTERED.items():
        verl_loader = RolloutReplicaRegistry._registry.get(name)
        if verl_loader is not None and getattr(verl_loader, "egpo_target", None) is None:
            _VERL_LOADERS[name] = verl_loader  # egpo's replica extends verl's: keep verl's own loader for it
        if name not in served:
            if name in _VERL_LOADERS:
                RolloutReplicaRegistry.register(name, _VERL_LOADERS[name])
            continue

        def load(target=target):
            return _load_target(target)

        load.egpo_target = target
        RolloutReplicaRegistry.register(name, load)


_VERL_LOADERS: dict = {}


def verl_replica_class(name: str):
    """verl's own replica class for ``name`` (through verl's loader, which prepares sglang's import), also where egpo
    registered its own replica under that name in this process."""
    if name in _VERL_LOADERS:
        return _VERL_LOADERS[name]()
    from verl.workers.rollout.replica import get_rollout_replica_class

    return get_rollout_replica_class(name)


def tool_loop_merges_tokens() -> bool:
    return verl_stack().tool_loop_merges_tokens


def check_tool_loop_shape(version: str | None = None) -> None:
    """Where verl merges a multi-turn response's tokens, the methods egpo's tool loop follows have the parameters it
    passes; otherwise a start-up error naming the version and the method."""
    import importlib

    version = version or verl_version()
    if not verl_stack(version).tool_loop_merges_tokens:
        return
    for target, expected in CT_SIGNATURES.items():
        module, _, qualname = target.partition(":")
        owner, _, name = qualname.partition(".")
        try:
            method = getattr(getattr(importlib.import_module(module), owner), name)
        except (ImportError, AttributeError):
            raise VerlRolloutShapeError(f"verl {version}: {module}.{qualname} is gone; egpo's multi-turn rollout "
                                        "entropy cannot follow its token merging") from None
        found = tuple(inspect.signature(method).parameters)
        if found != expected:
            raise VerlRolloutShapeError(f"verl {version}: {module}.{qualname} takes {found}, egpo's multi-turn rollout "
                                        f"entropy expects {expected}")
