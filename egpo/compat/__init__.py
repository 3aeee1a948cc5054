"""Where the verl versions egpo serves differ: one table of the tested versions, read by one module per concern.

* :mod:`egpo.compat.versions`: the table (``VERL``: one ``VerlStack`` per tested verl, with the sglang and vLLM it
  pins), and the start-up refusal of any other verl;
* :mod:`egpo.compat.entry`: verl's task runner (the class egpo's runner extends, the module whose
  ``RayPPOTrainer`` name its ``run`` builds the trainer by), guarded;
* :mod:`egpo.compat.rollout`: where rollout replicas are chosen (verl's agent-loop manager, or its LLM server
  manager through verl's replica registry) and what egpo's manager presets;
* :mod:`egpo.compat.seeds`, :mod:`egpo.compat.workers`, :mod:`egpo.compat.verl_shapes`: the rollout seeds, the
  actor workers verl builds, what egpo relies on in verl's source;
* what a stack cannot run is refused by :mod:`egpo.preflight.stack`.

Nothing else in egpo asks which verl it runs on.
"""
