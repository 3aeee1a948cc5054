"""verl's ``vLLMHttpServer`` returning each response's per-token entropy with its tokens.

Before vLLM launches, the server refuses settings where per-token entropy would be missing or wrong
(:mod:`egpo.rollout.vllm.limits`), checks every patch target of the installed vLLM, exports the entropy options and
the model runner's environment (:mod:`egpo.rollout.vllm.versions`) for vLLM's processes (where egpo's
``vllm.general_plugins`` entry point applies the sampler patch) and applies the front-end patch in its own process. verl's own ``generate`` runs unchanged: each request is sent with log probs on
(the entropy rides beside them), the engine client is wrapped once so that the final ``RequestOutput`` of each of
this server's requests leaves its ``egpo_entropy`` behind, and the values come back in
``TokenOutput.extra_fields["rollout_entropy"]``, checked to be one per token. Log probs are returned only if the
caller asked for them. A request aborted before its first token comes back with no tokens and no entropy.
"""

from __future__ import annotations

from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

from egpo.rollout.engine_options import export_options
from egpo.rollout.entropy import EntropyOptions
from egpo.rollout.token_output import attach_rollout_entropy
from egpo.rollout.vllm.frontend_patch import ENTROPY_FIELD, apply_frontend_patch
from egpo.rollout.vllm.limits import refuse_unsupported_settings
from egpo.rollout.vllm.versions import check_targets


class EntropyEngineClient:
    """verl's engine client with ``generate`` leaving each watched request's final entropy in ``captured``."""

    def __init__(self, engine):
        self._engine = engine
        self.captured: dict[str, list[float] | None] = {}

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def generate(self, *args, request_id: str, **kwargs):
        last = None
        async for output in self._engine.generate(*args, request_id=request_id, **kwargs):
            last = output
            yield output
        if request_id in self.captured and last is not None and last.outputs:
            self.captured[request_id] = getattr(last.outputs[0], ENTROPY_FIELD, None)


class EntropyvLLMHttpServer(vLLMHttpServer):
    async def launch_server(self, *args, **kwargs):
        prepare_entropy_engine(self.config)
        await super().launch_server(*args, **kwargs)

    def entropy_engine(self) -> EntropyEngineClient:
        if not isinstance(self.engine, EntropyEngineClient):
            self.engine = EntropyEngineClient(self.engine)
        return self.engine

    async def generate(self, prompt_ids, sampling_params, request_id, *args, **kwargs):
        """verl's ``generate``; ``args``/``kwargs``: what each verl adds (images, priority, KV-transfer payload)."""
        params = dict(sampling_params)
        wants_log_probs = bool(params.get("logprobs", False))
        params["logprobs"] = True
        engine = self.entropy_engine()
        engine.captured[request_id] = None
        try:
            output = await super().generate(prompt_ids, params, request_id, *args, **kwargs)
            entropy = engine.captured.get(request_id)
        finally:
            engine.captured.pop(request_id, None)
        if not output.token_ids:
            entropy = []  # aborted before its first token: nothing was sampled
        missing = (f"vLLM returned no {ENTROPY_FIELD} for request {request_id}: its workers ran without egpo's sampler "
                   "patch (egpo's vllm.general_plugins entry point: reinstall egpo so vLLM finds it)")
        return attach_rollout_entropy(output, entropy, wants_log_probs, missing, "vLLM", request_id)


def prepare_entropy_engine(rollout_config) -> EntropyOptions:
    """In the server's process, before vLLM starts its own: settings and targets checked, options exported, front end
    patched. The model runner is vLLM's choice: egpo's plugin patches the sampler of each one it serves."""
    refuse_unsupported_settings(rollout_config)
    check_targets()
    options = EntropyOptions.from_rollout_config(rollout_config)
    export_options(options)
    apply_frontend_patch()
    return options
