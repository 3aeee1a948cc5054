"""egpo.runs.main_dir: a main job's run directory (config, metrics, log, checkpoints), its start line and closing summary,
and metrics continued across resumed attempts, each step once."""

import json
import os
import pprint
import sys

import pytest
from conftest import VERL
from omegaconf import OmegaConf

from egpo.runs import main_dir as run_dir
from egpo.runs.state import ATTEMPT_METRICS, METRICS_FILE, read_steps


def config(where, **trainer):
    return OmegaConf.create({"trainer": {"default_local_dir": str(where), "logger": ["console"], "save_freq": -1,
                                         "resume_mode": "auto", **trainer},
                             "actor_rollout_ref": {"x": 1}, "algorithm": {"egpo_lambda": 0.4}})


def log_steps(path, steps):
    with path.open("a") as f:
        for step, data in steps:
            f.write(json.dumps({"step": step, "data": data}) + "\n")


def test_the_preflight_turns_on_verls_file_logger_into_the_run_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = config("checkpoints/egpo/cpu_warm")
    run_dir.complete_run_outputs(cfg)
    where = tmp_path / "checkpoints" / "egpo" / "cpu_warm"
    assert cfg.trainer.default_local_dir == str(where) and list(cfg.trainer.logger) == ["console", "file"]
    assert OmegaConf.select(cfg, run_dir.LOGGER_PATH_KEY) == str(where / ATTEMPT_METRICS)
    assert not where.exists()  # the preflight writes nothing
    ablation = config("elsewhere")  # python -m egpo.ablation sets the logger's path: its run directory is its own
    OmegaConf.update(ablation, run_dir.LOGGER_PATH_KEY, "/abl/run/metrics.attempt.jsonl", force_add=True)
    run_dir.complete_run_outputs(ablation)
    assert list(ablation.trainer.logger) == ["console"] and ablation.trainer.default_local_dir == "elsewhere"


def test_an_attempt_writes_config_log_and_metrics_and_ends_with_where_they_are(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    where = tmp_path / "run"
    cfg = config(where)
    run_dir.complete_run_outputs(cfg)
    with run_dir.RunOutputs(cfg):
        print("step:1 - from verl")
        log_steps(where / ATTEMPT_METRICS, [(1, {"critic/score/mean": 0.25, "egpo/cot_entropy_mean": 0.5}),
                                            (2, {"critic/score/mean": 0.5, "egpo/cot_entropy_mean": 0.4,
                                                 "val-egpo/pass@1": 0.1, "val-egpo/pass@8": 0.3,
                                                 "val-egpo/pass@2": 0.2})])
        print("verl's last line: its progress bar", file=sys.stderr)
        run_dir.end_runner_output(cfg, 12.0)  # what egpo's runner prints when verl's run returns
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"[egpo] run directory: {where} (starts at step 0; config.yaml, metrics.jsonl, log.txt, checkpoints)"
    assert out[-3].startswith("[egpo] done: 2 step(s) logged, the last step 2, in 12 s")
    assert out[-3].endswith("step 2: reward 0.5, CoT entropy 0.4; validation at step 2: pass@1 0.1, pass@8 0.3")
    assert out[-2] == (f"[egpo] run directory: {where}: metrics.jsonl, config.yaml, log.txt, no checkpoint "
                       "(trainer.save_freq=-1)")
    assert out[-1] == f"[egpo] report: python -m egpo.report {where}"
    assert [s["step"] for s in read_steps(where / METRICS_FILE)] == [1, 2] and not (where / ATTEMPT_METRICS).exists()
    assert OmegaConf.load(where / "config.yaml").algorithm.egpo_lambda == 0.4
    log = (where / "log.txt").read_text()
    assert "step:1 - from verl" in log and "[egpo] report: python -m egpo.report" in log


def test_a_resumed_attempt_keeps_the_steps_up_to_its_checkpoint_and_logs_the_rest_once(tmp_path, monkeypatch, capsys):
    """An attempt killed after step 5 with its last checkpoint at step 3: the next keeps steps 1-3, verl logs 4 and
    on again, and each step is in metrics.jsonl once, from the attempt the run went on with."""
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    where = tmp_path / "run"
    where.mkdir()
    log_steps(where / METRICS_FILE, [(1, {"a": 1.0}), (2, {"a": 2.0})])
    log_steps(where / ATTEMPT_METRICS, [(3, {"a": 3.0}), (4, {"a": -1.0}), (5, {"a": -1.0})])  # the killed attempt
    (where / "latest_checkpointed_iteration.txt").write_text("3")
    cfg = config(where)
    run_dir.complete_run_outputs(cfg)
    with run_dir.RunOutputs(cfg):
        assert [s["step"] for s in read_steps(where / METRICS_FILE)] == [1, 2, 3]
        log_steps(where / ATTEMPT_METRICS, [(4, {"a": 4.0}), (5, {"a": 5.0})])
        run_dir.end_runner_output(cfg, 1.0)
    assert "(resumes from step 3;" in capsys.readouterr().out
    assert [(s["step"], s["data"]["a"]) for s in read_steps(where / METRICS_FILE)] == [(i, float(i)) for i in range(1, 6)]
    fresh = config(where, resume_mode="disable")
    run_dir.complete_run_outputs(fresh)
    with run_dir.RunOutputs(fresh):
        assert read_steps(where / METRICS_FILE) == []  # a fresh start in the same directory keeps nothing
        run_dir.end_runner_output(fresh, 1.0)
    assert (where / "log.txt").read_text().count("\n=== ") == 2


def test_verls_dumps_become_one_line_each_in_the_runners_process(tmp_path, monkeypatch, capsys):
    from verl.trainer.ppo import ray_trainer

    from egpo import console

    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    cfg = config(tmp_path / "run")
    run_dir.complete_run_outputs(cfg)
    try:
        from egpo.runner import EgpoTaskRunner

        console.fold_verls_dumps(*EgpoTaskRunner.kept_files(cfg))
        from pprint import pprint as verls_pprint  # TaskRunner.run imports it inside the method, after egpo's runner

        verls_pprint(OmegaConf.to_container(cfg, resolve=True))
        verls_pprint({"other": 1})
        ray_trainer.pprint("Initial validation metrics: {'val-egpo/pass@1': 0.1}")  # RayPPOTrainer.fit's dumps
        ray_trainer.pprint("Final validation metrics: {'val-egpo/pass@1': 0.125}")  # the closing summary has it
        ray_trainer.pprint("another string")
    finally:
        console.CONFIG_DUMP.remove()
        console.VALIDATION_DUMP.remove()
    where = tmp_path / "run"
    assert capsys.readouterr().out == (f"[egpo] the run's configuration: {where / 'config.yaml'}\n{{'other': 1}}\n"
                                       f"[egpo] initial validation metrics: every figure in {where / 'metrics.jsonl'}\n"
                                       "'another string'\n")
    assert not hasattr(pprint.pprint, "__egpo_patch__") and not hasattr(ray_trainer.pprint, "__egpo_patch__")


def test_verls_optional_engine_warnings_are_filtered_in_every_worker(tmp_path):
    from egpo import console

    cfg = config(tmp_path / "run")
    OmegaConf.update(cfg, console.WARNINGS_KEY, "ignore::DeprecationWarning", force_add=True)
    console.quiet_workers(cfg)
    console.quiet_workers(cfg)  # once
    assert OmegaConf.select(cfg, console.WARNINGS_KEY) == "ignore::DeprecationWarning," + console.QUIET_WARNINGS


def test_a_failed_attempt_keeps_its_metrics_and_prints_no_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    where = tmp_path / "run"
    cfg = config(where)
    run_dir.complete_run_outputs(cfg)
    with pytest.raises(RuntimeError, match="worker died"):
        with run_dir.RunOutputs(cfg):
            log_steps(where / ATTEMPT_METRICS, [(1, {"a": 1.0})])
            raise RuntimeError("worker died")
    assert "[egpo] done" not in capsys.readouterr().out
    assert [s["step"] for s in read_steps(where / METRICS_FILE)] == [1]
    import sys

    from egpo.runner_console import Tee

    assert not isinstance(sys.stdout, Tee)


def test_a_steps_console_line_is_short_and_names_what_the_bonus_did():
    from egpo.trainer.metrics import format_step_summary

    metrics = {"egpo/cot_entropy_mean": 0.48831, "egpo/bonus_mean": 0.1431, "egpo/applied_bonus_mean": 0.05724,
               "egpo/clipped_frac": 0.6875, "egpo/bonus_active_frac": 0.5, "egpo/think_closed_frac": 1.0,
               "egpo/entropy_rollout_vs_actor/max_abs_diff": 3.979e-06, "egpo/no_cot_frac": 0.0}
    line = format_step_summary(3, metrics)
    assert line == ("[egpo] step 3: cot_entropy=0.4883 bonus=0.1431 applied=0.05724 clipped=0.6875 changed=0.5 "
                    "rollout_vs_actor=3.979e-06")
    assert len(line) < 120


def test_the_runners_end_marks_are_read_off_the_console_however_ray_writes_them(tmp_path):
    """The runner's last line on each stream reaches the driver as Ray prints it (a prefix, the line's text and its
    newline in two calls, or several lines in one write): each is read and kept off the console and the log, every
    other line passes. A write Ray's log thread began after the log closed reaches the console and raises nothing (a
    finished run must not end with a traceback)."""
    import io

    from egpo import runner_console

    console, end = io.StringIO(), runner_console.RunnerEnd()
    log = (tmp_path / "log.txt").open("a")
    tee = runner_console.Tee(console, log, end)
    prefix = "\x1b[36m(EgpoTaskRunner pid=7)\x1b[0m "
    tee.write(f"{prefix}Training Progress: 100%")
    tee.write("\n")
    tee.write(f"{prefix}{runner_console.END_MARK} stderr")
    assert end.ended == {"stderr"} and not end.all_ended.is_set()
    tee.write("\n")
    tee.write(f"{prefix}step:2 - a:1\n{prefix}{runner_console.END_MARK} stdout 45.250\n")
    assert end.all_ended.is_set() and end.seconds == 45.25
    log.close()
    tee.write("(raylet) a late line\n")
    tee.flush()
    shown = f"{prefix}Training Progress: 100%\n{prefix}step:2 - a:1\n"
    assert console.getvalue() == shown + "(raylet) a late line\n"
    assert (tmp_path / "log.txt").read_text() == shown


def test_a_finished_run_trains_nothing_and_says_how_to_extend_it(tmp_path, demo, capsys):
    """The same command again after a run reached its last step: verl would resume there and train one step beyond
    it. egpo says the run is finished, starts nothing (no Ray), and names the explicit setting that extends it."""
    from hydra import compose, initialize_config_dir

    from test_recipes import RECIPES

    from egpo.main import run
    from egpo.preflight.finished_run import finished_run

    where = tmp_path / "run"
    (where / "global_step_3").mkdir(parents=True)
    (where / "latest_checkpointed_iteration.txt").write_text("3")
    log_steps(where / METRICS_FILE, [(1, {"a": 1.0}), (2, {"a": 1.0}), (3, {"a": 1.0})])

    def config(*extra):
        with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
            return compose(config_name="cpu_smoke", overrides=[f"egpo_demo.out={demo}",
                                                               f"trainer.default_local_dir={where}", *extra])

    message = finished_run(config())
    assert message.startswith(f"[egpo] the run in {where} is finished: its checkpoint is at step 3 of its 3")
    assert "trainer.total_training_steps=6" in message
    # the report's hint on a line of its own, the last, as every run's closing summary ends
    assert message.splitlines()[-1] == f"[egpo] report: python -m egpo.report {where}" and len(message.splitlines()) == 2
    assert finished_run(config("trainer.total_training_steps=6")) is None  # extended: step 4 is to train
    assert finished_run(config("trainer.resume_mode=disable")) is None
    run(config())  # returns before Ray starts: nothing is trained or written
    assert "is finished" in capsys.readouterr().out
    assert sorted(p.name for p in where.iterdir()) == ["global_step_3", "latest_checkpointed_iteration.txt",
                                                       "metrics.jsonl"]


@pytest.mark.parametrize("spec, text, category, module", [
    ("verl.workers.engine", "torchtitan engine is not available: ModuleNotFoundError", UserWarning,
     "verl.workers.engine"),
    ("critic", "Disabled critic as algorithm.adv_estimator != gae. If it is not intended, please set "
               "critic.enable=True", UserWarning, "verl.trainer.ppo.utils"),
    ("set_vital", "'set_vital' is deprecated, please do not call", UserWarning,
     "torchdata.stateful_dataloader.stateful_dataloader"),
])
def test_the_expected_warnings_are_silent_in_workers_and_driver_and_no_other_is(spec, text, category, module):
    """Each of egpo.console's expected warnings, with the text verl (or torchdata) gives it: silent in a process
    started with the workers' PYTHONWARNINGS and in the driver after quiet_driver; printed without them; a warning of
    the same category from elsewhere still printed."""
    import subprocess
    import sys
    import warnings

    from egpo import console

    assert any(spec in filter_ for filter_, _ in console.EXPECTED_WARNINGS)
    emit = (f"import warnings; warnings.warn_explicit({text!r}, {category.__name__}, 'x.py', 1, module={module!r}); "
            f"warnings.warn_explicit('something else', {category.__name__}, 'x.py', 2, module='x.other')")
    for env, silenced in (({"PYTHONWARNINGS": console.QUIET_WARNINGS}, True), ({}, False)):
        proc = subprocess.run([sys.executable, "-c", emit], capture_output=True, text=True, timeout=60,
                              env={k: v for k, v in {**os.environ, **env}.items()
                                   if k != "PYTHONWARNINGS" or env})
        assert (text[:20] in proc.stderr) is not silenced, proc.stderr
        assert "something else" in proc.stderr
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        console.quiet_driver()
        warnings.warn_explicit(text, category, "x.py", 1, module=module)
        warnings.warn_explicit("something else", category, "x.py", 2, module="x.other")
    assert [str(w.message) for w in seen] == ["something else"]


def test_egpos_trainer_is_built_without_verls_deprecation_of_the_trainer_it_builds_on():
    """verl 0.9.1 deprecates RayPPOTrainer, which egpo builds on (trainer.use_v1=false): egpo's filter matches the
    message verl's decorator gives, and only it."""
    import re
    import warnings

    if VERL != "0.9.1":
        pytest.skip("verl 0.7.1's RayPPOTrainer is not deprecated")
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from egpo.trainer.ray_trainer import DEPRECATED_TRAINER

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(Exception):
            RayPPOTrainer(None)  # the decorator warns before verl's __init__ reads the (missing) config
    messages = [str(w.message) for w in seen if issubclass(w.category, FutureWarning)]
    assert messages and all(re.match(DEPRECATED_TRAINER, m) for m in messages), messages
    assert not re.match(DEPRECATED_TRAINER, "Warning: Class 'verl.other.Thing' is deprecated.")


HELD_LINE_SCRIPT = """
import sys
import time

import ray
from omegaconf import OmegaConf
from egpo.runs import main_dir as run_dir

cfg = OmegaConf.create({"trainer": {"default_local_dir": sys.argv[1], "logger": ["console"], "save_freq": -1,
                                    "resume_mode": "auto"}})
run_dir.complete_run_outputs(cfg)


@ray.remote(num_cpus=0)
class Worker:
    def say(self, text):
        print(text, flush=True)

    def end(self, cfg):
        run_dir.end_runner_output(cfg, 1.0)


with run_dir.RunOutputs(cfg):
    ray.init(address=sys.argv[2])  # the test's own cluster, on ports of its own
    one, two = Worker.remote(), Worker.remote()
    ray.get(one.say.remote("a line two workers print"))
    time.sleep(2)  # Ray forwards the first at once, and holds the second back for its deduplication
    ray.get(two.say.remote("a line two workers print"))
    ray.get(one.end.remote(cfg))
"""


@pytest.mark.skipif(VERL != "0.9.1", reason="Ray's driver is the same on both stacks (Ray 2.60): run on one")
def test_a_worker_line_ray_held_back_comes_before_the_closing_summary(tmp_path):
    """Ray's driver holds back a line another worker printed too (its log deduplication) until its next forwarded
    batch or its shutdown; the process's exit printed it after the closing summary. Real Ray (a cluster of the
    test's own, its driver in a process of its own): the held line comes before the summary, and the summary is the
    last output."""
    import subprocess

    from ray_cluster import start_cluster

    cluster = start_cluster(num_cpus=2, num_gpus=0, resources={})
    try:
        env = {k: v for k, v in cluster.env.items() if k not in ("RAY_DEDUP_LOGS", "VERL_FILE_LOGGER_PATH")}
        proc = subprocess.run([sys.executable, "-c", HELD_LINE_SCRIPT, str(tmp_path / "run"), cluster.gcs],
                              capture_output=True, text=True, timeout=300, env=env)
    finally:
        cluster.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    said = [i for i, line in enumerate(lines) if "a line two workers print" in line]
    assert len(said) == 2, proc.stdout
    assert lines[-1].startswith(run_dir.NO_STEPS_LINE), proc.stdout  # the summary of a run that logged no step


def test_verls_ray_init_line_is_one_short_line_on_the_console_and_whole_in_the_log(tmp_path):
    """verl's driver prints ray.init's arguments (about 1,000 characters) at every start: the console shows where they
    are, the run's log keeps the line as verl printed it."""
    import io

    from egpo import runner_console

    console, end = io.StringIO(), runner_console.RunnerEnd()
    log = (tmp_path / "log.txt").open("a")
    tee = runner_console.Tee(console, log, end)
    kwargs = "ray init kwargs: {'runtime_env': {'env_vars': {" + ", ".join(f"'K{i}': 'v'" for i in range(80)) + "}}}"
    tee.write(kwargs)  # print() writes the text, then its newline
    tee.write("\n")
    tee.write("a line before\nray init kwargs: {'num_cpus': 2}\na line after\n")
    log.close()
    stand_in = "[egpo] ray.init's arguments: ray_kwargs.ray_init in the run's configuration\n"
    assert console.getvalue() == stand_in + "a line before\n" + stand_in + "a line after\n"
    assert (tmp_path / "log.txt").read_text() == kwargs + "\na line before\nray init kwargs: {'num_cpus': 2}\na line after\n"


def test_the_closing_summary_names_the_last_checkpoint_by_its_step_not_its_name(tmp_path):
    """global_step_20 comes after global_step_5 (a name sort puts it first)."""
    where = tmp_path / "run"
    for step in (5, 10, 15, 20):
        (where / f"global_step_{step}").mkdir(parents=True)
    lines = run_dir.summary_lines(where, [{"step": 20, "data": {}}], config(where, save_freq=5), 1.0)
    assert lines[1].endswith("4 checkpoint(s), the last global_step_20")
