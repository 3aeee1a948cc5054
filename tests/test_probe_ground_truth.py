"""Exact on-policy sequence entropy of a tiny-vocabulary model: the estimator u and the probe, validated."""

import numpy as np
import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from egpo.probe.ground_truth import all_continuations, continuation_log_probs, exact_sequence_entropy
from egpo.probe.step_probe import AdamWStepProbe, dot64, grads_of
from egpo.probe.surrogate import sequence_entropy_surrogate

V, L, PROMPT = 12, 3, [1, 2, 3]


def tiny_model(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=32, tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg).double().eval()


def test_exact_entropy_matches_its_definition_and_bounds():
    model = tiny_model()
    h = exact_sequence_entropy(model, PROMPT, L)
    log_p = continuation_log_probs(model, PROMPT, all_continuations(V, L))
    assert log_p.exp().sum().item() == pytest.approx(1.0, abs=1e-12)  # a distribution over V^L sequences
    assert 0 < h.item() <= L * np.log(V) + 1e-9
    with pytest.raises(ValueError, match="too many"):
        all_continuations(200, 4)


def test_leave_one_out_estimate_points_along_the_exact_gradient():
    model = tiny_model()
    params = list(model.parameters())
    exact = grads_of(exact_sequence_entropy(model, PROMPT, L), params)
    log_p = continuation_log_probs(model, PROMPT, all_continuations(V, L))
    draws = torch.multinomial(log_p.detach().exp(), 8192, replacement=True, generator=torch.Generator().manual_seed(0))
    estimate = grads_of(sequence_entropy_surrogate(log_p[draws]), params)
    cosine = dot64(exact, estimate) / np.sqrt(dot64(exact, exact) * dot64(estimate, estimate))
    print(f"cosine(exact grad H, leave-one-out estimate from 8192 draws) = {cosine:.4f}")
    assert cosine > 0.9, cosine


def test_probe_predicts_the_exact_on_policy_entropy_change():
    """20 AdamW steps of an on-policy policy-gradient update; target: the exact sequence entropy."""
    model = tiny_model(seed=1)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    probe = AdamWStepProbe(opt)
    gen = torch.Generator().manual_seed(2)
    continuations = all_continuations(V, L)
    predicted, realised = [], []
    for _ in range(20):
        h = exact_sequence_entropy(model, PROMPT, L)
        u = grads_of(h, params)
        log_p = continuation_log_probs(model, PROMPT, continuations)
        draws = torch.multinomial(log_p.detach().exp(), 16, replacement=True, generator=gen)
        rewards = torch.randn(16, dtype=torch.float64, generator=gen)
        opt.zero_grad()
        (-((rewards - rewards.mean()) * log_p[draws]).mean()).backward()
        opt.step()
        with torch.no_grad():
            realised.append(float(exact_sequence_entropy(model, PROMPT, L) - h.detach()))
        predicted.append(probe.predict(u).total)
    r = np.corrcoef(predicted, realised)[0, 1]
    slope = np.dot(predicted, realised) / np.dot(predicted, predicted)
    print(f"exact on-policy entropy, lr 1e-4: r = {r:.5f}, slope = {slope:.4f}")
    assert r > 0.99 and abs(slope - 1) < 0.05, (r, slope)
