"""The ``hf`` rollout replica: one :class:`~egpo.rollout.hf.server.HFRolloutServer` actor per replica."""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.workers.rollout.replica import RolloutMode, RolloutReplica

from egpo.rollout.hf.names import hf_server_name
from egpo.rollout.hf.server import HFRolloutServer


class HFRolloutReplica(RolloutReplica):
    def __init__(self, replica_rank, config, model_config, gpus_per_node: int = 8, is_reward_model: bool = False,
                 **kwargs):
        super().__init__(replica_rank, config, model_config, gpus_per_node, is_reward_model, **kwargs)
        if is_reward_model:
            raise NotImplementedError("the hf rollout does not serve reward models")
        self.server_class = ray.remote(HFRolloutServer)

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self):
        if self.rollout_mode != RolloutMode.HYBRID:
            raise NotImplementedError(
                f"the hf rollout runs in hybrid mode only (trainer and rollout share the machine); got {self.rollout_mode}"
            )
        node_id = await self.workers[0].__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
        name = hf_server_name(self.replica_rank)
        server = self.server_class.options(
            name=name,
            num_cpus=0,
            max_concurrency=self.max_concurrency,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        await server.launch_server.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = name
