"""egpo's one way to put its code around a method or function of verl, sglang or vLLM.

A :class:`Patch` names its target (``"package.module:Class.method"`` or ``"package.module:function"``) and an
``around(original, *args, **kwargs)`` function that receives the target's original and decides when to call it.

* :meth:`Patch.apply` puts a wrapper in place of the target (idempotent: a second call is a no-op). The wrapper
  carries the original as ``__wrapped__`` (``functools.wraps``), so ``inspect.signature`` of a patched target still
  reads the original's parameters and a shape check passes the same before and after.
* :meth:`Patch.original` is the unpatched function, patched or not; :meth:`Patch.applied` says which.
* :meth:`Patch.remove` puts the original back (tests; production never removes a patch).

The shape check itself belongs to each dependency's version table (``egpo.rollout.sglang.versions``,
``egpo.rollout.vllm.versions``, ``egpo.compat``): it runs before any patch of a group is applied, with
:func:`parameters` reading a target's parameters the same way everywhere, and a mismatch stops start-up naming the
installed version and the target. Functions handed to another process by reference (sglang's process entries,
pickled by name) cannot be wrappers built here: those are swapped whole (:mod:`egpo.rollout.sglang.process_entries`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Callable

from egpo.errors import IncompatibleDependencyError

MARK = "__egpo_patch__"  # on each wrapper: the Patch that put it in place


def parameters(function) -> tuple[str, ...]:
    """A target's parameter names, without a leading ``self`` (a patched target reads as its original)."""
    params = tuple(inspect.signature(function).parameters)
    return params[1:] if params and params[0] == "self" else params


def resolve(path: str, error: type[Exception] = IncompatibleDependencyError, prefix: str = "", advice: str = ""):
    """The object at ``"package.module:Qual.name"``; a module that cannot be imported or a missing attribute raises
    ``error``: ``prefix`` (the dependency and its version), what is missing, then ``advice``."""
    module_name, _, qualname = path.partition(":")
    try:
        found = importlib.import_module(module_name)
    except ImportError as err:
        raise error(f"{prefix}{module_name} cannot be imported ({err}){advice}") from None
    for part in filter(None, qualname.split(".")):
        found = getattr(found, part, None)
        if found is None:
            raise error(f"{prefix}{module_name}.{qualname} does not exist{advice}")
    return found


class Patch:
    """One target and the function egpo puts around it."""

    def __init__(self, target: str, around: Callable):
        module, sep, qualname = target.partition(":")
        if not sep or not qualname:
            raise ValueError(f"a patch target is 'package.module:Qual.name', not {target!r}")
        self.target = target
        self.around = around
        owner, _, self.name = qualname.rpartition(".")
        self._owner_path = f"{module}:{owner}"

    def __repr__(self) -> str:
        return f"Patch({self.target!r})"

    @property
    def dotted(self) -> str:
        """The target as Python spells it (``package.module.Class.method``), for messages."""
        return self.target.replace(":", ".")

    def owner(self):
        return resolve(self._owner_path)

    def current(self):
        """What the target's name holds now (egpo's wrapper where applied)."""
        return getattr(self.owner(), self.name)

    def _wrapper(self):
        """This patch's wrapper, at the top of the target or under later egpo patches of the same target; or None
        (also where the target's module or class is not there: nothing was applied to it)."""
        try:
            function = self.current()
        except (IncompatibleDependencyError, AttributeError):
            return None
        while getattr(function, MARK, None) is not None:
            if getattr(function, MARK) is self:
                return function
            function = function.__wrapped__
        return None

    def applied(self) -> bool:
        return self._wrapper() is not None

    def original(self):
        """What this patch wraps (applied), or would wrap (not applied: a missing target raises, naming it)."""
        wrapper = self._wrapper()
        return self.current() if wrapper is None else wrapper.__wrapped__

    def apply(self) -> None:
        if self.applied():
            return
        owner = self.owner()
        original = getattr(owner, self.name)
        if isinstance(inspect.getattr_static(owner, self.name), (staticmethod, classmethod)):
            raise TypeError(f"{self}: a static or class method; egpo patches plain functions and methods only")
        around = self.around

        @functools.wraps(original)
        def patched(*args, **kwargs):
            return around(original, *args, **kwargs)

        setattr(patched, MARK, self)
        patched.__egpo_defined_here__ = self.name in vars(owner)  # an inherited method is shadowed, not replaced
        setattr(owner, self.name, patched)

    def remove(self) -> None:
        wrapper = self._wrapper()
        if wrapper is None:
            return
        owner = self.owner()
        current = getattr(owner, self.name)
        if current is not wrapper:
            raise RuntimeError(f"{self}: later patches of the same target are applied over it; remove them first")
        if current.__egpo_defined_here__:
            setattr(owner, self.name, current.__wrapped__)
        else:
            delattr(owner, self.name)


def apply_all(patches) -> None:
    for patch in patches:
        patch.apply()


def remove_all(patches) -> None:
    for patch in reversed(tuple(patches)):
        patch.remove()
