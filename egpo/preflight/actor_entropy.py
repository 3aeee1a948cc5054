"""The actor's entropy as egpo reads it: in fp32, at no memory verl would not use (driver side, before Ray starts).

egpo reads the entropy of the actor's old-log-prob recompute whenever that recompute runs in an egpo run: as the
bonus's entropy (``entropy_source=actor``) or for the rollout-vs-actor agreement figures. Two verl defaults would
corrupt it:

* **precision**: verl's plain ``entropy_from_logits`` takes softmax, logsumexp and sum(p * x) in the logits' dtype.
  FSDP's forward runs in its mixed-precision ``param_dtype`` (bf16 by default), so the entropy is a difference of two
  20-40 nat bf16 numbers: about +-0.1 nat per token against thoughts near 0.5. fp32 comes from verl's chunked
  entropy (``actor.entropy_from_logits_with_chunking=true``, which casts each chunk to fp32; verl reads it only on
  the remove-padding path) or its fused kernels (``model.use_fused_kernels=true``, fp32 logits). Megatron's
  ``Float16Module`` returns fp32 logits, and its vocab-parallel entropy works on those.
* **where it is computed**: egpo reads the old-policy recompute's entropy, which both verls compute whatever the
  config says (:mod:`egpo.compat.verl_shapes` checks that at start-up). ``actor.calculate_entropy`` is another
  entropy, the one of every actor-update micro-batch: on verl 0.9.1 a full-vocabulary fp32 entropy with a backward
  pass (its coefficient 0 does not skip autograd), tens of GB at a Qwen3 recipe's token budget. egpo never sets it;
  where a user's config does (or an entropy bonus needs it) the preflight states its memory
  (:mod:`egpo.preflight.scale`).

:func:`prepare_actor_entropy` sets what it can and returns the refusal (with the fixes) of what it cannot.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf, open_dict

from egpo.compat.versions import ActorEntropyKeys
from egpo.preflight.findings import Finding, error
from egpo.settings import EgpoSettings

ACTOR = "actor_rollout_ref.actor"
CHUNKED = f"{ACTOR}.entropy_from_logits_with_chunking"
CALCULATE = f"{ACTOR}.calculate_entropy"  # the update-time entropy: never set by egpo
FUSED = "actor_rollout_ref.model.use_fused_kernels"
REMOVE_PADDING = "actor_rollout_ref.model.use_remove_padding"
PARAM_DTYPE = f"{ACTOR}.fsdp_config.mixed_precision.param_dtype"
FP32_NAMES = ("fp32", "float32", "torch.float32", "float")


def reads_actor_entropy(settings: EgpoSettings) -> bool:
    """The run reads the actor's recompute entropy (the bonus, or the agreement with the rollout's entropy or
    surprisal)."""
    return settings.enabled and not settings.bypass_mode


def actor_strategy(config: DictConfig) -> str:
    return str(config.actor_rollout_ref.actor.get("strategy", "fsdp"))


def actor_entropy_keys(config: DictConfig, version: str | None = None) -> ActorEntropyKeys | None:
    """Where the actor verl builds for this config reads its entropy settings (verl's table,
    :data:`egpo.compat.versions.VERL`, by worker family and actor strategy); None for a strategy it has no entry
    for."""
    from egpo.compat.workers import workers

    return workers(config, version).entropy_keys(actor_strategy(config))


def forward_dtype_is_fp32(config: DictConfig, keys: ActorEntropyKeys | None) -> bool:
    """FSDP's forward runs in fp32 (``mixed_precision.param_dtype``, where the actor follows it; verl's default is
    bf16)."""
    value = OmegaConf.select(config, PARAM_DTYPE, default="bf16")
    return keys is not None and keys.follows_param_dtype and str(value).lower() in FP32_NAMES


_READ = object()  # the keys not given: read from verl's table for the installed verl


def actor_entropy_precision(config: DictConfig, keys: ActorEntropyKeys | None = _READ) -> str:
    """How the actor's entropy will be computed under ``config``: ``"fp32"``, or the reason it would be bf16.
    ``keys``: where the actor reads its entropy settings (the pass's ``run.entropy_keys``; else read here)."""
    strategy = actor_strategy(config)
    if strategy == "megatron":
        return "fp32"  # Float16Module hands fp32 logits to the vocab-parallel entropy
    if keys is _READ:
        keys = actor_entropy_keys(config)
    if keys is None:
        from egpo.compat.versions import verl_version

        return (f"{ACTOR}.strategy={strategy}: egpo has no entry for where that actor reads its entropy settings on "
                f"verl {verl_version()}, so it cannot make that entropy fp32")
    if OmegaConf.select(config, FUSED, default=False) or forward_dtype_is_fp32(config, keys):
        return "fp32"
    chunked = keys.chunked
    if not OmegaConf.select(config, REMOVE_PADDING, default=False):
        return (f"{REMOVE_PADDING}=false: verl's padded forward takes the entropy of the bf16 logits in bf16 "
                f"(its chunked fp32 entropy, {chunked}, is read only with remove-padding)")
    if not OmegaConf.select(config, chunked, default=False):
        return f"{chunked}=false: verl takes the entropy of the bf16 logits in bf16"
    return "fp32"


UNFIXABLE_FIXES = ((f"{REMOVE_PADDING}=true",), (f"{FUSED}=true",))


def compiles_chunked_entropy(config: DictConfig, keys: ActorEntropyKeys | None = _READ) -> list[str]:
    """The keys that would compile verl's chunked entropy in this FSDP config (none where it is not chunked)."""
    if keys is _READ:
        keys = actor_entropy_keys(config)
    if actor_strategy(config) == "megatron" or keys is None:
        return []
    if not OmegaConf.select(config, keys.chunked, default=False):
        return []
    return [key for key in keys.compile if OmegaConf.select(config, key, default=True)]


def prepare_actor_entropy(config: DictConfig, run) -> list[Finding]:
    """Where egpo reads the actor's entropy: fp32 entropy (chunked entropy set on the remove-padding path, with verl's
    compile of it off; the padded bf16 path refused with its fixes). Any other run is left as it is."""
    settings = run.settings
    if not reads_actor_entropy(settings):
        return []
    keys = run.entropy_keys
    with open_dict(config):
        precision = actor_entropy_precision(config, keys)
        if precision != "fp32" and keys is not None and OmegaConf.select(config, REMOVE_PADDING, default=False):
            chunked = keys.chunked
            OmegaConf.update(config, chunked, True, force_add=True)
            run.say(f"[egpo] {chunked}=true: egpo reads the actor's entropy, and verl computes it in fp32 only there")
            precision = actor_entropy_precision(config, keys)
        if precision == "fp32":
            compiled = compiles_chunked_entropy(config, keys)
            for key in compiled:
                OmegaConf.update(config, key, False, force_add=True)
            if compiled:
                run.say(f"[egpo] {' '.join(key + '=false' for key in compiled)}: verl's compiled chunked entropy recompiles for every new "
                     "token count (8 times a worker), then runs eager anyway")
    what = settings.actor_entropy_use
    if precision != "fp32" and keys is None:
        return [error("actor", f"egpo reads the actor's entropy ({what}) and cannot guarantee it in fp32: {precision}. "
                               f"Fix: {ACTOR}.strategy=fsdp2")]
    if precision != "fp32":
        return [error(
            "actor",
            f"egpo reads the actor's entropy ({what}), but it would be computed in bf16: {precision}, an error of about "
            f"0.1 nat per token. Fix: {UNFIXABLE_FIXES[0][0]} (verl's fp32 chunked entropy, which egpo then turns "
            f"on), or {UNFIXABLE_FIXES[1][0]} (fp32 logits)",
            UNFIXABLE_FIXES,
        )]
    return []
