"""A run that joins a running Ray cluster: what ray.init may not be given then, checked before the driver starts."""

from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from egpo.preflight.findings import Finding, error


# ray.init's arguments Ray refuses when it joins a running cluster (whose nodes got their resources from `ray start`)
RAY_NODE_ARGS = ("num_cpus", "num_gpus", "resources", "labels", "object_store_memory", "_system_config")


def joined_ray_cluster(config: DictConfig) -> str | None:
    """Where the run's ``ray.init`` joins a running Ray cluster: ``ray_kwargs.ray_init.address``, else the
    ``RAY_ADDRESS`` a Ray job's entrypoint is given (None: verl starts a Ray of its own)."""
    address = OmegaConf.select(config, "ray_kwargs.ray_init.address", default=None)
    if address:
        return f"ray_kwargs.ray_init.address={address}"
    return f"RAY_ADDRESS={os.environ['RAY_ADDRESS']}" if os.environ.get("RAY_ADDRESS") else None


def check_ray_cluster_settings(config: DictConfig, run=None) -> list[Finding]:
    """A run that joins a running cluster gives ray.init none of a node's resources: Ray would refuse them only once
    the driver starts."""
    joined = joined_ray_cluster(config)
    ray_init = OmegaConf.select(config, "ray_kwargs.ray_init", default=None) or {}
    given = [key for key in RAY_NODE_ARGS if ray_init.get(key, None) is not None]
    if joined and given:
        return [error("ray", f"this run joins a running Ray cluster ({joined}), whose nodes' resources are set by "
                             f"`ray start`, and ray.init refuses them then: set "
                             f"{' '.join(f'++ray_kwargs.ray_init.{key}=null' for key in given)}")]
    return []
