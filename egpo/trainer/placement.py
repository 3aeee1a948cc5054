"""A run's CPU-side actors on the run's own nodes: verl's agent-loop and reward-loop workers, and every actor verl
creates without saying where (the rollout's request load balancer among them).

verl places each run's agent-loop workers and reward-loop workers round-robin over every alive node of the Ray
cluster (``ray.nodes()`` in ``AgentLoopManager._init_agent_loop_workers`` and
``RewardLoopManager._init_reward_loop_workers``): it assumes it owns the cluster. In an ablation several runs share
one cluster, so every run would have workers on every node, and one lost node would fail every run at its next
rollout (each spending a retry). Other actors verl creates with no scheduling strategy (the rollout's load balancer) go
where Ray's default policy puts them: the creating process's node until it is half busy, then the least busy node,
another run's as likely as not. While egpo's trainer builds its workers (``init_workers``):

* inside verl's two placing methods, ``ray.nodes()`` lists only the nodes of the run's own placement groups
  (:func:`placing_on_run_nodes`, :func:`run_nodes_only`); before those exist, and where Ray names none of them, it
  lists what Ray lists. Everywhere else ``ray.nodes()`` is Ray's: verl's placement-group sort of a second resource
  pool (a reward model's, a teacher's) looks its groups' nodes up in it before the pool holds them;
* an actor created with no scheduling strategy gets a soft affinity to one of those nodes, in turn
  (:func:`default_actors_on`); one with a strategy of its own keeps it.

The task runner itself (which builds the trainer) stays on its driver's node (:class:`OnDriverNode`).

:mod:`egpo.compat.verl_shapes` checks at start-up that both verl methods still place their workers from
``ray.nodes()``, and that Ray's actor creation still takes its options as egpo passes them.
"""

from __future__ import annotations

import inspect
import itertools
from contextlib import contextmanager
from typing import Callable, Iterator

import ray
from ray.actor import ActorClass
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

UNPLACED = (None, "DEFAULT")  # the scheduling strategies that leave the choice of node to Ray's default policy


def pool_node_ids(resource_pool_manager) -> set[str]:
    """The nodes holding the bundles of the run's placement groups (empty before they are created)."""
    from ray.util import placement_group_table

    ids: set[str] = set()
    for pool in getattr(resource_pool_manager, "resource_pool_dict", {}).values():
        for group in getattr(pool, "pgs", None) or []:
            ids.update(placement_group_table(group).get("bundles_to_node_id", {}).values())
    return ids


@contextmanager
def run_nodes_only(run_node_ids: Callable[[], set[str]]) -> Iterator[None]:
    """Inside: ``ray.nodes()`` lists only the nodes ``run_node_ids()`` names (asked at each call); all of them where it
    names none, or none Ray lists."""
    listed_by_ray = ray.nodes

    def run_nodes():
        nodes = listed_by_ray()
        own = run_node_ids()
        kept = [node for node in nodes if node.get("NodeID") in own]
        return kept or nodes

    ray.nodes = run_nodes
    try:
        yield
    finally:
        ray.nodes = listed_by_ray


PLACING_METHODS = ("verl.experimental.agent_loop.agent_loop:AgentLoopManager._init_agent_loop_workers",
                   "verl.experimental.reward_loop.reward_loop:RewardLoopManager._init_reward_loop_workers")
_placing: list[Callable[[], set[str]]] = []  # the run's nodes while init_workers places its workers (innermost last)


def _narrowed(original, *args, **kwargs):
    """A placing method, run with ``ray.nodes()`` narrowed to the run's nodes where a run is placing its workers
    (a coroutine method: for as long as it runs)."""
    if not _placing:
        return original(*args, **kwargs)
    run_node_ids = _placing[-1]
    if inspect.iscoroutinefunction(original):
        async def placed():
            with run_nodes_only(run_node_ids):
                return await original(*args, **kwargs)

        return placed()
    with run_nodes_only(run_node_ids):
        return original(*args, **kwargs)


_PATCHES: list = []


def placing_patches() -> list:
    """The two placing methods' patches, made once per process (a Patch is idempotent as the same object)."""
    from egpo.patching import Patch

    if not _PATCHES:
        _PATCHES.extend(Patch(target, _narrowed) for target in PLACING_METHODS)
    return _PATCHES


@contextmanager
def placing_on_run_nodes(run_node_ids: Callable[[], set[str]]) -> Iterator[None]:
    """Inside: verl's two placing methods see only the run's nodes in ``ray.nodes()`` (their patches applied once)."""
    from egpo.patching import apply_all

    apply_all(placing_patches())
    _placing.append(run_node_ids)
    try:
        yield
    finally:
        _placing.remove(run_node_ids)


@contextmanager
def default_actors_on(run_node_ids: Callable[[], set[str]]) -> Iterator[None]:
    """Inside: an actor created with no scheduling strategy and no placement group gets a soft affinity to one of the
    nodes ``run_node_ids()`` names (asked at each creation, taken in turn); none where it names none."""
    created_by_ray = ActorClass._remote
    turn = itertools.count()

    def _remote(self, args=None, kwargs=None, **actor_options):
        unplaced = actor_options.get("scheduling_strategy") in UNPLACED and \
            actor_options.get("placement_group") in (None, "default")
        nodes = sorted(run_node_ids()) if unplaced else []
        if nodes:
            actor_options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                node_id=nodes[next(turn) % len(nodes)], soft=True)
        return created_by_ray(self, args=args, kwargs=kwargs, **actor_options)

    ActorClass._remote = _remote
    try:
        yield
    finally:
        ActorClass._remote = created_by_ray


def node_names(node_ids: set[str]) -> list[str]:
    """Each node's host name and address, as Ray lists them (an id Ray no longer lists: the id itself)."""
    listed = {node.get("NodeID"): node for node in ray.nodes()}
    names = []
    for node_id in sorted(node_ids):
        node = listed.get(node_id)
        names.append(f"{node.get('NodeManagerHostname', '?')} ({node.get('NodeManagerAddress', '?')})" if node
                     else node_id)
    return names


def record_run_nodes(config, node_ids: set[str]) -> None:
    """``nodes.json`` in the run's checkpoint folder (``trainer.default_local_dir``): the nodes of the run's placement
    groups, where its GPU workers are; a failed attempt names these, not the node its driver ran on (on a cluster,
    the head)."""
    import json
    from pathlib import Path

    from egpo.runs.state import NODES

    where = Path(str(config.trainer.default_local_dir)).expanduser()
    try:
        where.mkdir(parents=True, exist_ok=True)
        (where / NODES).write_text(json.dumps({"nodes": node_names(node_ids)}) + "\n")
    except OSError as err:  # a run does not stop for its diagnostics
        print(f"[egpo] could not record the run's nodes in {where / NODES}: {err}", flush=True)


def record_placed_nodes(config, run_node_ids: Callable[[], set[str]]) -> None:
    """:func:`record_run_nodes` once the run's placement groups exist (nothing before them); never raises, so a
    failure being raised through it stays the one reported."""
    try:
        nodes = run_node_ids()
    except Exception as err:  # noqa: BLE001 - diagnostics only: the run's own error (if any) is the one to see
        print(f"[egpo] could not read the run's placement groups: {err}", flush=True)
        return
    if nodes:
        record_run_nodes(config, nodes)


class OnDriverNode:
    """verl's ``task_runner_class``: the runner actor on the node of the process that starts it (the driver, whose
    node a run needs anyway), not wherever Ray's default policy finds a free CPU: a run then depends on its driver's
    node and its own GPU nodes only. ``remote`` and ``options`` are the two calls verl makes on it."""

    def __init__(self, actor_cls):
        self.actor_cls = actor_cls

    def _strategy(self) -> NodeAffinitySchedulingStrategy:
        return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True)

    def remote(self, *args, **kwargs):
        return self.actor_cls.options(scheduling_strategy=self._strategy()).remote(*args, **kwargs)

    def options(self, **options):
        return self.actor_cls.options(**{"scheduling_strategy": self._strategy(), **options})
