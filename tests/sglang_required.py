"""sglang for the tests that need it: a skip with its reason where sglang is not installed (README's environment has
no sglang; .ci/run adds it in a layer of its own), else sglang imported as egpo's processes import it. Importable
without conftest (the observer's ``--noconftest`` lanes)."""

import pytest

NOT_INSTALLED = ("sglang is not installed here (README's environment has none): these tests run where sglang is, "
                 "docs/cpu.md, 'sglang on a CPU', gives this stack's install line; .ci/run installs it in a layer")


def require_sglang():
    """Skips (the test, or the whole module when called at import) unless sglang is installed; imports it as egpo's
    processes do (CPU stand-ins first: sglang 0.5.12's top-level import needs torchvision)."""
    from egpo.rollout.sglang.standins import prepare_sglang_import
    from egpo.rollout.sglang.versions import installed_sglang

    if installed_sglang() == "not installed":
        pytest.skip(NOT_INSTALLED, allow_module_level=True)
    prepare_sglang_import()
    import sglang

    return sglang


def import_sglang_sampler():
    """The real ``sglang.srt.layers.sampler`` module with the CPU stand-ins installed unconditionally (the patch
    tests run its real code on CPU tensors), or the skip of :func:`require_sglang`."""
    from egpo.rollout.sglang.standins import install_standins
    from egpo.rollout.sglang.versions import installed_sglang

    if installed_sglang() == "not installed":
        pytest.skip(NOT_INSTALLED, allow_module_level=True)
    install_standins()
    import sglang.srt.layers.sampler as sampler

    return sampler
