"""Multi-turn rollout entropy through verl 0.9.1's real ToolAgentLoop, whose Continuous Token merging trims.

A GLM-style tokenizer (verl picks its GLM builder for ``hf_model_type=glm4_moe``): the assistant's tool-call turn
ends with the generated stop token ``<|observation|>``, and verl's merge of the tool response drops that token from
the response (``removed_prefix_token_count=1``) before appending ``<|observation|>`` + the tool's answer. The
entropy must take exactly the edits the log probs take.
"""

import asyncio
import string

import pytest

from conftest import VERL

if VERL == "0.7.1":
    pytest.skip("verl 0.7.1 appends turns whole (tests/test_tool_agent_entropy.py)", allow_module_level=True)

from hydra import compose, initialize_config_module  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from egpo.demo.build import build_model  # noqa: E402
from egpo.keys import ROLLOUT_ENTROPY  # noqa: E402
from egpo.rollout.tool_agent_loop import EntropyToolAgentLoop, lay_entropy_on_mask  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}{{ '<|observation|>\\n' + m['content'] }}"
    "{% else %}{{ '<|' + m['role'] + '|>\\n' + m['content'] }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
TOOL_CALL = '<tool_call>{"name": "calc", "arguments": {"x": 1}}</tool_call>'


def glm_like_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in string.printable:
        vocab.setdefault(ch, len(vocab))
    vocab["[UNK]"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|user|>", pad_token="<|endoftext|>",
                                   unk_token="[UNK]", chat_template=TEMPLATE, clean_up_tokenization_spaces=False)


class TurnServer:
    """Stands in for verl's LLM server client: each call is one assistant turn with known tokens; entropy e and
    log prob -e per token, so their alignment can be compared position by position."""

    def __init__(self, turns):
        self.turns = list(turns)

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        tokens, entropy = self.turns.pop(0)
        return TokenOutput(token_ids=tokens, log_probs=[-e for e in entropy], extra_fields={ROLLOUT_ENTROPY: entropy})


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model = build_model(tmp_path_factory.mktemp("tool_merged") / "model")
    with initialize_config_module("egpo.config", version_base=None):
        cfg = compose("egpo_trainer", overrides=[
            f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.name=hf",
            "data.max_prompt_length=256", "data.max_response_length=256",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        ])
    return cfg, glm_like_tokenizer()


def run_loop(cfg, tokenizer, turns):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    async def main():  # verl's loop binds the running event loop when it is built
        loop = EntropyToolAgentLoop(
            trainer_config=DictConfigWrap(cfg), server_manager=TurnServer(turns), tokenizer=tokenizer, processor=None,
            dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data), hf_model_type="glm4_moe",
        )
        assert type(loop.continuous_token_builder).__name__ == "GLMContinuousTokenBuilder"
        return await loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "What is 1+1?"}])

    return asyncio.run(main())


def turn(tokens, first):
    return tokens, [round(first + 0.01 * i, 2) for i in range(len(tokens))]


def test_entropy_takes_the_log_probs_edits_when_the_merge_trims_a_generated_token(setup):
    cfg, tokenizer = setup
    observation, user = (tokenizer.convert_tokens_to_ids(t) for t in ("<|observation|>", "<|user|>"))
    first = turn(tokenizer.encode(TOOL_CALL, add_special_tokens=False) + [observation], first=1.0)
    second = turn(tokenizer.encode("2", add_special_tokens=False) + [user], first=3.0)
    out = run_loop(cfg, tokenizer, [first, second])

    entropy, mask, logprobs = out.extra_fields[ROLLOUT_ENTROPY], out.response_mask, out.response_logprobs
    assert len(entropy) == len(mask) == len(logprobs) == len(out.response_ids)
    # verl trimmed the first turn's generated <|observation|>: its tokens minus the last, then the tool response
    n1, n2 = len(first[0]), len(second[0])
    context = len(mask) - (n1 - 1) - n2
    assert context > 0 and mask == [1] * (n1 - 1) + [0] * context + [1] * n2
    assert out.response_ids[:n1 - 1] == first[0][:-1] and out.response_ids[n1 - 1] == observation  # the context's own
    assert entropy == first[1][:-1] + [0.0] * context + second[1]
    # position by position, the entropy is where verl put each token's log prob
    assert entropy == [-lp if lp else 0.0 for lp in logprobs]
    # laying the turns onto the mask in order (verl 0.7.1's way) would shift the second turn by the trimmed token
    assert lay_entropy_on_mask([first[1], second[1]], mask) != entropy


def test_a_turn_without_entropy_leaves_the_response_without_it(setup):
    cfg, tokenizer = setup
    observation = tokenizer.convert_tokens_to_ids("<|observation|>")
    first = turn(tokenizer.encode(TOOL_CALL, add_special_tokens=False) + [observation], first=1.0)
    second = (tokenizer.encode("2", add_special_tokens=False), None)  # a server that returned no entropy

    class NoEntropySecondTurn(TurnServer):
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            tokens, entropy = self.turns.pop(0)
            extra = {ROLLOUT_ENTROPY: entropy} if entropy is not None else {}
            return TokenOutput(token_ids=tokens, log_probs=[-1.0] * len(tokens), extra_fields=extra)

    from verl.utils.dataset.rl_dataset import RLHFDataset

    async def main():
        loop = EntropyToolAgentLoop(
            trainer_config=DictConfigWrap(cfg), server_manager=NoEntropySecondTurn([first, second]),
            tokenizer=tokenizer, processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data),
            hf_model_type="glm4_moe",
        )
        return await loop.run({"temperature": 1.0}, raw_prompt=[{"role": "user", "content": "What is 1+1?"}])

    out = asyncio.run(main())
    assert ROLLOUT_ENTROPY not in out.extra_fields  # not made up: the batch check names the missing entropy


def test_the_merge_methods_egpo_follows_have_the_expected_shape():
    from egpo.compat.rollout import CT_SIGNATURES, check_tool_loop_shape

    check_tool_loop_shape("0.9.1")
    assert len(CT_SIGNATURES) == 3


def test_a_changed_merge_method_stops_start_up_naming_version_and_method(monkeypatch):
    from egpo.compat import rollout

    target = "verl.utils.tokenizer.continuous_token:ContinuousTokenBuilder.align_response_metadata"
    monkeypatch.setitem(rollout.CT_SIGNATURES, target, ("self", "merge_result", "response_mask"))
    with pytest.raises(rollout.VerlRolloutShapeError, match=r"verl 0\.9\.1: .*ContinuousTokenBuilder\.align_response_metadata takes"):
        rollout.check_tool_loop_shape("0.9.1")
    monkeypatch.setattr(rollout, "CT_SIGNATURES", {"verl.utils.tokenizer.continuous_token:Gone.method": ()})
    with pytest.raises(rollout.VerlRolloutShapeError, match="Gone.method is gone"):
        rollout.check_tool_loop_shape("0.9.1")
