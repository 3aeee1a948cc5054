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

Temporaries are bounded: rows are processed in blocks of at most ``max_block_bytes`` of fp32 working memory,
never a full batch x vocab copy. ``compiled=True`` uses a ``torch.compile``d fused kernel (batch dimension
dynamic, so a sweep of batch sizes compiles once per dtype) and falls back to the eager blocks if compiling
is not possible here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

__all__ = ["EntropyOptions", "token_entropy"]

DEFAULT_BLOCK_BYTES = 16 * 2**20


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
        cfg = dict(entropy_config or {})
        unknown = set(cfg) - {"top_k", "temperature_scaled"}
        if unknown:
            raise ValueError(
                f"unknown rollout entropy option(s) {sorted(unknown)}; the options are top_k (0 = full vocabulary) "
                "and temperature_scaled (false = raw logits)"
            )
        return cls(top_k=int(cfg.get("top_k", 0)), temperature_scaled=bool(cfg.get("temperature_scaled", False)))

    @classmethod
    def from_rollout_config(cls, rollout) -> "EntropyOptions":
        """The options in ``actor_rollout_ref.rollout.custom.entropy`` (a DictConfig or verl's RolloutConfig)."""
        custom = rollout.get("custom", None) or {}
        return cls.from_config(custom.get("entropy", None))


def _entropy_block(x: torch.Tensor, inv_temperature: torch.Tensor | None) -> torch.Tensor:
    x = x.float()
    if inv_temperature is not None:
        x = x * inv_temperature.unsqueeze(-1)
    y = x - x.amax(dim=-1, keepdim=True)
    e = torch.exp(y)
    s = e.sum(dim=-1)
    a = (e * y.clamp_min(torch.finfo(torch.float32).min)).sum(dim=-1)
    return torch.log(s) - a / s


_compiled_block = None
_compile_failed = False


def _get_compiled():
    global _compiled_block, _compile_failed
    if _compiled_block is None and not _compile_failed:
        try:
            _compiled_block = torch.compile(_entropy_block, dynamic=False)
        except Exception as err:  # pragma: no cover - depends on the platform's compiler
            logger.warning("torch.compile unavailable for the entropy kernel (%s); using eager row blocks", err)
            _compile_failed = True
    return _compiled_block


def _run_compiled(x, inv_temperature):
    global _compile_failed
    fn = _get_compiled()
    if fn is None:
        return None
    torch._dynamo.mark_dynamic(x, 0)
    if inv_temperature is not None:
        torch._dynamo.mark_dynamic(inv_temperature, 0)
    try:
        return fn(x, inv_temperature)
    except Exception as err:  # pragma: no cover - depends on the platform's compiler
        logger.warning("compiled entropy kernel failed (%s); falling back to eager row blocks", err)
        _compile_failed = True
        return None


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
    block = max(1, max_block_bytes // (4 * 3 * vocab))  # ~3 fp32 temporaries per element
    if block >= rows:
        return _entropy_block(logits, inv_temperature)
    out = torch.empty(rows, dtype=torch.float32, device=logits.device)
    for start in range(0, rows, block):  # bounded number of blocks, not a loop over tokens
        stop = min(start + block, rows)
        out[start:stop] = _entropy_block(
            logits[start:stop], None if inv_temperature is None else inv_temperature[start:stop]
        )
    return out
