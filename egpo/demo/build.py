"""Builds the demo model, tokenizer and task locally (nothing is downloaded).

    python -m egpo.demo.build [--out .egpo_demo] [--seed 0] [--warm] [--force]

Writes ``OUT/model`` (a real Qwen3 architecture with random weights from ``--seed`` and the demo tokenizer) and
``OUT/data/{train,val}.parquet`` (small additions in verl's RL parquet format). ``--warm`` then fine-tunes the
model briefly on synthetic reasoning traces (:mod:`egpo.demo.warm`), so its CoT entropy and success rate sit in
the regime of real thinking models; it prints and keeps (``OUT/model/warm_stats.json``) what it measured.
Idempotent: existing artifacts are kept unless ``--force``.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from egpo.cpu.vllm_rollout import CPU_ATTENTION_HEAD_SIZES
from egpo.demo.tokenizer import build_tokenizer

DATA_SOURCE = "egpo_demo_arithmetic"
HEAD_DIM = 16
VLLM_HEAD_DIM = min(CPU_ATTENTION_HEAD_SIZES)  # the smallest head vLLM's CPU attention runs: 32
VLLM_DEMO = "vllm"  # a vLLM rollout's demo: <out>/vllm


def build_model(out: Path, seed: int = 0, initializer_range: float = 0.02, head_dim: int = HEAD_DIM) -> Path:
    """``initializer_range`` 0.02 (transformers' default) gives near-uniform next-token distributions (entropy about
    ln V everywhere); 0.5 gives a model whose per-token entropies span roughly 0-3 nats (a sharper test).
    ``head_dim`` 32 suits vLLM's CPU attention (which needs >= 32); the hidden size stays 64."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = build_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=64 // head_dim,
        num_key_value_heads=max(1, 32 // head_dim),
        head_dim=head_dim,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
        attn_implementation="eager",
        initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def task_rows(n: int, split: str, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"What is {a}+{b}?"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": split, "index": i},
            }
        )
    return rows


def build_data(out: Path, n_train: int = 64, n_val: int = 8) -> Path:
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(task_rows(n_train, "train", 0)).to_parquet(out / "train.parquet")
    pd.DataFrame(task_rows(n_val, "val", 1)).to_parquet(out / "val.parquet")
    return out


# the warm demo the repository ships (recipes/cpu_warm.yaml's: seed 0, heads of 16), where egpo is installed from it
SHIPPED_WARM = Path(__file__).resolve().parents[2] / ".egpo_demo_warm"
SHIPPED_WARM_SEED = 0


def copy_shipped_warm_model(out: Path, seed: int, head_dim: int) -> bool:
    """The warm model asked for is the one the repository ships (its seed and heads): copied, not fine-tuned again
    (the fine-tuning takes minutes on a CPU). Returns whether it was."""
    import shutil

    shipped = SHIPPED_WARM / "model"
    if (seed != SHIPPED_WARM_SEED or head_dim != HEAD_DIM or not (shipped / "warm_stats.json").is_file()
            or out.resolve() == SHIPPED_WARM.resolve()):
        return False
    shutil.copytree(shipped, out / "model", dirs_exist_ok=True)
    print(f"[egpo] the warm demo model: the repository's ({shipped}, seed {seed}), copied into {out / 'model'}",
          flush=True)
    return True


def build(out: Path | str = ".egpo_demo", force: bool = False, seed: int = 0, warm: bool = False,
          head_dim: int | None = None) -> Path:
    """``head_dim`` None: :data:`HEAD_DIM`. A model already there with other heads is an error (never rebuilt over)."""
    out = Path(out)
    head_dim = head_dim or HEAD_DIM
    marker = out / "model" / ("warm_stats.json" if warm else "config.json")
    if not force and (out / "model" / "config.json").exists():
        import json

        found = json.loads((out / "model" / "config.json").read_text()).get("head_dim")
        if found != head_dim:
            from egpo.errors import EgpoConfigError

            raise EgpoConfigError(f"the demo model in {out / 'model'} has attention heads of {found}, not {head_dim}: "
                             "build it elsewhere (egpo_demo.out=...) or rebuild it (python -m egpo.demo.build --force)")
    shipped = not force and warm and not marker.exists() and copy_shipped_warm_model(out, seed, head_dim)
    if not shipped and (force or not marker.exists()):
        build_model(out / "model", seed=seed, head_dim=head_dim)
        if warm:
            from egpo.demo.warm import warm_start

            warm_start(out / "model", seed)
    if force or not (out / "data" / "val.parquet").exists():
        build_data(out / "data")
    return out


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m egpo.demo.build", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--out", default=".egpo_demo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm", action="store_true", help="fine-tune on synthetic reasoning traces (minutes; seed 0 "
                        "copies the repository's)")
    parser.add_argument("--force", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    out = build(args.out, args.force, seed=args.seed, warm=args.warm)
    print(f"demo model: {out / 'model'}\ndemo data:  {out / 'data'}")
    stats = out / "model" / "warm_stats.json"
    if args.warm and stats.exists():
        print(f"warm start: {stats.read_text().strip()}")


if __name__ == "__main__":
    main()
