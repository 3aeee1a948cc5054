"""Per-request entropy -> batch["rollout_entropy"] through verl's real AgentLoopWorker._postprocess."""

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, _InternalAgentLoopOutput

import numpy as np

from egpo.rollout.agent_loop import (
    EntropyAgentLoopManager,
    EntropyAgentLoopWorker,
    RolloutEntropyError,
    canonical_sample_order,
)
from egpo.compat.rollout import VerlRolloutShapeError, check_manager_extension_points
from egpo.compat.versions import verl_stack, verl_version
from egpo.keys import ROLLOUT_ENTROPY

P, R = 4, 6  # prompt_length, response_length


def item(prompt, response, entropy="absent", mask=None):
    """One padded output as verl's _agent_loop_postprocess builds it (left-padded prompt, right-padded response)."""
    prompt_ids = torch.tensor([[0] * (P - len(prompt)) + prompt])
    response_ids = torch.tensor([response + [0] * (R - len(response))])
    attention = torch.tensor([[0] * (P - len(prompt)) + [1] * len(prompt) + [1] * len(response) + [0] * (R - len(response))])
    rmask = torch.tensor([(mask or [1] * len(response)) + [0] * (R - len(response))])
    extra = {} if entropy == "absent" else {ROLLOUT_ENTROPY: entropy}
    return _InternalAgentLoopOutput(
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        input_ids=torch.cat([prompt_ids, response_ids], dim=1),
        position_ids=torch.zeros(1, P + R, dtype=torch.long),
        response_mask=rmask,
        attention_mask=attention,
        num_turns=2,
        metrics=AgentLoopMetrics(),
        extra_fields=extra,
    )


def worker(entropy_source="rollout", estimator="egpo"):
    w = object.__new__(EntropyAgentLoopWorker)
    w.rollout_config = SimpleNamespace(response_length=R)
    w.config = OmegaConf.create({"algorithm": {"adv_estimator": estimator, "entropy_source": entropy_source}})
    w.reward_loop_worker_handles = None
    return w


def test_entropy_is_padded_aligned_and_kept_out_of_non_tensor_batch():
    out = worker()._postprocess(
        [
            item([5, 6], [7, 8, 9], [0.5, 1.5, 2.5]),
            item([5, 6, 7], [9] * 6, [1.0] * 6),
        ]
    )
    expected = torch.tensor([[0.5, 1.5, 2.5, 0, 0, 0], [1.0] * 6])
    assert out.batch[ROLLOUT_ENTROPY].dtype == torch.float32
    torch.testing.assert_close(out.batch[ROLLOUT_ENTROPY], expected, rtol=0, atol=0)
    assert out.batch[ROLLOUT_ENTROPY].shape == out.batch["responses"].shape
    assert ROLLOUT_ENTROPY not in out.non_tensor_batch


def test_longer_entropy_than_kept_tokens_is_cut_at_response_length():
    # the single-turn loop keeps token_ids[:response_length] but passes the server's extra_fields whole
    out = worker()._postprocess([item([5], [7] * R, [float(i) for i in range(R + 3)])])
    torch.testing.assert_close(out.batch[ROLLOUT_ENTROPY], torch.arange(R, dtype=torch.float32)[None])


def test_required_entropy_missing_names_the_fix():
    with pytest.raises(RolloutEntropyError, match="entropy_source=actor"):
        worker()._postprocess([item([5], [7, 8])])


def test_not_required_and_absent_leaves_the_batch_as_verl_builds_it():
    out = worker(entropy_source="actor")._postprocess([item([5], [7, 8])])
    assert ROLLOUT_ENTROPY not in out.batch.keys()
    out = worker(estimator="grpo")._postprocess([item([5], [7, 8])])
    assert ROLLOUT_ENTROPY not in out.batch.keys()


def test_some_outputs_without_entropy_are_refused():
    with pytest.raises(RolloutEntropyError, match="1 of 2"):
        worker(entropy_source="actor")._postprocess([item([5], [7, 8], [1.0, 1.0]), item([5], [7, 8])])


def test_entropy_that_does_not_line_up_is_refused():
    with pytest.raises(RolloutEntropyError, match="2 entropy values for 3 response tokens"):
        worker()._postprocess([item([5], [7, 8, 9], [1.0, 1.0])])


def test_extension_point_guard_fires_on_an_altered_manager(monkeypatch):
    check_manager_extension_points()  # the installed verl as it is

    def altered_init(self, config, *args, **kwargs):
        self.rollout_replica_class = None

    monkeypatch.setattr(EntropyAgentLoopManager.__mro__[1], "__init__", altered_init)
    with pytest.raises(VerlRolloutShapeError, match=rf"verl {verl_version()}: AgentLoopManager.__init__ no longer keeps"):
        check_manager_extension_points()
    monkeypatch.undo()

    async def renamed(self, batch):
        return batch

    monkeypatch.setattr(EntropyAgentLoopManager.__mro__[1], "generate_sequences", renamed)
    with pytest.raises(VerlRolloutShapeError, match="generate_sequences is no longer a coroutine taking one rollout"):
        check_manager_extension_points()
    monkeypatch.undo()

    async def reordered(self, trajectory, sampling_params, **kwargs):
        return None

    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    monkeypatch.setattr(AgentLoopWorker, "_run_agent_loop", reordered)
    with pytest.raises(VerlRolloutShapeError, match="_run_agent_loop no longer takes"):
        check_manager_extension_points()


def test_replicas_are_chosen_where_this_verl_chooses_them():
    """0.7.1: egpo's manager presets its replica class; 0.9.1: egpo's hf replica is in verl's registry, which
    LLMServerManager reads by name."""
    from verl.workers.rollout.replica import get_rollout_replica_class

    from egpo.compat.rollout import register_replicas
    from egpo.rollout.hf.replica import HFRolloutReplica

    register_replicas()
    if verl_stack(verl_version()).manager_owns_replicas:
        manager = EntropyAgentLoopManager.__new__(EntropyAgentLoopManager)
        from egpo.compat.rollout import prepare_manager
        from omegaconf import OmegaConf

        prepare_manager(manager, OmegaConf.create({"algorithm": {"adv_estimator": "grpo"},
                                                   "actor_rollout_ref": {"rollout": {"name": "hf"}}}))
        assert manager.rollout_replica_class is HFRolloutReplica
    else:
        assert get_rollout_replica_class("hf") is HFRolloutReplica


def test_copies_of_a_prompt_get_a_canonical_sample_order_and_keep_their_entropy():
    rows = [item([5], [9, 9], [0.9, 0.9]), item([5], [7, 8], [0.7, 0.8]), item([6], [3], [0.3]), item([6], [1], [0.1])]
    uid = np.array(["a", "a", "b", "c"], dtype=object)
    ordered = canonical_sample_order(rows, {"uid": uid})
    assert [o.response_ids[0, 0].item() for o in ordered] == [7, 9, 3, 1]  # a's copies sorted; b, c not moved
    out = worker()._postprocess(ordered, input_non_tensor_batch={"uid": uid})
    torch.testing.assert_close(out.batch[ROLLOUT_ENTROPY][:2, :2], torch.tensor([[0.7, 0.8], [0.9, 0.9]]))
    assert canonical_sample_order(rows, None) == rows
