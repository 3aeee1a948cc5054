"""One data-parallel rank of a probed engine-actor update with attribution (tests/test_probe_engine.py runs one
process per rank): rows split over the ranks in order, so prompt groups straddle ranks as verl's balancing leaves
them; the first AdamW step conditioned as tests/probe_figures.py says. Rank 0 writes the update's probe metrics
and a parameter checksum as JSON.

    python tests/probe_ranks.py MODEL_PATH OUT_JSON [UID,UID,...]   (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)

The optional prompt ids replace the default grouping (one per row).
"""

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))

from engine_actor import B, batch, compose_actor_config, engine_batch, make_worker, on_policy, select_cpu, weights  # noqa: E402
from probe_figures import CONDITIONED_EPS  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402

from egpo.probe.engine_probe import EngineProbe  # noqa: E402
from egpo.probe.settings import ProbeSettings  # noqa: E402

GROUPS_OF = 3  # rows 0-2, 3-5, 6-7: on two ranks (0-3 | 4-7) the group p1 straddles them


def main(model_path: str, out: str, uids: list[str] | None) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = compose_actor_config(model_path)
    select_cpu(cfg)
    worker = make_worker(cfg, lr=1e-5, clip=1e9, rank=rank, world=world, eps=CONDITIONED_EPS)
    worker.egpo_probe = EngineProbe(worker, ProbeSettings(enable=True, attribution=True))
    rows = np.array_split(np.arange(B), world)[rank]
    data = on_policy(worker, batch(GROUPS_OF, rows=rows, uids=uids))
    output = worker.train_mini_batch(engine_batch(data))
    params = weights(worker)
    if rank == 0:
        metrics = {k: float(v) for k, v in tu.get(output, "metrics").items() if k.startswith("probe/")}
        metrics["param_checksum"] = float(sum(p.double().abs().sum() for p in params.values()))
        with open(out, "w") as f:
            json.dump(metrics, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.manual_seed(0)
    main(sys.argv[1], sys.argv[2], sys.argv[3].split(",") if len(sys.argv) > 3 else None)
