"""verl's own actor update, measured: verl 0.9.1's FSDP engine (``TrainingWorker.train_mini_batch``, the engine
code a run's actor executes) on one micro-batch at a recipe's tokens per GPU, with and without the update-time
entropy, and with the entropy checkpointed as the qwen3 recipes set it (``entropy_checkpointing``).

    python bench/verl_update_memory.py                          # on a GPU: qwen3_4b (Qwen3-4B's shape, 34,816 tokens)
    python bench/verl_update_memory.py --recipe qwen3_8b
    python bench/verl_update_memory.py --device cpu --shape tiny --tokens 512    # the plumbing, on a CPU (the test)

What runs is verl's: the recipe composed (its remove-padding path, gradient checkpointing, dynamic batching,
chunked fp32 entropy, entropy checkpointing), verl's ``TrainingWorker`` and FSDP2 engine built from it as
``ActorRolloutRefWorker`` builds the actor's, the batch as ``RayPPOTrainer._update_actor`` sends it (no padding,
one mini-batch, ``calculate_entropy`` the flag verl sends), verl's PPO loss and optimizer step. What is not verl's:

* the model: random weights of the recipe model's shape (``egpo.preflight.scale.KNOWN_SHAPES``), saved to a local
  folder with egpo's demo tokenizer; attention ``sdpa`` (the bench needs no flash-attn);
* one process, world size 1, on a GPU with FSDP2's own CPU offload (``fsdp_config.offload_policy=true``): the
  model's state (fp32 parameters, gradients, Adam's moments) stays on the host through the update, so the peak is
  what sharding over a node's GPUs does not shrink (activations, logits, log probabilities, the entropy, one layer's
  gathered parameters); the sharded state a GPU of the recipe's run also holds is printed beside it (16 bytes a
  parameter / GPUs). verl's ``param_offload`` and ``optimizer_offload`` would not do this: verl loads both onto the
  GPU for the whole of its train mode (``BaseEngineCtx``), which at world size 1 is the unsharded state;
* one warm-up update before the measured ones, so every mode runs with Adam's moments already made (the first
  optimizer step makes them);
* the log-probability kernel verl picks, printed: flash-attn's cross-entropy where flash-attn is installed (a run
  built as README says), else ``logprobs_from_logits_v2``'s per-row log-softmax (a bare machine), which saves more;
* ``--layers N``: the recipe model's shape with N of its layers (the head, the logits and one layer's activations
  are the full model's; the rest of the activations scale with the layers), for a model whose state and
  activations do not fit one GPU at its full depth (qwen3_8b on one H200: ``--layers 12``);
* Ray and datasets: verl's engine-worker modules import them at module level (Ray's remote classes; datasets in
  ``verl.utils.dataset``, which ``verl.workers.utils.losses`` imports). Where they are not installed (a bare GPU
  machine with torch and transformers only), stand-in modules answer those imports (:data:`STAND_INS`); nothing of
  either runs in this one process.

Reported per mode (``none``, ``entropy``, ``entropy_checkpointed``): the peak memory of the update
(``torch.cuda.max_memory_allocated`` after a reset; on a CPU the process's peak resident size after a reset), the
bytes autograd saved for the backward pass beyond the model's parameters (``saved_tensors_hooks``), and the
preflight's figure for the entropy (``egpo.preflight.scale.entropy_saved_bytes``). An out-of-memory is reported as
such: it is the finding. ``--json FILE`` writes the rows.

On a bare GPU machine, the packages verl's engine imports besides torch and transformers come as wheels
(``bench/verl_update_wheels.txt``: ``pip download --no-deps -r bench/verl_update_wheels.txt -d WHEELS``, then
``pip install --no-deps WHEELS/*``), under 64 MiB in all.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
import types
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # egpo from this checkout (recipes, shapes, tokenizer, CPU platform)

GB = 1e9
TINY = dict(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)
MODES = {"none": (False, False), "entropy": (True, False), "entropy_checkpointed": (True, True)}
# FSDP2's CPU offload: the state stays on the host in train mode (verl's param_offload/optimizer_offload would load it
# onto the GPU for the whole update, workers/engine/base.py BaseEngineCtx); verl turns its own two flags off with it
GPU_OFFLOAD = ("++actor_rollout_ref.actor.fsdp_config.offload_policy=true",
               "actor_rollout_ref.actor.fsdp_config.param_offload=false",
               "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false")


# --- Ray, where it is not installed --------------------------------------------------------------------------------

class _Anything:
    """Any attribute, any call: what verl's module-level uses of Ray need (decorators, types, constants)."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, name):
        return _Anything(f"{self._name}.{name}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and (callable(args[0]) or isinstance(args[0], type)):
            return args[0]  # @ray.remote, @ray.method(...)(f): the function or class itself
        return _Anything(f"{self._name}()")

    def __mro_entries__(self, bases):
        return (object,)

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(f"{self.__name__}.{name}")


# imported by verl's engine-worker modules at module level, never called by one process's update: Ray (the workers'
# remote classes and decorators), datasets (verl.utils.dataset, imported by verl.workers.utils.losses; it reads the
# data files, which this bench has none of)
STAND_INS = ("ray", "datasets")


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``import NAME`` and ``import NAME.<anything>`` with stand-in modules, for the names given."""

    def __init__(self, names):
        self.names = tuple(names)

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        module.__version__ = "0 (egpo's stand-in: not installed)"


def stand_ins() -> list[str]:
    """Stand-ins for those of :data:`STAND_INS` not installed (and for those ``EGPO_BENCH_STAND_INS`` names, a
    comma-separated list: the bare machine's path, taken where they are installed); returns their names."""
    forced = [name for name in os.environ.get("EGPO_BENCH_STAND_INS", "").split(",") if name in STAND_INS]
    missing = [name for name in STAND_INS if name in forced or importlib.util.find_spec(name) is None]
    if missing:
        sys.meta_path.insert(0, _StandIns(missing))
    return missing


# --- the model, the worker, the batch --------------------------------------------------------------------------------

def recipe_config(recipe: str, model: Path, device: str):
    from hydra import compose, initialize_config_dir

    overrides = [f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.strategy=fsdp2",
                 "++actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                 # as egpo prepares a run that reads the entropy (egpo.preflight.actor_entropy): eager, not compiled
                 "++actor_rollout_ref.actor.fsdp_config.use_torch_compile=false"]
    if device == "cpu":
        overrides += ["trainer.device=cpu", *(f"++actor_rollout_ref.actor.fsdp_config.mixed_precision.{k}=fp32"
                                              for k in ("param_dtype", "reduce_dtype", "buffer_dtype"))]
    else:
        overrides += GPU_OFFLOAD
    with initialize_config_dir(config_dir=str(ROOT / "recipes"), version_base=None):
        return compose(config_name=recipe, overrides=overrides)


def build_model(shape: dict, out: Path, device: str) -> Path:
    """Random weights of ``shape`` (bf16 on a GPU, fp32 on a CPU) and egpo's demo tokenizer, saved to ``out``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from egpo.demo.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    config = Qwen3Config(**{"max_position_embeddings": 40960, **shape}, bos_token_id=None,  # the Qwen3s' own
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         torch_dtype=str(dtype).removeprefix("torch."), attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device("cpu" if device == "cpu" else "cuda"):
        model = Qwen3ForCausalLM(config).to(dtype)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    return out


def select_device(cfg, device: str) -> None:
    if device == "cpu":
        from egpo.cpu.engine_worker import register_cpu_engines
        from egpo.cpu.platform import select_cpu_platform

        select_cpu_platform(cfg)
        register_cpu_engines()


def make_worker(cfg, tokens: int):
    """verl's TrainingWorker for the actor, as ActorRolloutRefWorker builds it, one micro-batch of ``tokens``."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import ppo_loss

    model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    actor_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    actor_config.model_config = model_config
    engine = actor_config.engine
    engine.use_dynamic_bsz = True
    engine.max_token_len_per_gpu = engine.infer_max_token_len_per_gpu = tokens
    config = TrainingWorkerConfig(model_type="language_model", model_config=model_config, engine_config=engine,
                                  optimizer_config=actor_config.optim, checkpoint_config=actor_config.checkpoint)
    worker = TrainingWorker(config=config)
    worker.reset()
    worker.set_loss_fn(partial(ppo_loss, config=actor_config))
    return worker


def update_batch(tokens: int, sequence: int, vocab: int, calculate_entropy: bool):
    """``tokens`` tokens in rows of the recipe's full sequence length (one row where fewer), as
    RayPPOTrainer._update_actor sends them: no padding, one mini-batch, one epoch."""
    import numpy as np
    import torch
    from tensordict import TensorDict
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    rows, length = max(1, tokens // sequence), min(tokens, sequence)
    prompt = max(1, length // 16)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (rows, length), generator=g)
    data = DataProto(batch=TensorDict({
        "input_ids": ids, "attention_mask": torch.ones(rows, length, dtype=torch.long),
        "position_ids": torch.arange(length).expand(rows, -1).clone(), "prompts": ids[:, :prompt],
        "responses": ids[:, prompt:], "response_mask": torch.ones(rows, length - prompt),
        "old_log_probs": torch.full((rows, length - prompt), -11.9),
        "advantages": torch.randn(rows, length - prompt, generator=g),
    }, batch_size=rows), meta_info={"temperature": 1.0})
    data.non_tensor_batch["uid"] = np.array([f"p{i}" for i in range(rows)], dtype=object)
    td = left_right_2_no_padding(data.to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=calculate_entropy, global_batch_size=rows, mini_batch_size=rows,
                         epochs=1, seed=1, dataloader_kwargs={"shuffle": False}, compute_loss=True)
    return td


def saved_bytes(fn, parameters: set[tuple[int, ...]]) -> int:
    """Bytes autograd saves for backward while ``fn`` runs (``bench/saved_tensors.py``); tensors of a parameter's full
    shape (FSDP's gathered parameters, which it gathers again for the backward pass) left out."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from saved_tensors import saved_bytes as count

    return count(fn, skip=lambda tensor: tuple(tensor.shape) in parameters)


def _rss_peak_reset() -> int:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status("VmRSS")


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def log_prob_kernel() -> str:
    """Which log-probability kernel verl's update takes here (verl.utils.torch_functional)."""
    from verl.utils import torch_functional

    if getattr(torch_functional, "FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE", False) and \
            os.environ.get("VERL_DISABLE_FLASH_ATTN_CE", "0") != "1":
        return "log probs: flash-attn's cross-entropy (a README-built run's)"
    return ("log probs: logprobs_from_logits_v2's per-row log-softmax (no flash-attn here; a README-built run takes "
            "flash-attn's cross-entropy, which saves less)")


def with_layers(shape: dict, layers: int | None) -> dict:
    return shape if not layers else {**shape, "num_hidden_layers": int(layers)}


def measure(worker, td, device: str) -> dict:
    import torch

    parameters = {tuple(p.shape) for p in worker.engine.module.parameters()}  # a DTensor's shape is the full one
    if device == "cpu":
        before = _rss_peak_reset()
    else:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    start = time.time()
    try:
        saved = saved_bytes(lambda: worker.train_mini_batch(td), parameters)
    except torch.OutOfMemoryError as err:
        return {"outcome": f"out of memory: {str(err).splitlines()[0]}", "seconds": round(time.time() - start, 1)}
    if device == "cpu":
        peak = _status("VmHWM") - before
    else:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    return {"outcome": "ok", "peak_gb": round(peak / GB, 3), "saved_gb": round(saved / GB, 3), "saved_bytes": saved,
            "seconds": round(time.time() - start, 1)}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="qwen3_4b", help="a recipe under recipes/ (its model's shape, its batch)")
    parser.add_argument("--shape", choices=("recipe", "tiny"), default="recipe",
                        help="the recipe model's shape, or a tiny one with Qwen3's vocabulary (a CPU)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="tokens in the micro-batch (default: the recipe's ppo_max_token_len_per_gpu)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--layers", type=int, default=None,
                        help="the model's shape with this many of its layers (a model too deep for one GPU)")
    parser.add_argument("--no-warm-up", action="store_true", help="measure the first update too (Adam's moments are "
                        "made in it: the first mode's figure then lacks them)")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args(argv)

    stood_in = stand_ins()
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": os.environ.get("MASTER_PORT", "29651")})
    import torch
    import torch.distributed as dist

    from egpo.preflight.scale import KNOWN_SHAPES, entropy_saved_bytes

    with tempfile.TemporaryDirectory() as folder:
        probe = recipe_config(args.recipe, Path(folder), args.device)
        name = str(probe.actor_rollout_ref.model.path)
        full = TINY if args.shape == "tiny" else KNOWN_SHAPES[name]
        shape = with_layers(full, args.layers)
        model = build_model(shape, Path(folder) / "model", args.device)
        cfg = recipe_config(args.recipe, model, args.device)
        select_device(cfg, args.device)
        if not dist.is_initialized():
            dist.init_process_group("gloo" if args.device == "cpu" else "nccl", rank=0, world_size=1)
        tokens = args.tokens or int(cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu)
        sequence = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
        worker = make_worker(cfg, tokens)
        from egpo.preflight.scale import ModelShape

        state_per_gpu = 16 * ModelShape.from_dict(name, shape).parameters / int(cfg.trainer.n_gpus_per_node)
        device_name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
        depth = (f", {shape['num_hidden_layers']} of its {full['num_hidden_layers']} layers"
                 if args.layers else "")
        print(f"verl's actor update: {args.recipe} ({'tiny shape' if args.shape == 'tiny' else name}{depth}), "
              f"{tokens:,} tokens, {device_name}, torch {torch.__version__}"
              f"{'; stand-ins (not installed): ' + ', '.join(stood_in) if stood_in else ''}", flush=True)
        print(log_prob_kernel(), flush=True)
        if not args.no_warm_up:  # Adam's moments are made by the first step: every measured mode then has them
            object.__setattr__(worker.engine.engine_config, "entropy_checkpointing", False)
            worker.train_mini_batch(update_batch(tokens, sequence, shape["vocab_size"], False))
            print("warm-up update done (Adam's moments made)", flush=True)
        rows = []
        for mode in args.modes:
            calculate, checkpointed = MODES[mode]
            # verl reads the field at each forward (transformer_impl.py); its config class is frozen after build
            object.__setattr__(worker.engine.engine_config, "entropy_checkpointing", checkpointed)
            td = update_batch(tokens, sequence, shape["vocab_size"], calculate)
            figure = entropy_saved_bytes(cfg, tokens, shape["vocab_size"]) if calculate else 0
            row = {"mode": mode, "tokens": tokens, "layers": shape["num_hidden_layers"],
                   **measure(worker, td, args.device),
                   "preflight_entropy_gb": round(figure / GB, 3), "preflight_entropy_bytes": figure,
                   "sharded_state_per_gpu_gb": round(state_per_gpu / GB, 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        dist.destroy_process_group()
    if args.json:
        args.json.write_text(json.dumps({"recipe": args.recipe, "shape": args.shape, "device": device_name,
                                         "torch": torch.__version__, "stand_ins": stood_in, "rows": rows},
                                        indent=1))
    return rows


if __name__ == "__main__":
    main()
