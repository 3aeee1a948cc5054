import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from egpo.compat.versions import verl_version  # noqa: E402

VERL = verl_version()
# what egpo runs on verl 0.7.1 only, so far: its sglang patches are sglang 0.5.6.post2's (verl 0.7.1's); on 0.9.1
# sglang is refused at start-up (egpo.compat.stack), and these tests say so in the skip summary
ON_071_ONLY = "egpo's sglang patches are sglang 0.5.6.post2's (verl 0.7.1's); not yet sglang 0.5.12 on verl {}".format(VERL)
only_verl_071 = pytest.mark.skipif(VERL != "0.7.1", reason=ON_071_ONLY)


def require_sglang():
    """Skips unless sglang is installed; imports it as egpo's processes do (CPU stand-ins first: sglang 0.5.12's
    top-level import needs torchvision)."""
    from egpo.rollout.sglang.versions import installed_sglang

    if installed_sglang() == "not installed":
        pytest.skip("sglang is not installed (README: the sglang CPU install line of this verl stack; .ci/run installs it)")
    from egpo.rollout.sglang.standins import prepare_sglang_import

    prepare_sglang_import()
    import sglang

    return sglang


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """The demo model, tokenizer and task, built once for every end-to-end run of the session."""
    from egpo.demo.build import build

    return build(tmp_path_factory.mktemp("egpo_demo"))
