"""The ablation runner (real trainer runs) and the report (tables and plots from verl's file-logger metrics)."""

import json
import subprocess
import sys

import pytest

from conftest import VERL
from egpo.report import load_runs, write_report
from test_recipes import RECIPES


def write_run(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in rows))


def test_report_tables_from_hand_made_runs(tmp_path):
    """Three seeds of two arms, GPU-style files (no run.json): names carry arm and seed."""
    for seed, (g, e) in enumerate([(1.0, 1.5), (2.0, 2.0), (3.0, 4.5)]):
        write_run(tmp_path / f"grpo__seed{seed}.jsonl", [(1, {"egpo/cot_entropy_mean": g, "critic/score/mean": 0.1}),
                                                         (2, {"egpo/cot_entropy_mean": g + 1, "critic/score/mean": 0.2})])
        write_run(tmp_path / "sub" / f"egpo_actor__seed{seed}" / "metrics.jsonl",
                  [(1, {"egpo/cot_entropy_mean": e}), (2, {"egpo/cot_entropy_mean": e + 1})])
    runs = load_runs(tmp_path)
    assert set(runs) == {"grpo", "egpo_actor"} and set(runs["grpo"]) == {0, 1, 2}
    report = write_report(tmp_path, steps=[2], window=1).read_text()
    # grpo at step 2: 2, 3, 4 -> mean 3, std 1; egpo_actor: 2.5, 3, 5.5 -> mean 3.667
    assert "| grpo | 2 | 3 | 3 | 1 | 2 | 4 |" in report
    assert "| egpo_actor | 2 | 3 | 3.667 |" in report
    # paired: +0.5, 0, +1.5 -> mean 0.6667, positive in 2 of 3 seeds; the signed-rank test on the two non-zero
    # differences (ranks 1, 2, both +): every sign flip is at most as extreme only for ++ and --: p = 2/4 = 0.5
    assert "| egpo_actor | 2 | 3 | 0.6667 | 0.7638 | 2/3 | [0, 1.5] | 0.5 | no | 0.5 | no |" in report
    # the one comparison is the whole family: Holm leaves it as it is
    assert "1 paired comparisons with `grpo`" in report and "After Holm's correction over all 1: none." in report
    assert (tmp_path / "egpo_cot_entropy_mean.png").stat().st_size > 1000
    assert (tmp_path / "egpo_cot_entropy_mean_diff.png").stat().st_size > 1000
    import csv

    rows = list(csv.DictReader((tmp_path / "report.csv").open()))
    assert list(rows[0])[:9] == ["metric", "step", "arm", "baseline", "n_seeds", "mean_diff", "ci_low", "ci_high",
                                 "p_value"]
    [row] = [r for r in rows if r["metric"] == "egpo/cot_entropy_mean" and r["step"] == "2"]
    assert row["arm"] == "egpo_actor" and row["baseline"] == "grpo" and row["n_seeds"] == "3"
    assert float(row["mean_diff"]) == pytest.approx(2 / 3) and float(row["p_value"]) == pytest.approx(0.5)
    assert float(row["ci_low"]) <= float(row["mean_diff"]) <= float(row["ci_high"])
    assert float(row["p_holm"]) == pytest.approx(0.5) and row["significant_holm"] == "0"
    # critic/score/mean exists in grpo only: nothing to pair, no row
    assert not [r for r in rows if r["metric"] == "critic/score/mean"]
    # a 2-step window averages steps 1 and 2
    assert "| grpo | 2 | 3 | 2.5 |" in write_report(tmp_path, steps=[2], window=2).read_text()


def test_a_window_without_a_validation_shows_none_and_one_with_shows_its_latest(tmp_path):
    """Validation at steps 10, 20 and 30 (test_freq=10), reported in 5-step windows: the window ending at step 15
    (steps 11-15) holds none, and shows none, never step 10's; the window ending at 12 (8-12) shows step 10's; a
    window holding two shows the later."""
    from egpo.report import at_step

    rows = [(s, {"critic/score/mean": s / 100, **({"val-egpo/pass@1": s / 1000} if s % 10 == 0 else {})})
            for s in range(1, 31)]
    write_run(tmp_path / "cpu_warm" / "metrics.jsonl", rows)
    series = load_runs(tmp_path)["cpu_warm"][0]
    assert at_step(series, "val-egpo/pass@1", 15, 5) is None
    assert at_step(series, "val-egpo/pass@1", 12, 5) == 0.01
    assert at_step(series, "val-egpo/pass@1", 20, 15) == 0.02
    assert at_step(series, "critic/score/mean", 15, 5) == pytest.approx(sum(range(11, 16)) / 500)
    report = write_report(tmp_path, steps=[10, 15, 30], window=5).read_text()
    assert "| cpu_warm | 15 | 0 | - | - | - | - |" in report and "| cpu_warm | 10 | 1 | 0.01 |" in report
    assert "(a validation's: the latest in those steps, - where none ran)" in report


@pytest.mark.e2e
@pytest.mark.skipif(VERL != "0.7.1", reason="the ablation is egpo's, the same on both stacks: on verl 0.9.1, "
                                            "tests/test_ablation_cluster.py runs one arm x 2 seeds on a cluster and "
                                            "the report")
def test_ablation_runner_on_one_machine_then_report(tmp_path, demo):
    """As a new user types it: from a working directory, a relative --out and relative data paths. One arm (the
    report's tables across arms: the hand-made runs above), EGPO on the sampled tokens' surprisal: verl 0.7.1's
    rollout log probs reach the estimator, and the surprisal's agreement with the actor's entropy is logged."""
    import shutil

    shutil.copytree(demo / "data", tmp_path / "data")
    out = tmp_path / "ablation"
    cmd = [sys.executable, "-m", "egpo.ablation", f"--config-path={RECIPES}", "--config-name=cpu_smoke",
           "--arms", "egpo_surprisal", "--seeds", "0", "--steps", "2", "--out", "ablation",
           "actor_rollout_ref.rollout.n=8", "data.train_files=data/train.parquet", "data.val_files=data/val.parquet"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[ablation] preflight passed for 1 arm(s)" in proc.stdout
    run = out / "egpo_surprisal__seed0"
    # the run read the relative data where the command ran, and kept Hydra's output in its own directory
    assert f"{tmp_path / 'data' / 'train.parquet'}: 64 rows" in (run / "log.txt").read_text()
    assert (run / "hydra" / ".hydra" / "overrides.yaml").exists()
    assert not (tmp_path / "outputs").exists() and not (run / "ablation").exists()
    assert "[ablation] 1/1 egpo_surprisal__seed0: done" in proc.stdout
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert (run / "done.json").exists()
    step2 = json.loads(lines[1])["data"]
    assert step2["egpo/entropy_source_is_surprisal"] == 1 and step2["egpo/entropy_source_is_rollout"] == 0
    agreement = {k.rsplit("/", 1)[1]: v for k, v in step2.items() if k.startswith("egpo/surprisal_vs_actor_entropy/")}
    assert agreement["tokens"] > 0 and -1 <= agreement["pearson"] <= 1
    assert agreement["mean_abs_diff"] >= abs(agreement["mean_diff"]) and agreement["max_abs_diff"] > 0

    # a finished run is skipped
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.count("done before, skipped") == 1

    report = subprocess.run([sys.executable, "-m", "egpo.report", str(out), "--window", "1"], capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    text = (out / "report.md").read_text()
    assert f"| egpo_surprisal | 2 | 1 | {step2['egpo/cot_entropy_mean']:.4g} |" in text  # the run's own number
    for png in ("egpo_cot_entropy_mean.png", "critic_score_mean.png", "actor_entropy.png"):
        assert (out / png).stat().st_size > 1000


def test_every_arm_composes_to_the_variant_its_name_says():
    from hydra import compose, initialize_config_module

    from omegaconf import OmegaConf

    from egpo.ablation import ARM_SETS, ARMS, expand_arms
    from egpo.settings import EgpoSettings

    assert expand_arms(["estimators", "grpo", "egpo_actor"]) == [*ARM_SETS["estimators"], "egpo_actor"]
    # an arm's vLLM twin is the arm and the engine's override (composed once, for one arm: each compose is ~1 s)
    vllm = [arm for arm in ARMS if arm.endswith("_vllm")]
    assert vllm and all(ARMS[arm] == (*ARMS[arm.removesuffix("_vllm")], "actor_rollout_ref.rollout.name=vllm")
                        for arm in vllm)
    with initialize_config_module(config_module="egpo.config", version_base=None):
        composed = {arm: compose(config_name="egpo_trainer", overrides=list(overrides))
                    for arm, overrides in ARMS.items() if arm not in vllm[1:]}
    for arm, cfg in composed.items():
        settings = EgpoSettings.from_algorithm(cfg.algorithm)
        assert settings.enabled
        shaping = {"grpo_gtpo": "gtpo", "grpo_gtpo_joint": "gtpo", "grpo_s": "grpo_s",
                   "grpo_s_verlloss": "grpo_s"}.get(arm.removesuffix("_vllm"), "egpo")
        assert settings.algo.egpo_method == shaping, arm
        if shaping == "egpo":  # GTPO's and GRPO-S's arms read no EGPO bonus
            assert (settings.algo.egpo_lambda == 0) == arm.startswith("grpo"), arm
        assert settings.algo.egpo_granularity == ("token" if "_token" in arm else "response"), arm
        assert settings.algo.egpo_span == ("response" if "respspan" in arm else "cot"), arm
        assert settings.algo.entropy_source == next((s for s in ("rollout", "surprisal") if s in arm), "actor"), arm
        assert settings.bypass_mode == arm.removesuffix("_vllm").endswith("bypass")
        name = OmegaConf.select(cfg, "actor_rollout_ref.rollout.name", throw_on_missing=False)
        assert (name == "vllm") == arm.endswith("_vllm"), arm
        actor = cfg.actor_rollout_ref.actor
        method = next((m for m in ("cliphigher", "klcov", "clipcov", "entbonus", "8020", "stare") if m in arm), None)
        assert settings.selects_tokens == (method == "8020"), arm
        assert settings.algo.egpo_token_reweighting == ("stare" if method == "stare" else "none"), arm
        assert settings.algo.egpo_top_entropy_quantile == 0.2
        base = arm.removesuffix("_vllm")
        assert actor.policy_loss.loss_mode == {"klcov": "kl_cov", "clipcov": "clip_cov"}.get(
            method, "grpo_s" if base == "grpo_s" else "vanilla"), arm  # grpo_s_verlloss: GRPO-S's advantage alone
        assert actor.loss_agg_mode == ("seq-mean-token-mean" if base in ("grpo_s", "grpo_seqmean") else "token-mean"), arm
        assert settings.algo.gtpo_norm == ("joint" if base == "grpo_gtpo_joint" else "per_sign"), arm
        assert actor.clip_ratio_high == {"cliphigher": 0.28, "clipcov": 1}.get(method, 0.2), arm
        assert actor.entropy_coeff == (0.001 if method == "entbonus" else 0), arm
    assert all(arm in ARMS for arms in ARM_SETS.values() for arm in arms)
    assert {arm.removesuffix("_vllm") for arm in ARM_SETS["vllm_sources"]} == set(ARM_SETS["sources"])


def test_the_summary_names_what_survives_holms_correction(tmp_path):
    """12 seeds: the CoT entropy is higher in every seed (exact p = 2/2^12), the reward differs by alternating signs;
    Holm over the 2 comparisons doubles the smallest p-value, which stays significant."""
    for seed in range(12):
        write_run(tmp_path / f"grpo__seed{seed}.jsonl", [(1, {"egpo/cot_entropy_mean": 0.5, "critic/score/mean": 0.5})])
        write_run(tmp_path / f"egpo_rollout__seed{seed}.jsonl",
                  [(1, {"egpo/cot_entropy_mean": 0.6 + 0.01 * seed, "critic/score/mean": 0.5 + (-1) ** seed * 0.1})])
    report = write_report(tmp_path, steps=[1], window=1).read_text()
    assert "2 paired comparisons with `grpo`" in report
    assert ("After Holm's correction over all 2: 1 (`egpo/cot_entropy_mean` egpo_rollout step 1 (0.155, "
            "p=0.000488, Holm p=0.000977))") in report


def test_pass_at_k_is_read_at_the_last_validation_and_compared(tmp_path):
    """Validations at steps 5 and 10 of 10: the table at step 7 reads step 5's pass@k (never a window mean of the
    steps without one), pass@1 and pass@4 are compared with the baseline, every k is tabulated and plotted. The
    80/20 arm's actor/entropy carries no caveat: verl takes it from the old-policy recompute over every response
    token on both stacks (the kept-token mask is swapped in for the update only, which computes no entropy)."""
    for seed in range(4):
        for arm, lift in (("grpo", 0.0), ("grpo_8020", 0.1 + 0.01 * seed)):
            rows = []
            for step in range(1, 11):
                data = {"actor/entropy": 0.4, "critic/score/mean": 0.3}
                if arm == "grpo_8020":
                    data["egpo/token_selection/kept_frac"] = 0.2
                if step in (5, 10):
                    base = 0.2 if step == 5 else 0.3
                    data.update({"val-egpo/pass@1": base + lift, "val-egpo/pass@2": base + 0.1 + lift,
                                 "val-egpo/pass@4": base + 0.2 + lift})
                rows.append((step, data))
            write_run(tmp_path / f"{arm}__seed{seed}.jsonl", rows)
    report = write_report(tmp_path, steps=[7, 10], window=5).read_text()
    assert "## pass@1 (validation) (`val-egpo/pass@1`)" in report and "## pass@4 (validation)" in report
    assert "## pass@2 (validation)" not in report  # only pass@1 and pass@n are compared
    assert "| grpo | 7 | 4 | 0.2 | 0 | 0.2 | 0.2 |" in report  # step 5's value
    assert "| grpo | 10 | 4 | 0.3 | 0 | 0.3 | 0.3 |" in report
    assert "| grpo_8020 | 10 | 4 | 0.415 |" in report  # 0.3 + mean(0.1, 0.11, 0.12, 0.13)
    assert "## pass@k at step 10" in report
    assert "| grpo | 4 | 0.3 ± 0 | 0.4 ± 0 | 0.5 ± 0 |" in report
    assert (tmp_path / "pass_at_k.png").stat().st_size > 1000
    assert "## actor entropy (nats/token) (`actor/entropy`)" in report and "80/20 rule kept" not in report
    import csv

    rows = [r for r in csv.DictReader((tmp_path / "report.csv").open()) if r["metric"] == "val-egpo/pass@4"]
    assert {(r["step"], r["arm"]) for r in rows} == {("7", "grpo_8020"), ("10", "grpo_8020")}
    assert all(float(r["mean_diff"]) == pytest.approx(0.115) for r in rows)


def test_one_seed_is_reported_as_untested_and_the_report_opens_with_what_was_compared(tmp_path):
    """A single paired seed gets its difference and no test (not p = 1 and an interval [d, d]); nothing untested
    enters Holm's family; the report opens with the recipe, steps, seeds, each arm's overrides and the versions,
    from the runs' run.json as the ablation writes it."""
    import csv

    from egpo.ablation.arms import ARMS
    from egpo.ablation.attempt import write_run as write_run_json
    from egpo.runs.state import DONE

    for arm, value in (("grpo", 1.0), ("egpo_rollout", 1.25)):
        work = tmp_path / f"{arm}__seed0"
        write_run_json(work, arm, 0, 2, ["python", "-m", "egpo.main"], keep=2, timeout=60, recipe="cpu_smoke",
                       overrides=["data.train_batch_size=4"])
        write_run(work / "metrics.jsonl", [(1, {"egpo/cot_entropy_mean": value}), (2, {"egpo/cot_entropy_mean": value})])
        (work / DONE).write_text("{}")
    report = write_report(tmp_path, steps=[2], window=1).read_text()
    assert "grpo (1 seed)" in report and "1 seeds" not in report
    assert "No paired test: every comparison with `grpo` has a single paired seed" in report
    assert "| egpo_rollout | 2 | 1 | 0.25 | - | 1/1 | 1 seed: no paired test | - | - | - | - | - |" in report
    assert "p (Holm)" in report and "| 1 | no |" not in report
    [row] = list(csv.DictReader((tmp_path / "report.csv").open()))
    assert row["n_seeds"] == "1" and float(row["mean_diff"]) == 0.25 and row["p_value"] == row["ci_low"] == ""
    versions = json.loads((tmp_path / "grpo__seed0" / "run.json").read_text())["versions"]
    header = report[:report.index("## Significance")]
    assert "- recipe `cpu_smoke`, 2 steps, seeds 0" in header
    assert f"`egpo_rollout`: {' '.join(ARMS['egpo_rollout'])}" in header
    assert f"`grpo`: {' '.join(ARMS['grpo'])}" in header
    assert "- the ablation's overrides: data.train_batch_size=4" in header
    assert f"verl {versions['verl']}" in header and f"torch {versions['torch']}" in header


def test_a_report_of_some_arms_pairs_them_alone_and_writes_where_it_is_told(tmp_path):
    """``--arms`` keeps the named arms only (their own comparisons and Holm family), ``--baseline`` pairs them with
    another arm than grpo, ``--out`` writes the report beside the ablation instead of into it; an arm without runs
    and a baseline outside the arms are refused, naming the fix."""
    import csv

    from egpo.report import main

    ablation = tmp_path / "ablation"
    for seed in range(3):
        write_run(ablation / f"grpo__seed{seed}.jsonl", [(1, {"egpo/cot_entropy_mean": 0.5})])
        write_run(ablation / f"egpo_rollout__seed{seed}.jsonl", [(1, {"egpo/cot_entropy_mean": 0.6 + seed})])
        write_run(ablation / f"egpo_surprisal__seed{seed}.jsonl", [(1, {"egpo/cot_entropy_mean": 0.7 + 2 * seed})])
    out = tmp_path / "surprisal_vs_rollout"
    main([str(ablation), "--steps", "1", "--window", "1", "--baseline", "egpo_rollout",
          "--arms", "egpo_surprisal", "egpo_rollout", "--out", str(out)])
    report = (out / "report.md").read_text()
    assert not (ablation / "report.md").exists() and not list(ablation.glob("*.png"))
    assert "Runs: egpo_surprisal (3 seeds), egpo_rollout (3 seeds)." in report and "grpo (" not in report
    assert "1 paired comparisons with `egpo_rollout`" in report
    [row] = list(csv.DictReader((out / "report.csv").open()))
    # surprisal - rollout per seed: 0.1, 1.1, 2.1
    assert (row["arm"], row["baseline"]) == ("egpo_surprisal", "egpo_rollout")
    assert float(row["mean_diff"]) == pytest.approx(1.1)
    assert (out / "egpo_cot_entropy_mean_diff.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="no finished runs of grpo_stare .*its arms: egpo_rollout, egpo_surprisal, "
                                         "grpo"):
        main([str(ablation), "--arms", "grpo", "grpo_stare", "--out", str(out)])
    with pytest.raises(SystemExit, match="the baseline 'grpo' is not among --arms egpo_surprisal egpo_rollout: add "
                                         "it to --arms, or name one of them with --baseline"):
        main([str(ablation), "--arms", "egpo_surprisal", "egpo_rollout", "--out", str(out)])


def test_the_ablations_help_says_what_it_does_in_whole_sentences_and_names_each_arm_once():
    from egpo.ablation.arms import ARMS
    from egpo.ablation.cli import parser

    text = parser().format_help()
    description = parser().description
    assert description.endswith(".") and "resumably:" in description and "one job per run" in description
    flat = " ".join(text.split())
    for arm in ARMS:
        assert flat.count(f" {arm},") + flat.count(f" {arm} ") + flat.count(f" {arm}.") >= 1
    assert flat.count("egpo_token_respspan_rollout_vllm") == 1  # listed once, not in the usage line as well


def test_a_misspelled_arm_is_one_line_with_the_arm_meant():
    from egpo.ablation.cli import parse

    with pytest.raises(SystemExit) as stop:
        parse(["--config-path=recipes", "--config-name=cpu_warm", "--out=x", "--arms", "grpo", "egpo_rolout",
               "entropy_method", "nothing_like_it"])
    said = str(stop.value.code)
    assert said.startswith("[ablation] --arms egpo_rolout: no such arm or arm set (did you mean egpo_rollout?); "
                           "--arms entropy_method: no such arm or arm set (did you mean entropy_methods?); "
                           "--arms nothing_like_it: no such arm or arm set. Arm sets: ")
    assert said.endswith("every arm: python -m egpo.ablation --help") and "\n" not in said
    assert parse(["--config-path=recipes", "--config-name=cpu_warm", "--out=x", "--arms", "grpo", "sources"]).arms[:2] \
        == ["grpo", "egpo_actor"]
