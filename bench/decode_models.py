"""The models and arguments of the two decode-step benches (``engine_decode.py`` for sglang,
``vllm_engine_decode.py`` for vLLM): the demo Qwen3 and a random-weight model with Qwen3-0.6B's shape, built
locally in fp32."""

from __future__ import annotations

import argparse
from pathlib import Path

QWEN3_06B_SHAPE = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)
MODELS = ("demo", "qwen3-0.6b")


def decode_bench_arguments(doc: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--new-tokens", type=int, default=8)
    return parser.parse_args()


def build_bench_model(out: Path, name: str, **demo_options) -> Path:
    """``demo``: egpo's demo model (``demo_options`` go to its builder); ``qwen3-0.6b``: Qwen3-0.6B's shape."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from egpo.demo.build import build_model as build_demo_model

    if name == "demo":
        return build_demo_model(out, initializer_range=0.5, **demo_options)
    config = Qwen3Config(**QWEN3_06B_SHAPE, max_position_embeddings=512, eos_token_id=2, pad_token_id=0,
                         bos_token_id=None, torch_dtype="float32")
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(out)
    return out
