"""Multi-turn rollout entropy through verl's real ToolAgentLoop state machine (assistant / user / assistant)."""

import asyncio
from typing import Any, Optional

import pytest
import torch
import yaml

from conftest import VERL

if VERL != "0.7.1":
    pytest.skip(f"verl {VERL} merges turns with Continuous Token and has no verl.interactions "
                "(tests/test_tool_agent_entropy_merged.py)", allow_module_level=True)
from hydra import compose, initialize_config_module
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.interactions.base import BaseInteraction
from verl.workers.rollout.replica import TokenOutput

from egpo.demo.build import build_model
from egpo.rollout.tool_agent_loop import EntropyToolAgentLoop, lay_entropy_on_mask
from egpo.keys import ROLLOUT_ENTROPY


class TryAgainInteraction(BaseInteraction):
    """Answers the first assistant turn with a user message, then ends the conversation."""

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]], **kwargs):
        return False, "Try again.", 0.0, {}

    async def start_interaction(self, instance_id: Optional[str] = None, **kwargs) -> str:
        return instance_id


class TurnServer:
    """Stands in for the rollout servers: each call is one assistant turn with known tokens and entropy."""

    def __init__(self, turns):
        self.turns = list(turns)

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None):
        tokens, entropy = self.turns.pop(0)
        return TokenOutput(token_ids=tokens, log_probs=[-1.0] * len(tokens), extra_fields={ROLLOUT_ENTROPY: entropy})


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tool")
    model = build_model(tmp / "model")
    interactions = tmp / "interactions.yaml"
    interactions.write_text(yaml.safe_dump({"interaction": [
        {"name": "try_again", "class_name": f"{__name__}.TryAgainInteraction", "config": {}}]}))
    with initialize_config_module("egpo.config", version_base=None):
        cfg = compose("egpo_trainer", overrides=[
            f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.name=hf",
            "data.max_prompt_length=64", "data.max_response_length=64",
            f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={interactions}",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        ])
    return cfg


def run_loop(cfg, turns):
    from verl.utils import hf_tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    async def main():  # verl's loop binds the running event loop when it is built
        loop = EntropyToolAgentLoop(
            trainer_config=DictConfigWrap(cfg), server_manager=TurnServer(turns),
            tokenizer=hf_tokenizer(cfg.actor_rollout_ref.model.path), processor=None, dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data),
        )
        return await loop.run(
            {"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "What is 1+1?"}],
            extra_info={"interaction_kwargs": {"name": "try_again"}},
        )

    return asyncio.run(main())


def test_entropy_of_both_turns_lands_on_the_assistant_tokens(setup):
    first, second = ([10, 11, 12], [0.5, 0.6, 0.7]), ([13, 14], [1.5, 1.6])
    out = run_loop(setup, [first, second])
    mask = torch.tensor(out.response_mask)
    entropy = torch.tensor(out.extra_fields[ROLLOUT_ENTROPY])
    assert len(entropy) == len(out.response_ids) == len(mask)
    assert mask.tolist()[:3] == [1, 1, 1] and mask.tolist()[-2:] == [1, 1] and (mask == 0).sum() > 0  # user turn
    torch.testing.assert_close(entropy[mask.bool()], torch.tensor([0.5, 0.6, 0.7, 1.5, 1.6]))
    assert (entropy[~mask.bool()] == 0).all()
    # the same padding verl applies to log probs
    assert [lp == 0.0 for lp in out.response_logprobs] == (~mask.bool()).tolist()


def test_lay_entropy_on_mask_rules():
    assert lay_entropy_on_mask([[1.0, 2.0], [3.0]], [1, 1, 0, 0, 1]) == [1.0, 2.0, 0.0, 0.0, 3.0]
    assert lay_entropy_on_mask([[1.0, 2.0, 9.0]], [1, 1]) == [1.0, 2.0]  # response cut at response_length
    with pytest.raises(RuntimeError, match="1 entropy values for 2"):
        lay_entropy_on_mask([[1.0]], [1, 0, 1])
