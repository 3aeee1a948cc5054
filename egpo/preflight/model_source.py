"""Whether the model of ``actor_rollout_ref.model.path`` can be read on this machine, known in seconds.

transformers answers a hub id it cannot fetch after about 50 s of retries (no network, as on many cluster login
nodes) with a long traceback; a local path with a typo fails with a hub error about repository names. This check
answers first: a local folder that does not exist, or a hub id that is neither in the Hugging Face cache nor
fetchable (offline mode set, or the hub's host not reachable within a few seconds).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

REMOTE_SCHEMES = ("hdfs://", "s3://", "gs://", "http://", "https://")  # verl's copy_to_local fetches these itself
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def _is_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - an id the cache cannot even parse is not cached
        return False


def model_source_problem(path: str, timeout: float = 3.0) -> str | None:
    """Why ``path`` cannot be read here (one sentence naming the fix), or None when it can or might be."""
    path = str(path)
    if path.startswith(REMOTE_SCHEMES) or Path(path).expanduser().exists():
        return None
    where = f"actor_rollout_ref.model.path={path}"
    if path.startswith(("/", "./", "../", "~")) or path.count("/") > 1:
        return f"{where} is no folder on this machine: give the folder of a Hugging Face model (its config.json)"
    if _is_cached(path):
        return None
    unreachable = hub_unreachable(timeout)
    if unreachable:
        return (f"{where} is not in this machine's Hugging Face cache and {unreachable}: download it where the hub is "
                "reachable (huggingface-cli download), or give a local folder")
    return None


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face Hub cannot be used from here (offline mode set, or its host not reachable within
    ``timeout`` seconds), as a clause; None when it can."""
    offline = [name for name in OFFLINE_VARIABLES if os.environ.get(name, "").lower() in ("1", "true", "yes", "on")]
    if offline:
        return f"{offline[0]} is set"
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        return f"the hub ({host}:{port}) cannot be reached from here ({type(err).__name__})"
    return None
