"""Rollout entropy from sglang while it samples; what differs between the versions is one table
(:mod:`egpo.rollout.sglang.versions`).

* 0.5.6.post2 (verl 0.7.1) and 0.5.12 (verl 0.9.1): private patches applied inside sglang's processes
  (``sampler_patch``, ``scheduler_patches``, ``tokenizer_patches``); every patch checks its target's shape first
  (:mod:`egpo.rollout.sglang.versions`) and is idempotent.
* 0.5.20 and 0.5.23 (verl's next pin is 0.5.20): sglang's official ``SamplingObserver`` (``observer``), installed by
  egpo's ``sglang.srt.plugins`` entry point (``plugin``) through sglang's ``HookRegistry``; nothing patched.
"""

# Where sglang's reply carries a request's entropy list: meta_info's key (both paths), and the Req.customized_info
# key the observer fills (sglang copies customized_info into meta_info).
META_KEY = "output_token_entropy"
