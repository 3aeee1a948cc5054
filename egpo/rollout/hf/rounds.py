"""Each rollout round announced to the HF rollout server, so that its batches are a function of the round's requests.

A batch's shape and companions change the last bits of every row's logits on a CPU; batches formed by arrival
timing would make a run's samples depend on machine load. Before verl's agent-loop manager dispatches a
``generate_sequences`` call, :meth:`RoundAnnouncer.announce` tells the server how many requests the call sends (one per
row: verl has already repeated each prompt ``rollout.n`` times), and the server batches them only once all have
arrived (:meth:`~egpo.rollout.hf.server.HFRolloutServer.expect_round`).

With several hf replicas, verl routes each request to the least busy server, so no server knows its share of a
round in advance: such runs are not announced, and a warning says their samples depend on timing.
"""

from __future__ import annotations

import logging

import ray

from egpo.rollout.hf.names import HF_SERVER_PREFIX

logger = logging.getLogger(__name__)


def hf_server_handles() -> list:
    """This Ray namespace's HF rollout servers, by replica rank."""
    names = [n for n in ray.util.list_named_actors() if isinstance(n, str) and n.startswith(HF_SERVER_PREFIX)]
    return [ray.get_actor(n) for n in sorted(names, key=lambda n: int(n[len(HF_SERVER_PREFIX):]))]


class RoundAnnouncer:
    """Finds the HF servers once (they exist before the first rollout) and announces every round to them."""

    def __init__(self, find_servers=hf_server_handles):
        self._find_servers = find_servers
        self._servers: list | None = None

    def servers(self) -> list:
        if self._servers is None:
            self._servers = list(self._find_servers())
            if len(self._servers) > 1:
                logger.warning(
                    "%d hf rollout replicas: verl routes requests by load, so which requests share a batch (and "
                    "the last bits of their logits) depends on timing; runs are bit-reproducible with one replica",
                    len(self._servers))
        return self._servers

    async def announce(self, count: int) -> bool:
        """Tell the single HF server that the next ``count`` requests are one round; False if nothing was told."""
        servers = self.servers()
        if len(servers) != 1:
            return False
        await servers[0].expect_round.remote(int(count))
        return True
