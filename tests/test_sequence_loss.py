"""GRPO-S's loss (egpo/advantage/sequence_loss.py, Eqs. 10-11) against a float64 loop of the equations, and against
verl's own token loss where the two must agree: responses of equal length whose token ratios are equal within each
response (the sequence ratio is then each token's ratio, and verl's seq-mean-token-mean PPO loss is GRPO-S's), loss
and gradient both; registered under verl's policy-loss registry as the arm asks for it."""

import numpy as np
import pytest
import torch

from egpo.advantage.sequence_loss import LOSS_MODE, grpo_s_policy_loss, register


class ActorConfig(dict):
    """What verl's losses read of the actor's config: the clip ratios and the global batch's sizes."""

    def __getattr__(self, name):
        return self[name]


CONFIG = ActorConfig(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, global_batch_info={})


def reference(old, new, adv, mask, low=0.2, high=0.28):
    """Eqs. 10-11 response by response in float64: (1/G) sum_i max(-A_i rho_i, -A_i clip(rho_i))."""
    losses = []
    for o, n, a, m in zip(old.tolist(), new.tolist(), adv.tolist(), mask.tolist()):
        valid = [t for t in range(len(m)) if m[t]]
        if not valid:
            continue
        rho = sum(np.exp(n[t] - o[t]) for t in valid) / len(valid)
        a_i = sum(a[t] for t in valid) / len(valid)
        losses.append(max(-a_i * rho, -a_i * min(max(rho, 1 - low), 1 + high)))
    return sum(losses) / len(losses)


@pytest.mark.parametrize("seed", range(5))
def test_the_loss_is_the_equations_on_ragged_responses(seed):
    g = torch.Generator().manual_seed(seed)
    B, L = 6, 7
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    mask = (torch.arange(L)[None, :] < lengths[:, None]).long()
    old = -torch.rand(B, L, generator=g, dtype=torch.float64) * 3
    new = old + torch.randn(B, L, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, L) * mask
    loss, metrics = grpo_s_policy_loss(old, new, adv, mask, "seq-mean-token-mean", CONFIG)
    assert float(loss) == pytest.approx(reference(old, new, adv, mask), rel=1e-9, abs=1e-12)
    assert 0.0 <= metrics["actor/pg_clipfrac"] <= 1.0


def test_it_is_verls_token_loss_where_each_responses_ratios_are_equal():
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    g = torch.Generator().manual_seed(0)
    B, L = 5, 4
    mask = torch.ones(B, L, dtype=torch.long)
    old = -torch.rand(B, L, generator=g, dtype=torch.float64) * 3
    shift = torch.tensor([-0.5, -0.1, 0.0, 0.15, 0.6], dtype=torch.float64)[:, None]  # some ratios clipped, some not
    adv = torch.tensor([1.0, -1.0, 0.5, -0.3, 2.0], dtype=torch.float64)[:, None].expand(B, L).contiguous()
    new_ours = (old + shift).clone().requires_grad_(True)
    new_verl = (old + shift).clone().requires_grad_(True)
    ours, _ = grpo_s_policy_loss(old, new_ours, adv, mask, "seq-mean-token-mean", CONFIG)
    verl, _ = compute_policy_loss_vanilla(old, new_verl, adv, mask, "seq-mean-token-mean", CONFIG)
    assert float(ours) == pytest.approx(float(verl), rel=1e-12)
    ours.backward()
    verl.backward()
    assert torch.allclose(new_ours.grad, new_verl.grad, rtol=1e-10, atol=1e-14)


def test_registered_as_verl_looks_it_up():
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    register()
    register()  # idempotent
    assert get_policy_loss_fn(LOSS_MODE) is grpo_s_policy_loss
