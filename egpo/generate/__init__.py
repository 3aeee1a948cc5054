"""Generation-only runs: samples with per-token entropy from a model or checkpoint (``python -m egpo.generate``),
teacher-forced scoring of another run's samples (``--score``); read by :mod:`egpo.analyze`.

Where each part lives: :mod:`egpo.generate.setup` (the driver: config, checkpoint, run.json, before Ray),
:mod:`egpo.generate.trainer` (the loop, in verl's task runner), :mod:`egpo.runs.generation_rows` (tensors -> rows),
:mod:`egpo.runs.generation_store` (the run's folder, resumable parts).
"""
