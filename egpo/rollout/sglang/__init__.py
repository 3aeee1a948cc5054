"""Rollout entropy from sglang 0.5.6.post2 while it samples: patches applied inside sglang's processes.

Every patch checks its target's shape first (:mod:`egpo.rollout.sglang.guards`) and is idempotent.
"""
