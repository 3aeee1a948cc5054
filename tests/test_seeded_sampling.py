"""Per-request seeded sampling: exact samples from the warped distribution, whatever the batch around them."""

import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from egpo.rollout.hf.seeded_sampling import SeededSampler, request_seed, uniform_noise, warp

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, float("-inf"), 1.5])


def sample(logits, seeds, temperature=1.0, top_k=0, top_p=1.0, position=0):
    rows = logits.expand(len(seeds), -1)
    sampler = SeededSampler(seeds, prompt_width=3, temperature=temperature, top_k=top_k, top_p=top_p)
    out = sampler(torch.zeros(len(seeds), 3 + position, dtype=torch.long), rows.clone())
    assert torch.isfinite(out).sum(dim=1).eq(1).all()  # exactly one token left for greedy decoding to pick
    return out.argmax(dim=1)


def reference_probs(logits, temperature, top_k, top_p):
    """transformers' own warpers (as generate(do_sample=True) applies them), then softmax."""
    scores = logits[None].clone()
    for warper in (TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k) if top_k else None,
                   TopPLogitsWarper(top_p) if top_p < 1 else None):
        if warper is not None:
            scores = warper(None, scores)
    return scores.softmax(-1)[0].double()


def test_samples_follow_the_warped_distribution():
    n = 40000
    seeds = [request_seed("test", i) for i in range(n)]
    for temperature, top_k, top_p in ((1.0, 0, 1.0), (0.7, 3, 1.0), (1.3, 0, 0.8), (1.0, 4, 0.9)):
        torch.testing.assert_close(warp(LOGITS[None], temperature, top_k, top_p).softmax(-1)[0].double(),
                                   reference_probs(LOGITS, temperature, top_k, top_p))
        counts = torch.bincount(sample(LOGITS, seeds, temperature, top_k, top_p), minlength=len(LOGITS)).double()
        p = reference_probs(LOGITS, temperature, top_k, top_p)
        assert counts[p == 0].sum() == 0  # never outside the warped support
        sigma = (n * p * (1 - p)).sqrt()
        assert ((counts - n * p).abs() <= 5 * sigma + 1).all(), (counts / n, p)


def test_a_rows_sample_depends_only_on_its_seed_and_position():
    seeds = [request_seed("row", i) for i in range(64)]
    together = sample(LOGITS, seeds, position=5)
    alone = torch.cat([sample(LOGITS, [s], position=5) for s in seeds])
    reversed_batch = sample(LOGITS, seeds[::-1], position=5).flip(0)
    assert torch.equal(together, alone) and torch.equal(together, reversed_batch)
    # other positions draw fresh noise
    assert not torch.equal(together, sample(LOGITS, seeds, position=6))


def test_uniform_noise_is_in_range_and_looks_uniform():
    u = uniform_noise(torch.tensor([request_seed(i) for i in range(256)]), 3, 4096)
    assert ((u > 0) & (u < 1)).all()
    assert abs(u.mean().item() - 0.5) < 0.002 and abs(u.var().item() - 1 / 12) < 0.001
    # neighbouring seeds and positions are not correlated
    v = uniform_noise(torch.tensor([request_seed(i) for i in range(256)]), 4, 4096)
    assert abs(torch.corrcoef(torch.stack([u.flatten(), v.flatten()]))[0, 1].item()) < 0.01
