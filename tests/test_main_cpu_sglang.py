"""The CPU main job with sglang's real engine as the rollout: verl's sglang replica/server launched through Ray,
egpo's patches in sglang's processes, the trainer's weights pushed into sglang every step by verl's own adapter.

Each run starts Ray and an sglang engine; about two minutes on 2 cores (measured 2026-11-26).
"""

import pytest
import torch

from egpo.demo.smoke_run import all_finite, egpo_metrics, run_smoke, step_metrics
from test_main_cpu import COMMON, assert_trained

from conftest import VERL, require_sglang  # noqa: E402

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
    return workdir, run_smoke(workdir, demo, *SGLANG, "algorithm.entropy_source=rollout", "trainer.save_freq=1", *COMMON)


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


@pytest.mark.skipif(VERL == "0.7.1", reason="verl's resume is egpo's the same beside either sglang (verl 0.7.1's own: "
                    "tests/test_main_cpu.py): the resume beside sglang runs on verl 0.9.1")
def test_a_resume_pushes_its_weights_before_sampling_and_trains_on_the_actors_entropy(demo, first_run):
    """The run resumed from its step-2 checkpoint for a third step, on the actor's entropy beside the same server
    (the rollout's still reaches the driver, for the agreement)."""
    workdir, first = first_run
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-6000:]
    resumed = run_smoke(workdir, demo, *SGLANG, "algorithm.entropy_source=actor", "trainer.save_freq=1",
                        "actor_rollout_ref.rollout.n=8", "trainer.total_training_steps=3")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-6000:]
    assert "Resuming from" in resumed.stdout and "global_step_2" in resumed.stdout
    later = step_metrics(resumed.stdout)
    assert sorted(later) == [3]
    assert later[3]["egpo/entropy_source_is_rollout"] == 0.0 and all_finite(egpo_metrics(later[3]))
    # the resumed actor's weights reach sglang before it samples again
    assert later[3]["egpo/entropy_rollout_vs_actor/max_abs_diff"] < 1e-4
    assert later[3][ROLLOUT_VS_ACTOR_PROBS] < 1e-5
