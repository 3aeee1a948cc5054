"""A run's CPU-side actors on the run's own nodes: verl's agent-loop and reward-loop workers, and every actor verl
creates without saying where (the rollout's request load balancer among them).

verl places each run's agent-loop workers and reward-loop workers round-robin over every alive node of the Ray
cluster (``ray.nodes()`` in ``AgentLoopManager._init_agent_loop_workers`` and
``RewardLoopManager._init_reward_loop_workers``): it assumes it owns the cluster. In an ablation several runs share
one cluster, so every run would have workers on every node, and one lost node would fail every run at its next
rollout (each spending a retry). Other actors verl creates with no scheduling strategy (the rollout's load balancer) go
where Ray's default policy puts them: the creating process's node until it is half busy, then the least busy node,
another run's as likely as not. While egpo's trainer builds its workers (``init_workers``):

* ``ray.nodes()`` lists only the nodes of the run's own placement groups (:func:`run_nodes_only`); before those
  exist, and where Ray names none of them, it lists what Ray lists;
* an actor created with no scheduling strategy gets a soft affinity to one of those nodes, in turn
  (:func:`default_actors_on`); one with a strategy of its own keeps it.

The task runner itself (which builds the trainer) stays on its driver's node (:class:`OnDriverNode`).

:mod:`egpo.compat.verl_shapes` checks at start-up that both verl methods still place their workers from
``ray.nodes()``, and that Ray's actor creation still takes its options as egpo passes them.
"""

from __future__ import annotations

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
