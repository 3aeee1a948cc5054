"""What egpo relies on in verl's source without calling it: attributes it sets for verl to read, and values verl
computes whatever the config says. One table per verl version, read before Ray starts.

egpo sets some of verl's hooks by attribute (a replica's ``server_class``, the manager's preset
``agent_loop_workers_class``). A verl that stops reading the attribute would not fail: it would start its own server or
worker, and the run would stop at its first batch ("the rollout returned no per-token entropy"). egpo also reads the
old-policy recompute's entropy, which both verls compute unconditionally; were it gated on
``actor.calculate_entropy`` (which also turns on the update-time entropy, tens of GB at a Qwen3 recipe's token budget),
egpo would have to set that flag. And egpo keeps a run's agent-loop and reward-loop workers on its own nodes by
narrowing what ``ray.nodes()`` lists while verl places them (:mod:`egpo.trainer.placement`). Each reliance is checked here by reading the method's source (parsed, not imported:
the sglang and vLLM replicas' modules need their engines to import), so such a verl is refused at start-up naming its
version, the method and what egpo would lose.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from egpo.compat.versions import verl_version
from egpo.errors import IncompatibleDependencyError


@dataclass(frozen=True)
class Reliance:
    target: str  # "module:Class.method"
    reads: str  # text the method's source must contain
    loses: str  # what egpo loses where it does not


SERVER_CLASS = "self.server_class"
_SGLANG_REPLICA = "verl.workers.rollout.sglang_rollout.async_sglang_server:SGLangReplica.launch_servers"
_VLLM_REPLICA = "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMReplica.launch_servers"
_REPLICA_SERVERS = (
    Reliance(_SGLANG_REPLICA, SERVER_CLASS, "egpo's sglang server (rollout entropy) would be replaced by verl's"),
    Reliance(_VLLM_REPLICA, SERVER_CLASS, "egpo's vLLM server (rollout entropy) would be replaced by verl's"),
)
_MANAGER_WORKERS = Reliance("verl.experimental.agent_loop.agent_loop:AgentLoopManager.__init__",
                            'hasattr(self, "agent_loop_workers_class")',
                            "egpo's agent-loop workers (rollout entropy into the batch, hf seeds) would be verl's")
_PLACEMENT = (
    Reliance("verl.experimental.agent_loop.agent_loop:AgentLoopManager._init_agent_loop_workers", "ray.nodes()",
             "a run's agent-loop workers could land on other runs' nodes"),
    Reliance("verl.experimental.reward_loop.reward_loop:RewardLoopManager._init_reward_loop_workers", "ray.nodes()",
             "a run's reward-loop workers could land on other runs' nodes"),
    Reliance("verl.trainer.ppo.ray_trainer:RayPPOTrainer.init_workers", "create_resource_pool()",
             "egpo could not tell the run's nodes before its workers are placed"),
)
# egpo.trainer.validation_after_log wraps the logger fit builds from this import
_VALIDATION_AFTER_LOG = Reliance("verl.trainer.ppo.ray_trainer:RayPPOTrainer.fit",
                                 "from verl.utils.tracking import Tracking",
                                 "a save step's validation would run before the step is logged, and a run stopped in "
                                 "it would lose the step's metrics or train a save interval again")
_OLD_POLICY_ENTROPY = "the old-policy entropy would need actor.calculate_entropy=true, which also computes (and on verl " \
                      "0.9.1 backpropagates) a full-vocabulary entropy in every update micro-batch"

VERL_RELIANCES: dict[str, tuple[Reliance, ...]] = {
    "0.7.1": (
        # legacy FSDP / Megatron workers (verl's default), and the engine path (use_legacy_worker_impl=disable)
        Reliance("verl.workers.fsdp_workers:ActorRolloutRefWorker.compute_log_prob", "calculate_entropy = not is_lora",
                 _OLD_POLICY_ENTROPY),
        Reliance("verl.workers.megatron_workers:ActorRolloutRefWorker.compute_log_prob",
                 "calculate_entropy=not is_lora", _OLD_POLICY_ENTROPY),
        Reliance("verl.trainer.ppo.ray_trainer:RayPPOTrainer._compute_old_log_prob", "calculate_entropy=True",
                 _OLD_POLICY_ENTROPY),
        Reliance("verl.experimental.agent_loop.agent_loop:AgentLoopManager.__init__",
                 'hasattr(self, "rollout_replica_class")', "egpo's rollout replicas would be verl's"),
        _MANAGER_WORKERS,
        *_REPLICA_SERVERS,
        *_PLACEMENT,
        _VALIDATION_AFTER_LOG,
    ),
    "0.9.1": (
        Reliance("verl.trainer.ppo.ray_trainer:RayPPOTrainer._compute_old_log_prob", "calculate_entropy=True",
                 _OLD_POLICY_ENTROPY),
        # egpo.compat.rollout.no_rollout_servers rebinds the trainer module's name for a score run
        Reliance("verl.trainer.ppo.ray_trainer:RayPPOTrainer.init_workers", "LLMServerManager.create(",
                 "egpo.generate --score would start rollout servers it never uses"),
        Reliance("verl.workers.rollout.llm_server:LLMServerManager.create_empty", "rollout_replicas = []",
                 "egpo.generate --score would start rollout servers it never uses"),
        _MANAGER_WORKERS,
        *_REPLICA_SERVERS,
        *_PLACEMENT,
        _VALIDATION_AFTER_LOG,
    ),
}


class VerlShapeError(IncompatibleDependencyError):
    pass


RAY_ACTOR_REMOTE = ("self", "args", "kwargs", "actor_options")  # ray.actor.ActorClass._remote, which egpo wraps


def check_ray_shape() -> None:
    """Ray's ``ActorClass._remote(args, kwargs, **actor_options)``, through which every actor is created and which
    egpo wraps while a run builds its workers (:mod:`egpo.trainer.placement`)."""
    import inspect

    import ray
    from ray.actor import ActorClass

    params = tuple(inspect.signature(ActorClass._remote).parameters)
    if params != RAY_ACTOR_REMOTE:
        raise VerlShapeError(f"ray {ray.__version__}: ActorClass._remote takes {params}, egpo expects {RAY_ACTOR_REMOTE} "
                             "to keep a run's actors on its own nodes; install the Ray your verl pins. Nothing was "
                             "started.")


@lru_cache(maxsize=None)
def _module_tree(module: str) -> tuple[ast.Module, str] | None:
    """The parsed file of ``module``, found from its top package's folder: no package on the way is imported (verl's
    ``vllm_rollout/__init__`` imports vLLM)."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root, *rest.split(".")).with_suffix(".py")
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            return ast.parse(text), text
    return None


def method_source(target: str) -> str | None:
    """The source text of ``module:Class.method`` as written in the installed file (None where it is gone)."""
    module, _, qualname = target.partition(":")
    owner, _, name = qualname.partition(".")
    parsed = _module_tree(module)
    if parsed is None:
        return None
    tree, text = parsed
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == owner:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                    return ast.get_source_segment(text, item)
    return None


def shape_problems(version: str) -> list[str]:
    problems = []
    for reliance in VERL_RELIANCES[version]:
        source = method_source(reliance.target)
        if source is None:
            problems.append(f"{reliance.target} is gone ({reliance.loses})")
        elif reliance.reads not in source:
            problems.append(f"{reliance.target} no longer has `{reliance.reads}` ({reliance.loses})")
    return problems


def check_verl_shapes(version: str | None = None) -> None:
    """Every reliance of this verl's table holds, or one start-up error naming the version and each target."""
    version = version or verl_version()
    check_ray_shape()
    problems = shape_problems(version)
    if problems:
        raise VerlShapeError(
            f"verl {version} is not the verl {version} egpo was tested with: " + "; ".join(problems) +
            f". Reinstall verl=={version} (README, 'Install'); nothing was started."
        )
