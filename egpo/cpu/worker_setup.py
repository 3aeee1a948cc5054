"""What every egpo CPU worker does before verl's worker ``__init__`` runs, on either verl (0.7.1's FSDP worker,
0.9.1's engine worker): a ``gloo`` process group (verl asks for ``cpu:gloo,cpu:<backend>``, which torch refuses as a
duplicate device type on a CPU; verl skips its own init when a group exists), the ``hf`` rollout in this process's
rollout registry, and, for ``rollout.name=sglang``, the trainer side of verl's weight push into sglang."""

from __future__ import annotations

from egpo.cpu.process_group import init_gloo_process_group
from egpo.engines import engine, load
from egpo.rollout.hf.adapter import register_hf_rollout


def prepare_cpu_worker(config) -> None:
    init_gloo_process_group(int(config.get("nccl_timeout", 600)))
    register_hf_rollout()
    described = engine(config.rollout.name)
    if described is not None and described.cpu_worker_setup:
        load(described.cpu_worker_setup)()
