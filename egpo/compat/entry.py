"""verl's PPO entry point: the task runner egpo's runner extends.

Both tested versions build the trainer inside ``TaskRunner.run`` by the module-level name ``RayPPOTrainer``, so
egpo's runner points that name at its trainer in its own Ray actor process and runs verl's ``run`` unchanged. What
moved: in 0.9.1 the runner lives in ``main_ppo_v0`` and is decorated ``@ray.remote`` (the plain class is its
``__ray_actor_class__``, which adds only ``__init__`` and ``run`` to ``BaseTaskRunner``); egpo's runner extends the
plain base class there (reachable by its module path, as Ray's pickling needs) and runs verl's ``run`` function.
``main_ppo.run_ppo(config, task_runner_class)`` is the same in both.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from egpo.compat.versions import verl_stack, verl_version
from egpo.errors import IncompatibleDependencyError

# verl_stack().runner_module holds TaskRunner (whose run builds RayPPOTrainer by that module's global name);
# verl_stack().runner_base is the plain class egpo's runner extends (0.9.1's TaskRunner name holds a Ray actor class)
TRAINER_NAME = "RayPPOTrainer"


class VerlEntryShapeError(IncompatibleDependencyError):
    pass


@dataclass(frozen=True)
class VerlEntry:
    version: str
    runner_module: ModuleType
    task_runner: type  # verl's runner, the plain class (not a Ray actor class)
    base: type  # the class egpo's runner extends

    def install_trainer(self, trainer_cls: type) -> None:
        """In the runner's process: ``run`` builds ``trainer_cls`` where it builds verl's trainer."""
        self.runner_module.__dict__[TRAINER_NAME] = trainer_cls


def verl_entry() -> VerlEntry:
    version = verl_version()
    stack = verl_stack(version)
    module = importlib.import_module(stack.runner_module)
    runner = getattr(module, "TaskRunner", None)
    runner = getattr(runner, "__ray_actor_class__", runner)  # 0.9.1: unwrap @ray.remote
    where = f"verl {version}: {module.__name__}.TaskRunner"
    if not isinstance(runner, type) or not hasattr(runner, "run") or not hasattr(runner, "add_actor_rollout_worker"):
        raise VerlEntryShapeError(f"{where} is not the task runner class egpo extends (got {runner!r})")
    if TRAINER_NAME not in runner.run.__code__.co_names or not hasattr(module, TRAINER_NAME):
        raise VerlEntryShapeError(f"{where}.run no longer builds the trainer by the module name {TRAINER_NAME}; egpo "
                                  "cannot install its trainer")
    base = getattr(module, stack.runner_base, None)
    if not isinstance(base, type) or not issubclass(runner, base) or set(vars(runner)) - set(vars(base)) - {
            "__init__", "run", "__doc__", "__module__", "__qualname__", "__dict__", "__weakref__"}:
        raise VerlEntryShapeError(f"{where} adds more than __init__ and run to {module.__name__}.{stack.runner_base}"
                                  " (egpo's runner extends that base and runs verl's run)")
    return VerlEntry(version, module, runner, base)
