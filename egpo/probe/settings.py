"""``egpo.probe.*``: the probe's switches (off by default)."""

from __future__ import annotations

from dataclasses import dataclass

WORKER_KEY = "egpo_probe"  # where egpo.main copies them inside actor_rollout_ref (the worker's config)
KNOWN = {"enable", "every", "realised", "attribution"}


@dataclass(frozen=True)
class ProbeSettings:
    enable: bool = False
    every: int = 1  # probe every N-th actor update
    realised: bool = True  # also re-forward after the update to measure the realised change
    attribution: bool = False  # same-prompt / cross-prompt split and the bias-free estimates (~2x an update)

    @classmethod
    def from_config(cls, node) -> "ProbeSettings":
        values = dict(node or {})
        unknown = set(values) - KNOWN
        if unknown:
            raise ValueError(f"unknown egpo.probe key(s) {sorted(unknown)}; known: {sorted(KNOWN)}")
        settings = cls(
            enable=bool(values.get("enable", False)),
            every=int(values.get("every", 1)),
            realised=bool(values.get("realised", True)),
            attribution=bool(values.get("attribution", False)),
        )
        if settings.every < 1:
            raise ValueError(f"egpo.probe.every must be >= 1 (got {settings.every})")
        return settings
