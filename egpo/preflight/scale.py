"""What egpo adds at the run's real scale, from the model's shape and the batch settings, before any GPU hour.

The model's shape comes from its ``config.json`` where it can be read (a local folder, or the Hugging Face cache; no
download), and otherwise from :data:`KNOWN_SHAPES` (the recipes' Qwen3 models). From it and the config:

* **per GPU, the actor update**: egpo adds nothing. The update-time entropy (``actor.calculate_entropy``, or a
  non-zero ``entropy_coeff``) is stated where the config turns it on: verl's chunked fp32 entropy saves two fp32
  copies of the micro-batch's bf16 logits for the backward pass (``2 x tokens x vocab x 4`` bytes: each chunk's
  upcast and softmax), its plain entropy one softmax in the logits' dtype (measured on the CPU by
  ``tests/test_update_memory.py``); fused kernels never materialise them.
* **per GPU, the old-policy recompute**: verl computes its entropy in every run; egpo has it in fp32 chunks, a few
  of one chunk's size alive at a time, with no gradient.
* **on the driver (host memory), per step**: the rollout's entropy (one fp32 per response token), the
  rollout-vs-actor agreement (float64 copies of the valid tokens of both), the surprisal (the negated rollout log
  probs) and its agreement with the actor's entropy, the 80/20 rule's selection, STARE's weights; bounds on each
  function's measured peak (``tests/test_scale.py``).
* **on disk**: bytes per checkpoint (the fp32 model and Adam's two moments: 12 bytes a parameter, and the tied
  embedding's second copy in the state dict; checked against a real checkpoint of the demo model by
  ``tests/test_scale.py``) x the checkpoints kept x runs, against the free space where they are written.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from egpo.entropy_sources import SOURCES
from egpo.preflight.findings import Finding, error, fact, warning

GB = 1e9
# config.json of the recipes' models (huggingface.co/Qwen/Qwen3-*/config.json), for a machine that cannot read them
KNOWN_SHAPES = {
    "Qwen/Qwen3-1.7B": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                            num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                            max_position_embeddings=40960),
    "Qwen/Qwen3-4B": dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                          num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                          max_position_embeddings=40960),
    "Qwen/Qwen3-8B": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                          num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
                          max_position_embeddings=40960),
}
UPDATE_ENTROPY_WARNING = 8 * GB  # the update-time entropy's saved tensors above this per GPU: warned, with the fix
DISK_WARNING_SHARE = 0.8  # checkpoints above this share of the free space: warned
ADAM_BYTES = 8  # exp_avg and exp_avg_sq, fp32
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}
FUSED_FIX = "actor_rollout_ref.model.use_fused_kernels=true"
# host bytes per response token on the driver, bounds on the peak with every token valid (tests/test_scale.py
# measures each function's peak resident memory at 4M tokens against these; the peak varies by a few bytes a token
# from run to run with the order the allocator returns memory in)
# each entropy source's own tensor (egpo.entropy_sources: its driver_bytes), (batch, response length) fp32: the rollout
# engine's entropy, the actor's recompute entropy kept in the batch, the negated rollout log probs
ROLLOUT_ENTROPY_BYTES = SOURCES["rollout"].driver_bytes
ACTOR_ENTROPY_BYTES = SOURCES["actor"].driver_bytes
SURPRISAL_BYTES = SOURCES["surprisal"].driver_bytes
AGREEMENT_BYTES = 48  # egpo.trainer.metrics.entropy_agreement: float64 copies of both, the valid tokens' indices
SELECTION_BYTES = 24  # egpo.advantage.token_selection.top_entropy_mask: flags, the valid values, the narrowed mask
STARE_BYTES = 64  # egpo.advantage.stare.stare_weights and the reweighted advantages: flags, surprisals, the weights
GTPO_BYTES = 100  # egpo.advantage.gtpo.gtpo_advantage: the per-group sums at each position, the rewards, the z-scores
GRPO_S_BYTES = 48  # egpo.advantage.gtpo.grpo_s_advantage: the masks, the advantages and rewards broadcast


@dataclass(frozen=True)
class ModelShape:
    source: str  # where the shape was read
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool
    max_positions: int | None = None  # max_position_embeddings: the context verl gives an engine by default

    @classmethod
    def from_dict(cls, source: str, fields: dict) -> "ModelShape":
        heads = int(fields["num_attention_heads"])
        head_dim = fields.get("head_dim") or int(fields["hidden_size"]) // heads
        return cls(source, int(fields["vocab_size"]), int(fields["hidden_size"]), int(fields["intermediate_size"]),
                   int(fields["num_hidden_layers"]), heads, int(fields.get("num_key_value_heads") or heads),
                   int(head_dim), bool(fields.get("tie_word_embeddings", False)),
                   int(fields["max_position_embeddings"]) if fields.get("max_position_embeddings") else None)

    @property
    def parameters(self) -> int:
        """A Qwen3 (Llama-shaped, q/k norms, no biases) decoder's parameter count."""
        h, heads, kv, d = self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim
        attention = h * heads * d + 2 * h * kv * d + heads * d * h + 2 * d  # q, k, v, o; q_norm, k_norm
        layer = attention + 3 * h * self.intermediate_size + 2 * h  # gate, up, down; two norms
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return embeddings + self.num_hidden_layers * layer + h  # final norm


def model_shape(config) -> ModelShape | None:
    """The policy's shape: its config.json (a local folder or the Hugging Face cache), else :data:`KNOWN_SHAPES`."""
    path = str(config.actor_rollout_ref.model.path)
    local = Path(path).expanduser() / "config.json"
    candidates = [local] if local.is_file() else []
    if not candidates:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(path, "config.json")
            if isinstance(cached, str):
                candidates.append(Path(cached))
        except Exception:  # noqa: BLE001 - not a repository id, or no hub library: fall back to the table
            pass
    for candidate in candidates:
        fields = json.loads(candidate.read_text())
        fields = fields.get("text_config", fields)
        if "vocab_size" in fields and "hidden_size" in fields:
            return ModelShape.from_dict(f"{candidate}", fields)
    known = KNOWN_SHAPES.get(path.rstrip("/"))
    return ModelShape.from_dict(f"egpo's table for {path}", known) if known else None


def _select(config, key, default=None):
    return OmegaConf.select(config, key, default=default, throw_on_missing=False)


def _count(n: int) -> str:
    return f"{n / 1e9:,.2f}B" if n >= 1e9 else f"{n / 1e6:,.2f}M" if n >= 1e6 else f"{n:,}"


def gb(n: float) -> str:
    return f"{n / GB:,.1f} GB" if n >= 0.1 * GB else f"{n / 1e6:,.1f} MB"


def sequence_length(config) -> int:
    return int(config.data.max_prompt_length) + int(config.data.max_response_length)


def update_tokens_per_gpu(config) -> int:
    """The most tokens one actor-update micro-batch holds on one GPU."""
    actor = config.actor_rollout_ref.actor
    if actor.get("use_dynamic_bsz", False):
        return int(actor.ppo_max_token_len_per_gpu)
    return int(actor.get("ppo_micro_batch_size_per_gpu") or 1) * sequence_length(config)


def recompute_tokens_per_gpu(config) -> int:
    """The most tokens one old-log-prob micro-batch holds on one GPU."""
    rollout = config.actor_rollout_ref.rollout
    if rollout.get("log_prob_use_dynamic_bsz", False):
        return int(rollout.log_prob_max_token_len_per_gpu)
    return int(rollout.get("log_prob_micro_batch_size_per_gpu") or 1) * sequence_length(config)


def update_entropy_reason(config) -> str | None:
    """Why this config computes the update-time entropy (None: it does not)."""
    actor = config.actor_rollout_ref.actor
    if actor.get("calculate_entropy", False):
        return "actor_rollout_ref.actor.calculate_entropy=true"
    if float(actor.get("entropy_coeff", 0) or 0) != 0:
        return f"actor_rollout_ref.actor.entropy_coeff={actor.entropy_coeff} (an entropy bonus)"
    return None


def logits_dtype_bytes(config) -> int:
    """Bytes per logit of the FSDP forward (``mixed_precision.param_dtype``; verl's default bf16)."""
    dtype = str(_select(config, "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype", "bf16")).lower()
    return DTYPE_BYTES.get(dtype.removeprefix("torch."), 2)


def entropy_saved_bytes(config, tokens: int, vocab: int) -> int:
    """Bytes verl's entropy of ``tokens`` logits saves for the backward pass on one GPU, beyond what the log
    probabilities save already (the logits themselves): 0 with fused kernels."""
    if _select(config, "actor_rollout_ref.model.use_fused_kernels", False):
        return 0
    actor = config.actor_rollout_ref.actor
    if actor.get("strategy", "fsdp") == "megatron":
        tp = int(_select(config, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size", 1) or 1)
        return 2 * tokens * math.ceil(vocab / tp) * 4  # the fp32 logits and softmax, a vocabulary shard each
    dtype_bytes = logits_dtype_bytes(config)
    chunked = actor.get("entropy_from_logits_with_chunking", False) and \
        _select(config, "actor_rollout_ref.model.use_remove_padding", False)  # verl reads it only there
    if chunked:  # each chunk's fp32 softmax, and its fp32 upcast where the logits are not fp32 already
        return tokens * vocab * 4 * (1 if dtype_bytes == 4 else 2)
    return tokens * vocab * dtype_bytes  # the softmax, in the logits' dtype


def gpu_findings(config, shape: ModelShape, run) -> list[Finding]:
    from egpo.preflight.actor_entropy import reads_actor_entropy

    settings = run.settings
    findings = []
    tokens, vocab = update_tokens_per_gpu(config), shape.vocab_size
    reason = update_entropy_reason(config)
    if reason is None:
        findings.append(fact("gpu", f"actor update ({tokens:,} tokens per GPU): egpo adds nothing (no update-time "
                                    "entropy)"))
    else:
        saved = entropy_saved_bytes(config, tokens, vocab)
        text = (f"actor update ({tokens:,} tokens per GPU): {reason} computes the update-time entropy, which saves "
                f"{gb(saved)} per GPU for the backward pass")
        if saved >= UPDATE_ENTROPY_WARNING:
            findings.append(warning("gpu", f"{text} (fp32 copies of the micro-batch's {tokens:,} x {vocab:,} logits, "
                                           f"beside the model's activations and logits; verl takes the entropy "
                                           f"before the log probs, so the update holds these bytes at once, beside "
                                           f"the logits; verl's own update at this size is not measured, docs/benchmarks.md): "
                                           f"likely out of memory; fused kernels never materialise them: "
                                           f"{FUSED_FIX}"))
        else:
            findings.append(fact("gpu", text))
    keys = run.entropy_keys
    if settings.enabled and reads_actor_entropy(settings) and keys is not None and \
            _select(config, keys.chunked, False) and \
            not _select(config, "actor_rollout_ref.model.use_fused_kernels", False):
        chunk = int(config.actor_rollout_ref.actor.get("entropy_from_logits_chunk_size", 2048) or 2048)
        rows = min(chunk, recompute_tokens_per_gpu(config))
        findings.append(fact("gpu", f"old-policy recompute ({recompute_tokens_per_gpu(config):,} tokens per GPU): "
                                    "verl computes its entropy in every run, egpo has it in fp32 chunks of "
                                    f"{rows:,} rows x {vocab:,} x 4 B = {gb(rows * vocab * 4)}, a few alive at a "
                                    "time (no gradient)"))
    return findings


# verl's step batch in the trainer process, per sequence position: int64 input_ids, attention_mask and position_ids
# over the whole sequence, and over the response its int64 responses and response_mask and about eight fp32 per-token
# tensors (old and rollout log probs, entropy, scores, rewards, advantages, returns, reference log probs)
SEQUENCE_BYTES = 3 * 8
RESPONSE_BYTES = 2 * 8 + 8 * 4


def step_batch_bytes(config) -> int:
    """About how much host memory verl's padded step batch takes in the trainer process (verl's, not egpo's)."""
    rows = int(config.data.train_batch_size) * int(config.actor_rollout_ref.rollout.n)
    prompt, response = int(config.data.max_prompt_length), int(config.data.max_response_length)
    return rows * ((prompt + response) * SEQUENCE_BYTES + response * RESPONSE_BYTES)


def egpo_driver_bytes(config, settings) -> int:
    """The most host memory egpo adds on the driver per step (:func:`driver_findings`'s total; 0: none)."""
    from egpo.settings import rollout_name

    return sum(size for _, size in _driver_parts(config, settings, rollout_name(config)))


def driver_findings(config, run) -> list[Finding]:
    """Host memory egpo holds on the driver per step (transient; freed with the batch)."""
    settings = run.settings
    if not settings.enabled:
        return []
    parts = _driver_parts(config, settings, run.rollout)
    cells = int(config.data.train_batch_size) * int(config.actor_rollout_ref.rollout.n) * \
        int(config.data.max_response_length)
    if not parts:
        return [fact("driver", "egpo holds nothing on the driver beyond verl's own batch")]
    total = sum(size for _, size in parts)
    return [fact("driver", f"at most {gb(total)} host memory per step over {cells:,} response tokens: " +
                           ", ".join(f"{name} {gb(size)}" for name, size in parts))]


def _driver_parts(config, settings, rollout: str | None) -> list[tuple[str, int]]:
    """``rollout``: actor_rollout_ref.rollout.name."""
    from egpo.preflight.actor_entropy import reads_actor_entropy
    from egpo.settings import ENTROPY_ROLLOUTS

    if not settings.enabled:
        return []
    cells = int(config.data.train_batch_size) * int(config.actor_rollout_ref.rollout.n) * \
        int(config.data.max_response_length)
    parts = []
    source = settings.source
    recompute = reads_actor_entropy(settings)  # the actor's recompute entropy reaches the driver
    if recompute and source.from_recompute:  # verl drops it after its metric; egpo keeps it
        parts.append((source.cost_words, cells * source.driver_bytes))
    if rollout in ENTROPY_ROLLOUTS:  # egpo's engines return their entropy into every egpo run's batch
        engine = SOURCES["rollout"]
        parts.append((engine.cost_words, cells * engine.driver_bytes))
        if recompute:
            parts.append(("rollout-vs-actor agreement", cells * AGREEMENT_BYTES))
    if source.negated:  # verl's log probs are verl's cost; their negation, and its agreement, are egpo's
        parts.append((source.cost_words, cells * source.driver_bytes))
        if recompute:
            parts.append((f"{source.name}-vs-actor agreement", cells * (source.driver_bytes + AGREEMENT_BYTES)))
    if settings.selects_tokens:
        parts.append(("80/20 selection", cells * SELECTION_BYTES))
    if settings.algo.egpo_token_reweighting == "stare":
        parts.append(("STARE's weights", cells * STARE_BYTES))
    if settings.algo.egpo_method == "gtpo":
        parts.append(("GTPO's shaping", cells * GTPO_BYTES))
    elif settings.algo.egpo_method == "grpo_s":
        parts.append(("GRPO-S's shaping", cells * GRPO_S_BYTES))
    return parts


def checkpoint_bytes(config, shape: ModelShape) -> int:
    """One checkpoint of the actor: the model's state dict in ``model_dtype`` (fp32; a tied embedding is in it twice,
    as the input embedding and as the output head) and Adam's two fp32 moments per parameter."""
    contents = list(_select(config, "actor_rollout_ref.actor.checkpoint.save_contents", ["model", "optimizer", "extra"])
                    or [])
    dtype = str(_select(config, "actor_rollout_ref.actor.fsdp_config.model_dtype", "fp32") or "fp32").lower()
    state_dict = shape.parameters + (shape.vocab_size * shape.hidden_size if shape.tie_word_embeddings else 0)
    return (state_dict * DTYPE_BYTES.get(dtype, 4) if "model" in contents else 0) + \
        (shape.parameters * ADAM_BYTES if "optimizer" in contents else 0) + \
        (state_dict * 2 if "hf_model" in contents else 0)


def saves_per_run(config, steps: int | None, after: int = 0) -> int | None:
    """The saves of steps ``after + 1`` to ``steps``: every ``save_freq``-th step, and the last (``after``: the step a
    resumed run starts from, whose saves are made)."""
    freq = int(config.trainer.get("save_freq", -1) or -1)
    if freq <= 0:
        return 0
    if steps is None:
        return None
    if after >= steps:
        return 0
    return steps // freq - after // freq + (0 if steps % freq == 0 else 1)


def free_bytes(where: Path) -> tuple[int, Path]:
    """Free space of the disk ``where`` is (or will be) on: its nearest existing folder."""
    where = Path(where).expanduser().resolve()
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free, probe


def peak_checkpoints(keep: int) -> int:
    """The checkpoints on disk at once when verl keeps ``keep``: verl deletes the oldest only after the next one is
    written whole, and with keep=1 not before the new one is registered (0.9.1 and 0.7.1
    ``CheckpointManager.ensure_checkpoint_capacity`` returns early for keep <= 1; ``register_checkpoint`` removes the
    old one afterwards), so keep=1 peaks at 2. Every keep >= 2 deletes before it saves and peaks at keep."""
    return max(int(keep), 2)


FEWEST_KEPT = 2  # the fewest checkpoints a fix offers: keep=1 peaks at 2 anyway, and a run killed between saving a
# checkpoint and logging its step resumes from the one before it


def disk_finding(per_checkpoint: int, peak: int, runs: int, where: Path, what: str, fewer,
                 fewest: int = FEWEST_KEPT, already: str = "") -> Finding:
    """``peak``: the checkpoints a run holds at once; ``fewer(k)``: the override that makes the peak ``k`` (offered
    only for ``k >= fewest``); ``already``: what is on that disk already for this run, said in the line."""
    total = per_checkpoint * peak * runs
    free, probe = free_bytes(where)
    text = (f"{what}: {gb(per_checkpoint)} per checkpoint x {peak} at the peak" + (f" x {runs} runs" if runs > 1 else "")
            + f" = {gb(total)}; {gb(free)} free on the disk of {probe}" + (f" ({already})" if already else ""))
    if total <= DISK_WARNING_SHARE * free:
        return fact("disk", text)
    fits = int(free // max(1, per_checkpoint * runs))
    fix = fewer(min(fits, peak - 1)) if fewest <= min(fits, peak - 1) else None
    fixes = "free space there, or write to a disk with " + gb(total) + " free" + (f", or keep fewer: {fix}" if fix else "")
    if total > free:
        return error("disk", f"{text}: a run would fail at a save. Fix: {fixes}")
    return warning("disk", f"{text}: over {DISK_WARNING_SHARE:.0%} of it, with nothing else written there. Fix: {fixes}")


def resumed_at(config) -> int:
    """The step a main job resumes from (verl's pointer in its run directory; 0: a fresh start)."""
    from egpo.runs.main_dir import resumed_step

    where = Path(str(config.trainer.default_local_dir)).expanduser()
    return resumed_step(config, where) if where.is_dir() else 0  # 0 under resume_mode=disable too


def leftover_checkpoints(config) -> tuple[list[Path], int]:
    """A main job that resumes (``trainer.resume_mode=auto`` with verl's pointer in its run directory) finds the
    checkpoints of the attempt before it there; verl's rotation knows only those its own attempt saves, so they stay
    until the run ends: (their folders, their bytes on disk; already off the free space)."""
    where = Path(str(config.trainer.default_local_dir)).expanduser()
    if not resumed_at(config):
        return [], 0
    folders = sorted(p for p in where.glob("global_step_*") if p.is_dir())
    size = sum(f.stat().st_size for folder in folders for f in folder.rglob("*") if f.is_file())
    return folders, size


def checkpoints_held(config, steps: int | None, after: int = 0) -> tuple[int, int] | None:
    """(the checkpoints verl keeps, the most on disk at once) over steps ``after + 1`` to ``steps``; None where the
    run's length is unknown and nothing bounds the keep."""
    saves = saves_per_run(config, steps, after=after)
    if saves == 0:
        return 0, 0
    keep = config.trainer.get("max_actor_ckpt_to_keep", None)
    kept = saves if keep is None else (min(int(keep), saves) if saves is not None else int(keep))
    if kept is None:
        return None
    return kept, (min(peak_checkpoints(kept), saves) if saves is not None else peak_checkpoints(kept))


def run_checkpoint_finding(config, shape: ModelShape, steps: int | None) -> Finding | None:
    held = checkpoints_held(config, steps, after=resumed_at(config))  # a resumed job: only the saves still to come
    if held == (0, 0):
        return None
    if held is None:
        return fact("disk", f"{gb(checkpoint_bytes(config, shape))} per checkpoint (every trainer.save_freq="
                            f"{config.trainer.save_freq} steps; the run's length is unknown)")
    kept, peak = held
    what = "checkpoints" + (f" (max_actor_ckpt_to_keep={kept} holds {peak} while the next is written)"
                            if peak > kept else "")
    folders, size = leftover_checkpoints(config)
    already = (f"{len(folders)} checkpoint(s) of the attempt it resumes, {gb(size)}, stay beside them until the run "
               f"ends: verl rotates only the ones it saves") if folders else ""
    return disk_finding(checkpoint_bytes(config, shape), peak, 1, Path(str(config.trainer.default_local_dir)),
                        what, lambda k: f"trainer.max_actor_ckpt_to_keep={k}", already=already)


def ablation_disk_finding(config, runs: int, keep: int, out: Path) -> Finding | None:
    """An ablation's checkpoints at their peak: ``keep`` per run plus the one a resumed attempt starts from, for
    every run, against the free space of ``--out`` (None: the model's shape is unknown)."""
    shape = model_shape(config)
    if shape is None or runs == 0:
        return None
    return disk_finding(checkpoint_bytes(config, shape), keep + 1, runs, out,
                        f"the ablation's checkpoints at their peak (--keep {keep}, plus the one a resumed attempt "
                        "starts from)", lambda k: f"--keep {k - 1}", fewest=3)


def run_scale_findings(config, run) -> list[Finding]:
    """:func:`scale_findings` over the steps the data step's rows plan (``run.rows``)."""
    from egpo.preflight.budget import planned_steps

    return scale_findings(config, planned_steps(config, run.rows.get("data.train_files"))[0], run)


def scale_findings(config, steps: int | None, run) -> list[Finding]:
    """What egpo adds per GPU and on the driver, and the run's checkpoint footprint, for a prepared config and its
    facts (:class:`egpo.preflight.run_facts.Run`)."""
    shape = model_shape(config)
    if shape is None:
        return [fact("scale", f"the shape of {config.actor_rollout_ref.model.path} is unknown (no readable "
                              "config.json): per-GPU and checkpoint figures not computed")]
    findings = [fact("scale", f"{_count(shape.parameters)} parameters, vocabulary {shape.vocab_size:,} "
                              f"({shape.source})")]
    findings += gpu_findings(config, shape, run)
    findings += driver_findings(config, run)
    checkpoint = run_checkpoint_finding(config, shape, steps)
    if checkpoint is not None:
        findings.append(checkpoint)
    return findings
