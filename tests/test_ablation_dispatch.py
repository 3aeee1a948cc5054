"""The ablation's dispatch to a Ray cluster, against a scripted job client (what Ray's JobSubmissionClient answers),
and its attempt entrypoint with a stand-in training command: how many jobs at once, which failures are resubmitted,
what is adopted from an earlier invocation, what Ctrl-C stops; what a run asks of a node and how many the cluster
holds; the start-up check of a run that joins a cluster. The real cluster: tests/test_ablation_cluster.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from egpo.ablation.attempt import write_run
from egpo.ablation.cluster import JobDispatch, capacity, run_resources, runtime_env
from egpo.preflight.run_facts import with_facts
from egpo.runs.state import ATTEMPT, ATTEMPT_METRICS, DONE, FAILED, JOB, METRICS_FILE, read_steps
from test_recipes import RECIPES

ADDRESS = "http://head:8265"


class Info:
    def __init__(self, message):
        self.message = message


class ScriptedJobs:
    """Each submitted job walks through the states its run's script gives (one per look), the last one staying;
    a job that reaches SUCCEEDED has written its run's done.json, unless the script says ``SUCCEEDED-nofile``."""

    def __init__(self, scripts: dict[str, list[list[str]]], foreign: tuple[str, ...] = ()):
        self.scripts = {name: list(attempts) for name, attempts in scripts.items()}
        self.jobs: dict[str, dict] = {sid: {"states": ["RUNNING"], "work": None} for sid in foreign}
        self.submitted: list[str] = []
        self.stopped: list[str] = []
        self.live: set[str] = set()  # submitted and not yet seen ended
        self.most_running = 0
        self.interrupt_after: int | None = None
        self.looks = 0

    def submit_job(self, entrypoint, submission_id, runtime_env, metadata):
        work = Path(entrypoint.split()[-1])
        assert entrypoint.split()[1:3] == ["-m", "egpo.ablation.attempt"] and metadata["egpo_run"] == work.name
        self.jobs[submission_id] = {"states": list(self.scripts[work.name].pop(0)), "work": work}
        self.submitted.append(work.name)
        self.live.add(submission_id)
        self.most_running = max(self.most_running, len(self.live))
        return submission_id

    def get_job_status(self, sid):
        self.looks += 1
        if self.interrupt_after is not None and self.looks > self.interrupt_after:
            self.interrupt_after = None  # one Ctrl-C
            raise KeyboardInterrupt
        job = self.jobs[sid]
        state = job["states"].pop(0) if len(job["states"]) > 1 else job["states"][0]
        if state == "SUCCEEDED" and job["work"] is not None:
            (job["work"] / DONE).write_text("{}")
        if state not in ("PENDING", "RUNNING"):
            self.live.discard(sid)
        return "SUCCEEDED" if state == "SUCCEEDED-nofile" else state

    def stop_job(self, sid):
        self.stopped.append(sid)
        self.jobs[sid]["states"] = ["STOPPED"]

    def get_job_info(self, sid):
        return Info("Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 "
                    "chars):\nnoise")

    def list_jobs(self):
        """Ray's JobDetails of every job: its state now (without taking a look's step) and the metadata it was
        submitted with (none for a job submitted outside egpo)."""
        details = []
        for sid, job in self.jobs.items():
            work = job["work"]
            metadata = {"egpo_ablation": str(work.parent), "egpo_run": work.name} if work is not None else {}
            details.append(JobDetails(sid, job["states"][0], metadata))
        return details


class JobDetails:
    def __init__(self, submission_id, status, metadata):
        self.submission_id, self.status, self.metadata = submission_id, status, metadata


def runs(tmp_path, names):
    works = []
    for name in names:
        work = tmp_path / name
        work.mkdir()
        (work / "log.txt").write_text(f"training of {name}\nTraceback: the last line of {name}\n")
        works.append(work)
    return works


def dispatch(client, max_parallel=2, retries=1, address=ADDRESS, capacity=None):
    return JobDispatch(client, address, max_parallel, retries, {"env_vars": {}}, "/venv/bin/python", poll=0,
                       capacity=capacity)


def test_at_most_max_parallel_jobs_at_once_and_every_run_to_its_end(tmp_path, capsys):
    names = ["a__seed0", "b__seed0", "a__seed1", "b__seed1", "a__seed2"]
    client = ScriptedJobs({n: [["PENDING", "RUNNING", "RUNNING", "SUCCEEDED"]] for n in names})
    assert dispatch(client, max_parallel=2).run(runs(tmp_path, names)) == []
    assert client.submitted == names and client.most_running == 2
    out = capsys.readouterr().out
    for name in names:
        assert f"{name}: submitted as job egpo-{name}-" in out and f"{name}: RUNNING (job" in out
        assert f"{name}: done (job" in out
        assert json.loads((tmp_path / name / JOB).read_text())["address"] == ADDRESS


def test_a_failed_job_is_resubmitted_up_to_retries_with_its_log_tail(tmp_path, capsys):
    client = ScriptedJobs({"a__seed0": [["RUNNING", "FAILED"], ["RUNNING", "SUCCEEDED"]],
                           "b__seed0": [["RUNNING", "FAILED"], ["FAILED"]], "c__seed0": [["SUCCEEDED"]]})
    failed = dispatch(client, max_parallel=1, retries=1).run(runs(tmp_path, ["a__seed0", "b__seed0", "c__seed0"]))
    assert failed == ["b__seed0"]
    # a failed run goes back to the front of the queue: it resumes before the runs behind it start
    assert client.submitted == ["a__seed0", "a__seed0", "b__seed0", "b__seed0", "c__seed0"]
    out = capsys.readouterr().out
    assert "a__seed0: FAILED (job egpo-a__seed0-" in out and "; Job entrypoint command failed with exit code 1)" in out
    assert "noise" not in out  # Ray's copy of the job's logs: the run's log's tail is printed instead
    assert "resubmitting from its last checkpoint in 0 s; the end of a__seed0/log.txt:\n" in out
    assert "Traceback: the last line of b__seed0" in out


def test_a_job_stopped_outside_the_ablation_is_not_resubmitted(tmp_path):
    client = ScriptedJobs({"a__seed0": [["RUNNING", "STOPPED"]]})
    assert dispatch(client, retries=3).run(runs(tmp_path, ["a__seed0"])) == ["a__seed0"]
    assert client.submitted == ["a__seed0"]


def test_a_job_that_succeeded_without_done_json_here_means_storage_the_nodes_do_not_share(tmp_path, capsys):
    client = ScriptedJobs({"a__seed0": [["RUNNING", "SUCCEEDED-nofile"]]})
    assert dispatch(client).run(runs(tmp_path, ["a__seed0"])) == ["a__seed0"]
    assert "--out must be on storage every node mounts at the same path" in capsys.readouterr().out


def test_finished_runs_are_skipped_and_a_job_still_running_from_before_is_waited_for_not_started_twice(tmp_path):
    works = runs(tmp_path, ["done__seed0", "running__seed0", "gone__seed0", "other__seed0"])
    (works[0] / DONE).write_text("{}")
    (works[1] / JOB).write_text(json.dumps({"address": ADDRESS, "submission_id": "earlier"}))
    (works[2] / JOB).write_text(json.dumps({"address": ADDRESS, "submission_id": "ended"}))
    (works[3] / JOB).write_text(json.dumps({"address": "http://another:8265", "submission_id": "earlier"}))
    client = ScriptedJobs({"gone__seed0": [["SUCCEEDED"]], "other__seed0": [["SUCCEEDED"]]})
    client.jobs["earlier"] = {"states": ["RUNNING", "SUCCEEDED"], "work": works[1]}
    client.jobs["ended"] = {"states": ["FAILED"], "work": works[2]}
    assert dispatch(client).run(works) == []
    assert client.submitted == ["gone__seed0", "other__seed0"]
    assert (works[1] / DONE).exists()


def test_ctrl_c_stops_the_jobs_it_submitted_or_waits_for_and_no_other(tmp_path, capsys):
    client = ScriptedJobs({n: [["RUNNING"]] for n in ("a__seed0", "b__seed0", "c__seed0")},
                          foreign=("someone-elses-job",))
    client.interrupt_after = 4
    works = runs(tmp_path, ["a__seed0", "b__seed0", "c__seed0"])
    with pytest.raises(SystemExit, match="interrupted: the jobs it submitted were stopped"):
        dispatch(client, max_parallel=2).run(works)
    assert sorted(client.stopped) == sorted(s for s, j in client.jobs.items() if j["work"] in works[:2])
    assert "someone-elses-job" not in client.stopped and client.submitted == ["a__seed0", "b__seed0"]


def compose(*overrides):
    from egpo.preflight.compose import compose as compose_config

    return compose_config(str(RECIPES), "cpu_smoke", list(overrides))


def test_what_a_run_asks_of_a_node_and_how_many_runs_a_cluster_holds():
    need, nnodes = run_resources(compose())
    assert (need, nnodes) == ({"GPU": 1.0, "cpu": 1.0, "CPU": 8.0}, 1)  # recipes/cpu/base.yaml
    assert capacity([{"GPU": 2, "cpu": 2, "CPU": 16}], need, nnodes) == 2
    assert capacity([{"GPU": 2, "cpu": 2, "CPU": 12}], need, nnodes) == 1  # CPUs for one run only
    assert capacity([{"GPU": 4, "CPU": 64}], need, nnodes) == 0  # no 'cpu' resource: egpo's CPU bundles ask for it
    eight = {"GPU": 8.0}
    assert capacity([{"GPU": 8}, {"GPU": 8}, {"GPU": 4}], eight, 1) == 2
    assert capacity([{"GPU": 8}, {"GPU": 8}, {"GPU": 8}], eight, 2) == 1  # a 2-node run takes two whole nodes
    assert capacity([{"GPU": 16}], eight, 1) == 2


def test_a_cluster_that_cannot_place_one_run_is_refused_before_any_job(monkeypatch):
    from egpo.ablation import cluster

    monkeypatch.setattr(cluster, "nodes_resources", lambda address: [{"GPU": 4.0, "CPU": 32.0}])
    with pytest.raises(SystemExit, match=r"cannot place one run: each asks GPU 1, cpu 1, CPU 8 .*GPU 4, cpu 0, CPU 32"):
        cluster.default_max_parallel(ADDRESS, compose())
    gpu_run = compose("trainer.device=cuda", "actor_rollout_ref.rollout.name=vllm")
    assert cluster.default_max_parallel(ADDRESS, gpu_run) == 4


def test_the_jobs_runtime_env_adds_the_users_to_egpos(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/shared/src")
    env = runtime_env('{"env_vars": {"HF_HOME": "/shared/hf", "PYTHONUNBUFFERED": "0"}, "pip": ["x"]}')
    assert env == {"pip": ["x"], "env_vars": {"PYTHONUNBUFFERED": "0", "PYTHONPATH": "/shared/src",
                                              "HF_HOME": "/shared/hf"}}
    with pytest.raises(SystemExit, match="must be a JSON object"):
        runtime_env("[1]")


def test_a_run_that_joins_a_cluster_gives_ray_init_no_node_resources_and_the_fix_works(monkeypatch):
    from egpo.ablation.cluster import CLUSTER_OVERRIDES
    from egpo.settings import EgpoConfigError
    from egpo.preflight.cpu_backend import check_cpu_backend
    from egpo.preflight.findings import refuse
    from egpo.preflight.ray_cluster import check_ray_cluster_settings

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    refuse(check_ray_cluster_settings(compose()))  # its own Ray: the recipe's counts are ray.init's
    with pytest.raises(EgpoConfigError) as refused:
        refuse(check_ray_cluster_settings(compose("++ray_kwargs.ray_init.address=auto")))
    fix = str(refused.value).rsplit(": set ", 1)[1].split()
    assert fix == ["++ray_kwargs.ray_init.num_cpus=null", "++ray_kwargs.ray_init.num_gpus=null",
                   "++ray_kwargs.ray_init.resources=null"]
    joined = compose("++ray_kwargs.ray_init.address=auto", *fix)
    refuse(check_ray_cluster_settings(joined))
    refuse(check_cpu_backend(*with_facts(joined)))  # the cluster's nodes hold the logical GPUs and 'cpu's, not ray.init
    assert list(CLUSTER_OVERRIDES) == ["++ray_kwargs.ray_init.address=auto", *fix]
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # a Ray job's entrypoint
    with pytest.raises(EgpoConfigError, match="RAY_ADDRESS=10.0.0.1:6379"):
        refuse(check_ray_cluster_settings(compose()))
    with pytest.raises(EgpoConfigError, match="num_gpus"):  # its own Ray, without the counts: refused as before
        monkeypatch.delenv("RAY_ADDRESS")
        refuse(check_cpu_backend(*with_facts(compose("++ray_kwargs.ray_init.num_gpus=null"))))


STAND_IN = """
import json, os, signal, sys, time
path = sys.argv[2]  # the attempt's metrics file, which egpo.main's command names for verl's file logger
if sys.argv[1] == "crash":  # a start-up error: nothing logged
    sys.exit(2)
if sys.argv[1] == "killed_once":  # the first attempt dies as the kernel's OOM killer ends a process
    if not os.path.exists(path + ".killed"):
        open(path + ".killed", "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    sys.argv[1] = "0"
for step in (1, 2):
    with open(path, "a") as f:
        timing = {"timing_s/step": 1.5} if sys.argv[1] == "paced" else {}
        f.write(json.dumps({"step": step, "data": {"cwd": os.getcwd(), **timing}}) + "\\n")
    if sys.argv[1] == "paced":  # a training step's time, as verl logs it
        time.sleep(1.5)
if sys.argv[1] == "sleep":
    print("training", flush=True)
    time.sleep(600)
sys.exit(int(sys.argv[1]) if sys.argv[1] not in ("sleep", "paced") else 0)
"""


def attempt_run(tmp_path, how: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "train.py"
    script.write_text(STAND_IN)
    work = tmp_path / "out" / "a__seed0"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        write_run(work, "a", 0, 2, [sys.executable, str(script), how, str(work / ATTEMPT_METRICS)], keep=2, timeout=0)
    finally:
        os.chdir(cwd)
    return work


def entrypoint(work: Path, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "egpo.ablation.attempt", str(work)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, **kwargs)


def test_the_job_entrypoint_runs_the_attempt_where_the_ablation_was_started_and_echoes_its_log(tmp_path):
    work = attempt_run(tmp_path, "0")
    proc = entrypoint(work, cwd="/")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert [s["data"]["cwd"] for s in read_steps(work / METRICS_FILE)] == [str(tmp_path)] * 2
    assert (work / DONE).exists() and not (work / ATTEMPT).exists()
    assert "attempt ended with status 0" in out

    failing = attempt_run(tmp_path, "3")
    (failing / DONE).unlink()
    proc = entrypoint(failing)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and json.loads((failing / FAILED).read_text())["returncode"] == 3


def test_without_a_cluster_a_killed_attempt_is_retried_and_a_run_that_fails_every_attempt_is_named(tmp_path, capsys):
    """egpo.ablation on one machine (egpo.ablation.local): an attempt killed by SIGKILL is retried and the run ends
    done; a run whose every attempt fails is returned by name, with its log's tail. That a retried run resumes from
    its checkpoint to the uninterrupted run's weights: tests/test_ablation_cluster.py (a lost node) and
    tests/test_main_cpu.py (verl's resume)."""
    from egpo.ablation.local import run_locally

    killed, failing = attempt_run(tmp_path / "killed", "killed_once"), attempt_run(tmp_path / "failing", "3")
    for work in (killed, failing):
        (work / DONE).unlink(missing_ok=True)
    assert run_locally([killed, failing], retries=1) == [failing.name]
    out = capsys.readouterr().out
    assert f"1/2 {killed.name}: FAILED (rc -9)" in out and "retrying from its last checkpoint" in out, out
    assert f"1/2 {killed.name}: done in" in out and (killed / DONE).exists()
    assert out.count(f"2/2 {failing.name}: FAILED (rc 3)") == 2 and not (failing / DONE).exists()
    assert json.loads((failing / FAILED).read_text())["returncode"] == 3
    assert run_locally([killed], retries=1) == [] and "done before, skipped" in capsys.readouterr().out


def test_on_one_machine_start_up_errors_in_a_row_stop_the_ablation_instead_of_every_run(tmp_path, capsys):
    """Attempts that fail before logging a step (a start-up error every run meets) spend no more than three attempts
    in all: then no further run starts, and the message says how many were left and how to resume."""
    from egpo.ablation.local import run_locally

    broken = [attempt_run(tmp_path / f"r{k}", "crash") for k in range(4)]
    for work in broken:
        (work / DONE).unlink(missing_ok=True)
    with pytest.raises(SystemExit) as stop:
        run_locally(broken, retries=1)
    said = str(stop.value.code)
    assert said.startswith(f"[ablation] 3 attempts in a row failed before logging a step ({broken[0].name}, "
                           f"{broken[0].name}, {broken[1].name}): no further run was started")
    assert "2 run(s) not started; failed: " + broken[0].name in said
    out = capsys.readouterr().out
    assert f"3/4 {broken[2].name}" not in out and not (broken[2] / "log.txt").exists()


def test_a_local_run_names_its_log_and_says_its_step_while_it_trains(tmp_path, capsys):
    from egpo.ablation.local import run_locally

    paced = attempt_run(tmp_path / "paced", "paced")
    (paced / DONE).unlink(missing_ok=True)
    assert run_locally([paced], retries=0) == []
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"[ablation] 1/1 {paced.name}: running (2 steps); its console: {paced / 'log.txt'}"
    assert out[1].startswith(f"[ablation] 1/1 {paced.name}: step 1/2, ")
    assert out[2].startswith(f"[ablation] 1/1 {paced.name}: step 2/2, ") and out[2].endswith(" s/step, 0s left")
    assert out[3].startswith(f"[ablation] 1/1 {paced.name}: done in")


def test_the_job_entrypoint_stopped_by_ray_records_the_attempt_and_stops_its_training(tmp_path):
    work = attempt_run(tmp_path, "sleep")
    proc = entrypoint(work)
    deadline = time.time() + 60
    while not (work / ATTEMPT).exists() and time.time() < deadline:
        time.sleep(0.2)
    training = json.loads((work / ATTEMPT).read_text())["pid"]
    os.killpg(proc.pid, signal.SIGTERM)  # what Ray's job stop sends to the entrypoint's process group
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, out
    assert json.loads((work / FAILED).read_text())["returncode"] == -signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(training, 0)


def test_the_job_entrypoint_names_the_storage_fix_when_the_run_is_not_on_its_node(tmp_path):
    proc = entrypoint(tmp_path / "not-here")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "must be on storage every node mounts at the same path" in out
    work = attempt_run(tmp_path, "0")
    spec = json.loads((work / "run.json").read_text())
    (work / "run.json").write_text(json.dumps({**spec, "cwd": str(tmp_path / "elsewhere")}))
    proc = entrypoint(work)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "is not on" in out and "start the ablation from storage" in out


def test_a_job_ray_refuses_stops_the_dispatch_and_leaves_the_submitted_ones_running(tmp_path):
    class Refusing(ScriptedJobs):
        def submit_job(self, entrypoint, submission_id, runtime_env, metadata):
            if "b__seed0" in entrypoint:
                raise RuntimeError("runtime_env: pip package 'nope' not found")
            return super().submit_job(entrypoint, submission_id, runtime_env, metadata)

    client = Refusing({"a__seed0": [["RUNNING"]]})
    with pytest.raises(SystemExit, match=r"b__seed0: Ray refused the job \(RuntimeError: runtime_env: pip package"):
        dispatch(client).run(runs(tmp_path, ["a__seed0", "b__seed0"]))
    assert client.submitted == ["a__seed0"] and client.stopped == []  # a rerun waits for it (adoption)


# --- on a shared or failing cluster (review N4, N6, N7, N9) ---------------------------------------------------------


def test_a_live_job_is_adopted_whatever_the_address_was_spelled(tmp_path):
    """An earlier invocation submitted both runs with the dashboard spelled http://10.0.0.1:8265; this one says
    http://head:8265/. Both jobs are found by their metadata and waited for, never submitted again: one run's
    job.json names it, the other's was never written (the earlier invocation died during its submission)."""
    works = runs(tmp_path, ["a__seed0", "b__seed0"])
    client = ScriptedJobs({})
    for work, sid in zip(works, ("earlier-a", "earlier-b")):
        client.jobs[sid] = {"states": ["RUNNING", "SUCCEEDED"], "work": work}
    (works[0] / JOB).write_text(json.dumps({"address": "http://10.0.0.1:8265", "submission_id": "earlier-a"}))
    assert dispatch(client, address="http://head:8265/").run(works) == []
    assert client.submitted == [] and all((w / DONE).exists() for w in works)


def test_the_job_id_is_recorded_before_the_job_is_submitted(tmp_path):
    class Recording(ScriptedJobs):
        def submit_job(self, entrypoint, submission_id, runtime_env, metadata):
            work = Path(entrypoint.split()[-1])
            self.recorded = json.loads((work / JOB).read_text())["submission_id"]
            return super().submit_job(entrypoint, submission_id, runtime_env, metadata)

    client = Recording({"a__seed0": [["SUCCEEDED"]]})
    dispatch(client).run(runs(tmp_path, ["a__seed0"]))
    assert client.recorded in client.jobs  # the id job.json held before submit_job is the job's


def test_never_more_jobs_than_the_cluster_holds_and_a_lost_node_lowers_it(tmp_path, capsys):
    """Two 8-GPU nodes and --max-parallel 3: at most 2 jobs at once; then a node is lost and at most 1."""
    names = [f"r{i}__seed0" for i in range(5)]
    client = ScriptedJobs({n: [["RUNNING", "RUNNING", "SUCCEEDED"]] for n in names})
    held = iter([2, 2, 2] + [1] * 100)
    assert dispatch(client, max_parallel=3, capacity=lambda: next(held)).run(runs(tmp_path, names)) == []
    assert client.most_running == 2
    assert "the cluster now holds 1 run(s) at once (was 2)" in capsys.readouterr().out
    # after the loss: one job at a time (the live count never exceeded 1 once capacity said 1)


def test_a_job_verl_refused_for_lack_of_gpus_is_queued_again_without_spending_a_retry(tmp_path, capsys):
    works = runs(tmp_path, ["a__seed0"])
    (works[0] / "log.txt").write_text("ValueError: Total available GPUs 0 is less than total desired GPUs 8\n")
    client = ScriptedJobs({"a__seed0": [["RUNNING", "FAILED"], ["RUNNING", "FAILED"], ["RUNNING", "SUCCEEDED"]]})
    assert dispatch(client, retries=0).run(works) == []
    assert client.submitted == ["a__seed0"] * 3
    assert capsys.readouterr().out.count("too few free GPUs for it") == 2


def test_repeated_fast_failures_stop_the_dispatch_naming_the_host(tmp_path):
    """Every job fails after one look without logging a step (a bad node): 6 runs x 2 attempts would be 12 failed
    submissions; the dispatch stops after 3 in a row, names the host, and leaves the rest to a rerun."""
    names = [f"r{i}__seed0" for i in range(6)]
    works = runs(tmp_path, names)
    for work in works:  # the attempt ran on the head (a job's entrypoint); its GPU workers on gpu-node-7
        (work / FAILED).write_text(json.dumps({"returncode": 1, "host": "head-0",
                                               "nodes": ["gpu-node-7 (10.0.0.7)"]}))
    client = ScriptedJobs({n: [["RUNNING", "FAILED"]] * 2 for n in names})
    with pytest.raises(SystemExit, match=r"3 attempts in a row failed before logging a step .* on gpu-node-7 "
                                         r"\(10\.0\.0\.7\)") as err:
        dispatch(client, max_parallel=1, retries=1).run(works)
    assert len(client.submitted) == 3 and "run(s) not started" in str(err.value)
    assert "head-0" not in str(err.value)


def test_a_failure_before_any_worker_was_placed_names_the_driver_as_such(tmp_path):
    from egpo.ablation.cluster import failed_host

    work = runs(tmp_path, ["a__seed0"])[0]
    (work / FAILED).write_text(json.dumps({"returncode": 1, "host": "head-0", "nodes": []}))
    assert failed_host(work) == "driver head-0, before any GPU worker was placed"


def test_a_failure_after_progress_is_no_fast_failure(tmp_path):
    """Runs that log steps before failing are resubmitted as before: the dispatch does not stop."""
    names = [f"r{i}__seed0" for i in range(4)]
    works = runs(tmp_path, names)

    class Progressing(ScriptedJobs):
        def get_job_status(self, sid):
            work = self.jobs[sid]["work"]
            if work is not None:
                path = work / ATTEMPT_METRICS
                step = len(read_steps(path)) + 1
                with path.open("a") as f:
                    f.write(json.dumps({"step": step, "data": {}}) + "\n")
            return super().get_job_status(sid)

    client = Progressing({n: [["RUNNING", "FAILED"], ["RUNNING", "SUCCEEDED"]] for n in names})
    assert dispatch(client, max_parallel=1, retries=1).run(works) == []
    assert len(client.submitted) == 8


def test_ray_asking_to_try_again_later_is_retried(tmp_path, capsys):
    """Right after `ray start` the job agent may not be up: Ray answers "try again later", which is retried."""
    class NotYet(ScriptedJobs):
        refusals = 2

        def submit_job(self, entrypoint, submission_id, runtime_env, metadata):
            if self.refusals:
                self.refusals -= 1
                raise RuntimeError("No available agent to submit job, please try again later.")
            return super().submit_job(entrypoint, submission_id, runtime_env, metadata)

    client = NotYet({"a__seed0": [["RUNNING", "SUCCEEDED"]]})
    assert dispatch(client).run(runs(tmp_path, ["a__seed0"])) == []
    assert client.submitted == ["a__seed0"] and capsys.readouterr().out.count("Ray asks to try again later") == 2


def test_a_cluster_that_never_takes_a_job_stops_the_wait_naming_the_cause_ray_logged(tmp_path, monkeypatch):
    """Ray answers "try again later" for good (the head's job agent could not bind its port, taken by another cluster
    on the machine): the ablation stops after its bound, quoting the line the agent logged, with the fix."""
    session = tmp_path / "raytmp" / "ray" / "session_2026-11-26_10-00-00_1" / "logs"
    session.mkdir(parents=True)
    (session / "dashboard_agent.log").write_text(
        "INFO agent.py:100 -- starting\n"
        "ERROR agent.py:200 -- OSError: [Errno 98] error while attempting to bind on address ('0.0.0.0', 52365): "
        "address already in use\nINFO agent.py:300 -- exiting\n")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))
    import ray.util.state

    def unreachable(**kwargs):  # Ray's log API goes through the very agent that is down
        raise ConnectionError("the head's agent does not answer")

    monkeypatch.setattr(ray.util.state, "list_nodes", unreachable)

    class Never(ScriptedJobs):
        def submit_job(self, entrypoint, submission_id, runtime_env, metadata):
            raise RuntimeError("No available agent to submit job, please try again later.")

    jobs = dispatch(Never({"a__seed0": []}))
    jobs.try_again_for = 0.5
    with pytest.raises(SystemExit) as err:
        jobs.run(runs(tmp_path, ["a__seed0"]))
    text = str(err.value)
    assert "answered 'No available agent to submit job, please try again later.' to every job" in text
    assert "('0.0.0.0', 52365): address already in use" in text and "dashboard_agent.log" in text
    assert "--dashboard-agent-listen-port" in text


def test_a_stalled_attempt_is_stopped_and_recorded(tmp_path):
    """The training logs its steps, then hangs (a collective waiting on a dead peer): with a stall timeout of 3 s the
    attempt ends within seconds as stalled, its training killed, and the run is failed (to be resumed)."""
    work = attempt_run(tmp_path, "sleep")
    spec = json.loads((work / "run.json").read_text())
    (work / "run.json").write_text(json.dumps({**spec, "stall_timeout": 3}))
    start = time.time()
    proc = entrypoint(work)
    out, _ = proc.communicate(timeout=120)
    assert time.time() - start < 30 and proc.returncode == 1, out
    failed = json.loads((work / FAILED).read_text())
    assert failed["ended"].startswith("stalled: nothing logged for") and failed["returncode"] == -signal.SIGKILL
    assert failed["host"] == socket.gethostname()
    assert "stalled: nothing logged" in (work / "log.txt").read_text()


class Clock:
    def __init__(self):
        self.now = 1_000.0

    def __call__(self):
        return self.now


def log_line(path: Path, step: int, training: bool) -> None:
    data = {"timing_s/step": 1.0, "actor/pg_loss": 0.1} if training else {"val-core/score": 0.3}
    with path.open("a") as f:
        f.write(json.dumps({"step": step, "data": data}) + "\n")


def test_the_first_training_step_after_a_long_validation_is_not_taken_for_a_stall(tmp_path, monkeypatch):
    """verl validates before training and logs step 0 without training metrics: that line is no training step. An 8B
    run's first step after it, at 1.5x the stall timeout, is not stopped (the first training step has twice the
    allowance, and at least twice the validation's time); after it, the watch is as strict as before."""
    from egpo.ablation import attempt

    clock = Clock()
    monkeypatch.setattr(attempt.time, "time", clock)
    metrics = tmp_path / "metrics.attempt.jsonl"
    watch = attempt.Watch(metrics, None, 1800)
    clock.now += 3000  # model load and the validation before training
    log_line(metrics, 0, training=False)
    assert watch.check() is None and watch.steps == 0
    clock.now += 1.5 * 1800  # step 1 of a slow run
    assert watch.check() is None
    log_line(metrics, 1, training=True)
    assert watch.check() is None and watch.steps == 1
    clock.now += 1801  # the second step hangs: stalled after max(1800, 5 x 0) s
    assert watch.check().startswith("stalled: nothing logged for 1801 s (allowed 1800 s; one training step so far, "
                                    "none timed yet)")
    # before the first training step: twice the validation's time where it is longer than the stall timeout
    clock.now = 0.0
    watch = attempt.Watch(tmp_path / "other.jsonl", None, 600)
    clock.now = 2000.0
    log_line(tmp_path / "other.jsonl", 0, training=False)
    watch.check()
    clock.now += 3999
    assert watch.check() is None
    clock.now += 2
    assert "no training step yet" in watch.check()


def test_the_start_has_an_allowance_of_its_own_and_the_steps_keep_theirs(tmp_path, monkeypatch):
    """--start-timeout: the allowance before the first training step (a start on a loaded machine, an engine's load)
    alone; twice the validation's time still extends it; after the first step the stall allowance is the step's."""
    from egpo.ablation import attempt

    clock = Clock()
    monkeypatch.setattr(attempt.time, "time", clock)
    metrics = tmp_path / "metrics.attempt.jsonl"
    watch = attempt.Watch(metrics, None, 168, start_timeout=900)
    clock.now += 900
    assert watch.check() is None  # 900 s of start with nothing logged: within the start's allowance
    clock.now += 1.5
    assert watch.check().startswith("stalled: nothing logged for 902 s (allowed 900 s; no training step yet)")
    watch = attempt.Watch(metrics.with_name("b.jsonl"), None, 168, start_timeout=900)
    clock.now += 600
    log_line(metrics.with_name("b.jsonl"), 0, training=False)  # the validation, 600 s after the start
    watch.check()
    clock.now += 1199
    assert watch.check() is None  # twice the validation's time (1200 s) is longer than the start's 900 s
    log_line(metrics.with_name("b.jsonl"), 1, training=True)
    watch.check()
    clock.now += 169
    assert "allowed 168 s" in watch.check()  # a step's allowance is the stall timeout's, not the start's
    assert attempt.Watch(metrics, None, 168).start_timeout == 336  # none given: twice the stall timeout
    assert attempt.Watch(metrics, None, None).start_timeout is None


def test_a_line_being_written_waits_for_its_end(tmp_path, monkeypatch):
    from egpo.ablation import attempt

    metrics = tmp_path / "m.jsonl"
    watch = attempt.Watch(metrics, None, 60)
    line = json.dumps({"step": 1, "data": {"timing_s/step": 2.0}})
    metrics.write_text(line[:10])
    watch.check()
    assert watch.steps == 0
    with metrics.open("a") as f:
        f.write(line[10:] + "\n")
    watch.check()
    assert watch.steps == 1


def test_the_stall_allowance_follows_the_recipes_response_length():
    from hydra import compose, initialize_config_dir

    from egpo.ablation.attempt import default_stall_timeout

    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        assert default_stall_timeout(compose(config_name="qwen3_8b")) == 7200  # 16K responses
        assert default_stall_timeout(compose(config_name="cpu_smoke")) == 1800


def test_a_stalled_attempt_that_logged_no_step_is_no_fast_failure(tmp_path):
    """Three attempts stopped as stalled before their first step (a slow first step, not a bad node) are resubmitted
    and never halt the dispatch; three that failed on their own do."""
    names = [f"r{i}__seed0" for i in range(3)]

    class Stalling(ScriptedJobs):
        def get_job_status(self, sid):
            state = super().get_job_status(sid)
            work = self.jobs[sid]["work"]
            if work is not None and state == "FAILED":
                (work / FAILED).write_text(json.dumps({"returncode": -9, "host": "gpu-node-1",
                                                       "ended": "stalled: nothing logged for 7300 s"}))
            return state

    client = Stalling({n: [["RUNNING", "FAILED"], ["RUNNING", "SUCCEEDED"]] for n in names})
    assert dispatch(client, max_parallel=1, retries=1).run(runs(tmp_path, names)) == []
    assert len(client.submitted) == 6


def test_sigterm_ends_the_ablation_through_ctrl_cs_path(monkeypatch):
    """A scheduler's SIGTERM raises the KeyboardInterrupt Ctrl-C raises, so it stops what the ablation started the
    same way (the cluster test sends Ctrl-C to a real ablation)."""
    from egpo.ablation import cli

    class Parsed(Exception):
        pass

    class Args:
        def __getattr__(self, name):
            raise Parsed

    installed = {}
    monkeypatch.setattr(cli, "parse", lambda argv: Args())
    monkeypatch.setattr(cli.signal, "signal", lambda signum, handler: installed.setdefault(signum, handler))
    with pytest.raises(Parsed):
        cli.main(["--arms", "grpo"])
    assert installed == {signal.SIGTERM: cli.stop_as_on_ctrl_c}
    with pytest.raises(KeyboardInterrupt):
        cli.stop_as_on_ctrl_c(signal.SIGTERM, None)


def test_a_cluster_that_takes_jobs_without_a_token_is_said_to_in_one_line(capsys):
    """The ablation asks the dashboard's jobs API for its jobs with no token: a cluster that answers (no token
    authentication) is said to accept jobs from anyone; one that refuses (401, Ray's token mode) or does not answer
    is not."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from egpo.ablation import cluster

    def dashboard(status):
        class Jobs(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(status if self.path == "/api/jobs/" else 404)
                self.end_headers()
                self.wfile.write(b"[]")

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Jobs)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server, f"http://127.0.0.1:{server.server_address[1]}"

    for status, expected in ((200, True), (401, False), (403, False), (500, None)):
        server, address = dashboard(status)
        try:
            assert cluster.accepts_jobs_without_a_token(address) is expected, status
        finally:
            server.shutdown()
    assert cluster.accepts_jobs_without_a_token("http://127.0.0.1:1") is None  # nothing listens
    server, address = dashboard(200)
    try:
        with pytest.raises(SystemExit):  # not a Ray dashboard: the client refuses it, after the one line
            cluster.connect(address)
    finally:
        server.shutdown()
    said = [line for line in capsys.readouterr().out.splitlines() if "accepts jobs without a token" in line]
    assert said == [cluster.OPEN_CLUSTER.format(address=address)]
