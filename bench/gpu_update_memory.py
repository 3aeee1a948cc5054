"""What only a GPU shows, with torch and transformers alone (no verl, Ray or engine): the actor-update micro-batch
of a Qwen3-shaped model at a recipe's token budget, with and without the update-time entropy, and the rollout
entropy kernel on CUDA.

    python bench/gpu_update_memory.py                       # Qwen3-4B's shape, 34,816 and 8,192 tokens, then the kernel
    python bench/gpu_update_memory.py --model qwen3-8b --tokens 34816
    python bench/gpu_update_memory.py --device cpu --model tiny --tokens 256 --no-kernel    # the plumbing, on a CPU

The update micro-batch is the one verl's FSDP actor runs on each GPU under dynamic batching
(``ppo_max_token_len_per_gpu`` tokens, packed into one row): a random-weight model of the recipe's shape in bf16
with gradient checkpointing (as the recipes), the log probabilities of the sampled tokens (fp32 log-softmax of
the bf16 logits), the policy-gradient loss, and backward. ``entropy`` adds what verl's update does when
``actor.calculate_entropy`` is on (or ``entropy_coeff`` is non-zero): the entropy of every token over the full
vocabulary, in fp32 chunks of 2,048 rows (as ``entropy_from_logits_with_chunking``), under autograd, with
coefficient 0 in the loss (autograd does not skip it). ``recompute`` is the old-policy recompute's entropy, under
no_grad. For each: the peak memory (``torch.cuda.max_memory_allocated``; on a CPU, the bytes autograd saves), the
difference from ``none``, and the preflight's figure for it (``egpo.preflight.scale``: 2 x tokens x vocabulary x 4
bytes). An out-of-memory is reported as such: it is the finding. Optimizer state is left out (FSDP shards it over
the node's GPUs); the parameters and their gradients are whole, as on one GPU of an unsharded run, so the absolute
peaks are an upper bound and the differences are the figure to read.

The kernel part runs ``bench/entropy_kernel.py --device cuda`` (the rollout engines' entropy kernel). The whole
script takes a few minutes on an H100.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

SHAPES = {  # config.json of the recipes' models (egpo.preflight.scale.KNOWN_SHAPES), and a tiny one for a CPU
    "qwen3-1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                       max_position_embeddings=40960),
    "qwen3-4b": dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                     max_position_embeddings=40960),
    "qwen3-8b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
                     max_position_embeddings=40960),
    "tiny": dict(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True),
}
MODES = ("none", "entropy", "recompute")
CHUNK = 2048
GB = 1e9


def chunked_entropy(logits: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """Entropy per row in fp32 chunks: logsumexp(x) - sum(softmax(x) * x)."""
    out = torch.empty(logits.shape[0], device=logits.device)
    for start in range(0, logits.shape[0], chunk):
        x = logits[start:start + chunk].float()
        out[start:start + chunk] = torch.logsumexp(x, -1) - (torch.softmax(x, -1) * x).sum(-1)
    return out


def build(shape: dict, device: str):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    # positions past the recipes' 40,960: a token budget here may exceed one sequence
    config = Qwen3Config(**{**shape, "max_position_embeddings": 65536}, attn_implementation="sdpa",
                         torch_dtype="bfloat16")
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    return model


class SavedBytes:
    """Bytes of the distinct storages autograd saves (the CPU's stand-in for a peak)."""

    def __init__(self):
        self.total, self.seen, self.held = 0, set(), []

    def pack(self, tensor):
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in self.seen and key[0]:
            self.seen.add(key)
            self.total += storage.nbytes()
            self.held.append(tensor)
        return tensor


def micro_batch(model, ids: torch.Tensor, mode: str) -> None:
    """One update micro-batch (``none`` / ``entropy``) or one recompute micro-batch (``recompute``)."""
    positions = torch.arange(ids.shape[1], device=ids.device)[None]
    if mode == "recompute":
        with torch.no_grad():
            logits = model(input_ids=ids, position_ids=positions).logits[0]
            chunked_entropy(logits)
        return
    logits = model(input_ids=ids, position_ids=positions).logits[0]
    labels = ids[0].roll(-1)
    log_probs = torch.log_softmax(logits.float(), -1).gather(-1, labels[:, None])[:, 0]
    loss = -(log_probs * torch.randn_like(log_probs)).mean()  # the policy gradient with made-up advantages
    if mode == "entropy":
        loss = loss - 0.0 * chunked_entropy(logits).mean()  # coefficient 0: autograd keeps it all the same
    loss.backward()


def measure(model, tokens: int, mode: str, device: str) -> dict:
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, tokens), device=device)
    model.zero_grad(set_to_none=True)
    try:
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            micro_batch(model, ids, mode)
            torch.cuda.synchronize()
            return {"peak_bytes": torch.cuda.max_memory_allocated(), "seconds": time.perf_counter() - start}
        saved = SavedBytes()
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
            micro_batch(model, ids, mode)
        return {"saved_bytes": saved.total, "seconds": time.perf_counter() - start}
    except torch.OutOfMemoryError as err:
        return {"out_of_memory": str(err).splitlines()[0]}
    finally:
        model.zero_grad(set_to_none=True)


def update_rows(model, tokens_list: list[int], device: str) -> list[dict]:
    rows = []
    vocab = model.config.vocab_size
    for tokens in tokens_list:
        results = {mode: measure(model, tokens, mode, device) for mode in MODES}
        key = "peak_bytes" if device == "cuda" else "saved_bytes"
        base = results["none"].get(key)
        for mode in MODES:
            row = {"tokens": tokens, "mode": mode, **results[mode]}
            comparable = mode == "entropy" or device == "cuda"  # a CPU counts saved bytes: none under no_grad
            if base is not None and key in results[mode] and mode != "none" and comparable:
                row["minus_none_bytes"] = results[mode][key] - base
            if mode == "entropy":
                row["preflight_bytes"] = 2 * tokens * vocab * 4
            rows.append(row)
    return rows


def print_rows(rows: list[dict], device: str) -> None:
    measured = "peak (GB)" if device == "cuda" else "saved for backward (GB)"
    print(f"| tokens | mode | {measured} | minus none (GB) | preflight's figure (GB) | seconds |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        peak = row.get("peak_bytes", row.get("saved_bytes"))
        peak_text = "out of memory" if "out_of_memory" in row else f"{peak / GB:.2f}"
        extra = f"{row['minus_none_bytes'] / GB:.2f}" if "minus_none_bytes" in row else "-"
        preflight = f"{row['preflight_bytes'] / GB:.2f}" if "preflight_bytes" in row else "-"
        seconds = f"{row['seconds']:.2f}" if "seconds" in row else "-"
        print(f"| {row['tokens']:,} | {row['mode']} | {peak_text} | {extra} | {preflight} | {seconds} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="qwen3-4b")
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 34816],
                        help="update micro-batch tokens per GPU (the qwen3_4b/8b recipes: 34816)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-kernel", action="store_true", help="skip bench/entropy_kernel.py")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    where = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
    print(f"# {args.model}, {where}, torch {torch.__version__}")
    model = build(SHAPES[args.model], args.device)
    rows = update_rows(model, args.tokens, args.device)
    print_rows(rows, args.device)
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "device": where, "torch": torch.__version__,
                                         "rows": rows}, indent=1))
    del model
    if not args.no_kernel and args.device == "cuda":
        torch.cuda.empty_cache()
        kernel = Path(__file__).with_name("entropy_kernel.py")
        subprocess.run([sys.executable, str(kernel), "--device", "cuda"], check=True,
                       env={**__import__("os").environ, "PYTHONPATH": str(kernel.parent.parent)})


if __name__ == "__main__":
    main()
