import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """The demo model, tokenizer and task, built once for every end-to-end run of the session."""
    from egpo.demo.build import build

    return build(tmp_path_factory.mktemp("egpo_demo"))
