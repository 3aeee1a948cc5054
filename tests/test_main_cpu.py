"""The real verl trainer on CPU through ``python -m egpo.main`` (tiny model, HF rollout server, egpo trainer).

Each run starts Ray, builds FSDP2 over gloo and trains; about 40 s on 2 cores.
"""

import json

import pytest
import torch

from conftest import VERL
from egpo.demo.smoke_run import all_finite, egpo_metrics, run_smoke, step_metrics


pytestmark = pytest.mark.e2e

# 4 prompts x 8 samples: enough responses that rewards differ within a group in a step
COMMON = ("trainer.total_training_steps=2", "actor_rollout_ref.rollout.n=8")
EGPO_KEYS = ("egpo/bonus_mean", "egpo/cot_entropy_mean", "egpo/clipped_frac", "egpo/no_cot_frac", "egpo/entropy_source_is_rollout")


def assert_trained(proc, source: str, compared: bool):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    steps = step_metrics(proc.stdout)
    assert sorted(steps) == [1, 2], proc.stdout[-3000:]
    for metrics in steps.values():
        egpo = egpo_metrics(metrics)
        assert set(EGPO_KEYS) <= set(egpo) and all_finite(egpo), egpo
        assert egpo["egpo/entropy_source_is_rollout"] == (source == "rollout")
        if compared:
            # same weights, temperature 1.0: the HF server's entropy and probabilities vs the actor's recompute
            assert egpo["egpo/entropy_rollout_vs_actor/max_abs_diff"] < 1e-4, egpo
            assert metrics["training/rollout_probs_diff_max"] < 1e-5, metrics["training/rollout_probs_diff_max"]
        else:
            assert "egpo/entropy_rollout_vs_actor/max_abs_diff" not in egpo
    assert any(m["egpo/bonus_mean"] != 0 for m in steps.values()), "the EGPO bonus was zero in every step"
    assert any(m["actor/grad_norm"] > 0 for m in steps.values())  # weights moved, and were pushed to the server
    assert "[egpo] step 2:" in proc.stdout
    return steps


def final_weights(workdir, step: int = 2):
    import torch

    state = torch.load(workdir / "checkpoints" / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt",
                       weights_only=False)
    return {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in state.items()}


# dynamic batch sizes as every Qwen3 recipe has them: a budget of two 80-token sequences per micro-batch, so each
# 8-sample prompt group is split in four for the probe's attribution passes too
DYNAMIC = ("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=160",
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null")
# the last step's validation, 4 samples per problem: pass@1..4
VALIDATION = ("trainer.test_freq=2", "actor_rollout_ref.rollout.val_kwargs.n=4",
              "actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0")
# verl 0.9.1 trains on the actor's entropy here (its README run trains on the rollout's: tests/test_docs_figures.py);
# verl 0.7.1 on the rollout's, through its own agent loop. Either computes the other for the agreement.
SOURCE = "actor" if VERL == "0.9.1" else "rollout"
# one run of two steps per stack, a checkpoint at each: the runs below that change one thing compare with it
BASE = (f"algorithm.entropy_source={SOURCE}", "trainer.save_freq=1", *COMMON, *DYNAMIC, *VALIDATION)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, demo):
    workdir = tmp_path_factory.mktemp("base_run")
    return workdir, run_smoke(workdir, demo, *BASE)


def test_two_egpo_steps(base_run):
    workdir, proc = base_run
    steps = assert_trained(proc, SOURCE, compared=True)
    # the run directory: said at the start and at the end, holding what the console no longer does
    where = workdir / "checkpoints"
    assert f"[egpo] run directory: {where} (starts at step 0;" in proc.stdout
    assert proc.stdout.rstrip().endswith(f"[egpo] report: python -m egpo.report {where}"), proc.stdout[-2000:]
    assert f"[egpo] the run's configuration: {where / 'config.yaml'}" in proc.stdout
    assert "'actor_rollout_ref':" not in proc.stdout  # verl's config dump (900 lines) is in config.yaml instead
    logged = [json.loads(line) for line in (where / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in logged] == [1, 2]
    assert logged[-1]["data"]["egpo/cot_entropy_mean"] == pytest.approx(steps[2]["egpo/cot_entropy_mean"], rel=1e-6)
    assert "[egpo] step 2:" in (where / "log.txt").read_text()
    passes = [steps[2][f"val-egpo/pass@{k}"] for k in (1, 2, 4)]
    assert passes == sorted(passes) and 0 <= passes[0] and passes[-1] <= 1


PROBE = ("egpo.probe.enable=true", "egpo.probe.attribution=true")
# on verl 0.7.1 the resumed run also selects the 80/20 rule's tokens at quantile 1 around its FSDP actor (the
# selection's wiring is tested on both stacks: tests/test_trainer_policy.py)
SELECTION = (("algorithm.egpo_token_selection=top_entropy", "algorithm.egpo_top_entropy_quantile=1.0")
             if VERL == "0.7.1" else ())


def assert_probed(steps: dict):
    """Finite probe/ metrics every step, measuring the entropy verl logs for the same batch."""
    for metrics in steps.values():
        probe = {k: v for k, v in metrics.items() if k.startswith("probe/")}
        assert {"probe/delta_h_pred", "probe/delta_h_pred_fresh", "probe/delta_h_pred_momentum",
                "probe/delta_h_pred_weight_decay", "probe/delta_h_realised", "probe/entropy_before",
                "probe/attr_same_prompt", "probe/attr_cross_prompt", "probe/pred_cross_fit"} <= set(probe)
        assert all_finite(probe) and probe["probe/optimizer_steps"] == 1
        assert probe["probe/entropy_before"] == pytest.approx(metrics["actor/entropy"], abs=1e-4)


def test_a_resume_with_the_probe_on_trains_step_two_to_the_same_weights(tmp_path, demo, base_run):
    """verl's own resume (a checkpoint given by path, the run directory fresh) with the entropy probe on (attribution
    included, dynamic batch sizes), and on verl 0.7.1 the 80/20 rule at quantile 1: step 1 is not run again, step 2
    is, and it ends at the weights of the run that never stopped and had neither (the same seed, the same requests),
    bit for bit: a resume that changed the state, a probe that touched the update or a selection that dropped a token
    would each break it. The probe's and the selection's metrics are logged, and the last step's validation
    (4 samples per problem) logs the pass@1..4 of the run without them."""
    workdir, plain = base_run
    resumed = run_smoke(tmp_path, demo, *BASE, *PROBE, *SELECTION, "trainer.resume_mode=resume_path",
                        f"trainer.resume_from_path={workdir / 'checkpoints' / 'global_step_1'}")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-6000:]
    assert "[egpo] run directory:" in resumed.stdout and "(resumes from step 1;" in resumed.stdout, resumed.stdout[-3000:]
    steps = step_metrics(resumed.stdout)
    assert sorted(steps) == [2]  # step 1 was not run again
    assert all_finite(egpo_metrics(steps[2])) and egpo_metrics(steps[2])
    ours, theirs = final_weights(tmp_path), final_weights(workdir)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert_probed(steps)
    before = step_metrics(plain.stdout)[2]
    if SELECTION:
        assert steps[2]["egpo/token_selection/kept_frac"] == 1.0
        assert "egpo/token_selection/kept_frac" not in before
    passes = [steps[2][f"val-egpo/pass@{k}"] for k in (1, 2, 4)]
    assert passes == sorted(passes) and 0 <= passes[0] and passes[-1] <= 1
    assert passes == [before[f"val-egpo/pass@{k}"] for k in (1, 2, 4)]  # the same weights, the same samples


@pytest.mark.skipif(VERL == "0.7.1", reason="bypass mode and the response span are verl's rollout correction and "
                    "egpo's estimator and tokenizer check, the same on both stacks (unit-tested on both: "
                    "tests/test_trainer_config.py): this run of them runs on verl 0.9.1")
def test_bypass_mode_and_the_response_span_on_a_model_without_thinking_markers(uninterrupted_run):
    """The rollout's entropy in bypass mode (no recompute at all), with egpo_span=response on a model whose
    tokenizer has no <think> (refused for egpo_span=cot): the bonus reads every response token, the metrics say so,
    and no CoT figure is made up. The run is the cluster test's uninterrupted one (tests/ablation_runs.py: the
    ablation's egpo_rollout_bypass arm, three steps), which every interrupted run there must end as."""
    log = (uninterrupted_run / "log.txt").read_text()
    assert "egpo_span=response: per-response bonus, entropy read over every response token" in log
    steps = {s["step"]: s["data"] for s in map(json.loads, (uninterrupted_run / "metrics.jsonl").read_text().splitlines())}
    assert sorted(steps) == [1, 2, 3]
    for metrics in steps.values():
        assert "timing_s/old_log_prob" not in metrics  # no recompute at all
        egpo = egpo_metrics(metrics)
        assert egpo["egpo/entropy_source_is_rollout"] == 1.0
        assert egpo["egpo/span_is_response"] == 1.0 and egpo["egpo/granularity_is_token"] == 0.0
        assert {"egpo/cot_entropy_mean", "egpo/no_cot_frac", "egpo/cot_tokens_mean"}.isdisjoint(egpo)
        assert egpo["egpo/span_entropy_mean"] == egpo["egpo/response_entropy_mean"] > 0
        assert all_finite(egpo)
    assert any(m["egpo/bonus_active_frac"] > 0 for m in steps.values()), "the bonus never acted"
    assert any(m["actor/grad_norm"] > 0 for m in steps.values())


@pytest.mark.skipif(VERL != "0.7.1", reason="verl 0.7.1's engine workers (trainer.use_legacy_worker_impl=disable)")
def test_the_8020_rule_trains_on_verl_071s_engine_workers(tmp_path, demo):
    """The fix egpo names for the 80/20 rule on verl 0.7.1 (whose legacy actor divides each micro-batch by its own
    kept tokens): verl's engine workers, which divide by the mini-batch's. egpo's CPU engine worker runs them (the
    actor's forward is bf16 there whatever the FSDP config says, so the entropy comes from the rollout, in bypass
    mode); the update trains on a fifth of the tokens."""
    proc = run_smoke(tmp_path, demo, "algorithm.entropy_source=rollout", "algorithm.rollout_correction.bypass_mode=true",
                     "algorithm.egpo_token_selection=top_entropy", "trainer.use_legacy_worker_impl=disable",
                     "++actor_rollout_ref.actor.fsdp_config.strategy=fsdp2", *COMMON)
    steps = assert_trained(proc, "rollout", compared=False)
    for metrics in steps.values():
        assert metrics["egpo/token_selection/kept_frac"] == pytest.approx(0.2, abs=0.02)
        assert metrics["egpo/token_selection/kept_tokens"] > 0
        assert "actor/loss" in metrics  # the engine workers' update metric (the legacy actor logs actor/pg_loss alone)


@pytest.mark.skipif(VERL == "0.7.1", reason="the order of a save step (save, log, then validate) is egpo's trainer's, "
                    "on verl's fit of either stack (its shape checked on both: egpo.compat.verl_shapes): killed and "
                    "resumed on verl 0.9.1")
def test_a_run_killed_in_a_save_steps_validation_keeps_the_save_and_every_step(tmp_path, demo):
    """Killed as a node loss kills it (every process of the run at once) during step 2's validation, right after
    step 2's save: the same command again resumes from that save (nothing trained twice), validates at step 2 first,
    and the run logs steps 1 to 4 each once, step 2 with its training metrics and its validation."""
    import os
    import subprocess
    import time

    from egpo.demo.smoke_run import run_metrics, smoke_command
    from egpo.process_tree import kill_tree
    from egpo.runs.state import ATTEMPT_METRICS, VALIDATION_OWED, read_steps

    overrides = ("trainer.total_training_steps=4", "trainer.save_freq=2", *COMMON[1:], *VALIDATION)
    checkpoints = tmp_path / "checkpoints"
    proc = subprocess.Popen(smoke_command(tmp_path, demo, *overrides), cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        end = time.time() + 600
        while not any(line["step"] == 2 for line in read_steps(checkpoints / ATTEMPT_METRICS)):
            assert proc.poll() is None and time.time() < end, "the run ended before step 2 was logged"
            time.sleep(0.05)
        kill_tree(proc.pid)  # step 2 is saved and logged; its validation has just begun (Ray's workers too)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
    assert (checkpoints / "global_step_2" / VALIDATION_OWED).exists(), "the kill did not land in the validation"
    again = run_smoke(tmp_path, demo, *overrides)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-6000:]
    assert "(resumes from step 2;" in again.stdout and "step 2's validation was cut short" in again.stdout
    assert "its step never logged" not in again.stdout  # the save was kept
    steps = run_metrics(tmp_path)
    assert sorted(steps) == [1, 2, 3, 4]
    assert "timing_s/step" in steps[2] and "val-egpo/pass@1" in steps[2] and "val-egpo/pass@1" in steps[4]
    assert not (checkpoints / "global_step_2" / VALIDATION_OWED).exists()
    console = step_metrics(again.stdout)
    assert sorted(console) == [2, 3, 4] and "timing_s/step" not in console[2]  # step 2 only validated, not trained
