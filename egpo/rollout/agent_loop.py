"""Per-request rollout entropy -> ``batch["rollout_entropy"]``: the agent-loop worker and manager.

A rollout server puts each response's per-token entropy in ``TokenOutput.extra_fields["rollout_entropy"]``
(a list aligned 1:1 with the response tokens; multi-turn loops put 0 on tool tokens). verl would carry
``extra_fields`` into ``non_tensor_batch`` as object arrays; :class:`EntropyAgentLoopWorker` takes the key out
first and writes a padded ``(bs, response_length)`` float32 tensor aligned with ``responses`` (0 on padding)
into the batch, in every worker, so ``DataProto.concat`` across workers sees the same keys.

:class:`EntropyAgentLoopManager` is verl's ``AgentLoopManager`` with this worker and with egpo's replica for
rollout names egpo serves (``egpo.settings.ENTROPY_ROLLOUTS``); other names keep verl's replica (and return no
entropy). Where the
replica is chosen depends on the verl version (:mod:`egpo.compat.rollout`). It announces each
``generate_sequences`` call's request count to an hf rollout server (:mod:`egpo.rollout.hf.rounds`), whose batches
then do not depend on timing. egpo.main selects this manager through
``actor_rollout_ref.rollout.agent.agent_loop_manager_class``.
"""

from __future__ import annotations

import itertools
import os

import ray
import torch
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker
from verl.utils.ray_utils import auto_await

from egpo.errors import EntropyError
from egpo.keys import ROLLOUT_ENTROPY, SAMPLE_KEY
from egpo.rollout.hf.rounds import RoundAnnouncer
from egpo.settings import ENTROPY_ROLLOUTS, EgpoSettings

MANAGER_PATH = "egpo.rollout.agent_loop.EntropyAgentLoopManager"
CPU_PLATFORM = ("VERL_PLATFORM", "cpu")  # egpo's CPU platform, selected by this variable in every Ray worker


class RolloutEntropyError(EntropyError):
    """A rollout server's entropy is missing or does not line up with its tokens."""


def collect_rollout_entropy(inputs, response_length: int, *, required: bool) -> torch.Tensor | None:
    """Take ``rollout_entropy`` out of each output's ``extra_fields`` and pad it to ``(bs, response_length)``.

    ``inputs`` are verl's padded per-request outputs (``response_ids`` and ``attention_mask`` already padded to
    ``response_length``). Returns None when no output carries entropy and ``required`` is False.
    """
    values = [item.extra_fields.pop(ROLLOUT_ENTROPY, None) for item in inputs]
    present = [v is not None for v in values]
    if not any(present):
        if required:
            raise RolloutEntropyError(
                "algorithm.entropy_source=rollout, but the rollout server returned no per-token entropy "
                f"(TokenOutput.extra_fields[{ROLLOUT_ENTROPY!r}] is absent). Use a rollout that produces it "
                f"(actor_rollout_ref.rollout.name={' or '.join(ENTROPY_ROLLOUTS)}, through egpo's agent-loop "
                "manager), or set algorithm.entropy_source=actor."
            )
        return None
    if not all(present):
        raise RolloutEntropyError(
            f"{present.count(False)} of {len(values)} rollout outputs carry no {ROLLOUT_ENTROPY!r}; every response "
            "must have its entropy (a mix of servers, or a server that drops it for some requests)"
        )
    rows = [torch.as_tensor(v, dtype=torch.float32)[:response_length] for v in values]
    lengths = torch.tensor([len(r) for r in rows])
    prompt_width = inputs[0].prompt_ids.shape[1]
    tokens = torch.cat([item.attention_mask[:, prompt_width:] for item in inputs]).sum(dim=1)
    bad = (lengths != tokens).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise RolloutEntropyError(
            f"rollout entropy does not line up with the response tokens for {bad.numel()} request(s): request {i} "
            f"has {int(lengths[i])} entropy values for {int(tokens[i])} response tokens"
        )
    entropy = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    if entropy.shape[1] < response_length:
        entropy = torch.nn.functional.pad(entropy, (0, response_length - entropy.shape[1]))
    return entropy


def canonical_sample_order(inputs, non_tensor_batch) -> list:
    """Within each run of rows that are copies of one prompt, order the samples by their tokens.

    verl repeats every prompt ``rollout.n`` times in consecutive rows; which copy receives which sample
    depends on the order in which concurrent requests reached the server, so two runs with the same seed get
    the same samples per prompt in different rows (and so different micro-batches). The copies are
    interchangeable (same prompt, same uid), so a canonical order makes runs reproducible without changing
    what is trained on. Rows whose inputs differ are never moved.
    """
    keys = [k for k in ("uid", "index") if non_tensor_batch is not None and k in non_tensor_batch]
    if not keys:
        return list(inputs)

    def row_key(i):
        return tuple(non_tensor_batch[k][i] for k in keys) + (tuple(inputs[i].prompt_ids.flatten().tolist()),)

    ordered = []
    for _, run in itertools.groupby(range(len(inputs)), key=row_key):
        ordered += sorted((inputs[i] for i in run), key=lambda item: item.response_ids.flatten().tolist())
    return ordered


TOOL_AGENT = "tool_agent"
TOOL_AGENT_TARGET = "egpo.rollout.tool_agent_loop.EntropyToolAgentLoop"


def register_entropy_tool_agent() -> None:
    """Point verl's ``tool_agent`` name at the entropy-accumulating subclass (in this process)."""
    from verl.experimental.agent_loop import agent_loop as verl_agent_loop

    import verl.experimental.agent_loop.tool_agent_loop  # noqa: F401  (verl's own registration first)

    registry = verl_agent_loop._agent_loop_registry
    current = registry.get(TOOL_AGENT, {}).get("_target_")
    verl_target = "verl.experimental.agent_loop.tool_agent_loop.ToolAgentLoop"
    if current not in (verl_target, TOOL_AGENT_TARGET):
        raise RuntimeError(
            f"verl's agent loop {TOOL_AGENT!r} is {current!r}, not {verl_target}; egpo will not replace it"
        )
    registry[TOOL_AGENT] = {"_target_": TOOL_AGENT_TARGET}


def sample_key(trajectory: dict) -> tuple:
    """Which row of a rollout a request samples for: verl's trajectory (data-set index, copy number, validation).

    Plain Python values, so that the key (and the seed hashed from it) is the same under numpy 1 and 2.
    """
    index = trajectory["sample_index"]
    index = index.item() if hasattr(index, "item") else index
    return (index if isinstance(index, (int, str)) else repr(index), int(trajectory["rollout_n"]),
            bool(trajectory["validate"]))


def row_seed(rollout_config, trajectory: dict) -> int:
    """vLLM's ``SamplingParams.seed`` for one request on a CPU: a hash of the rollout seed (verl's ``rollout.seed``,
    else egpo's ``rollout.custom.seed``), the step and the row (:func:`sample_key`). (On a GPU no seed is set: vLLM
    handles seeded requests one by one in its sampler, a cost every decode step.)"""
    from egpo.options import config_get, rollout_custom
    from egpo.rollout.hf.seeded_sampling import request_seed

    base = config_get(rollout_config, "seed")
    if base is None:
        base = rollout_custom(rollout_config).seed
    step = trajectory.get("step", -1)
    return request_seed(int(base or 0), int(step.item() if hasattr(step, "item") else step), *sample_key(trajectory))


class EntropyAgentLoopWorker(AgentLoopWorker):
    def __init__(self, *args, **kwargs):
        register_entropy_tool_agent()
        super().__init__(*args, **kwargs)

    @property
    def egpo_settings(self) -> EgpoSettings:
        """The run's settings, read once in this worker."""
        return EgpoSettings.of(self.config.algorithm)

    async def _run_agent_loop(self, sampling_params, trajectory, **kwargs):
        # the hf server seeds each request from its row, not from its arrival among copies of the same prompt
        if self.rollout_config.name == "hf":
            sampling_params = {**sampling_params, SAMPLE_KEY: sample_key(trajectory)}
        elif self.rollout_config.name == "vllm" and os.environ.get(CPU_PLATFORM[0]) == CPU_PLATFORM[1]:
            # vLLM on egpo's CPU platform: a seed per row (vLLM's per-request generator; docs/cpu.md)
            sampling_params = {**sampling_params, "seed": row_seed(self.rollout_config, trajectory)}
        return await super()._run_agent_loop(sampling_params, trajectory, **kwargs)

    def _postprocess(self, inputs, input_non_tensor_batch=None, **kwargs):
        inputs = canonical_sample_order(inputs, input_non_tensor_batch)
        required = self.egpo_settings.reads_rollout_entropy
        entropy = collect_rollout_entropy(inputs, self.rollout_config.response_length, required=required)
        output = super()._postprocess(inputs, input_non_tensor_batch=input_non_tensor_batch, **kwargs)
        if entropy is not None:
            output.batch[ROLLOUT_ENTROPY] = entropy
        return output


class EntropyAgentLoopManager(AgentLoopManager):
    """verl's manager with egpo's worker (and, where the manager owns them, egpo's replicas); verl's arguments pass
    through unchanged (they differ between verl versions)."""

    def __init__(self, config, *args, **kwargs):
        from egpo.compat.rollout import prepare_manager

        prepare_manager(self, config)
        self.agent_loop_workers_class = ray.remote(EntropyAgentLoopWorker)
        self._hf_rounds = RoundAnnouncer()
        super().__init__(config, *args, **kwargs)

    @auto_await
    async def generate_sequences(self, prompts):
        await self._hf_rounds.announce(len(prompts))
        return await super().generate_sequences(prompts)
