"""A warm-started demo model: briefly fine-tuned on synthetic reasoning traces for the demo task.

A random-weight model's chain of thought sits at 2-4.4 nats per token, where every EGPO bonus is clipped to
``|A_i| / egpo_alpha`` and the entropy no longer matters. Real thinking models sit well under 1 nat. This module
fine-tunes the demo Qwen3 on traces of the form

    <think>\\n{one of several phrasings of a+b=c}\\n</think>\\n{c}<|im_end|>

(the chat template already ends the prompt with ``<think>\\n``), with a share of traces whose sum is off by one,
so the model ends in the regime real models live in: a low but non-zero CoT entropy and a partial success rate.
Training is seeded and runs on the CPU in seconds; :func:`measure` reports the sampled accuracy and mean CoT
entropy the build ends with (written to ``warm_stats.json`` next to the model).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

PHRASINGS = ("{a}+{b}={c}", "{a} plus {b} is {c}", "add {a} and {b}: {c}", "{b}+{a}={c}", "{a}+{b} makes {c}")
WRONG_FRACTION = 0.3  # traces whose sum (and answer) is off by one


def trace(a: int, b: int, rng: random.Random) -> str:
    c = a + b
    if rng.random() < WRONG_FRACTION:
        c += rng.choice((-1, 1))
    thought = rng.choice(PHRASINGS).format(a=a, b=b, c=c)
    return f"{thought}\n</think>\n{c}"


def _examples(tokenizer, n: int, rng: random.Random) -> list[tuple[list[int], list[int]]]:
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": f"What is {a}+{b}?"}],
                                               add_generation_prompt=True, return_dict=False)
        response = tokenizer(trace(a, b, rng), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        out.append((prompt, response))
    return out


def fine_tune(model_dir: Path, seed: int, steps: int = 400, batch: int = 32, lr: float = 3e-3) -> None:
    """Teacher-forced cross-entropy on the response tokens only; overwrites the model in ``model_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager")
    model.train()
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    pad = tokenizer.pad_token_id
    started = time.monotonic()
    for step in range(steps):
        if step % 50 == 0:
            print(f"[egpo] warming the demo model in {model_dir}: step {step}/{steps}, "
                  f"{time.monotonic() - started:.0f} s", flush=True)
        pairs = _examples(tokenizer, batch, rng)
        width = max(len(p) + len(r) for p, r in pairs)
        ids = torch.full((batch, width), pad, dtype=torch.long)
        labels = torch.full((batch, width), -100, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, (p, r) in enumerate(pairs):  # building the batch (not a hot path)
            seq = p + r
            ids[i, : len(seq)] = torch.tensor(seq)
            mask[i, : len(seq)] = 1
            labels[i, len(p) : len(seq)] = torch.tensor(r)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(model_dir)


@torch.no_grad()
def measure(model_dir: Path, seed: int = 0, prompts: int = 64, samples: int = 4) -> dict:
    """Sampled (temperature 1) accuracy under the demo reward, and the mean per-token CoT entropy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from egpo.demo.reward import compute_score
    from egpo.rollout.hf.generate import generate_batch

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    rng = random.Random(seed + 1)
    questions = [(rng.randint(0, 9), rng.randint(0, 9)) for _ in range(prompts)]
    batch = [tokenizer.apply_chat_template([{"role": "user", "content": f"What is {a}+{b}?"}], add_generation_prompt=True, return_dict=False)
             for a, b in questions for _ in range(samples)]
    outs = generate_batch(model, batch, max_new_tokens=32, temperature=1.0, stop_token_ids=[tokenizer.eos_token_id],
                          pad_token_id=tokenizer.pad_token_id, generator_seed=seed)
    end = tokenizer.convert_tokens_to_ids("</think>")
    scores, cot_entropy = [], []
    for (a, b), out in zip([q for q in questions for _ in range(samples)], outs):
        text = tokenizer.decode(out.token_ids, skip_special_tokens=True)
        scores.append(compute_score("egpo_demo_arithmetic", text, str(a + b)))
        span = out.token_ids.index(end) if end in out.token_ids else len(out.token_ids)
        cot_entropy += out.entropy[:span]
    return {
        "accuracy": sum(s == 1.0 for s in scores) / len(scores),
        "think_closed": sum(s > 0 for s in scores) / len(scores),
        "cot_entropy_mean": sum(cot_entropy) / max(1, len(cot_entropy)),
    }


def warm_start(model_dir: Path, seed: int) -> dict:
    fine_tune(model_dir, seed)
    stats = measure(model_dir, seed)
    (model_dir / "warm_stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    return stats
