"""Shape checks for every sglang patch target: a mismatch stops start-up naming the version and the target."""

from __future__ import annotations

import inspect

from egpo.errors import IncompatibleDependencyError


class SglangPatchTargetError(IncompatibleDependencyError):
    """An sglang function or attribute egpo patches no longer has the shape egpo was written against."""


def sglang_version() -> str:
    from egpo.rollout.sglang.versions import installed_sglang

    return installed_sglang()


def check_parameters(target, expected: tuple[str, ...], name: str) -> None:
    """``target``'s parameters (after ``self``) must be exactly ``expected``, in order."""
    try:
        params = tuple(inspect.signature(target).parameters)
    except (TypeError, ValueError) as err:
        raise SglangPatchTargetError(f"{name}: cannot read its signature ({err})") from None
    if params and params[0] == "self":
        params = params[1:]
    if params != expected:
        from egpo.rollout.sglang.versions import SUPPORTED

        raise SglangPatchTargetError(
            f"sglang {sglang_version()}: {name} has parameters {params}, egpo's patch expects {expected}. egpo "
            f"patches sglang {', '.join(SUPPORTED)} (egpo.rollout.sglang.versions); install one of them or update "
            "that table."
        )


def import_target(module: str):
    """An sglang module egpo patches; a moved or missing one stops start-up with this guard's message, naming the
    installed and the supported versions (not an ImportError from deep inside egpo)."""
    import importlib

    from egpo.rollout.sglang.versions import SUPPORTED

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise SglangPatchTargetError(
            f"sglang {sglang_version()}: {module} cannot be imported ({err}); egpo patches sglang "
            f"{', '.join(SUPPORTED)} (egpo.rollout.sglang.versions)"
        ) from None
