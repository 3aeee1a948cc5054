"""A recipe's own run rehearsed on the CPU (``python -m egpo.rehearse``): :mod:`egpo.preflight.rehearsal_plan` says what changes
(only what a CPU cannot hold), :mod:`egpo.rehearse.schedule` what the schedule's events are and whether the run held
each."""
