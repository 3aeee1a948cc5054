"""The HF rollout server: a Ray actor generating with ``transformers`` on CPU, tokens in, tokens out.

It is verl's rollout server contract (``generate(prompt_ids, sampling_params, request_id, ...) -> TokenOutput``,
``sleep`` / ``wake_up`` / ``clear_kv_cache`` / ``abort_all_requests`` / ``resume_generation``) served by
Hugging Face ``generate``. Each output carries the sampled token ids, their log probs (logits / temperature,
the actor's definition) and, in ``extra_fields["rollout_entropy"]``, their per-token entropy from
:func:`egpo.rollout.entropy.token_entropy` with the options in ``actor_rollout_ref.rollout.custom.entropy``.

Requests are generated in left-padded batches (grouped by identical sampling settings, ordered by prompt and seed,
at most ``max_num_seqs`` rows). A batch's shape and companions change the last bits of every row's logits on a
CPU, so which requests share a batch must not depend on timing: egpo's agent-loop manager announces each
``generate_sequences`` call's request count (:meth:`expect_round`, :mod:`egpo.rollout.hf.rounds`) and the server
waits until that round is complete before batching it, however slowly its requests arrive. Requests outside an
announced round (a multi-turn loop's later turns, a caller that announces nothing) are gathered until none has
arrived for ``GATHER_WINDOW_S``. Each request
samples from its own seed (:mod:`egpo.rollout.hf.seeded_sampling`), derived from ``rollout.custom.seed``, the
replica, the weights version (``global_steps``), its prompt tokens and the row it samples for
(``sampling_params["egpo_sample_key"]``, which egpo's agent-loop worker sets from verl's trajectory: data-set
index, copy number, validation), counting identical requests in arrival order only where two share all of that (a
caller that sends no row key: then which of a prompt's identical copies gets which sample depends on arrival
order). A row's sample never depends on timing, batching or arrival order; two data-set rows with the same prompt
text do not trade samples either, which would change their GRPO groups. Weights arrive
from the trainer through :meth:`update_weights` every step (on-policy); generation and weight loading never
overlap.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import defaultdict

import torch

from egpo.rollout.entropy import EntropyOptions
from egpo.rollout.hf.generate import generate_batch
from egpo.rollout.hf.sampling import HFSampling, resolve_sampling
from egpo.rollout.hf.seeded_sampling import request_seed
from egpo.keys import ROLLOUT_ENTROPY, SAMPLE_KEY
from egpo.options import rollout_custom

logger = logging.getLogger(__name__)

GATHER_WINDOW_S = 0.05
# how long an announced round waits after its latest arrival for the rest before it is generated as it stands
ROUND_WAIT_S = 300.0


def _as_tuple(ids) -> tuple[int, ...]:
    if ids is None:
        return ()
    if isinstance(ids, int):
        return (ids,)
    return tuple(int(i) for i in ids)


class HFRolloutServer:
    def __init__(self, config, model_config, replica_rank: int = 0):
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig, RolloutConfig

        self.config: RolloutConfig = omega_conf_to_dataclass(config)
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        self.entropy_options = EntropyOptions.from_rollout_config(self.config)
        self.global_steps = None
        self.model = None
        self._pending: list[tuple[list[int], int, HFSampling, asyncio.Future]] = []
        self._occurrences: dict[tuple, int] = defaultdict(int)  # (weights version, prompt[, row]) -> requests so far
        self._drainer: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._batches = 0
        self._round_left = 0  # requests still to come in the announced round
        self._round_size = 0
        self._last_arrival = 0.0
        self._seed = (rollout_custom(self.config).seed, replica_rank)

    # ------------------------------------------------------------------ lifecycle
    async def launch_server(self) -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(max(1, int(os.environ.get("EGPO_HF_ROLLOUT_THREADS", torch.get_num_threads()))))
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_config.local_path,
            dtype=torch.float32,
            attn_implementation="eager",
            trust_remote_code=self.model_config.trust_remote_code,
        ).eval()
        gen = self.model.generation_config
        self.eos_token_ids = _as_tuple(gen.eos_token_id) or _as_tuple(self.model.config.eos_token_id)
        pad = gen.pad_token_id if gen.pad_token_id is not None else self.model_config.tokenizer.pad_token_id
        if pad is None:
            raise ValueError(f"the model at {self.model_config.local_path} has no pad token id")
        self.pad_token_id = int(pad)

    async def update_weights(self, state_dict: dict[str, torch.Tensor], global_steps: int | None = None) -> None:
        """Load the trainer's full (unsharded) weights; every parameter must be covered."""
        async with self._lock:
            missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
            tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
            missing = [k for k in missing if k not in tied]
            if missing or unexpected:
                raise RuntimeError(
                    f"weights pushed to the hf rollout server do not match its model: missing {missing[:5]}, "
                    f"unexpected {unexpected[:5]}"
                )
            if global_steps is not None:
                self._set_weights_version(global_steps)

    async def set_global_steps(self, global_steps: int) -> None:
        self._set_weights_version(global_steps)

    def _set_weights_version(self, global_steps) -> None:
        if global_steps != self.global_steps:
            self._occurrences.clear()  # the counts only distinguish identical requests within one version
        self.global_steps = global_steps

    async def wake_up(self):  # weights live in host memory: nothing to resume
        return None

    async def sleep(self):
        return None

    async def clear_kv_cache(self):  # no cache outlives a batch
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def abort_all_requests(self, reject_request: bool = False):
        return None

    async def resume_generation(self):
        return None

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None

    # ------------------------------------------------------------------ generation
    async def generate(self, prompt_ids, sampling_params, request_id, image_data=None, video_data=None, **kwargs):
        """verl's server ``generate`` (0.9.1 calls it with keywords and may add multimodal ones: refused if set)."""
        from verl.workers.rollout.replica import TokenOutput

        if image_data or video_data or any(v for k, v in kwargs.items() if k.endswith(("_data", "_kwargs"))):
            raise NotImplementedError("the hf rollout server is text-only")
        prompt = [int(t) for t in prompt_ids]
        sampling_params = dict(sampling_params)
        row = sampling_params.pop(SAMPLE_KEY, None)
        sampling = resolve_sampling(
            sampling_params,
            prompt_len=len(prompt),
            prompt_length=self.config.prompt_length,
            response_length=self.config.response_length,
            max_model_len=self.config.max_model_len,
            eos_token_ids=self.eos_token_ids,
        )
        self._last_arrival = time.monotonic()
        if self._round_left > 0:
            self._round_left -= 1
        key = (self.global_steps, tuple(prompt)) if row is None else (self.global_steps, tuple(prompt), tuple(row))
        seed = request_seed(*self._seed, *key, self._occurrences[key])
        self._occurrences[key] += 1
        future = asyncio.get_running_loop().create_future()
        self._pending.append((prompt, seed, sampling, future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        out = await future
        return TokenOutput(
            token_ids=out.token_ids,
            log_probs=out.log_probs if sampling.return_log_probs else None,
            stop_reason=out.stop_reason,
            extra_fields={"global_steps": self.global_steps, ROLLOUT_ENTROPY: out.entropy},
        )

    async def expect_round(self, count: int) -> None:
        """The next ``count`` requests are one round: none is generated before all of them have arrived.

        Replaces a round still open (one announced for requests that never came, e.g. a rollout verl skipped).
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"expect_round takes a request count >= 0, got {count!r}")
        if self._round_left:
            logger.warning("hf rollout server: a new round replaces one still waiting for %d of its %d requests",
                           self._round_left, self._round_size)
        self._round_left = self._round_size = count

    async def _gather(self) -> None:
        if self._round_left > 0:  # an announced round: all of it, whatever the timing
            while self._round_left > 0:
                await asyncio.sleep(GATHER_WINDOW_S)
                if time.monotonic() - self._last_arrival > ROUND_WAIT_S:
                    logger.warning(
                        "hf rollout server: %d of the %d requests announced for this round did not arrive within "
                        "%.0f s of the last one; generating the %d that did (this round's batches depend on "
                        "arrival timing, so its samples are not bit-reproducible)",
                        self._round_left, self._round_size, ROUND_WAIT_S, len(self._pending))
                    self._round_left = 0
            return
        # unannounced requests: those that arrive together (an agent-loop worker sends its chunk at once)
        seen = -1
        while seen != len(self._pending):
            seen = len(self._pending)
            await asyncio.sleep(GATHER_WINDOW_S)

    async def _drain(self) -> None:
        while True:
            await self._gather()
            if not self._pending:
                return
            pending, self._pending = self._pending, []
            groups: dict[HFSampling, list] = defaultdict(list)
            for item in sorted(pending, key=lambda item: (item[0], item[1])):
                groups[item[2]].append(item)
            for sampling, items in groups.items():
                for start in range(0, len(items), self.config.max_num_seqs):
                    chunk = items[start : start + self.config.max_num_seqs]
                    try:
                        async with self._lock:
                            results = await asyncio.to_thread(
                                self._generate, [p for p, _, _, _ in chunk], [s for _, s, _, _ in chunk], sampling
                            )
                    except Exception as err:  # every waiting request learns why
                        for *_, fut in chunk:
                            if not fut.done():
                                fut.set_exception(err)
                        continue
                    for (*_, fut), result in zip(chunk, results, strict=True):
                        if not fut.done():
                            fut.set_result(result)

    def _generate(self, prompts: list[list[int]], seeds: list[int], sampling: HFSampling):
        self._batches += 1
        return generate_batch(
            self.model,
            prompts,
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            stop_token_ids=list(sampling.stop_token_ids),
            pad_token_id=self.pad_token_id,
            entropy_options=self.entropy_options,
            row_seeds=seeds,
        )
