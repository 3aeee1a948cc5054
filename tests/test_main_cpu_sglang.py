"""The CPU main job with sglang's real engine as the rollout: verl's sglang replica/server launched through Ray,
egpo's patches in sglang's processes, the trainer's weights pushed into sglang every step by verl's own adapter.

Each run starts Ray and an sglang engine; about two minutes on 2 cores (measured 2026-11-26). A resumed run pushes
its weights to sglang by the same call before its first rollout (verl 0.9.1's ``fit`` loads the checkpoint, then pushes
the weights, resumed or not: ray_trainer.py:1429-1430), so the first push this run shows stands for it; verl's resume
itself is tested on the HF server (tests/test_main_cpu.py) and on a cluster (tests/test_ablation_cluster.py).
"""

import pytest
import torch

from egpo.demo.smoke_run import run_smoke
from test_main_cpu import COMMON, assert_trained

from sglang_required import require_sglang  # noqa: E402
from cpu_engine_lock import one_engine_at_a_time  # noqa: E402

require_sglang()

pytestmark = [pytest.mark.e2e]

SGLANG = ("actor_rollout_ref.rollout.name=sglang",)
ROLLOUT_VS_ACTOR_PROBS = "training/rollout_probs_diff_max"


def max_prob_change(model_dir, state_dict, prompts) -> float:
    """max |p_before - p_after| over the vocabulary at every prompt position: how far one update moved the policy."""
    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float64, attn_implementation="eager").eval()
    after = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float64, attn_implementation="eager").eval()
    after.load_state_dict({k: v.double() for k, v in state_dict.items()}, strict=False)
    worst = 0.0
    with torch.no_grad():
        for ids in prompts:
            ids = torch.tensor([ids])
            p0, p1 = before(input_ids=ids).logits.softmax(-1), after(input_ids=ids).logits.softmax(-1)
            worst = max(worst, (p0 - p1).abs().max().item())
    return worst


def demo_prompts(demo, n=4):
    import pandas as pd
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(demo / "model")
    rows = pd.read_parquet(demo / "data" / "val.parquet").head(n)
    return [tok.apply_chat_template(list(r), add_generation_prompt=True, return_dict=False) for r in rows["prompt"]]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, demo):
    workdir = tmp_path_factory.mktemp("sglang_run")
    with one_engine_at_a_time():
        return workdir, run_smoke(workdir, demo, *SGLANG, "algorithm.entropy_source=rollout", "trainer.save_freq=1",
                                  *COMMON)


def test_rollout_entropy_agrees_with_the_actor_and_the_weights_are_pushed(demo, first_run):
    """entropy_source=rollout with sglang: agreement with the actor every step, the weights really pushed."""
    workdir, first = first_run
    steps = assert_trained(first, "rollout", compared=True)

    # sglang starts from dummy weights (load_format=dummy): step 1 agreeing with the actor shows the first push.
    # Step 2 samples after one update; had sglang kept the step-1 weights, its probabilities would be off by as
    # much as that update moved them, orders of magnitude above what is measured.
    from test_main_cpu import final_weights

    moved = max_prob_change(demo / "model", final_weights(workdir, step=1), demo_prompts(demo))
    measured = steps[2][ROLLOUT_VS_ACTOR_PROBS]
    assert moved > 1e-3 and measured < moved / 1000, (moved, measured)
