"""verl's ``SGLangHttpServer`` returning each response's per-token entropy with its tokens.

Before sglang launches, the server refuses settings where per-token entropy would be missing or wrong,
installs the entry points of sglang's processes (:mod:`egpo.rollout.sglang.process_entries`) and the
tokenizer-manager patches (:mod:`egpo.rollout.sglang.tokenizer_patches`). Each request is sent with log probs on (the entropy
rides next to them in ``meta_info``); the values come back in ``TokenOutput.extra_fields["rollout_entropy"]``,
checked to be one per token, and the log probs are returned only if the caller asked for them. Only the requests
this server sends are captured (sglang's HTTP routes and other callers share the tokenizer manager). A request
aborted before its first token comes back with no tokens and no entropy (verl's own ``generate`` cannot unpack an
empty log-prob list, so that one case is answered here).
"""

from __future__ import annotations

from egpo.rollout.sglang.standins import prepare_sglang_import

prepare_sglang_import()  # CPU machines only: before this process imports sglang

from dataclasses import dataclass  # noqa: E402

from verl.workers.rollout.replica import TokenOutput  # noqa: E402
from verl.workers.rollout.sglang_rollout.async_sglang_server import SGLangHttpServer  # noqa: E402

from egpo.rollout.entropy import EntropyOptions
from egpo.rollout.token_output import attach_rollout_entropy
from egpo.rollout.sglang.limits import refuse_unsupported_settings
from egpo.rollout.sglang import META_KEY
from egpo.rollout.sglang.tokenizer_patches import apply_tokenizer_patches
from egpo.rollout.sglang.versions import sglang_targets


class EntropySGLangHttpServer(SGLangHttpServer):
    async def launch_server(self, master_address: str | None = None, master_port: int | None = None):
        from egpo.rollout.sglang.process_entries import install_process_entries

        refuse_unsupported_settings(self.config)
        add_cpu_engine_settings(self.config)
        add_replica_engine_settings(self.config, self.replica_rank)
        install_process_entries(EntropyOptions.from_rollout_config(self.config))
        if not sglang_targets().entropy_via_observer:  # the observer's values reach meta_info through sglang itself
            apply_tokenizer_patches()
        await super().launch_server(master_address=master_address, master_port=master_port)
        if getattr(self, "tokenizer_manager", None) is not None:
            capture_entropy(self)

    async def generate(self, prompt_ids, sampling_params, request_id, image_data=None, video_data=None, **kwargs):
        """verl's ``generate``; ``kwargs``: what a newer verl adds (0.9.1: the PD-disaggregation bootstrap)."""
        params = dict(sampling_params)
        wants_log_probs = bool(params.get("logprobs", False))
        params["logprobs"] = True
        self._entropy_by_rid[request_id] = None  # this request's final output is captured
        try:
            try:
                output = await super().generate(prompt_ids, params, request_id, image_data=image_data,
                                                video_data=video_data, **kwargs)
            except ValueError:
                captured = self._entropy_by_rid.get(request_id)
                if captured is None or captured.tokens:
                    raise
                output = self._no_token_output(captured)
            captured = self._entropy_by_rid.get(request_id)
        finally:
            self._entropy_by_rid.pop(request_id, None)
        entropy = None if captured is None else captured.entropy
        if captured is not None and (captured.tokens == 0 or not output.token_ids):
            # aborted before its first token (nothing was sampled), or an output verl 0.9.1 returns without
            # tokens (its log probs did not match them): no token, no entropy
            entropy = []
        missing = (f"sglang returned no meta_info[{META_KEY!r}] for request {request_id}: its scheduler ran without "
                   "egpo's patches (check that the rollout replica is egpo's)")
        return attach_rollout_entropy(output, entropy, wants_log_probs, missing, "sglang", request_id)

    def _no_token_output(self, captured: "CapturedOutput") -> TokenOutput:
        """The output of a request that ended before its first token (verl's generate fails to unpack it)."""
        return TokenOutput(token_ids=[], log_probs=[], routed_experts=None, stop_reason=captured.finish_reason,
                           extra_fields={"global_steps": self.global_steps})


def add_cpu_engine_settings(config) -> None:
    """On a CPU engine (``engine_kwargs.sglang.device=cpu``), the settings this sglang version needs there
    (:attr:`egpo.rollout.sglang.versions.SglangTargets.cpu_engine_args`) unless the config sets them."""
    from egpo.rollout.sglang.versions import sglang_targets

    engine_kwargs = (config.get("engine_kwargs", {}) or {}).get("sglang", None)
    if engine_kwargs is None or engine_kwargs.get("device") != "cpu":
        return
    for key, value in sglang_targets().cpu_engine_args:
        if key not in engine_kwargs:
            engine_kwargs[key] = value


def add_replica_engine_settings(config, replica_rank: int) -> None:
    """Settings of this replica's engine unless the config sets them: its sampling seed, ``replica_rank`` + the run's
    rollout seed (:func:`egpo.compat.seeds.sglang_replica_seed`; verl seeds no sglang server), and chunked log-prob
    processing (:func:`egpo.rollout.sglang.versions.chunked_logprob_env`) exported for sglang's processes."""
    import os

    from egpo.compat.seeds import sglang_replica_seed
    from egpo.rollout.sglang.versions import chunked_logprob_env

    engine_kwargs = config.get("engine_kwargs", None)
    if engine_kwargs is not None:
        if engine_kwargs.get("sglang", None) is None:
            engine_kwargs["sglang"] = {}
        seed = sglang_replica_seed(config, replica_rank)
        if seed is not None:
            engine_kwargs["sglang"]["random_seed"] = seed
    for name, value in chunked_logprob_env().items():
        os.environ.setdefault(name, value)


@dataclass(frozen=True)
class CapturedOutput:
    entropy: list | None  # meta_info["output_token_entropy"]; None where sglang's processes were not patched
    tokens: int  # output tokens in that output
    finish_reason: str | None


def capture_entropy(server) -> None:
    """Wrap this server's ``tokenizer_manager.generate_request`` to keep the entropy of egpo's requests.

    verl's ``generate`` builds its ``TokenOutput`` from the final output; the entropy is taken from the same
    output here, only for request ids that :meth:`EntropySGLangHttpServer.generate` registered, and popped by it as
    soon as that request returns: nothing is kept for requests other callers send through the same manager.
    """
    server._entropy_by_rid = {}
    manager = server.tokenizer_manager
    original = manager.generate_request

    async def generate_request(obj, request=None):
        rid = getattr(obj, "rid", None)
        ours = isinstance(rid, str) and rid in server._entropy_by_rid
        async for out in original(obj, request):
            if ours:
                meta = out.get("meta_info") or {}
                reason = meta.get("finish_reason")
                server._entropy_by_rid[rid] = CapturedOutput(
                    meta.get(META_KEY), len(out.get("output_ids") or ()),
                    reason.get("type") if isinstance(reason, dict) else reason)
            yield out

    manager.generate_request = generate_request
