"""What a generation run is asked for: the command's options, carried to the trainer in the config (``egpo_generate``),
and the checkpoint they name, resolved and checked before Ray starts."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from egpo.errors import EgpoConfigError

NODE = "egpo_generate"
STEP_DIR = re.compile(r"global_step_(\d+)$")


@dataclass(frozen=True)
class GenerateOptions:
    out: str
    mode: str = "generate"  # generate: sample and keep the engine's entropy; score: teacher-force another run's rows
    split: str = "val"  # val: data.val_files; train: data.train_files
    n: int | None = None  # samples per prompt (None: actor_rollout_ref.rollout.n)
    max_rows: int | None = None  # the data set's first rows only
    chunk: int | None = None  # prompts per generate call and per part file (None: data.train_batch_size)
    source: str | None = None  # score: the run whose responses are scored
    checkpoint: str | None = None  # a verl actor checkpoint (global_step_N), resolved

    @classmethod
    def from_config(cls, config: DictConfig) -> "GenerateOptions":
        node = OmegaConf.select(config, NODE, default=None)
        if node is None:
            raise EgpoConfigError(f"the config has no {NODE} node: a generation run is started by python -m "
                                  "egpo.generate")
        return cls(**OmegaConf.to_container(node))

    def into(self, config: DictConfig) -> None:
        with open_dict(config):
            config[NODE] = asdict(self)


class CheckpointError(EgpoConfigError):
    pass


def resolve_checkpoint(path: str) -> Path:
    """A verl checkpoint as given on the command line -> its ``global_step_N`` folder: that folder itself, or a run's
    checkpoint folder (``trainer.default_local_dir``), whose resume pointer names the latest step."""
    from egpo.runs.state import checkpoint_pointer

    where = Path(path).expanduser().resolve()
    if not where.is_dir():
        raise CheckpointError(f"--checkpoint {path}: no such folder")
    if not STEP_DIR.search(where.name):
        step = checkpoint_pointer(where)
        steps = sorted((int(STEP_DIR.search(p.name).group(1)) for p in where.glob("global_step_*")
                        if STEP_DIR.search(p.name)))
        if not step and not steps:
            raise CheckpointError(f"--checkpoint {path} holds no verl checkpoint (no global_step_N folder): the run "
                                  "saved none (trainer.save_freq=-1, or it stopped before its first save). Give a "
                                  "run's trainer.default_local_dir that holds one, or one of its global_step_N "
                                  "folders; a run saves one at its last step with trainer.save_freq=N for any N > 0 "
                                  "(recipes/cpu_warm.yaml does)")
        where = where / f"global_step_{step or steps[-1]}"
    if not (where / "actor").is_dir():
        raise CheckpointError(f"--checkpoint {where} has no actor/ folder: it is not a verl actor checkpoint")
    return where


def checkpoint_world_sizes(step_dir: Path) -> set[int]:
    """The world sizes the actor's shards in ``step_dir`` were saved by (``model_world_size_W_rank_R.pt``)."""
    found = set()
    for shard in (step_dir / "actor").glob("model_world_size_*_rank_*.pt"):
        match = re.match(r"model_world_size_(\d+)_rank_\d+\.pt$", shard.name)
        if match:
            found.add(int(match.group(1)))
    return found


def check_checkpoint_world_size(step_dir: Path, config: DictConfig) -> None:
    """verl's FSDP checkpoint loads on the world size that saved it: refused now, not after the workers started."""
    world = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    sizes = checkpoint_world_sizes(step_dir)
    if sizes and world not in sizes:
        saved = min(sizes)
        raise CheckpointError(
            f"--checkpoint {step_dir} was saved by {saved} actor processes; verl loads it on the same number, and "
            f"this run has {world} (trainer.nnodes x trainer.n_gpus_per_node). Fix: trainer.nnodes=1 "
            f"trainer.n_gpus_per_node={saved}" if saved <= 8 else
            f"--checkpoint {step_dir} was saved by {saved} actor processes; verl loads it on the same number, and this "
            f"run has {world}: set trainer.nnodes and trainer.n_gpus_per_node to make {saved}")
