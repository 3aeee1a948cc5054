"""What the generation tests share: the ``python -m egpo.generate`` command on the CPU smoke recipe, its rows, and a
float64 recompute of a model's entropy and log probabilities on them."""

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import torch

from test_recipes import RECIPES

COLUMNS = ["index", "sample", "prompt", "prompt_ids", "response_ids", "response", "entropy", "log_prob", "score"]


def command(demo, *args):
    return [sys.executable, "-m", "egpo.generate", f"--config-path={RECIPES}", "--config-name=cpu_smoke",
            f"egpo_demo.out={demo}", *map(str, args)]


def generate(workdir, demo, *args, timeout=900):
    return subprocess.run(command(demo, *args), cwd=workdir, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def rows(out):
    parts = sorted((out / "samples").glob("part-*.parquet"))
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)


def float64_recompute(model, frame):
    """Per row: the entropy of softmax(logits) and the log probability of each response token, in float64."""
    entropy, log_prob = [], []
    for prompt_ids, response_ids in zip(frame.prompt_ids, frame.response_ids):
        ids = torch.tensor([*prompt_ids, *response_ids])[None]
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt_ids) - 1:-1].double()
        logp = torch.log_softmax(logits, dim=-1)
        entropy.append(-(logp.exp() * logp).sum(-1).numpy())
        log_prob.append(logp.gather(1, torch.tensor(response_ids)[:, None])[:, 0].numpy())
    return entropy, log_prob


def max_abs_diff(a, b):
    return max(float(np.abs(np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)).max()) for x, y in
               zip(a, b))


def hf_model(path, state=None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64, attn_implementation="eager").eval()
    if state is not None:
        model.load_state_dict({k: v.double() for k, v in state.items()}, strict=False)
    return model
