"""kill_tree stops a run as a lost node stops it: the driver's process group and the processes below it that sit in
groups of their own, as Ray's workers do (a signal to the driver's group alone leaves those running)."""

import os
import signal
import subprocess
import sys
import time

import psutil

from egpo.process_tree import kill_tree

# a driver that starts a worker in a process group of its own (as Ray's raylet starts its workers), then waits
DRIVER = """
import os, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], preexec_fn=os.setpgrp)
print(worker.pid, flush=True)
time.sleep(600)
"""


def started():
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    worker = int(proc.stdout.readline())
    assert os.getpgid(worker) == worker != proc.pid  # a group of its own
    return proc, worker


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_signal_to_the_drivers_group_alone_leaves_the_worker_running():
    proc, worker = started()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        time.sleep(0.5)
        assert not gone(worker)
    finally:
        os.kill(worker, signal.SIGKILL)


def test_kill_tree_stops_the_driver_and_the_worker_in_its_own_group():
    proc, worker = started()
    kill_tree(proc.pid)
    proc.wait(timeout=30)
    end = time.time() + 30
    while not gone(worker) and time.time() < end:
        time.sleep(0.05)
    assert gone(worker)
    kill_tree(proc.pid)  # a tree already gone: nothing to do, nothing raised
