"""qwen3_1.7b's rehearsal whole with the recipe's own rollout engine: sglang's CPU engine, as verl 0.9.1 launches it
(one replica on each of the rehearsal's two ranks), through every event of the schedule, the kill during the
validation after a save and its resume, and the finished run's rerun (tests/test_rehearse.py's rehearse_whole).
In the sglang lane only (README's environment has no engine); on verl 0.9.1 (the rehearsal is egpo's, the same on
both stacks, and verl 0.7.1's sglang runs in tests/test_main_cpu_sglang.py)."""

import pytest
from omegaconf import OmegaConf

from conftest import VERL
from sglang_required import require_sglang  # noqa: E402
from cpu_engine_lock import one_engine_at_a_time  # noqa: E402

from egpo.runs.state import CONFIG

require_sglang()

pytestmark = [pytest.mark.e2e]


@pytest.mark.skipif(VERL == "0.7.1", reason="the rehearsal is egpo's, the same on both stacks: run whole on verl 0.9.1")
def test_the_smallest_qwen3_recipe_rehearses_whole_on_its_own_engine(tmp_path):
    from test_rehearse import rehearse_whole

    with one_engine_at_a_time():
        proc = rehearse_whole(tmp_path)
    assert "[rehearse] actor_rollout_ref.rollout.name:" not in proc.stdout  # the recipe's engine, unchanged
    assert "[rehearse] actor_rollout_ref.rollout.engine_kwargs.sglang." in proc.stdout  # its CPU settings, said
    ran = OmegaConf.load(tmp_path / "checkpoints" / "egpo" / "qwen3_1.7b_egpo_rehearsal" / CONFIG)
    assert ran.actor_rollout_ref.rollout.name == "sglang"
