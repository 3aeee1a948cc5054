"""Rollout entropy from sglang (0.5.6.post2 with verl 0.7.1, 0.5.12 with verl 0.9.1) while it samples: patches
applied inside sglang's processes; what differs between the versions is one table (:mod:`egpo.rollout.sglang.versions`).

Every patch checks its target's shape first (:mod:`egpo.rollout.sglang.guards`) and is idempotent.
"""
