"""``egpo.ablation --generate`` and the report's token figures: the commands it runs, and the figures paired by seed
against numpy over the parquet rows."""

import json

import numpy as np
import pytest

from egpo.ablation.arms import ARMS, seed_overrides
from egpo.ablation.generation import generation_commands
from egpo.analyze.run_figures import token_metrics
from egpo.runs.ablation_dir import BASE, BASE_SCORED, GENERATED, ON_BASE
from egpo.report import write_report
from generation_rows import random_rows, write_run


def ablation_run(root, arm, seed, last_step=3):
    work = root / f"{arm}__seed{seed}"
    work.mkdir(parents=True)
    (work / "run.json").write_text(json.dumps({"arm": arm, "seed": seed}))
    (work / "done.json").write_text("{}")
    (work / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": {"critic/score/mean": 0.1 * s}}) + "\n"
                                                for s in range(1, last_step + 1)))
    return work


def test_the_commands_start_with_the_base_and_skip_what_is_done(tmp_path):
    runs = [ablation_run(tmp_path, "grpo", 0), ablation_run(tmp_path, "egpo_rollout", 1)]
    commands = generation_commands(tmp_path, runs, "recipes", "cpu_warm", ["x.y=1"], tmp_path / "demo", 4, None,
                                   python="PY")
    assert len(commands) == 6 and commands[0][-2:] == ["--out", str(tmp_path / BASE)]
    assert commands[0][:3] == ["PY", "-m", "egpo.generate"] and "--checkpoint" not in commands[0]
    # the base reads its own responses through the actor's recompute, as each checkpoint does
    base_scored = commands[1]
    assert base_scored[-2:] == ["--out", str(tmp_path / BASE_SCORED)] and "--checkpoint" not in base_scored
    assert base_scored[base_scored.index("--score") + 1] == str(tmp_path / BASE)
    own, scored = commands[4], commands[5]
    assert own[-2:] == ["--out", str(runs[1] / GENERATED)]
    assert own[own.index("--checkpoint") + 1] == str(runs[1] / "checkpoints")
    assert all(o in own for o in (*ARMS["egpo_rollout"], *seed_overrides(1), "x.y=1", "--n", "4"))
    assert scored[scored.index("--score") + 1] == str(tmp_path / BASE) and scored[-1] == str(runs[1] / ON_BASE)
    for done in (tmp_path / BASE, tmp_path / BASE_SCORED, runs[0] / GENERATED, runs[0] / ON_BASE):
        done.mkdir(parents=True)
        (done / "done.json").write_text("{}")
    left = generation_commands(tmp_path, runs, "recipes", "cpu_warm", [], None, None, None)
    assert [c[c.index("--out") + 1] for c in left] == [str(runs[1] / GENERATED), str(runs[1] / ON_BASE)]


def flat(rows):
    return np.concatenate([np.asarray(r["entropy"], dtype=np.float32).astype(np.float64) for r in rows])


def test_the_report_pairs_the_token_figures_by_seed(tmp_path):
    base_rows = random_rows(0)
    # the engine's entropy of the base's samples is never a side of the comparison: only the recompute is
    write_run(tmp_path / BASE, [{**r, "entropy": [h + 0.3 for h in r["entropy"]]} for r in base_rows],
              responses_id="base")
    write_run(tmp_path / BASE_SCORED, base_rows[::-1], responses_id="base")
    rng = np.random.default_rng(1)
    expected = {}
    for arm, scale in (("grpo", 1.0), ("egpo_rollout", 1.3)):
        for seed in range(3):
            work = ablation_run(tmp_path, arm, seed)
            own = random_rows(10 + seed + (100 if arm != "grpo" else 0))
            own = [{**r, "entropy": [h * scale for h in r["entropy"]]} for r in own]
            write_run(work / GENERATED, own)
            on_base = [{**r, "entropy": [h * scale + float(rng.normal(0, 0.05)) for h in r["entropy"]]}
                       for r in base_rows]
            write_run(work / ON_BASE, on_base[::-1], responses_id="base")
            figures = token_metrics(tmp_path, work)
            entropy, base, scored = flat(own), flat(base_rows), flat(on_base)
            assert figures["token/entropy_mean"] == pytest.approx(entropy.mean(), abs=1e-9)
            assert figures["token/entropy_p80"] == pytest.approx(np.percentile(entropy, 80), abs=1e-9)
            assert figures["token/frac_below_0.01"] == pytest.approx((entropy < 0.01).mean())
            assert figures["token/base_tokens_entropy_shift"] == pytest.approx((scored - base).mean(), abs=1e-6)
            top_base, top_scored = base >= np.percentile(base, 80), scored >= np.percentile(scored, 80)
            assert figures["token/top20_overlap_with_base"] == pytest.approx((top_base & top_scored).sum()
                                                                             / top_base.sum())
            expected[arm, seed] = figures
    report = write_report(tmp_path, steps=[3], window=1).read_text()
    assert "Token figures (`token/*`, `egpo.ablation --generate`) for 6 run(s)" in report
    assert "## token entropy after training, mean (nats) (`token/entropy_mean`)" in report
    diffs = [expected["egpo_rollout", s]["token/entropy_mean"] - expected["grpo", s]["token/entropy_mean"]
             for s in range(3)]
    assert f"| egpo_rollout | 3 | 3 | {np.mean(diffs):.4g} |" in report  # the paired mean difference, by seed
    rows = (tmp_path / "report.csv").read_text()
    assert "token/top20_overlap_with_base,3,egpo_rollout,grpo,3," in rows
    # the token-by-token command it gives names every run, the baseline's first, and runs as given
    hint = report.split("the tokens themselves, each arm's first seed on the base model's responses: `")[1].split("`")[0]
    assert hint == (f"python -m egpo.analyze {tmp_path / BASE_SCORED} {tmp_path / 'grpo__seed0' / ON_BASE} "
                    f"{tmp_path / 'egpo_rollout__seed0' / ON_BASE} --names base grpo__seed0 egpo_rollout__seed0 "
                    f"--out {tmp_path / 'tokens_seed0'}")
    from egpo.analyze.__main__ import main as analyze_main

    analyze_main(hint.split()[3:] + ["--min-count", "3", "--bootstrap", "5"])
    table = (tmp_path / "tokens_seed0" / "index.html").read_text()
    assert all(f"<td>{name}</td>" in table for name in ("base", "grpo__seed0", "egpo_rollout__seed0"))


def test_an_unchanged_model_shows_no_shift_and_full_overlap_whatever_the_engine_said(tmp_path):
    """A checkpoint that is the base model reads the base's responses exactly as the base's own recompute does: shift
    0 and overlap 1, though the engine's entropy of those samples (generate_base) differs from the recompute."""
    base_rows = random_rows(3)
    engine = [{**r, "entropy": [h * 1.1 + 0.02 for h in r["entropy"]]} for r in base_rows]
    write_run(tmp_path / BASE, engine, responses_id="base")
    write_run(tmp_path / BASE_SCORED, base_rows, responses_id="base")
    work = ablation_run(tmp_path, "grpo", 0)
    write_run(work / ON_BASE, base_rows[::-1], responses_id="base")
    figures = token_metrics(tmp_path, work)
    assert figures["token/base_tokens_entropy_shift"] == 0.0
    assert figures["token/top20_overlap_with_base"] == 1.0


def test_generate_on_a_cluster_is_refused_with_the_command_that_does_it():
    from egpo.ablation.cli import parse

    with pytest.raises(SystemExit, match="without --ray-address and with --generate"):
        parse(["--config-path", "recipes", "--config-name", "cpu_warm", "--out", "x", "--generate",
               "--ray-address", "http://head:8265"])
    assert parse(["--config-path", "recipes", "--config-name", "cpu_warm", "--out", "x", "--generate",
                  "--generate-n", "4"]).generate_n == 4


def test_every_arms_preflight_warnings_are_printed_with_what_the_arm_does(tmp_path, demo, capsys):
    """An arm whose preflight warns (here the entropy bonus's update-time entropy, at a micro-batch where it saves
    12.8 GB per GPU) passes the ablation's preflight; its warning is printed, naming the arm, with what it will do."""
    from test_recipes import RECIPES

    from egpo.ablation.cli import parse, preflight

    args = parse(["--config-path", str(RECIPES), "--config-name", "cpu_smoke", "--out", str(tmp_path),
                  "--arms", "grpo", "grpo_entbonus", "--seeds", "0", "--steps", "2",
                  "actor_rollout_ref.actor.use_dynamic_bsz=true",
                  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=40000000"])
    from egpo.preflight.compose import compose

    config = compose(args.config_path, args.config_name, [f"egpo_demo.out={demo}", *args.overrides])
    preflight(args, demo, (), config)
    out = capsys.readouterr().out
    [warned] = [line for line in out.splitlines() if line.startswith("[ablation] arm grpo_entbonus: ! gpu")]
    assert "saves 12.8 GB per GPU" in warned and "actor_rollout_ref.model.use_fused_kernels=true" in warned
    assert "[ablation] arm grpo_entbonus runs as configured all the same" in out
    assert "[ablation] arm grpo:" not in out and "preflight passed for 2 arm(s)" in out


def test_every_arms_generation_config_passes_the_settings_check():
    """egpo.ablation --generate samples each run's checkpoint with the arm's overrides and the generation's own
    (egpo.generate.setup.GENERATION_OVERRIDES): the result is a configuration egpo accepts for every arm, GTPO's and
    GRPO-S's included (their method refuses EGPO's response span, which a generation reads)."""
    from hydra import compose, initialize_config_module

    from egpo.ablation.arms import ARMS
    from egpo.generate.setup import GENERATION_OVERRIDES
    from egpo.settings import EgpoSettings

    with initialize_config_module(config_module="egpo.config", version_base=None):
        for arm in ("grpo", "egpo_rollout", "grpo_gtpo", "grpo_gtpo_joint", "grpo_s", "grpo_s_verlloss", "grpo_stare",
                    "grpo_8020"):
            config = compose(config_name="egpo_trainer", overrides=[*ARMS[arm], *GENERATION_OVERRIDES])
            settings = EgpoSettings.from_algorithm(config.algorithm)
            assert settings.reads_rollout_entropy and settings.algo.egpo_span == "response", arm
