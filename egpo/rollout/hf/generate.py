"""Token-in/token-out generation with ``transformers``: never re-tokenizes, returns per-token entropy.

For each sampled token it returns the token id, its log probability under the distribution it was sampled
from (logits / temperature, as the actor's recompute defines ``old_log_probs``), and its entropy from
:func:`egpo.rollout.entropy.token_entropy` with the same options the sglang path uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from transformers import LogitsProcessorList

from egpo.rollout.entropy import EntropyOptions, token_entropy
from egpo.rollout.hf.seeded_sampling import SeededSampler, request_seed


@dataclass
class GeneratedTokens:
    token_ids: list[int]
    log_probs: list[float]
    entropy: list[float]
    stop_reason: str  # "completed" (a stop token) or "length"


def generate_tokens(model, prompt_ids: list[int], *, n: int = 1, **settings) -> list[GeneratedTokens]:
    """``n`` samples for one prompt (the settings of :func:`generate_batch`)."""
    if not prompt_ids:
        raise ValueError("prompt_ids is empty")
    return generate_batch(model, [list(prompt_ids)] * n, **settings)


@torch.no_grad()
def generate_batch(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = -1,
    stop_token_ids: list[int] | None = None,
    pad_token_id: int = 0,
    entropy_options: EntropyOptions = EntropyOptions(),
    generator_seed: int | None = None,
    row_seeds: list[int] | None = None,
) -> list[GeneratedTokens]:
    """One sample per prompt, prompts of any lengths in one left-padded batch, the same sampling settings.

    ``temperature <= 0`` is greedy (and still gets entropy); ``top_k <= 0`` and ``top_p == 1`` disable those
    filters; ``stop_token_ids`` end a sample (the stop token is kept). Sampling is per row
    (:class:`~egpo.rollout.hf.seeded_sampling.SeededSampler`): ``row_seeds[i]`` alone decides row ``i``'s sample,
    whatever else is in the batch; without it, row ``i`` uses the seed ``(generator_seed or 0, i)``.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    stop = list(stop_token_ids or [])
    greedy = temperature <= 0
    if row_seeds is None:
        row_seeds = [request_seed(generator_seed or 0, i) for i in range(len(prompts))]
    if len(row_seeds) != len(prompts):
        raise ValueError(f"{len(row_seeds)} row seeds for {len(prompts)} prompts")
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_token_id] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long)
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
    out = model.generate(
        input_ids=input_ids.to(model.device),
        attention_mask=attention_mask.to(model.device),
        max_new_tokens=max_new_tokens,
        do_sample=False,  # greedy, or the seeded sampler leaves only the sampled token finite
        logits_processor=None if greedy else LogitsProcessorList([
            SeededSampler(row_seeds, width, temperature, top_k if top_k and top_k > 0 else 0, top_p)
        ]),
        temperature=None,
        top_p=None,
        top_k=None,
        eos_token_id=stop or None,
        pad_token_id=pad_token_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    sequences = out.sequences[:, width:]
    raw = torch.stack(out.logits, dim=1).float()  # (B, T, V): the model's raw logits at each step
    batch, steps, vocab = raw.shape
    scale = 1.0 if greedy else temperature
    log_probs = torch.log_softmax(raw / scale, dim=-1).gather(-1, sequences.unsqueeze(-1)).squeeze(-1)
    entropy = token_entropy(
        raw.reshape(-1, vocab),
        top_k=entropy_options.top_k,
        temperature=scale if entropy_options.temperature_scaled else None,
    ).reshape(batch, steps)

    # trim each sample after its first stop token (vectorized; finished rows are padded by generate)
    is_stop = torch.isin(sequences, torch.tensor(stop, dtype=sequences.dtype, device=sequences.device))
    stopped = is_stop.any(dim=1)
    lengths = torch.where(stopped, is_stop.int().argmax(dim=1) + 1, steps).tolist()
    reasons = ["completed" if s else "length" for s in stopped.tolist()]
    seq, lp, ent = sequences.tolist(), log_probs.tolist(), entropy.tolist()
    return [
        GeneratedTokens(seq[i][:n_i], lp[i][:n_i], ent[i][:n_i], reasons[i]) for i, n_i in enumerate(lengths)
    ]
