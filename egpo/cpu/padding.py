"""verl 0.7.1's remove-padding helpers on a machine without flash-attn (a CPU): verl's own pure-torch copies.

verl 0.7.1's engine workers (``trainer.use_legacy_worker_impl=disable``) unpad every batch, driver and worker, through
``verl.utils.attention_utils``, which imports ``flash_attn.bert_padding`` on every device but an NPU. verl ships the
same four functions in pure torch (``verl.utils.npu_flash_attn_utils``, a copy of flash-attn's ``bert_padding``);
on a CPU egpo points ``attention_utils`` at them. verl 0.9.1 falls back to pure torch itself
(``VerlStack.padding_needs_flash_attn``).

A guarded in-process patch: the target is checked first, so a verl whose helper has another shape is refused naming
the version and the target rather than failing in the first batch.
"""

from __future__ import annotations

import importlib.util

from egpo.compat.versions import verl_stack, verl_version
from egpo.errors import IncompatibleDependencyError
from egpo.patching import Patch, parameters

SOURCE = "verl.utils.npu_flash_attn_utils"
FUNCTIONS = ("index_first_axis", "pad_input", "rearrange", "unpad_input")  # the order attention_utils unpacks


class PaddingPatchTargetError(IncompatibleDependencyError):
    pass


def torch_padding_functions(original):
    """In place of flash-attn's helpers: verl's pure-torch copies (``original`` would import flash-attn)."""
    import importlib

    source = importlib.import_module(SOURCE)
    return tuple(getattr(source, name) for name in FUNCTIONS)


PADDING = Patch("verl.utils.attention_utils:_get_attention_functions", torch_padding_functions)
TARGET = PADDING.dotted


def use_torch_padding() -> bool:
    """Point verl's padding helpers at its pure-torch copies where flash-attn is missing; True when patched."""
    if not verl_stack().padding_needs_flash_attn or importlib.util.find_spec("flash_attn") is not None:
        return False
    from verl.utils import attention_utils, npu_flash_attn_utils

    original = getattr(attention_utils, "_get_attention_functions", None)
    missing = [name for name in FUNCTIONS if not callable(getattr(npu_flash_attn_utils, name, None))]
    if original is None or parameters(original) or missing:
        raise PaddingPatchTargetError(
            f"verl {verl_version()}: {TARGET} is not the zero-argument function egpo replaces on a CPU"
            + (f" ({SOURCE} lacks {', '.join(missing)})" if missing else "")
            + "; this verl cannot unpad batches without flash-attn")
    PADDING.apply()
    return True
