"""Where the verl versions egpo serves differ: one module per concern, each a table keyed by the tested version.

* :mod:`egpo.compat.versions`: which verl versions are tested, and the start-up refusal of any other;
* :mod:`egpo.compat.entry`: verl's task runner (the class egpo's runner extends, the module whose
  ``RayPPOTrainer`` name its ``run`` builds the trainer by), guarded;
* :mod:`egpo.compat.rollout`: where rollout replicas are chosen (verl's agent-loop manager, or its LLM server
  manager through verl's replica registry) and what egpo's manager presets;
* :mod:`egpo.compat.stack`: what each stack's egpo can run (the CPU backend, the probe, sglang), refused at
  start-up with the fix where the stack cannot.

Nothing else in egpo asks which verl it runs on.
"""
