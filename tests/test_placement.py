"""A run's agent-loop and reward-loop workers stay on the run's own nodes (egpo.trainer.placement): verl's own
placement methods, run with a cluster that lists a node of another run beside this run's, place nothing there inside
egpo's scope, and round-robin onto it outside (what verl does on its own). Then the same on a real Ray: the nodes of a
real placement group are the ones egpo reads."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
import ray

from egpo.runs.state import NODES as NODES_FILE
from egpo.trainer.placement import placing_on_run_nodes, pool_node_ids, record_run_nodes, run_nodes_only

OWN, FOREIGN, DEAD = "a1" * 28, "b2" * 28, "c3" * 28  # Ray's node ids: 56 hex digits
NODES = [{"NodeID": OWN, "Alive": True, "Resources": {"CPU": 8.0, "GPU": 8.0}},
         {"NodeID": FOREIGN, "Alive": True, "Resources": {"CPU": 8.0, "GPU": 8.0}},
         {"NodeID": DEAD, "Alive": False, "Resources": {"CPU": 8.0}}]


class RecordingActorClass:
    """Stands in for ``ray.remote(Worker)``: records each worker's node affinity."""

    def __init__(self):
        self.nodes = []

    def options(self, name=None, scheduling_strategy=None, **kwargs):
        self.nodes.append(scheduling_strategy.node_id)
        return SimpleNamespace(remote=lambda *args, **kw: object())


def agent_loop_placement() -> list[str]:
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    manager = object.__new__(AgentLoopManager)
    manager.rollout_config = SimpleNamespace(agent=SimpleNamespace(num_workers=8))
    manager.agent_loop_workers_class = RecordingActorClass()
    manager.config = manager.llm_client = manager.teacher_client = manager.reward_loop_worker_handles = None
    manager.global_load_balancer, manager.server_addresses, manager.server_handles = None, [], []  # verl 0.7.1 reads
    result = manager._init_agent_loop_workers()
    if asyncio.iscoroutine(result):
        asyncio.run(result)
    return manager.agent_loop_workers_class.nodes


def reward_loop_placement() -> list[str]:
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    manager = object.__new__(RewardLoopManager)
    manager.config = SimpleNamespace(reward=SimpleNamespace(num_workers=8))
    manager.reward_loop_workers_class = RecordingActorClass()
    manager.reward_router_address = None
    manager._init_reward_loop_workers()
    return manager.reward_loop_workers_class.nodes


@pytest.mark.parametrize("placement", [agent_loop_placement, reward_loop_placement])
def test_verls_workers_land_only_on_the_runs_nodes(placement, monkeypatch):
    monkeypatch.setattr(ray, "nodes", lambda: [dict(n) for n in NODES])
    assert set(placement()) == {OWN, FOREIGN}  # verl on its own: every alive node of the cluster
    with run_nodes_only(lambda: {OWN}):
        assert placement() == [OWN] * 8
    assert set(placement()) == {OWN, FOREIGN}  # restored after the scope
    with run_nodes_only(lambda: set()):  # before the run's placement groups exist: what Ray lists
        assert set(placement()) == {OWN, FOREIGN}


def test_the_run_nodes_are_those_of_its_placement_groups(tmp_path):
    from ray.util.placement_group import placement_group, remove_placement_group

    created = not ray.is_initialized()
    if created:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        group = placement_group([{"CPU": 1}], strategy="STRICT_PACK")
        ray.get(group.ready(), timeout=60)
        manager = SimpleNamespace(resource_pool_dict={"global_pool": SimpleNamespace(pgs=[group]),
                                                      "not_created_yet": SimpleNamespace(pgs=None)})
        this_node = ray.get_runtime_context().get_node_id()
        assert pool_node_ids(manager) == {this_node}
        with run_nodes_only(lambda: pool_node_ids(manager)):
            assert [n["NodeID"] for n in ray.nodes()] == [this_node]
        # what a failed attempt names: the nodes of the run's placement groups, as Ray lists them
        record_run_nodes(SimpleNamespace(trainer=SimpleNamespace(default_local_dir=str(tmp_path))),
                         pool_node_ids(manager))
        node = next(n for n in ray.nodes() if n["NodeID"] == this_node)
        assert json.loads((tmp_path / NODES_FILE).read_text())["nodes"] == [
            f"{node['NodeManagerHostname']} ({node['NodeManagerAddress']})"]
        remove_placement_group(group)
    finally:
        if created:
            ray.shutdown()


def test_actors_verl_leaves_unplaced_get_the_runs_nodes_and_placed_ones_keep_theirs(monkeypatch):
    """Inside egpo's scope, an actor created with no scheduling strategy (verl's rollout load balancer) gets a soft
    affinity to the run's nodes, in turn; one with a strategy of its own keeps it; outside, Ray's default again. What
    reaches Ray's own ``ActorClass._remote`` is recorded, nothing is created."""
    from ray.actor import ActorClass
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from egpo.trainer.placement import default_actors_on

    seen = []
    monkeypatch.setattr(ActorClass, "_remote", lambda self, args=None, kwargs=None, **options: seen.append(options))

    class Balancer:
        pass

    remote = ray.remote(Balancer)
    explicit = NodeAffinitySchedulingStrategy(node_id=FOREIGN, soft=False)
    with default_actors_on(lambda: {OWN, DEAD}):
        remote.remote()
        remote.options(name="lb").remote()
        remote.options(scheduling_strategy=explicit).remote()
        remote.options(scheduling_strategy="SPREAD").remote()
    remote.remote()
    with default_actors_on(lambda: set()):  # before the run's placement groups exist
        remote.remote()
    placed = [o.get("scheduling_strategy") for o in seen]
    assert [(s.node_id, s.soft) for s in placed[:2]] == [(OWN, True), (DEAD, True)]  # in turn over sorted ids
    assert placed[2] is explicit and placed[3] == "SPREAD"
    assert placed[4] in (None, "DEFAULT") and placed[5] in (None, "DEFAULT")


def test_the_task_runner_is_created_on_its_drivers_node(monkeypatch):
    """verl calls ``task_runner_class.remote()`` (or ``.options(runtime_env=...)`` to profile): both reach Ray with a
    soft affinity to the node of the process that starts the run."""
    from types import SimpleNamespace

    from egpo.trainer.placement import OnDriverNode

    calls = []

    class ActorClass:
        def options(self, **options):
            calls.append(options)
            return SimpleNamespace(remote=lambda *args, **kwargs: "runner")

    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: OWN))
    runner = OnDriverNode(ActorClass())
    assert runner.remote() == "runner"
    runner.options(runtime_env={"nsight": {}}).remote()
    assert [(c["scheduling_strategy"].node_id, c["scheduling_strategy"].soft) for c in calls] == [(OWN, True)] * 2
    assert calls[1]["runtime_env"] == {"nsight": {}}


def test_a_second_pools_placement_groups_sort_against_every_node(monkeypatch):
    """verl sorts a resource pool's placement groups by the address ray.nodes() gives their node, before the pool
    holds them. While a run places its workers, a second pool (a reward model's) created on a node the first pool does
    not use must still find its node there: verl's own sort does not raise, while verl's placing methods still see
    only the run's nodes."""
    from verl.single_controller.ray import base

    monkeypatch.setattr(ray, "nodes", lambda: [{**n, "NodeManagerAddress": f"10.0.0.{i}"} for i, n in enumerate(NODES)])
    tables = {"pg-own": {"bundles_to_node_id": {0: OWN}}, "pg-reward": {"bundles_to_node_id": {0: FOREIGN}}}
    monkeypatch.setattr(base.ray._private.state.state, "placement_group_table", lambda pg_id: tables[pg_id])
    reward_pool_groups = [SimpleNamespace(id="pg-reward")]
    with placing_on_run_nodes(lambda: {OWN}):  # the first pool's groups exist: the run's nodes are known
        assert base.sort_placement_group_by_node_ip(reward_pool_groups) == reward_pool_groups
        assert set(agent_loop_placement()) == {OWN} and set(reward_loop_placement()) == {OWN}
    assert set(agent_loop_placement()) == {OWN, FOREIGN}  # outside: verl's own round-robin over every node


def test_the_placing_methods_are_wrapped_once_however_often_a_run_places():
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    from egpo.patching import MARK

    for _ in range(3):
        with placing_on_run_nodes(lambda: {OWN}):
            pass
    method = AgentLoopManager._init_agent_loop_workers
    assert getattr(method, MARK, None) is not None and getattr(method.__wrapped__, MARK, None) is None


def test_a_failure_after_the_pools_exist_still_names_their_nodes(tmp_path, monkeypatch):
    """verl's init_workers creates the pools, then loads the model and starts the engine on them: a failure there (a
    bad GPU node) leaves nodes.json naming the pools' nodes, and the failure itself is what propagates; a failure
    before the pools exist records nothing."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from egpo.trainer import placement
    from egpo.trainer.ray_trainer import EgpoRayPPOTrainer

    monkeypatch.setattr("egpo.compat.verl_shapes.check_ray_shape", lambda: None)
    monkeypatch.setattr(placement, "pool_node_ids", lambda manager: set(manager.nodes))
    monkeypatch.setattr(placement, "node_names", lambda ids: sorted(f"host-{i}" for i in ids))

    def failing_init(self):
        self.resource_pool_manager.nodes = self.placed  # create_resource_pool ran
        raise RuntimeError("CUDA error: no kernel image on this node")

    monkeypatch.setattr(RayPPOTrainer, "init_workers", failing_init)
    for placed, recorded in ((["n2", "n1"], ["host-n1", "host-n2"]), ([], None)):
        (tmp_path / NODES_FILE).unlink(missing_ok=True)
        trainer = object.__new__(EgpoRayPPOTrainer)
        trainer.config = SimpleNamespace(trainer=SimpleNamespace(default_local_dir=str(tmp_path)))
        trainer.resource_pool_manager, trainer.placed = SimpleNamespace(nodes=[]), placed
        with pytest.raises(RuntimeError, match="no kernel image"):
            trainer.init_workers()
        assert (json.loads((tmp_path / NODES_FILE).read_text())["nodes"] if recorded else
                (tmp_path / NODES_FILE).exists()) == (recorded or False)


def test_a_worker_that_fails_to_start_after_the_pools_exist_leaves_the_pools_nodes_recorded(tmp_path, monkeypatch):
    """verl creates the run's placement groups, then starts its workers there (the model's load, CUDA, an engine):
    when a worker fails to start, the failed attempt names the nodes of the run's pools (nodes.json), not the node
    its driver ran on; the worker's own error is the one raised."""
    from contextlib import nullcontext

    from omegaconf import OmegaConf
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from egpo.runs.state import CHECKPOINTS, run_nodes
    from egpo.trainer import placement
    from egpo.trainer.ray_trainer import EgpoRayPPOTrainer

    work = tmp_path / "run"
    trainer = EgpoRayPPOTrainer.__new__(EgpoRayPPOTrainer)  # verl's constructor needs the whole run: not here
    trainer.config = OmegaConf.create({"trainer": {"default_local_dir": str(work / CHECKPOINTS)}})
    trainer.resource_pool_manager = SimpleNamespace(resource_pool_dict={})
    pools = set()

    def verls_init_workers(self):
        pools.add("0123abcd" * 7)  # the pools exist (verl's create_resource_pool), then a worker fails to start
        raise RuntimeError("CUDA error: an illegal memory access")

    monkeypatch.setattr(RayPPOTrainer, "init_workers", verls_init_workers)
    monkeypatch.setattr(placement, "pool_node_ids", lambda manager: set(pools))
    monkeypatch.setattr(placement, "placing_on_run_nodes", lambda nodes: nullcontext())
    monkeypatch.setattr(placement, "default_actors_on", lambda nodes: nullcontext())
    monkeypatch.setattr(placement, "node_names", lambda ids: sorted(f"gpu-node-{i[:4]}" for i in ids))
    monkeypatch.setattr("egpo.compat.verl_shapes.check_ray_shape", lambda: None)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        trainer.init_workers()
    assert run_nodes(work) == ["gpu-node-0123"]
