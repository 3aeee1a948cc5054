"""The ablation rehearsal's faults (egpo/ablation/rehearsal_cluster.py) on stand-in nodes whose "workers" are real
processes of this test: which run and node each fault picks, that a worker Ray left idle is never taken for the run's,
that the freeze does not fire on the lost attempt's stale lines, and what the closing lines say when a fault held,
did not hold, or never came. The whole rehearsal on a real cluster: tests/test_rehearse.py."""

import json
import signal
import subprocess
import sys
import time

import psutil
import pytest

from egpo.ablation.rehearsal_cluster import Fault, Faults
from egpo.runs.state import ATTEMPT, ATTEMPT_METRICS, DONE, LOG, RUN, TRAINING_STEP_KEY


class Node:
    def __init__(self, name, runs):
        self.temp_dir = type("P", (), {"name": name})()
        self.runs = runs  # run dir -> [psutil.Process]

    def run_processes(self):
        return {work: list(procs) for work, procs in self.runs.items()}


class Cluster:
    def __init__(self, nodes):
        self.nodes, self.lost, self.added = list(nodes), [], 0

    def lose(self, node):
        self.nodes.remove(node)
        self.lost.append(node)

    def add(self):
        self.added += 1


@pytest.fixture
def spawn():
    started = []

    def start(title="worker"):
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", title])
        started.append(proc)
        return psutil.Process(proc.pid)

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def log_step(work, step, pid, steps=3):
    work.mkdir(parents=True, exist_ok=True)
    (work / RUN).write_text(json.dumps({"steps": steps}))
    (work / ATTEMPT).write_text(json.dumps({"pid": pid}))
    with open(work / ATTEMPT_METRICS, "a") as f:
        f.write(json.dumps({"step": step, "data": {TRAINING_STEP_KEY: 1.0}}) + "\n")


def test_the_node_lost_is_the_one_holding_a_run_that_trained_and_idle_workers_are_not_the_runs(tmp_path, spawn):
    a, b = tmp_path / "a__seed0", tmp_path / "b__seed0"
    idle = spawn()
    idle.name = lambda: "ray::IDLE"  # a worker Ray started ahead for the job, never used
    node1 = Node("node-1", {a: [idle]})
    node2 = Node("node-2", {a: [spawn(), spawn()], b: [spawn()]})
    cluster = Cluster([node1, node2])
    faults = Faults(cluster)
    faults._lose_a_node()
    assert faults.lost.run is None and not cluster.lost  # no run has logged a training step yet
    log_step(b, 0, 10)  # a line with no step timing: the validation before training
    (b / ATTEMPT_METRICS).write_text(json.dumps({"step": 0, "data": {"val-core/x": 1.0}}) + "\n")
    faults._lose_a_node()
    assert faults.lost.run is None
    log_step(a, 1, 11)
    faults._lose_a_node()
    assert cluster.lost == [node2] and cluster.added == 1  # run a's workers, not its idle one on node-1
    assert (faults.lost.run, faults.lost.attempt, faults.lost.step) == (a, 11, 1)


def test_the_hung_step_freezes_a_later_attempts_workers_on_every_node_and_not_the_lost_attempts(tmp_path, spawn):
    a = tmp_path / "a__seed0"
    w1, w2 = spawn(), spawn()
    cluster = Cluster([Node("node-2", {a: [w1]}), Node("node-3", {a: [w2]})])
    faults = Faults(cluster)
    log_step(a, 1, 11)
    faults.lost = Fault(a, 11, 1, time.time(), "node-1")
    faults._freeze_a_step()
    assert faults.frozen.run is None  # the lost attempt's lines: its next attempt has not started anew
    (a / ATTEMPT_METRICS).unlink()
    log_step(a, 2, 12, steps=2)  # the next attempt, resumed from 1, trained step 2: its last
    faults._freeze_a_step()
    assert faults.frozen.run is None  # what is left of its last step may not need the workers a freeze would stop
    log_step(a, 2, 12, steps=3)  # the same, of a run of 3 steps
    faults._freeze_a_step()
    assert (faults.frozen.run, faults.frozen.attempt, faults.frozen.step) == (a, 12, 2)
    assert sorted(faults.frozen.pids) == sorted([w1.pid, w2.pid])
    for proc in (w1, w2):
        end = time.time() + 10  # the signal is delivered, not waited for
        while proc.status() != psutil.STATUS_STOPPED and time.time() < end:
            time.sleep(0.01)
        assert proc.status() == psutil.STATUS_STOPPED
        proc.send_signal(signal.SIGCONT)


def test_the_closing_lines_say_held_only_from_the_runs_own_records(tmp_path, spawn, monkeypatch):
    from egpo.ablation import rehearsal_cluster

    monkeypatch.setattr(rehearsal_cluster, "GRACE_S", 0.5)
    a = tmp_path / "a__seed0"
    a.mkdir()
    faults = Faults(Cluster([]))
    lines, held = faults.lines()
    assert not held and all(line.endswith("never happened  NOT HELD") for line in lines)
    frozen = spawn()
    # the run's first attempt stalled at its start (a slow machine), the second lost its node, the third froze
    start_stall = ("[ablation] attempt from step 0 on h\n[ablation] attempt stalled: nothing logged for 901 s (allowed "
                   "900 s; no training step yet); stopped, to be resumed from its last checkpoint\n")
    faults.lost = Fault(a, 11, 1, time.time(), "node-1", attempts_before=2)
    faults.frozen = Fault(a, 12, 2, time.time(), "node-2", [frozen.pid], {frozen.pid: "ray::WorkerDict"},
                          attempts_before=3)
    (a / LOG).write_text(start_stall + "[ablation] attempt from step 0 on h\n")
    lines, held = faults.lines()
    assert not held and lines[0].endswith("never resumed (its attempts, from steps [0, 0], all came before), not "
                                          "done  NOT HELD")
    (a / LOG).write_text(start_stall + "[ablation] attempt from step 0 on h\n[ablation] attempt from step 1 on h\n")
    lines, held = faults.lines()
    assert not held and lines[0].endswith("not done  NOT HELD")  # resubmitted, but not finished
    assert "its watch never stopped the attempt" in lines[1] and "still there: " in lines[1]
    (a / LOG).write_text(start_stall + "[ablation] attempt from step 0 on h\n[ablation] attempt from step 1 on h\n"
                         "[ablation] attempt from step 2 on h\n")
    (a / DONE).write_text("{}")
    lines, held = faults.lines()  # the start's stall is not the frozen attempt's
    assert not held and "its watch never stopped the attempt" in lines[1]
    (a / DONE).unlink()
    (a / LOG).write_text(start_stall + "[ablation] attempt from step 0 on h\n[ablation] attempt from step 1 on h\n"
                         "[ablation] attempt stalled: nothing logged for 170 s (allowed 168 s; one training step so "
                         "far, none timed yet); stopped, to be resumed from its last checkpoint\n"
                         "[ablation] attempt from step 2 on h\n")
    (a / DONE).write_text("{}")
    lines, held = faults.lines()
    assert not held and f"still there: {frozen.pid} (ray::WorkerDict)  NOT HELD" in lines[1]  # a frozen worker left
    frozen.kill()
    frozen.wait(timeout=10)
    lines, held = faults.lines()
    assert held, lines
    assert lines[1].endswith("its watch stopped the attempt (nothing logged for 170 s (allowed 168 s; one training "
                             "step so far, none timed yet)); resumed (attempts after it from steps [2]; all of its "
                             "attempts from steps [0, 0, 1, 2]), done; its 1 frozen process(es) ended with their job")
    assert lines[0].endswith("resumed (attempts after it from steps [1, 2]; all of its attempts from steps "
                             "[0, 0, 1, 2]), done")


def test_a_clusters_worker_ports_are_free_and_outside_the_ports_the_kernel_hands_out():
    """A worker range inside the ephemeral range took, in another run on the machine, the rendezvous port verl had just
    picked (EADDRINUSE): the range is outside it, free when chosen, and holds none of the node's own ports."""
    import random
    import socket

    from egpo.ablation.own_cluster import WORKER_PORTS, ephemeral_ports, worker_ports_clear_of

    low_e, high_e = ephemeral_ports()
    rng = random.Random(0)
    for _ in range(20):
        low = worker_ports_clear_of([], rng)
        assert low >= 20000 and (low + WORKER_PORTS < low_e or low > high_e)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        for _ in range(20):  # a node's own port, and a port some program holds, never inside the range
            low = worker_ports_clear_of([low_e - 150], rng)
            assert not low <= low_e - 150 <= low + WORKER_PORTS and not low <= taken <= low + WORKER_PORTS
