"""The Ray actor name of a replica's HF rollout server (the replica creates it, the worker adapter finds it)."""


def hf_server_name(replica_rank: int) -> str:
    return f"egpo_hf_rollout_server_{replica_rank}"
