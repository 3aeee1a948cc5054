"""verl's ``SGLangHttpServer`` returning each response's per-token entropy with its tokens.

Before sglang launches, the server refuses settings where per-token entropy would be missing or wrong,
installs the entry points of sglang's processes (:mod:`egpo.rollout.sglang.process_entries`) and the
tokenizer-manager patches (:mod:`egpo.rollout.sglang.tokenizer_patches`). Each request is sent with log probs on (the entropy
rides next to them in ``meta_info``); the values come back in ``TokenOutput.extra_fields["rollout_entropy"]``,
checked to be one per token, and the log probs are returned only if the caller asked for them.
"""

from __future__ import annotations

from egpo.rollout.sglang.standins import prepare_sglang_import

prepare_sglang_import()  # CPU machines only: before this process imports sglang

from verl.workers.rollout.sglang_rollout.async_sglang_server import SGLangHttpServer  # noqa: E402

from egpo.rollout.entropy import EntropyOptions
from egpo.rollout.sglang.limits import refuse_unsupported_settings
from egpo.rollout.sglang.tokenizer_patches import META_KEY, apply_tokenizer_patches
from egpo.keys import ROLLOUT_ENTROPY


class EntropySGLangHttpServer(SGLangHttpServer):
    async def launch_server(self, master_address: str | None = None, master_port: int | None = None):
        from egpo.rollout.sglang.process_entries import install_process_entries

        refuse_unsupported_settings(self.config)
        install_process_entries(EntropyOptions.from_rollout_config(self.config))
        apply_tokenizer_patches()
        await super().launch_server(master_address=master_address, master_port=master_port)
        if getattr(self, "tokenizer_manager", None) is not None:
            capture_entropy(self)

    async def generate(self, prompt_ids, sampling_params, request_id, image_data=None, video_data=None):
        params = dict(sampling_params)
        wants_log_probs = bool(params.get("logprobs", False))
        params["logprobs"] = True
        try:
            output = await super().generate(prompt_ids, params, request_id, image_data=image_data, video_data=video_data)
            entropy = self._entropy_by_rid.get(request_id)
        finally:
            self._entropy_by_rid.pop(request_id, None)
        if entropy is None:
            raise RuntimeError(
                f"sglang returned no meta_info[{META_KEY!r}] for request {request_id}: its scheduler ran without "
                "egpo's patches (check that the rollout replica is egpo's)"
            )
        if len(entropy) != len(output.token_ids):
            raise RuntimeError(
                f"sglang returned {len(entropy)} entropy values for {len(output.token_ids)} tokens (request {request_id})"
            )
        output.extra_fields[ROLLOUT_ENTROPY] = list(entropy)
        if not wants_log_probs:
            output.log_probs = None
        return output


def capture_entropy(server) -> None:
    """Wrap this server's ``tokenizer_manager.generate_request`` to keep each request's entropy by request id.

    verl's ``generate`` builds its ``TokenOutput`` from the final output; the entropy is taken from the same
    output here and popped by :meth:`EntropySGLangHttpServer.generate` as soon as that request returns.
    """
    server._entropy_by_rid = {}
    manager = server.tokenizer_manager
    original = manager.generate_request

    async def generate_request(obj, request=None):
        async for out in original(obj, request):
            entropy = (out.get("meta_info") or {}).get(META_KEY)
            if entropy is not None:
                server._entropy_by_rid[obj.rid] = entropy
            yield out

    manager.generate_request = generate_request
