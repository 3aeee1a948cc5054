"""The entropy probe: predict, around a real optimizer step, how much the policy's entropy will move.

Plain tensor / optimizer code, independent of verl:

* :mod:`surrogate` - scalars whose gradient is the entropy-surrogate direction u (sequence entropy with a
  leave-one-out baseline; per-token entropy on fixed contexts, verl's ``actor/entropy``);
* :mod:`adamw` - an AdamW step split into its fresh-gradient, momentum and weight-decay parts, exactly;
* :mod:`step_probe` - hooks on a real optimizer capturing theta_t, theta_{t+1} and the state, and
  delta_H_pred = u . (theta_{t+1} - theta_t) with float64 reductions, plus its parts;
* :mod:`attribution` - same-prompt / cross-prompt block totals from per-group gradients, the bias-free
  variants, and the per-sequence kernel K1 on request;
* :mod:`ground_truth` - the exact on-policy sequence entropy of a small-vocabulary model, for validation;
* :mod:`update_probe` - the probe around one actor update, whatever runs its passes; :mod:`settings` - its
  switches (``egpo.probe.*``);
* :mod:`actor_probe`, :mod:`worker` - its passes inside verl 0.7.1's FSDP actor (``DataParallelPPOActor``);
* :mod:`engine_probe`, :mod:`engine_worker` - its passes inside verl 0.9.1's engine ``TrainingWorker``.
"""
