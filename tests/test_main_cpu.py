"""The real verl trainer on CPU through ``python -m egpo.main`` (tiny model, HF rollout server, egpo trainer).

Each run starts Ray, builds FSDP2 over gloo and trains; about 40 s on 2 cores.
"""

import json

import pytest

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


@pytest.mark.parametrize("source", [
    pytest.param("actor", marks=pytest.mark.skipif(
        VERL == "0.7.1", reason="the actor's entropy into egpo's estimator is the same on both stacks: on verl 0.9.1 "
                                "(verl 0.7.1's actor computes it in the rollout run beside, for the agreement)")),
    pytest.param("rollout", marks=pytest.mark.skipif(
        VERL == "0.9.1", reason="on verl 0.9.1 README's run trains with rollout entropy (tests/test_docs_figures.py)"))])
def test_two_egpo_steps(tmp_path, demo, source):
    proc = run_smoke(tmp_path, demo, f"algorithm.entropy_source={source}", *COMMON)
    steps = assert_trained(proc, source, compared=True)
    # the run directory: said at the start and at the end, holding what the console no longer does
    where = tmp_path / "checkpoints"
    assert f"[egpo] run directory: {where} (starts at step 0;" in proc.stdout
    assert proc.stdout.rstrip().endswith(f"[egpo] report: python -m egpo.report {where}"), proc.stdout[-2000:]
    assert f"[egpo] the run's configuration: {where / 'config.yaml'}" in proc.stdout
    assert "'actor_rollout_ref':" not in proc.stdout  # verl's config dump (900 lines) is in config.yaml instead
    logged = [json.loads(line) for line in (where / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in logged] == [1, 2]
    assert logged[-1]["data"]["egpo/cot_entropy_mean"] == pytest.approx(steps[2]["egpo/cot_entropy_mean"], rel=1e-6)
    assert "[egpo] step 2:" in (where / "log.txt").read_text()


@pytest.mark.skipif(VERL == "0.7.1", reason="bypass mode is verl's rollout correction and egpo's estimator, the same "
                    "on both stacks: on verl 0.9.1")
def test_rollout_entropy_in_bypass_mode(tmp_path, demo):
    proc = run_smoke(tmp_path, demo, "algorithm.entropy_source=rollout", "algorithm.rollout_correction.bypass_mode=true", *COMMON)
    steps = assert_trained(proc, "rollout", compared=False)
    assert all("timing_s/old_log_prob" not in m for m in steps.values())  # no recompute at all


@pytest.mark.skipif(VERL == "0.7.1", reason="the response span and the tokenizer check are egpo's, the same on both "
                    "stacks (unit-tested on both: tests/test_trainer_config.py): this run of them runs on verl 0.9.1")
def test_response_span_on_a_model_without_thinking_markers(tmp_path, demo):
    """egpo_span=response trains a model whose tokenizer has no <think> (refused for egpo_span=cot): the bonus
    reads every response token, the metrics say so, and no CoT figure is made up."""
    import shutil

    from egpo.demo.tokenizer import build_tokenizer

    model = tmp_path / "model_no_thinking"
    shutil.copytree(demo / "model", model)
    build_tokenizer(with_think_tokens=False).save_pretrained(model)
    proc = run_smoke(tmp_path, demo, f"actor_rollout_ref.model.path={model}", "algorithm.entropy_source=rollout",
                     "algorithm.egpo_span=response", "reward.custom_reward_function.name=compute_score_no_thinking",
                     *COMMON)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "egpo_span=response: per-response bonus, entropy read over every response token" in proc.stdout
    steps = step_metrics(proc.stdout)
    assert sorted(steps) == [1, 2]
    for metrics in steps.values():
        egpo = egpo_metrics(metrics)
        assert egpo["egpo/span_is_response"] == 1.0 and egpo["egpo/granularity_is_token"] == 0.0
        assert {"egpo/cot_entropy_mean", "egpo/no_cot_frac", "egpo/cot_tokens_mean"}.isdisjoint(egpo)
        assert egpo["egpo/span_entropy_mean"] == egpo["egpo/response_entropy_mean"] > 0
        assert all_finite(egpo)
    assert any(m["egpo/bonus_active_frac"] > 0 for m in steps.values()), "the bonus never acted"


def test_checkpoint_at_step_one_then_resume_for_step_two(tmp_path, demo):
    first = run_smoke(tmp_path, demo, "algorithm.entropy_source=rollout", "trainer.total_training_steps=1", "trainer.save_freq=1")
    assert first.returncode == 0, first.stderr[-6000:]
    assert (tmp_path / "checkpoints" / "global_step_1" / "actor").is_dir()
    second = run_smoke(tmp_path, demo, "algorithm.entropy_source=rollout", "trainer.total_training_steps=2", "trainer.save_freq=1")
    assert second.returncode == 0, second.stderr[-6000:]
    assert "Resuming from" in second.stdout and "global_step_1" in second.stdout
    steps = step_metrics(second.stdout)
    assert sorted(steps) == [2]  # step 1 was not run again
    assert all_finite(egpo_metrics(steps[2])) and egpo_metrics(steps[2])
    assert (tmp_path / "checkpoints" / "global_step_2" / "actor").is_dir()


def final_weights(workdir, step: int = 2):
    import torch

    state = torch.load(workdir / "checkpoints" / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt",
                       weights_only=False)
    return {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in state.items()}


# dynamic batch sizes as every Qwen3 recipe has them: a budget of two 80-token sequences per micro-batch, so each
# 8-sample prompt group is split in four for the probe's attribution passes too
DYNAMIC = ("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=160",
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null")


def test_entropy_probe_in_the_main_job(tmp_path, demo):
    """Probe on (attribution included, dynamic batch sizes): finite probe/ metrics every step, and the same weights
    after 2 steps as with the probe off."""
    import torch

    (tmp_path / "off").mkdir()
    (tmp_path / "on").mkdir()
    off = run_smoke(tmp_path / "off", demo, "trainer.save_freq=2", *COMMON, *DYNAMIC)
    assert off.returncode == 0, off.stderr[-6000:]
    proc = run_smoke(tmp_path / "on", demo, "trainer.save_freq=2", "egpo.probe.enable=true",
                     "egpo.probe.attribution=true", *COMMON, *DYNAMIC)
    assert proc.returncode == 0, proc.stderr[-6000:]
    baseline, probed = final_weights(tmp_path / "off"), final_weights(tmp_path / "on")
    assert all(torch.equal(baseline[k], probed[k]) for k in baseline)
    steps = step_metrics(proc.stdout)
    assert sorted(steps) == [1, 2]
    for metrics in steps.values():
        probe = {k: v for k, v in metrics.items() if k.startswith("probe/")}
        assert {"probe/delta_h_pred", "probe/delta_h_pred_fresh", "probe/delta_h_pred_momentum",
                "probe/delta_h_pred_weight_decay", "probe/delta_h_realised", "probe/entropy_before",
                "probe/attr_same_prompt", "probe/attr_cross_prompt", "probe/pred_cross_fit"} <= set(probe)
        assert all_finite(probe) and probe["probe/optimizer_steps"] == 1
        # the probe measures the entropy verl logs for the same batch
        assert probe["probe/entropy_before"] == pytest.approx(metrics["actor/entropy"], abs=1e-4)


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


@pytest.mark.skipif(VERL != "0.7.1", reason="the selection's wiring is tested on both stacks (tests/test_trainer_policy.py); "
                                            "the real update through fit runs on verl 0.7.1's stack")
def test_top_entropy_selection_at_quantile_one_trains_bit_identically_and_validation_logs_pass_at_k(tmp_path, demo):
    """The 80/20 rule at quantile 1 through fit: verl's update gets the full mask, so the weights after 2 steps are
    those of the run without selection, bit for bit; the selection's metrics are logged; the last step's validation
    (4 samples per problem) logs pass@1..4."""
    import torch

    validation = ("trainer.test_freq=2", "actor_rollout_ref.rollout.val_kwargs.n=4",
                  "actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0")
    runs = {}
    for name, selection in (("all", ()), ("top", ("algorithm.egpo_token_selection=top_entropy",
                                                   "algorithm.egpo_top_entropy_quantile=1.0"))):
        (tmp_path / name).mkdir()
        proc = run_smoke(tmp_path / name, demo, "algorithm.entropy_source=rollout", "trainer.save_freq=2", *COMMON,
                         *validation, *selection)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        runs[name] = step_metrics(proc.stdout)
    plain, chosen = final_weights(tmp_path / "all"), final_weights(tmp_path / "top")
    assert all(torch.equal(plain[k], chosen[k]) for k in plain)
    for step in (1, 2):
        assert runs["top"][step]["egpo/token_selection/kept_frac"] == 1.0
        assert "egpo/token_selection/kept_frac" not in runs["all"][step]
    passes = [runs["top"][2][f"val-egpo/pass@{k}"] for k in (1, 2, 4)]
    assert passes == sorted(passes) and 0 <= passes[0] and passes[-1] <= 1
    assert passes == [runs["all"][2][f"val-egpo/pass@{k}"] for k in (1, 2, 4)]  # the same weights, the same samples
