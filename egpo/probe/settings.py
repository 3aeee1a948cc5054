"""``egpo.probe.*``: the probe's switches (off by default), declared in :class:`egpo.options.ProbeOptions`."""

from __future__ import annotations

from dataclasses import fields

from egpo.options import ProbeOptions

WORKER_KEY = "egpo_probe"  # where egpo.main copies them inside actor_rollout_ref (the worker's config)
KNOWN = {f.name for f in fields(ProbeOptions)}
ProbeSettings = ProbeOptions  # read with ProbeSettings.from_config(node)
