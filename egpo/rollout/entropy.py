"""THE per-token entropy function, used by every rollout producer (the HF server and the sglang sampler patch).

    y = x / T - max(x / T),  S = sum(exp y),  A = sum(exp(y) * y),  H = log S - A / S

The shifted form has no cancellation (``logsumexp(x) - sum(softmax(x) * x)`` loses ~5e-4 relative accuracy
on rows whose logits sit near 57). ``-inf`` logits (grammar masks, penalizers, top-k) contribute exactly 0:
``y`` is clamped to a finite value before the product, so ``0 * -inf`` never makes a NaN, and a one-hot row
gives exactly 0. A row whose logits are all ``-inf`` is malformed and gives NaN (downstream code counts and
leaves out non-finite values), never a crash.

Options, the same for every producer:
* ``top_k``: 0 = full vocabulary; k > 0 = entropy of the k largest logits renormalized (bounded by log k).
* ``temperature``: None = raw logits (the default: the design's constraint); a float or a per-row tensor =
  entropy of the temperature-scaled distribution the sampler draws from.

Temporaries are bounded: rows are processed in blocks of at most ``max_block_bytes`` of fp32 working memory
(two fp32 temporaries per element), never a full batch x vocab copy. ``compiled=True`` uses a ``torch.compile``d
fused kernel (batch dimension dynamic, so a sweep of batch sizes compiles once per dtype and width;
:func:`warm_compiled_kernel` compiles it ahead of the first request) and falls back to the eager blocks if
compiling is not possible here. The fallback says so once, on stderr (an engine's log level may hide warnings),
and keeps decode steps cheap: its blocks on an accelerator hold :data:`FALLBACK_BLOCK_BYTES` (a 256-row decode
batch at V=151936 in two blocks), not the CPU's 16 MiB. :func:`kernel_status` tells which path runs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

__all__ = ["EntropyOptions", "kernel_status", "token_entropy", "warm_compiled_kernel"]

DEFAULT_BLOCK_BYTES = 16 * 2**20
FALLBACK_BLOCK_BYTES = 256 * 2**20  # eager blocks on an accelerator, once the compiled kernel is unavailable
TEMPORARIES = 2  # fp32 working copies per element in the eager block


@dataclass(frozen=True)
class EntropyOptions:
    """How rollout entropy is taken; serializable so it can cross a ``spawn`` boundary."""

    top_k: int = 0
    temperature_scaled: bool = False

    def __post_init__(self):
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"entropy top_k must be an int >= 0 (0 = full vocabulary); got {self.top_k!r}")

    @classmethod
    def from_config(cls, entropy_config) -> "EntropyOptions":
        """``actor_rollout_ref.rollout.custom.entropy`` as declared in :class:`egpo.options.RolloutEntropyOptions`."""
        from egpo.options import RolloutEntropyOptions, read

        options = read(RolloutEntropyOptions, entropy_config, "actor_rollout_ref.rollout.custom.entropy")
        return cls(top_k=options.top_k, temperature_scaled=options.temperature_scaled)

    def kernel_width(self, vocab: int) -> int:
        """The width of the rows the kernel sees for logits of ``vocab`` entries: ``top_k`` where it cuts them."""
        return self.top_k if 0 < self.top_k < vocab else vocab

    @classmethod
    def from_rollout_config(cls, rollout) -> "EntropyOptions":
        """The options in ``actor_rollout_ref.rollout.custom.entropy`` (a DictConfig or verl's RolloutConfig)."""
        from egpo.options import rollout_custom

        options = rollout_custom(rollout).entropy
        return cls(top_k=options.top_k, temperature_scaled=options.temperature_scaled)


def _entropy_math(x: torch.Tensor, inv_temperature: torch.Tensor | None) -> torch.Tensor:
    """The fused form torch.compile turns into one kernel."""
    x = x.float()
    if inv_temperature is not None:
        x = x * inv_temperature.unsqueeze(-1)
    y = x - x.amax(dim=-1, keepdim=True)
    e = torch.exp(y)
    s = e.sum(dim=-1)
    a = (e * y.clamp_min(torch.finfo(torch.float32).min)).sum(dim=-1)
    return torch.log(s) - a / s


def _entropy_block(x: torch.Tensor, inv_temperature: torch.Tensor | None) -> torch.Tensor:
    """The same math eagerly, with two fp32 temporaries (y, e) and in-place steps."""
    if inv_temperature is not None:
        y = x.float() * inv_temperature.unsqueeze(-1)
    else:
        y = x.float() if x.dtype != torch.float32 else x.clone()
    y -= y.amax(dim=-1, keepdim=True)
    e = torch.exp(y)
    s = e.sum(dim=-1)
    a = e.mul_(y.clamp_min_(torch.finfo(torch.float32).min)).sum(dim=-1)
    return torch.log(s) - a / s


_kernel: dict = {"compiled": None, "fallback_reason": None}


def kernel_status() -> dict:
    """``{"compiled": bool, "fallback_reason": str | None}`` for this process."""
    return {"compiled": _kernel["compiled"] is not None and _kernel["fallback_reason"] is None,
            "fallback_reason": _kernel["fallback_reason"]}


def _fall_back(stage: str, err: Exception) -> None:
    reason = f"{stage}: {type(err).__name__}: {err}".splitlines()[0][:300]
    _kernel["fallback_reason"] = reason
    print(f"[egpo] the compiled entropy kernel is unavailable ({reason}); the eager kernel runs for the rest of this "
          f"process, in blocks of {FALLBACK_BLOCK_BYTES >> 20} MiB on an accelerator", file=sys.stderr, flush=True)


def _run_compiled(x, inv_temperature):
    if _kernel["fallback_reason"] is not None:
        return None
    if _kernel["compiled"] is None:
        try:
            _kernel["compiled"] = torch.compile(_entropy_math, dynamic=False)
        except Exception as err:  # noqa: BLE001 - any compiler failure means the eager path
            _fall_back("torch.compile", err)
            return None
    # maybe_mark_dynamic: a batch of one is specialized (its own graph, warmed by warm_compiled_kernel) instead of
    # rejected, which mark_dynamic does on some torch versions
    torch._dynamo.maybe_mark_dynamic(x, 0)
    if inv_temperature is not None:
        torch._dynamo.maybe_mark_dynamic(inv_temperature, 0)
    try:
        return _kernel["compiled"](x, inv_temperature)
    except Exception as err:  # noqa: BLE001 - a failure to compile shows up at the first call
        _fall_back("compiling the entropy kernel", err)
        return None


def warm_compiled_kernel(width: int, device, temperature_scaled: bool = False, dtype=torch.float32) -> dict:
    """Compiles the kernel for rows of ``width`` on ``device`` now (1 row and several: torch specializes a batch of
    one), so no request waits for it. ``temperature_scaled``: the scaled kernel too (an engine may still pass no
    temperature, vLLM for an all-greedy batch). Returns :func:`kernel_status`."""
    for scaled in (False, True) if temperature_scaled else (False,):
        for rows in (1, 2):
            logits = torch.zeros(rows, width, dtype=dtype, device=device)
            temperature = torch.ones(rows, device=device) if scaled else None
            token_entropy(logits, temperature=temperature, compiled=True)
    return kernel_status()


def token_entropy(
    logits: torch.Tensor,
    top_k: int = 0,
    temperature: float | torch.Tensor | None = None,
    compiled: bool = False,
    max_block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> torch.Tensor:
    """Entropy (nats, fp32) of each row of ``logits`` ``(B, V)``. See the module docstring for the options."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D (batch, vocab); got shape {tuple(logits.shape)}")
    rows, vocab = logits.shape
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = full vocabulary); got {top_k}")
    inv_temperature = None
    if temperature is not None:
        t = torch.as_tensor(temperature, dtype=torch.float32, device=logits.device)
        t = t.expand(rows) if t.dim() == 0 else t.reshape(-1)
        if t.shape[0] != rows:
            raise ValueError(f"temperature has {t.shape[0]} values for {rows} rows")
        # greedy rows (temperature 0) take the raw distribution's entropy; they still get a value
        inv_temperature = torch.where(t > 0, 1.0 / t.clamp_min(1e-30), torch.ones_like(t))
    if rows == 0:
        return torch.empty(0, dtype=torch.float32, device=logits.device)
    if 0 < top_k < vocab:
        logits = torch.topk(logits, top_k, dim=-1, sorted=False).values
        vocab = top_k
    if compiled:
        out = _run_compiled(logits, inv_temperature)
        if out is not None:
            return out
        if logits.device.type != "cpu":
            max_block_bytes = max(max_block_bytes, FALLBACK_BLOCK_BYTES)
    block = max(1, max_block_bytes // (4 * TEMPORARIES * vocab))
    if block >= rows:
        return _entropy_block(logits, inv_temperature)
    out = torch.empty(rows, dtype=torch.float32, device=logits.device)
    for start in range(0, rows, block):  # bounded number of blocks, not a loop over tokens
        stop = min(start + block, rows)
        out[start:stop] = _entropy_block(
            logits[start:stop], None if inv_temperature is None else inv_temperature[start:stop]
        )
    return out
