"""The Ray actor name of a replica's HF rollout server (the replica creates it, the worker adapter and the
agent-loop manager find it)."""

HF_SERVER_PREFIX = "egpo_hf_rollout_server_"


def hf_server_name(replica_rank: int) -> str:
    return f"{HF_SERVER_PREFIX}{replica_rank}"
