"""A run's CPU-side workers on the run's own nodes: verl's agent-loop and reward-loop workers.

verl places each run's agent-loop workers and reward-loop workers round-robin over every alive node of the Ray
cluster (``ray.nodes()`` in ``AgentLoopManager._init_agent_loop_workers`` and
``RewardLoopManager._init_reward_loop_workers``): it assumes it owns the cluster. In an ablation several runs share
one cluster, so every run would have workers on every node, and one lost node would fail every run at its next
rollout (each spending a retry). While egpo's trainer builds its workers (``init_workers``), ``ray.nodes()`` lists
only the nodes of the run's own placement groups (:func:`run_nodes_only`); before those exist, and where Ray names
none of them, it lists what Ray lists. :mod:`egpo.compat.verl_shapes` checks at start-up that both verl methods
still place their workers from ``ray.nodes()``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import ray


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
