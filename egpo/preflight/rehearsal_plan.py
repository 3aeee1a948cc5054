"""What a rehearsal changes in a recipe: only what a CPU cannot hold, each change a Hydra override with the recipe's
value, the rehearsal's and why, and the ratios the preflight's checks read kept.

* **Hardware.** ``trainer.device=cpu`` on two CPU ranks (verl's CPU backend over gloo), each a logical GPU: FSDP2
  shards the actor across them and gathers it for the rollout, its checkpoints are sharded as on a node, and a
  rollout replica of tensor parallelism 2 spans both (a wider one: as wide as the ranks allow); fp32 (a CPU's
  matmuls), eager attention (flash-attn needs a GPU), ray.init's counts for the ranks.
* **The model.** The warm demo model (a Qwen3 of a few layers, its tokenizer with ``<think>`` markers, a chat
  template and an EOS) in place of the recipe's hub model.
* **Lengths.** The prompt length becomes what the demo's prompts need, and every other token count scales by the same
  factor: the response length, the update's and the recompute's tokens per GPU. Their ratios are the recipe's, so
  the batch arithmetic the preflight checks (tokens per GPU against the sequence length) meets the same cases; on
  vLLM, its prefill budget and context (``max_num_batched_tokens``, ``max_model_len``) too.
* **Batch.** ``train_batch_size`` becomes the demo's (4 prompts), the mini-batch the same share of it; ``n`` and the
  validation's ``n`` are the recipe's.
* **Schedule.** The steps, ``test_freq`` and ``save_freq`` divided by their greatest common divisor: the events fall
  in the same order with the same coincidences (a validation on a save step, the last step's save and validation).
* **Data.** The recipe's files where they exist, else the demo's in the same format, with the demo's reward.

The rollout engine, the entropy source, the estimator and its options, the loggers, the checkpoint keep and
everything else are the recipe's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CHECKOUT = Path(__file__).resolve().parents[2]  # the recipes and the committed warm demo
DEMO = ".egpo_demo_warm"  # the committed warm demo (model, tokenizer with <think>, data)
PROMPT_TOKENS = 48  # the demo's longest chat-templated prompt is 33 tokens
BATCH = 4  # prompts a step: the demo's train set is 64
RANKS = 2  # CPU ranks (logical GPUs) of the rehearsal
STEP_CAP = 40  # a schedule divided by its divisor keeps at most this many steps (else: this many, and said)


@dataclass(frozen=True)
class Change:
    key: str
    recipe: object  # the recipe's value (None: not set)
    rehearsal: object
    why: str

    def override(self) -> str:
        value = self.rehearsal
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, (list, tuple)):
            value = "[" + ",".join(map(str, value)) + "]"
        elif isinstance(value, dict):
            value = "{" + ",".join(f"{k}:{v}" for k, v in value.items()) + "}"
        return f"++{self.key}={value}"

    def line(self) -> str:
        return f"  {self.key}: {self.recipe!r} -> {self.rehearsal!r} ({self.why})"


def _get(config: DictConfig, key: str):
    value = OmegaConf.select(config, key, default=None)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def scaled(value, factor: float) -> int:
    return max(1, int(math.ceil(int(value) * factor)))


def schedule(config: DictConfig) -> tuple[int, int, int]:
    """(total steps, test_freq, save_freq) divided by their greatest common divisor (a frequency <= 0: off, kept)."""
    total = int(_get(config, "trainer.total_training_steps") or 0)
    test, save = int(_get(config, "trainer.test_freq") or -1), int(_get(config, "trainer.save_freq") or -1)
    divisor = reduce(math.gcd, [n for n in (total, test, save) if n > 0], 0) or 1
    steps = total // divisor if total else STEP_CAP
    return min(steps, STEP_CAP), (test // divisor if test > 0 else test), (save // divisor if save > 0 else save)


def token_factor(config: DictConfig) -> float:
    """What every token count of ``config`` is multiplied by: the demo's prompts over the recipe's prompt length."""
    return min(1.0, PROMPT_TOKENS / int(_get(config, "data.max_prompt_length")))


SCHEDULE_KEYS = ("trainer.total_training_steps", "trainer.test_freq", "trainer.save_freq")


def plan(config: DictConfig, root: Path = CHECKOUT) -> list[Change]:
    """The changes that make ``config`` (a recipe, composed with the user's overrides) run on this CPU."""
    demo = (root / DEMO).resolve()
    prompt = int(_get(config, "data.max_prompt_length"))
    factor = token_factor(config)
    changes = [
        Change("trainer.device", _get(config, "trainer.device") or "cuda", "cpu", "no GPU here: verl's CPU backend"),
        Change("trainer.n_gpus_per_node", _get(config, "trainer.n_gpus_per_node"), RANKS, "CPU ranks, one logical "
               "GPU each: the actor sharded, its checkpoints too"),
        Change("trainer.nnodes", _get(config, "trainer.nnodes"), 1, "this machine"),
        Change("ray_kwargs.ray_init.num_gpus", _get(config, "ray_kwargs.ray_init.num_gpus"), RANKS,
               "verl counts 'GPU' resources before placing workers"),
        Change("ray_kwargs.ray_init.resources", _get(config, "ray_kwargs.ray_init.resources"), {"cpu": RANKS},
               "verl's placement bundles ask for a 'cpu' resource on a CPU"),
        Change("ray_kwargs.ray_init.num_cpus", _get(config, "ray_kwargs.ray_init.num_cpus"), 8,
               "logical CPUs: verl's workers ask several each, more than two cores"),
        Change("data.dataloader_num_workers", _get(config, "data.dataloader_num_workers"), 0, "two cores"),
        Change("ray_kwargs.ray_init.include_dashboard", _get(config, "ray_kwargs.ray_init.include_dashboard"), False,
               "a run on one machine"),
        Change("actor_rollout_ref.model.path", _get(config, "actor_rollout_ref.model.path"), str(demo / "model"),
               "the warm demo model (Qwen3's family, its tokenizer with <think> markers, a chat template, an EOS)"),
        Change("actor_rollout_ref.model.override_config.attn_implementation",
               _get(config, "actor_rollout_ref.model.override_config.attn_implementation"), "eager",
               "flash-attn needs a GPU (on a GPU: the recipe's)"),
        Change("actor_rollout_ref.model.use_remove_padding", _get(config, "actor_rollout_ref.model.use_remove_padding"),
               False, "packing runs flash-attn's variable-length kernel"),
        Change("actor_rollout_ref.model.enable_gradient_checkpointing",
               _get(config, "actor_rollout_ref.model.enable_gradient_checkpointing"), False,
               "the demo model's activations are small"),
        Change("actor_rollout_ref.actor.strategy", _get(config, "actor_rollout_ref.actor.strategy"), "fsdp2",
               "FSDP1 syncs the module's states through a GPU device"),
        Change("actor_rollout_ref.actor.fsdp_config.dtype", _get(config, "actor_rollout_ref.actor.fsdp_config.dtype"),
               "float32", "a CPU computes in fp32"),
        *(Change(f"actor_rollout_ref.actor.fsdp_config.mixed_precision.{k}",
                 _get(config, f"actor_rollout_ref.actor.fsdp_config.mixed_precision.{k}"), "fp32", "a CPU computes in "
                 "fp32") for k in ("param_dtype", "reduce_dtype", "buffer_dtype")),
        Change("actor_rollout_ref.rollout.dtype", _get(config, "actor_rollout_ref.rollout.dtype"), "float32",
               "a CPU computes in fp32"),
        Change("actor_rollout_ref.rollout.free_cache_engine", _get(config, "actor_rollout_ref.rollout.free_cache_engine"),
               False, "an engine's memory release needs CUDA"),
        Change("actor_rollout_ref.rollout.agent.num_workers", _get(config, "actor_rollout_ref.rollout.agent.num_workers"),
               1, "two cores"),
    ]
    tp = int(_get(config, "actor_rollout_ref.rollout.tensor_model_parallel_size") or 1)
    if math.gcd(tp, RANKS) != tp:  # a replica spans ranks of the rehearsal's, as the recipe's spans GPUs of a node
        changes.append(Change("actor_rollout_ref.rollout.tensor_model_parallel_size", tp, math.gcd(tp, RANKS),
                              f"a rollout replica within the rehearsal's {RANKS} rank(s)"))
    if _get(config, "actor_rollout_ref.rollout.name") == "sglang":
        from egpo.preflight.cpu_backend import SGLANG_CPU_ENGINE

        for key, value in (*SGLANG_CPU_ENGINE.items(), ("max_total_tokens", 4096)):
            changes.append(Change(f"actor_rollout_ref.rollout.engine_kwargs.sglang.{key}",
                                  _get(config, f"actor_rollout_ref.rollout.engine_kwargs.sglang.{key}"), value,
                                  "sglang's CPU engine"))
    for key in ("data.max_prompt_length",):
        changes.append(Change(key, prompt, scaled(prompt, factor), f"the demo's prompts; every token count x "
                                                                     f"{factor:.4g}"))
    for key in ("data.max_response_length", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"):
        value = _get(config, key)
        if isinstance(value, int) and value > 0:
            changes.append(Change(key, value, scaled(value, factor), f"x {factor:.4g}, the recipe's ratios kept"))
    if _get(config, "actor_rollout_ref.rollout.name") == "vllm":  # vLLM's prefill budget against its context
        for key in ("actor_rollout_ref.rollout.max_num_batched_tokens", "actor_rollout_ref.rollout.max_model_len"):
            value = _get(config, key)
            if isinstance(value, int) and value > 0:
                changes.append(Change(key, value, scaled(value, factor), f"x {factor:.4g}, vLLM's prefill budget "
                                                                         "against its context kept"))
    batch = int(_get(config, "data.train_batch_size"))
    share = BATCH / batch
    changes.append(Change("data.train_batch_size", batch, BATCH, "the demo's prompts a step"))
    mini = _get(config, "actor_rollout_ref.actor.ppo_mini_batch_size")
    if isinstance(mini, int):
        changes.append(Change("actor_rollout_ref.actor.ppo_mini_batch_size", mini, scaled(mini, share),
                              f"the same {batch // mini if mini else 1} update(s) a step"))
    steps, test, save = schedule(config)
    changes += [
        Change("trainer.total_training_steps", _get(config, "trainer.total_training_steps"), steps,
               "the schedule over its greatest common divisor: the same events in the same order"),
        Change("trainer.test_freq", _get(config, "trainer.test_freq"), test, "the same divisor"),
        Change("trainer.save_freq", _get(config, "trainer.save_freq"), save, "the same divisor"),
    ]
    for split, file in (("data.train_files", "train.parquet"), ("data.val_files", "val.parquet")):
        given = _get(config, split)
        files = given if isinstance(given, list) else [given]
        if not all(f and Path(str(f)).expanduser().exists() for f in files):
            changes.append(Change(split, given, str(demo / "data" / file), "the recipe's file is not here: the demo's, "
                                                                            "in verl's RL parquet format"))
    if any(c.key == "data.train_files" for c in changes):
        changes += [Change("reward.custom_reward_function.path", _get(config, "reward.custom_reward_function.path"),
                           "pkg://egpo.demo.reward", "the demo data's reward"),
                    Change("reward.custom_reward_function.name", _get(config, "reward.custom_reward_function.name"),
                           "compute_score", "the demo data's reward")]
    return [c for c in changes if c.recipe != c.rehearsal]
