"""A run on disk, whichever tool made it: what each folder holds and how it is read back.

* :mod:`egpo.runs.state`: a training run's folder as the ablation and the main job share it (``run.json``, an
  attempt's metrics joined into ``metrics.jsonl``, the checkpoints, ``done.json``, where a run resumes);
* :mod:`egpo.runs.main_dir`: a main job's run directory (``config.yaml``, ``metrics.jsonl``, ``log.txt``), said at
  its start and end;
* :mod:`egpo.runs.ablation_dir`: an ablation's folder (a run per arm and seed, its generation folders);
* :mod:`egpo.runs.generation_store` and :mod:`egpo.runs.generation_rows`: a generation's folder (its resumable parts)
  and the rows in them.

The running tools (``egpo.main``, ``egpo.generate``, ``egpo.ablation``) write them; the reading tools
(``egpo.analyze``, ``egpo.report``) read them, with no import of the running tools.
"""
