"""The ablation on a real Ray cluster of the test's own with two nodes on this machine (tests/ray_cluster.py: `ray
start --head` and a second `ray start` on free ports, each with a temp dir of its own and one logical GPU, with token
authentication): two seeds as Ray jobs, one on each node; then the second node is lost mid-run (every process of it
SIGKILLed): only the run it held fails, and it resumes from its last checkpoint and ends as the uninterrupted run
ends, while the run on the other node goes on untouched (its agent-loop and reward workers were on its own node);
then the status grid and the report. And Ctrl-C: the ablation stops the jobs it submitted, and no other.
Real trainer runs on the CPU smoke recipe; verl 0.9.1 only, for CI time (the dispatch is egpo's, the same on both
stacks)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ablation_runs import ARM, RUN, STEPS, ablation, training_metrics, wait_for, weights, with_demo_data
from conftest import VERL
from egpo.runs.state import ATTEMPT, ATTEMPT_METRICS, DONE, FAILED, JOB, METRICS_FILE, read_steps

if VERL == "0.7.1":
    pytest.skip("the cluster dispatch is egpo's, the same on both stacks: this slow test runs on verl 0.9.1",
                allow_module_level=True)

pytestmark = [pytest.mark.e2e]


def runs_on(node) -> list:
    """The runs whose workers a node holds (their attempt-metrics path in their environment)."""
    return sorted(node.run_processes())


@pytest.fixture(scope="module")
def cluster():
    from ray_cluster import add_node, start_cluster

    # two nodes, one CPU run each: a run asks 1 'GPU', 1 'cpu' and its recipe's 8 CPUs of a node; 12 leave room for
    # the task runner of a run whose driver is on the head and whose workers are on the other node
    cluster = start_cluster(num_cpus=12, num_gpus=1, resources={"cpu": 1})
    try:
        cluster.node = add_node(cluster, num_cpus=12, num_gpus=1, resources={"cpu": 1})
    except BaseException:
        cluster.stop()
        raise
    yield cluster
    cluster.node.stop()
    cluster.stop()
    assert not cluster.processes() and not cluster.node.processes(), "the test's Ray cluster did not stop"
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    shutil.rmtree(cluster.node.temp_dir, ignore_errors=True)


def ray_job(cluster, command: str, *args: str) -> str:
    """`ray job COMMAND ...` against the test's cluster."""
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    done = subprocess.run([ray, "job", command, "--address", cluster.dashboard, *args], env=cluster.env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout + done.stderr


def job_state(cluster, submission_id: str) -> str:
    code = ("import sys; from ray.job_submission import JobSubmissionClient; "
            "print(JobSubmissionClient(sys.argv[1]).get_job_status(sys.argv[2]).value)")
    done = subprocess.run([sys.executable, "-c", code, cluster.dashboard, submission_id], env=cluster.env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()[-1]


def start(cmd, root, cluster, name):
    """The ablation as Ctrl-C in a terminal reaches it: with SIGINT's default action, which a test run started in
    the background (``pytest &`` from a script) would otherwise pass down as ignored."""
    out = open(root / f"{name}.out", "w")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=root, env=cluster.env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)), root / f"{name}.out"


def test_stopping_the_ablation_stops_the_jobs_it_submitted_and_no_other(tmp_path, demo, cluster):
    """Ctrl-C; SIGTERM ends the ablation through the same KeyboardInterrupt (tests/test_ablation_dispatch.py)."""
    stop = signal.SIGINT
    root = with_demo_data(tmp_path, demo)
    other = f"someone-elses-job-{stop.name}"
    ray_job(cluster, "submit", "--no-wait", "--submission-id", other, "--", "sleep", "600")
    # a run of all the smoke data's steps (16), not 3: it is still training when Ctrl-C comes on a slow machine
    proc, log = start(ablation(root, "stopped", "--ray-address", cluster.dashboard, "--poll", "1", "--steps", "1000"),
                      root, cluster, "ablation")
    work = root / "stopped" / RUN
    try:
        wait_for(lambda: (work / ATTEMPT).exists(), proc, 600, "the run's job to start training")
        job = json.loads((work / JOB).read_text())["submission_id"]
        pid = json.loads((work / ATTEMPT).read_text())["pid"]
        proc.send_signal(stop)  # Ctrl-C, or a scheduler cancelling the ablation
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 1 and "interrupted: the jobs it submitted were stopped" in text, text[-3000:]
    assert f"stopping job {job}" in text and f"job {job} stopped" in text
    assert job_state(cluster, job) == "STOPPED"
    assert job_state(cluster, other) == "RUNNING"
    ray_job(cluster, "stop", other)
    # the attempt recorded its end, and its training is gone with the job
    assert json.loads((work / FAILED).read_text())["returncode"] == -signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_lost_node_fails_and_resumes_only_its_run_then_the_report(tmp_path, demo, cluster, uninterrupted_run):
    from ray_cluster import wait_until_idle

    wait_until_idle(cluster, nodes=2)  # each node's one GPU free, so that each run holds a node of its own
    root = with_demo_data(tmp_path, demo)
    out = root / "cluster"
    proc, log = start(ablation(root, "cluster", "--ray-address", cluster.dashboard, "--poll", "1", "--retries", "1",
                               "--stall-timeout", "600", seeds=(0, 1)), root, cluster, "ablation")
    works = [out / f"{ARM}__seed{seed}" for seed in (0, 1)]
    held = []

    def held_mid_run() -> bool:  # the run whose workers the second node holds has logged a step and not ended
        held[:] = runs_on(cluster.node)
        return len(held) == 1 and any(s["step"] >= 1 for s in read_steps(held[0] / ATTEMPT_METRICS)) and not (
            held[0] / DONE).exists()

    try:
        # the kill waits on the run the second node holds, not on both runs: a run started late on the head must not
        # let the other node's run finish first (seen here once under load: nothing left on the node to lose)
        wait_for(held_mid_run, proc, 900, "the run on the second node to log a step")
        jobs = {w.name: json.loads((w / JOB).read_text())["submission_id"] for w in works}  # the first jobs
        cluster.node.kill()  # the second node is lost, mid-run: its raylet, its workers, all at once
        proc.wait(timeout=1800)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 0, text[-5000:]
    assert "2 run(s) as Ray jobs" in text and "at most 2 at once" in text  # the two nodes hold one run each
    assert "accepts jobs without a token" not in text  # the test's cluster runs Ray's token authentication
    lost = [w for w in works if f"{w.name}: FAILED (job {jobs[w.name]}" in text]
    assert lost == held, text[-5000:]  # only the run the lost node held
    (kept,) = [w for w in works if w not in lost]
    assert f"{kept.name}: done (job {jobs[kept.name]})" in text  # its first job, never failed
    assert (kept / "log.txt").read_text().count("[ablation] attempt from step") == 1
    assert job_state(cluster, jobs[lost[0].name]) == "FAILED"
    starts = re.findall(r"\[ablation\] attempt from step (\d+)", (lost[0] / "log.txt").read_text())
    assert len(starts) == 2 and int(starts[1]) >= 1, starts  # resumed from its checkpoint, not restarted
    for work in works:
        assert (work / DONE).exists(), work.name
        assert [s["step"] for s in read_steps(work / METRICS_FILE)] == [1, 2, 3], work.name
        # the last --keep checkpoints, no older one
        assert sorted(p.name for p in (work / "checkpoints").glob("global_step_*")) == ["global_step_2", "global_step_3"]
    # seed 0, lost or kept, ends as the uninterrupted run of its seed: the same per-step metrics and final weights
    for ours, theirs in zip(read_steps(out / RUN / METRICS_FILE), read_steps(uninterrupted_run / METRICS_FILE)):
        assert training_metrics(ours) == training_metrics(theirs), ours["step"]
    final, expected = weights(out / RUN, STEPS), weights(uninterrupted_run, STEPS)
    assert final.keys() == expected.keys() and all(torch.equal(final[k], expected[k]) for k in expected)

    status = subprocess.run([sys.executable, "-m", "egpo.ablation", "--status", str(out)], capture_output=True,
                            text=True, timeout=120, env=cluster.env)
    assert status.returncode == 0, status.stderr
    assert f"| {ARM} | done | done |" in status.stdout and "2 done of 2 run(s)" in status.stdout
    report = subprocess.run([sys.executable, "-m", "egpo.report", str(out), "--window", "1"], capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    text = (out / "report.md").read_text()
    assert f"| {ARM} | 3 | 2 |" in text and "Left out" not in text  # both seeds, none left out
