"""verl 0.9.1's engine-worker actor (``TrainingWorker`` with egpo's probe hook, FSDP2 on the CPU) built as
``ActorRolloutRefWorker.init_model`` builds it, and batches as ``RayPPOTrainer._update_actor`` sends them: shared by
tests/test_probe_engine.py (one process) and tests/probe_ranks.py (one process per rank)."""

from __future__ import annotations

import dataclasses
import os
from contextlib import contextmanager
from functools import partial

import numpy as np
import torch
from tensordict import TensorDict
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from egpo.probe.engine_probe import ProbeTrainingWorker
from ray_cluster import free_ports

B, P, R = 8, 6, 10


def compose_actor_config(model_path):
    from hydra import compose, initialize_config_module

    with initialize_config_module("egpo.config", version_base=None):
        return compose("egpo_trainer", overrides=[
            f"actor_rollout_ref.model.path={model_path}", "trainer.device=cpu", "actor_rollout_ref.actor.strategy=fsdp2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.n=1", "actor_rollout_ref.model.use_remove_padding=false",
            "+actor_rollout_ref.model.override_config.attn_implementation=eager",
            *(f"+actor_rollout_ref.actor.fsdp_config.mixed_precision.{k}=fp32"  # no bf16 autocast
              for k in ("param_dtype", "reduce_dtype", "buffer_dtype")),
        ])


def select_cpu(cfg):
    """The cpu platform and verl's FSDP engines for it; returns a function that restores the previous platform."""
    from verl.plugin.platform.platform_manager import get_platform, set_platform

    from egpo.cpu.engine_worker import register_cpu_engines
    from egpo.cpu.platform import select_cpu_platform

    saved_platform, saved_env = get_platform(), os.environ.get("VERL_PLATFORM")
    select_cpu_platform(cfg)
    register_cpu_engines()

    def restore():
        set_platform(saved_platform)
        if saved_env is None:
            os.environ.pop("VERL_PLATFORM", None)

    return restore


@contextmanager
def worker_env(rank: int = 0, world: int = 1):
    """The variables verl's Worker reads at construction, only for it."""
    values = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": os.environ.get("MASTER_PORT") or str(free_ports(1)[0])}
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def make_worker(cfg, lr: float, clip: float = 1.0, dynamic_budget: int | None = None, rank: int = 0, world: int = 1,
                eps: float | None = None):
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import TrainingWorkerConfig
    from verl.workers.utils.losses import ppo_loss

    model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    actor_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    actor_config.model_config = model_config
    config = TrainingWorkerConfig(model_type="language_model", model_config=model_config,
                                  engine_config=actor_config.engine,
                                  optimizer_config=dataclasses.replace(
                                      actor_config.optim, lr=lr, clip_grad=clip,
                                      override_optimizer_config=None if eps is None else {"eps": eps}),
                                  checkpoint_config=actor_config.checkpoint)
    engine = config.engine_config
    engine.use_dynamic_bsz = dynamic_budget is not None
    engine.micro_batch_size_per_gpu = engine.infer_micro_batch_size_per_gpu = 4 // world
    engine.max_token_len_per_gpu = engine.infer_max_token_len_per_gpu = dynamic_budget or 4096
    with worker_env(rank, world):
        worker = ProbeTrainingWorker(config=config)
    worker.reset()
    worker.set_loss_fn(partial(ppo_loss, config=actor_config))
    return worker


def batch(groups_of: int = 2, rows=None, uids=None) -> DataProto:
    """B rows; prompt group of row i: i // groups_of (or ``uids[i]``). ``rows``: this rank's share."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 80, (B, P + R), generator=g)
    data = DataProto(batch=TensorDict({
        "input_ids": ids, "attention_mask": torch.ones(B, P + R, dtype=torch.long),
        "position_ids": torch.arange(P + R).expand(B, -1).clone(), "prompts": ids[:, :P], "responses": ids[:, P:],
        "response_mask": torch.ones(B, R), "old_log_probs": torch.full((B, R), -4.3),
        "advantages": torch.randn(B, R, generator=g),
    }, batch_size=B), meta_info={"temperature": 1.0})
    data.non_tensor_batch["uid"] = np.array(uids or [f"p{i // groups_of}" for i in range(B)], dtype=object)
    return data if rows is None else data.select_idxs(np.asarray(rows))


def engine_batch(data: DataProto) -> TensorDict:
    """As RayPPOTrainer._update_actor sends it (one mini-batch of all B rows, one epoch, no shuffle)."""
    td = left_right_2_no_padding(data.to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=False, global_batch_size=B, mini_batch_size=B, epochs=1, seed=1,
                         dataloader_kwargs={"shuffle": False}, compute_loss=True)
    return td


def on_policy(worker, data: DataProto) -> DataProto:
    """old_log_probs from the worker's own forward: ratio 1."""
    td = left_right_2_no_padding(data.to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=False, compute_loss=False)
    out = worker.infer_batch(td)
    data.batch["old_log_probs"] = no_padding_2_padding(tu.get(out, "log_probs"), td).float()
    return data


def weights(worker) -> dict:
    """Full (unsharded) parameters."""
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in worker.engine.module.state_dict().items()}
