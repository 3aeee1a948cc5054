"""The rollout engines egpo reads per-token entropy from, one descriptor each.

What differs by engine is read from here: the replica egpo registers with verl, which runs it serves, the settings
it refuses, what a CPU run needs of it, its version table, its engine seed. A new engine is one more
:class:`Engine` (and its package under ``egpo/rollout/``); the checks, the tables and the registry iterate
:data:`ENGINES` instead of naming engines. Each ``"module:function"`` is imported only where it is used.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    name: str  # actor_rollout_ref.rollout.name
    replica: str  # egpo's replica ("module:Class"), registered with verl under ``name``
    # egpo's replica serves only the runs that read the rollout's entropy (any other run keeps verl's own replica,
    # and any version verl accepts); else every run under egpo's agent-loop manager
    only_for_rollout_entropy: bool
    cpu_only: bool  # egpo's own CPU rollout (trainer.device=cpu)
    # "module:function" (rollout config) raising an EgpoConfigError that names each setting under which egpo's
    # entropy would be missing or wrong, or its version egpo does not patch; None: none
    limits: str | None
    # "module:function" (config, run facts) -> the settings trainer.device=cpu needs of it, each a fix; None: none
    cpu_problems: str | None
    # "module:function" () run in each CPU worker before verl's worker starts (its weight push); None: none
    cpu_worker_setup: str | None
    versions: str | None  # its version table's module (installed version, untested note); None: egpo's own
    must_match_verl_pin: bool  # egpo patches exactly the version the installed verl pins (VerlStack.<name>)
    shared_seed_key: str | None  # engine_kwargs.<name>.<key>: one seed every replica shares


HF = Engine("hf", replica="egpo.rollout.hf.replica:HFRolloutReplica", only_for_rollout_entropy=False, cpu_only=True,
            limits=None, cpu_problems=None, cpu_worker_setup=None, versions=None, must_match_verl_pin=False,
            shared_seed_key=None)
SGLANG = Engine("sglang", replica="egpo.rollout.sglang.replica:EntropySGLangReplica", only_for_rollout_entropy=False,
                cpu_only=False, limits="egpo.rollout.sglang.limits:refuse_unsupported_settings",
                cpu_problems="egpo.preflight.cpu_backend:sglang_cpu_problems",
                cpu_worker_setup="egpo.cpu.sglang_rollout:prepare_worker_for_sglang",
                versions="egpo.rollout.sglang.versions", must_match_verl_pin=True, shared_seed_key="random_seed")
VLLM = Engine("vllm", replica="egpo.rollout.vllm.replica:EntropyvLLMReplica", only_for_rollout_entropy=True,
              cpu_only=False, limits="egpo.rollout.vllm.limits:refuse_unpatched",
              cpu_problems="egpo.preflight.cpu_backend:vllm_cpu_problems", cpu_worker_setup=None,
              versions="egpo.rollout.vllm.versions", must_match_verl_pin=False, shared_seed_key="seed")

ENGINES = {engine.name: engine for engine in (HF, SGLANG, VLLM)}


def engine(name: str | None) -> Engine | None:
    """The descriptor of ``actor_rollout_ref.rollout.name`` (None: an engine egpo reads no entropy from)."""
    return ENGINES.get(name) if name is not None else None


def load(target: str):
    """The object a descriptor's ``"module:name"`` names."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
