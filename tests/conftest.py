import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from egpo.compat.versions import verl_version  # noqa: E402

VERL = verl_version()
# what egpo runs on verl 0.7.1 only, so far: its tool-agent loop follows 0.7.1's token merging, and its sglang
# patches are sglang 0.5.6.post2's; on 0.9.1 those runs are refused at start-up (egpo.compat.stack), and these
# tests say so in the skip summary
ON_071_ONLY = ("egpo's tool-agent loop and sglang patches stand on verl 0.7.1's token "
               "merging and sglang 0.5.6.post2; not yet on verl {}".format(VERL))
only_verl_071 = pytest.mark.skipif(VERL != "0.7.1", reason=ON_071_ONLY)


def skip_module_unless_verl_071() -> None:
    if VERL != "0.7.1":
        pytest.skip(ON_071_ONLY, allow_module_level=True)


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """The demo model, tokenizer and task, built once for every end-to-end run of the session."""
    from egpo.demo.build import build

    return build(tmp_path_factory.mktemp("egpo_demo"))
