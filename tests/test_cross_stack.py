"""The same inputs give the same EGPO advantages on every verl stack: a golden file of inputs and results, written
once (``python tests/test_cross_stack.py --write`` on the verl 0.7.1 stack) and compared bit for bit on each.

The estimator is egpo's tensor code around verl's ``compute_grpo_outcome_advantage``; a verl release that changed
GRPO's arithmetic, or its inputs' handling, would show here as a difference between the stacks.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

from egpo import advantage

GOLDEN = Path(__file__).resolve().parent / "data" / "egpo_advantages_golden.json"
S, E = 3, 4
CASES = [dict(seed=0, egpo_lambda=0.4, egpo_alpha=2.0, norm=True), dict(seed=1, egpo_lambda=0.0, egpo_alpha=2.0, norm=True),
         dict(seed=2, egpo_lambda=0.9, egpo_alpha=1.0, norm=False), dict(seed=3, egpo_lambda=0.4, egpo_alpha=2.0, norm=True)]


def inputs(seed, bs=24, length=20, group=6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (bs,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    responses = torch.randint(1, 9, (bs, length), generator=g)
    responses[torch.rand(bs, generator=g) < 0.8, 0] = S
    responses[torch.arange(bs), torch.randint(1, length, (bs,), generator=g)] = E
    rewards = torch.zeros(bs, length)
    rewards[torch.arange(bs), lengths - 1] = torch.randint(0, 3, (bs,), generator=g).float()
    entropy = torch.rand(bs, length, generator=g) * 3
    entropy[0, 1] = float("nan")  # left out of H_0 and counted
    return rewards, mask, np.array([f"p{i // group}" for i in range(bs)], dtype=object), entropy, responses


def results() -> list[list[str]]:
    """Each case's advantages as float.hex strings (exact, readable in JSON)."""
    out = []
    for case in CASES:
        rewards, mask, index, entropy, responses = inputs(case["seed"])
        adv, _, _ = advantage.compute_egpo_advantage(
            rewards, mask, index, entropy, responses, egpo_lambda=case["egpo_lambda"], egpo_alpha=case["egpo_alpha"],
            cot_start_token_id=S, cot_end_token_id=E, granularity="response", span="cot",
            norm_adv_by_std_in_grpo=case["norm"])
        out.append([float(v).hex() for v in adv.flatten().tolist()])
    return out


def test_advantages_equal_the_golden_file_bit_for_bit():
    golden = json.loads(GOLDEN.read_text())
    assert golden["cases"] == CASES
    for case, got, expected in zip(CASES, results(), golden["advantages"], strict=True):
        assert got == expected, f"case {case}: {sum(a != b for a, b in zip(got, expected))} values differ"
    assert any(float.fromhex(v) != 0 for v in golden["advantages"][0])  # the file holds real advantages


if __name__ == "__main__" and "--write" in sys.argv:
    from importlib.metadata import version

    GOLDEN.write_text(json.dumps({"written_with": {"verl": version("verl"), "torch": version("torch")},
                                  "cases": CASES, "advantages": results()}) + "\n")
    print(GOLDEN)
