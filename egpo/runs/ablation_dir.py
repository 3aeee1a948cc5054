"""An ablation's folder: a run folder per arm and seed (``<arm>__seed<seed>``, each a run's folder of
:mod:`egpo.runs.state`), and with ``--generate`` the generation folders (:mod:`egpo.runs.generation_store`): the base
model's samples and its own reading of them at the top, each run's samples and its reading of the base's below it."""

from __future__ import annotations

import re

RUN_NAME = re.compile(r"^(?P<arm>.+)__seed(?P<seed>\d+)$")  # a run's folder name: its arm and its seed

BASE = "generate_base"  # the recipe's model before training samples every prompt (the common responses)
BASE_SCORED = "generate_base_scored"  # the base responses teacher-forced through the base model itself
GENERATED = "generate"  # under a run: its last checkpoint samples every prompt
ON_BASE = "generate_on_base"  # under a run: the base responses teacher-forced through its last checkpoint


def run_name(arm: str, seed: int) -> str:
    return f"{arm}__seed{seed}"
