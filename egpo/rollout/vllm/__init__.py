"""Rollout entropy from vLLM (0.12.0 and 0.24.0, verl's; 0.32.0, the CPU build the engine test runs): born in the sampler, carried in vLLM's own log-prob path.

* ``sampler_patch``: in the worker process, ``Sampler.sample`` takes the entropy of the logits as they enter
  sampling (after penalties, masks and bias, before temperature) and ``Sampler.forward`` appends it to the
  sampled-token log probs as one extra column. vLLM carries that column unchanged through the scheduler's
  per-request slicing and stop truncation and the engine-core message.
* ``frontend_patch``: in the process that owns the engine client, the column is taken off before vLLM's own
  log-prob processing and attached to each ``CompletionOutput`` as ``egpo_entropy`` (one value per generated
  token).
* ``versions``: the patch targets of each supported vLLM, checked before anything is patched.
"""
