"""python -m egpo.rehearse: a recipe's own configuration on the CPU. What it changes keeps the recipe's ratios and its
schedule's coincidences (by hand arithmetic on the qwen3 recipes); run whole, every event of the schedule holds, read
from the run's own files."""

import json
import os
import re
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import VERL, failed_run
from test_recipes import RECIPES

from egpo.preflight.rehearsal_plan import plan, schedule
from egpo.rehearse.schedule import expected_events


def recipe(name, *overrides):
    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def rehearsed(config, changes):
    config = config.copy()
    for change in changes:
        OmegaConf.update(config, change.key, change.rehearsal, force_add=True)
    return config


@pytest.mark.parametrize("name", ["qwen3_1.7b", "qwen3_4b", "qwen3_8b"])
def test_a_rehearsal_keeps_the_recipes_ratios_engine_and_choices(name, tmp_path):
    config = recipe(name)
    changes = plan(config, RECIPES.parent)
    small = rehearsed(config, changes)
    keys = {c.key for c in changes}
    # every token count scaled by the prompt's factor: the ratios the preflight's batch checks read are the recipe's
    factor = small.data.max_prompt_length / config.data.max_prompt_length
    for key in ("data.max_response_length", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"):
        big, little = (float(OmegaConf.select(c, key)) for c in (config, small))
        assert little == pytest.approx(big * factor, abs=1), key
    sequences = lambda c: c.actor_rollout_ref.actor.ppo_max_token_len_per_gpu // (  # noqa: E731
        c.data.max_prompt_length + c.data.max_response_length)
    assert sequences(small) == sequences(config)  # whole sequences a micro-batch holds
    updates = lambda c: c.data.train_batch_size // c.actor_rollout_ref.actor.ppo_mini_batch_size  # noqa: E731
    assert updates(small) == updates(config)
    # what the run is about is the recipe's, untouched
    for kept in ("actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.val_kwargs",
                 "algorithm", "trainer.logger", "trainer.val_before_train", "actor_rollout_ref.actor.loss_agg_mode",
                 "actor_rollout_ref.actor.clip_ratio_high", "actor_rollout_ref.rollout.temperature"):
        assert not any(k == kept or k.startswith(kept + ".") for k in keys), kept
    assert small.trainer.device == "cpu" and small.actor_rollout_ref.actor.strategy == "fsdp2"
    assert all(c.recipe != c.rehearsal and c.why for c in changes)


def test_a_rollout_replica_spans_the_rehearsals_two_ranks_as_the_recipes_spans_gpus():
    for name, tp in (("qwen3_1.7b", 1), ("qwen3_4b", 2), ("qwen3_8b", 2)):
        config = recipe(name)
        small = rehearsed(config, plan(config, RECIPES.parent))
        assert small.trainer.n_gpus_per_node == 2
        assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == tp
        assert small.actor_rollout_ref.rollout.tensor_model_parallel_size == tp  # kept: it divides two ranks
    wide = recipe("qwen3_8b", "actor_rollout_ref.rollout.tensor_model_parallel_size=4")
    change = next(c for c in plan(wide, RECIPES.parent) if c.key.endswith("tensor_model_parallel_size"))
    assert (change.recipe, change.rehearsal) == (4, 2)


def test_the_schedule_keeps_its_events_in_order_with_the_same_coincidences():
    config = recipe("qwen3_4b")  # 200 steps, validation every 20, a save every 50
    steps, test, save = schedule(config)
    assert (steps, test, save) == (20, 2, 5)
    big = [(e.what, e.step) for e in expected_events(config)]
    small = [(e.what, e.step * 10) for e in expected_events(rehearsed(config, plan(config, RECIPES.parent)))]
    assert [event for event in big if event[0] != "training step"] == \
        [event for event in small if event[0] != "training step"]
    assert ("validation on a save step", 100) in big and ("validation", 0) in big
    # one key changed at a time: a save moved onto every validation step shows as exactly that
    moved = recipe("qwen3_4b", "trainer.save_freq=20")
    events = expected_events(rehearsed(moved, plan(moved, RECIPES.parent)))
    assert {e.step for e in events if e.what == "validation on a save step"} == set(range(1, 11))
    assert not [e for e in events if e.what == "validation" and e.step > 0]


@pytest.mark.parametrize("overrides, found", [
    (("actor_rollout_ref.rollout.max_num_batched_tokens=4096",), True),  # under the model's 40,960 positions
    (("actor_rollout_ref.rollout.max_num_batched_tokens=65536",), False),
    (("actor_rollout_ref.rollout.max_num_batched_tokens=8192", "actor_rollout_ref.rollout.max_model_len=16384"), True),
    (("actor_rollout_ref.rollout.max_num_batched_tokens=16384", "actor_rollout_ref.rollout.max_model_len=16384"), False),
])
def test_vllms_prefill_budget_meets_its_context_in_the_rehearsal_as_in_the_recipe(overrides, found):
    """One key changed: vLLM's prefill budget under its context (chunked prefill off) is found in the recipe and in
    its rehearsal alike, and a budget over it in neither (the rehearsal's context is the demo model's 512 positions)."""
    from egpo.preflight.batch import prefill_budget_findings

    config = recipe("qwen3_1.7b", "actor_rollout_ref.rollout.name=vllm",
                    "actor_rollout_ref.rollout.enable_chunked_prefill=false", *overrides)
    small = rehearsed(config, plan(config, RECIPES.parent))
    assert bool(prefill_budget_findings(config)) is found
    assert bool(prefill_budget_findings(small)) is found


def test_a_recipe_whose_engine_is_not_installed_ends_the_rehearsal_at_its_refusal(tmp_path):
    """One key changed: the recipe's engine left out of this environment. The run's own refusal (before Ray, with the
    install line) ends the rehearsal, with its exit status; no event table of a schedule that never ran."""
    import importlib.util

    missing = next((name for name in ("sglang", "vllm") if importlib.util.find_spec(name) is None), None)
    if missing is None:
        pytest.skip("sglang and vLLM are both installed here")
    proc = subprocess.run([sys.executable, "-m", "egpo.rehearse", f"--config-path={RECIPES}", "--config-name=qwen3_1.7b",
                           f"actor_rollout_ref.rollout.name={missing}"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    refusal = next(line for line in (proc.stdout + proc.stderr).splitlines()
                   if line.startswith("[egpo] refused before anything started:"))
    assert missing in refusal, refusal
    from egpo.compat.versions import verl_stack

    if missing == "vllm" and not verl_stack().vllm_on_cpu:
        assert "verl 0.9.1" in refusal, refusal  # verl 0.7.1's vLLM has no CPU build: the stack that runs it here
    else:
        assert "pip install" in refusal, refusal  # the line that installs it
    assert proc.stderr.rstrip().endswith("[rehearse] the run stopped before its first step (exit status 1; its own "
                                         "lines above say why): nothing of the schedule ran")
    assert "NOT HELD" not in proc.stdout and "[rehearse] validation" not in proc.stdout


def test_the_disk_peak_is_the_most_the_checkpoints_held_at_once(tmp_path):
    """Hand-made checkpoints: two written, then the older removed (verl's keep): the peak is both at once, and only
    checkpoint folders count."""
    from egpo.rehearse.measure import DiskPeak

    def write(step, size):
        (tmp_path / f"global_step_{step}" / "actor").mkdir(parents=True)
        (tmp_path / f"global_step_{step}" / "actor" / "model.pt").write_bytes(b"x" * size)

    (tmp_path / "metrics.jsonl").write_bytes(b"y" * 10_000)  # the run's other files: not checkpoints
    peak = DiskPeak(tmp_path, every=3600)  # sampled by hand here
    write(1, 100)
    peak.sample()
    write(2, 300)
    peak.sample()
    import shutil

    shutil.rmtree(tmp_path / "global_step_1")
    peak.sample()
    assert (peak.folders, peak.size) == (2, 400)
    with DiskPeak(tmp_path, every=0.01) as watched:  # its thread samples until the block ends, and once more at exit
        write(3, 1000)
    assert (watched.folders, watched.size) == (2, 1300)


def rehearse_whole(tmp_path, *overrides):
    """qwen3_1.7b's own configuration through the real trainer on this CPU (tests/test_rehearse_sglang.py runs it
    with the recipe's own engine, sglang's CPU engine, in the sglang lane): its step-0 validation, 20 training steps,
    the saves at 5, 10, 15 and 20, the validations at every second step (two of them on save steps), each held and
    read from the run's own files; killed whole during step 10's validation right after its save, the same command
    resumes from that save and validates there first; the finished run's command again trains nothing; the
    preflight's checkpoint size beside the one written, and the checkpoints' peak on disk beside its figure."""
    proc = subprocess.run([sys.executable, "-m", "egpo.rehearse", f"--config-path={RECIPES}", "--config-name=qwen3_1.7b",
                           *overrides], cwd=tmp_path, capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, failed_run(proc)
    events = [line for line in proc.stdout.splitlines() if re.match(r"\[rehearse\] [a-z ]+ step +\d+  ", line)]
    assert len(events) == 1 + 20 + 4 + 10 and all(re.search(r"step +\d+  held", line) for line in events), events
    assert "[rehearse] validation on a save step   step  10  held" in proc.stdout
    assert "[rehearse] killed every process of the run during step 10's validation, right after its save" in proc.stdout
    assert ("[rehearse] the resume after the kill: from step 10 (its save kept), validated step 10 first, then "
            "trained on") in proc.stdout
    assert "[rehearse] the finished run's command again: trained nothing, said it is finished" in proc.stdout
    checkpoint = [line for line in proc.stdout.splitlines() if line.startswith("[rehearse] checkpoint global_step_20")]
    ratio = float(checkpoint[0].rsplit("(", 1)[1].split("x")[0])
    assert 0.9 <= ratio <= 1.2, checkpoint  # the preflight's model of a checkpoint against the one on disk
    # the checkpoints' peak, sampled while the run went on, against the preflight's (no keep: every save stays)
    disk = re.search(r"\[rehearse\] disk at its peak: (\d+) checkpoint\(s\), .* on disk; the preflight's (\d+) "
                     r"checkpoint\(s\), .* \(([\d.]+)x\)", proc.stdout)
    assert disk and disk.group(1) == disk.group(2) == "4" and 0.9 <= float(disk.group(3)) <= 1.3, proc.stdout[-2000:]
    where = tmp_path / "checkpoints" / "egpo" / "qwen3_1.7b_egpo_rehearsal"
    assert (where / "metrics.jsonl").exists() and (where / "global_step_20").is_dir()
    # two CPU ranks: the actor's checkpoint is sharded over both, as over a node's GPUs
    assert {p.name for p in (where / "global_step_20" / "actor").glob("model_world_size_*")} == \
        {"model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"}
    return proc


@pytest.mark.parametrize("schedule, rehearsed_schedule", [
    ((30, 3, 20), (20, 3, 20)),  # the ablation's defaults on a qwen3 recipe: no common divisor; the first validation
    ((200, 20, 20), (1, 1, 1)),  # step 1 saves and validates, as step 20 would on the GPU
    ((4, 2, 20), (2, 1, 10)),  # the run ends before its first validation's step: its last step validates
    ((30, 3, -1), (1, 1, -1)),  # no validation: through the first save
])
def test_the_ablation_rehearsals_schedule(schedule, rehearsed_schedule):
    from egpo.ablation.rehearsal import rehearsal_schedule

    assert rehearsal_schedule(*schedule) == rehearsed_schedule


def test_the_ablation_rehearsal_runs_here_only(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "egpo.ablation", "--rehearse", f"--config-path={RECIPES}",
                           "--config-name=qwen3_1.7b", "--out", str(tmp_path), "--ray-address", "http://head:8265"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "--rehearse runs every arm on this machine's CPU: leave out --ray-address" in \
        proc.stderr, proc.stderr


@pytest.mark.e2e
@pytest.mark.skipif(VERL == "0.7.1", reason="the rehearsal is egpo's, the same on both stacks: run whole on verl 0.9.1")
def test_the_ablation_rehearses_each_arm_through_its_first_save_and_validation(tmp_path):
    """An arm of qwen3_1.7b's ablation on this CPU (every arm runs the same way, with its own overrides), with the
    recipe's own configuration changed as egpo.rehearse changes it: the schedule (6 steps, a save every 2, the recipe's
    validation every 20) over its divisor 2, so the run validates before training, trains 3 steps, saves at each and
    validates at the last. As a Ray job on the rehearsal's own token-authenticated cluster of a head and two nodes: the
    node the run trains on is lost after its first step (the job fails, the run resumes from its save on the node that
    took its place), then the resumed attempt's workers freeze after its next step, and its stall watch, at the
    recipe's allowance scaled, stops it and the run resumes and finishes, its frozen workers gone with their job; then
    --status and the report read the rehearsal's folder as any ablation's."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "egpo.ablation", "--rehearse", f"--config-path={RECIPES}",
                           "--config-name=qwen3_1.7b", "--arms", "egpo_rollout", "--seeds", "0", "--steps", "6",
                           "--save-every", "2", "--out", str(out), "actor_rollout_ref.rollout.name=hf"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=2700,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, failed_run(proc)
    assert "[ablation] rehearsal of qwen3_1.7b on this CPU:" in proc.stdout
    assert "[ablation] actor_rollout_ref.model.path: 'Qwen/Qwen3-1.7B' -> " in proc.stdout
    assert "ray_kwargs.ray_init" not in proc.stdout  # the runs join the rehearsal's cluster
    assert ("[ablation] schedule: --steps 6 -> 3, --save-every 2 -> 1, trainer.test_freq 20 -> 10 (over their greatest "
            "common divisor, through the first save and validation)") in proc.stdout
    assert "1 run(s) as Ray jobs on http://127.0.0.1:" in proc.stdout
    assert "--retries 1 -> 3 (one run may meet both, and one spare for this machine's own)" in proc.stdout
    assert "accepts jobs without a token" not in proc.stdout
    lost = re.search(r"\[ablation\] rehearsal, a node lost mid-step: egpo_rollout__seed0 lost its node after step 1; "
                     r"its job failed and the run resumed \(attempts after it from steps \[1, 2\]"
                     r"(; all of its attempts from steps \[[\d, ]+\])?\), done\n",
                     proc.stdout)
    assert lost, proc.stdout[-6000:]
    hung = re.search(r"\[ablation\] rehearsal, a hung step: egpo_rollout__seed0 frozen after step 2: its watch stopped "
                     r"the attempt \(nothing logged for (\d+) s \(allowed 168 s; one training step so far, none timed "
                     r"yet\)\); resumed \(attempts after it from steps \[2\]; all of its attempts from steps "
                     r"\[[\d, ]*1, 2\]\), done; its (\d+) frozen process\(es\) ended with their job\n", proc.stdout)
    assert hung and int(hung.group(2)) >= 2, proc.stdout[-6000:]  # the run's two ranks at least
    assert "NOT HELD" not in proc.stdout
    assert f"1 done of 1 run(s)" in proc.stdout  # --status, printed by the rehearsal
    assert f"[ablation] python -m egpo.report {out} --window 1: report: {out / 'report.md'}" in proc.stdout
    from egpo.runs.state import checkpoint_steps, logged_steps

    for arm in ("egpo_rollout",):
        work = out / f"{arm}__seed0"
        steps = {s["step"]: s["data"] for s in logged_steps(work)}
        assert sorted(steps) == [0, 1, 2, 3]
        assert [s for s in steps if any(k.startswith("val-") for k in steps[s])] == [0, 3]
        assert checkpoint_steps(work) == [2, 3]
        # the stall watch's allowance scaled as the tokens are: the recipe's 3,600 s (8,192-token responses) x 48/1024
        spec = json.loads((work / "run.json").read_text())
        assert spec["stall_timeout"] == 168
        assert spec["start_timeout"] == 900  # before the first training step: a CPU start's floor, not the tokens'
    assert (out / "report.md").exists()
