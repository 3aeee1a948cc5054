"""EGPO's estimator family vs verl's GRPO estimator on the same batch, as ratios measured in one run.

    python bench/advantage.py [--bs 4096] [--length 8192] [--group 8] [--rounds 5]

Every estimator sees identical tensors; rounds interleave them so machine noise hits all alike. Prints the
median time of each, each variant's ratio to GRPO with its spread over rounds, and the CoT mask alone. The
variants: egpo_granularity response (EGPO) or token (Cheng et al.), egpo_span cot or response; STARE's step
after the estimator (egpo_token_reweighting=stare, variant C2, its gate held on): the weights and the reweighted
advantages, timed alone; and the whole method as both its callers run it (egpo.advantage.method.compose_method:
the advantage, its metrics, STARE and the 80/20 selection where set) for EGPO, EGPO with the 80/20 rule, GTPO and
GRPO-S.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from egpo.advantage import compute_cot_mask, compute_egpo_advantage
from egpo.advantage.config import ALGORITHM_DEFAULTS, EgpoAlgorithmConfig
from egpo.advantage.method import compose_method
from egpo.advantage.stare import stare_weights

START, END = 151667, 151668


def make_batch(bs: int, length: int, group: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 4, length + 1, (bs,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).long()  # verl's response_mask dtype
    responses = torch.randint(0, 150000, (bs, length), generator=g)
    rows = torch.arange(bs)
    responses[:, 0] = START
    responses[rows, lengths // 2] = END  # thinking for half the response, as in a real CoT
    rewards = torch.zeros(bs, length)
    rewards[rows, lengths - 1] = torch.randint(0, 2, (bs,), generator=g).float()
    entropy = torch.rand(bs, length, generator=g) * 2
    index = np.array([f"prompt-{i // group}" for i in range(bs)], dtype=object)
    return rewards, mask, index, entropy, responses


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bs", type=int, default=4096)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    rewards, mask, index, entropy, responses = make_batch(args.bs, args.length, args.group)
    grpo_advantages = compute_grpo_outcome_advantage(rewards, mask, index)[0]
    old_log_probs = -torch.rand(args.bs, args.length, generator=torch.Generator().manual_seed(1)) * 5

    def egpo(granularity, span):
        return lambda: compute_egpo_advantage(rewards, mask, index, entropy, responses,  # noqa: E731
                                              egpo_lambda=ALGORITHM_DEFAULTS["egpo_lambda"],
                                              egpo_alpha=ALGORITHM_DEFAULTS["egpo_alpha"],
                                              cot_start_token_id=START, cot_end_token_id=END,
                                              granularity=granularity, span=span)

    def method(**settings):
        algo = EgpoAlgorithmConfig(cot_start_token_id=START, cot_end_token_id=END, **settings)
        return lambda: compose_method(algo, token_level_rewards=rewards, response_mask=mask,  # noqa: E731
                                      index=index, entropy=entropy, responses=responses, solved_score=1.0)

    estimators = {
        "verl GRPO": lambda: compute_grpo_outcome_advantage(rewards, mask, index),
        "EGPO (response, cot)": egpo("response", "cot"),
        "token (Cheng), cot": egpo("token", "cot"),
        "response, response span": egpo("response", "response"),
        "token, response span": egpo("token", "response"),
        "CoT mask alone": lambda: compute_cot_mask(responses, mask, START, END),
        "STARE step (C2, gate on)": lambda: grpo_advantages * stare_weights(
            grpo_advantages, old_log_probs, entropy, mask, variant="C2", top_ratio=0.1, w=1.1, m=0.9,
            target_entropy=10.0).weights,
        "method: EGPO": method(),
        "method: EGPO + 80/20 rule": method(egpo_token_selection="top_entropy", egpo_top_entropy_quantile=0.2),
        "method: GTPO (per_sign)": method(egpo_method="gtpo"),
        "method: GRPO-S": method(egpo_method="grpo_s"),
    }
    for fn in estimators.values():  # warm the allocator
        fn()
    times = {name: [] for name in estimators}
    for _ in range(args.rounds):
        for name, fn in estimators.items():
            times[name].append(timed(fn))
    med = statistics.median
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"batch: {args.bs} responses x {args.length} tokens, groups of {args.group}, {args.rounds} rounds")
    base = times["verl GRPO"]
    for name, t in times.items():
        line = f"{name:28s} median {med(t) * 1e3:8.1f} ms"
        if name not in ("verl GRPO", "CoT mask alone"):
            ratios = [x / g for x, g in zip(t, base)]
            line += f"   ratio to GRPO {med(ratios):.2f}x (min {min(ratios):.2f}, max {max(ratios):.2f})"
        print(line)


if __name__ == "__main__":
    main()
