"""Shape checks for every sglang patch target: a mismatch stops start-up naming the version and the target."""

from __future__ import annotations

import inspect

SUPPORTED_SGLANG = "0.5.6.post2"


class SglangPatchTargetError(RuntimeError):
    """An sglang function or attribute egpo patches no longer has the shape egpo was written against."""


def sglang_version() -> str:
    try:
        import sglang

        return getattr(sglang, "__version__", "unknown")
    except ImportError:
        return "not installed"


def check_parameters(target, expected: tuple[str, ...], name: str) -> None:
    """``target``'s parameters (after ``self``) must be exactly ``expected``, in order."""
    try:
        params = tuple(inspect.signature(target).parameters)
    except (TypeError, ValueError) as err:
        raise SglangPatchTargetError(f"{name}: cannot read its signature ({err})") from None
    if params and params[0] == "self":
        params = params[1:]
    if params != expected:
        raise SglangPatchTargetError(
            f"sglang {sglang_version()}: {name} has parameters {params}, egpo's patch expects {expected} "
            f"(sglang {SUPPORTED_SGLANG}). Pin sglang=={SUPPORTED_SGLANG} or update egpo.rollout.sglang."
        )
