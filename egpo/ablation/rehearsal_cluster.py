"""The ablation rehearsal's own Ray cluster and the faults a first run on a cluster meets.

The cluster (:mod:`egpo.ablation.own_cluster`): a head on this machine with Ray's token authentication, as
docs/ablation.md starts one, that holds the drivers and no GPU, and two nodes of the rehearsal's ranks each (logical
GPUs and 'cpu's), on ports of their own. Every arm is a Ray job through the ablation's own dispatch.

The faults, each once, each on whatever run meets it first:

* **A node lost mid-step.** The first run to log a training step on a node loses that node: every process of it
  SIGKILLed at once, as a machine that dies; a node takes its place (a replacement joining the cluster). The run's
  job fails, and the ablation resubmits it from its last checkpoint.
* **A hung step.** After that, the first attempt to log a training step that is not its run's last has its workers
  frozen, on every node: SIGSTOPped, as a stuck collective leaves them (alive, silent, their GPUs held). The attempt's stall watch,
  its allowance scaled as the rehearsal's tokens are, must stop it; the run resumes; the frozen workers must end
  with their job.

:meth:`Faults.lines` says what each fault did, held or NOT HELD, read from the runs' own records.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from egpo.ablation.own_cluster import Cluster, add_node, start_cluster
from egpo.runs.state import ATTEMPT, ATTEMPT_METRICS, DONE, LOG, RUN, TRAINING_STEP_KEY, read_steps

HEAD_CPUS = 4  # the head: the jobs' drivers and supervisors, a run's task runner where Ray puts it there
NODE_CPUS = 12  # a node: one run's workers (verl's CPU bundles, its agent-loop and reward workers) and room to spare
NODES = 2
GRACE_S = 60.0  # how long after its job the frozen workers may take to go


class RehearsalCluster:
    """The head and its nodes, started on entering and stopped (every process, by their temp dirs) on leaving. Its
    token goes into this process's environment at once, for the ablation's client: Ray reads it once per process, so
    it is made before anything of Ray's is imported, and taken back on leaving."""

    def __init__(self, ranks: int):
        self.ranks = ranks
        self.head: Cluster | None = None
        self.nodes: list[Cluster] = []
        self.retired: list[Cluster] = []  # nodes lost (kept for the stop: a killed node's stray processes)
        self.token = secrets.token_hex(32)
        self._saved_env = {key: os.environ.get(key) for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token)

    @property
    def dashboard(self) -> str:
        return self.head.dashboard

    def add(self) -> Cluster:
        node = add_node(self.head, num_cpus=NODE_CPUS, num_gpus=self.ranks, resources={"cpu": self.ranks},
                        nodes=1 + len(self.nodes) + 1)
        self.nodes.append(node)
        return node

    def lose(self, node: Cluster) -> None:
        node.kill()
        self.nodes.remove(node)
        self.retired.append(node)

    def __enter__(self) -> "RehearsalCluster":
        self.head = start_cluster(num_cpus=HEAD_CPUS, num_gpus=0, resources={}, token=self.token)
        try:
            for _ in range(NODES):
                self.add()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for node in [*self.nodes, *self.retired, *([self.head] if self.head else [])]:
            node.stop()
            shutil.rmtree(node.temp_dir, ignore_errors=True)
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _idle(proc) -> bool:
    try:
        return proc.name().startswith("ray::IDLE") or " ".join(proc.cmdline()).startswith("ray::IDLE")
    except Exception:  # noqa: BLE001 - a process that just ended
        return True


def trained_steps(work: Path) -> list[int]:
    """The training steps the run's current attempt has logged."""
    return [line["step"] for line in read_steps(work / ATTEMPT_METRICS) if TRAINING_STEP_KEY in line["data"]]


def run_steps(work: Path) -> int:
    """The training steps the run is to make (run.json)."""
    return int(json.loads((work / RUN).read_text())["steps"])


def attempt_id(work: Path) -> int | None:
    """The current attempt's training process (attempt.json), which tells one attempt of a run from the next."""
    try:
        return int(json.loads((work / ATTEMPT).read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


@dataclass
class Fault:
    run: Path | None = None
    attempt: int | None = None
    step: int = 0
    when: float = 0.0
    node: str = ""
    pids: list[int] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)  # what each process was (its command line, shortened)
    attempts_before: int = 0  # the run's attempts when the fault came, the faulted one included


class Faults(threading.Thread):
    """Watches the cluster's nodes once a second and brings each fault about once (the module's docstring)."""

    def __init__(self, cluster: RehearsalCluster, every: float = 1.0):
        super().__init__(daemon=True, name="rehearsal-faults")
        self.cluster, self.every = cluster, every
        self.lost, self.frozen = Fault(), Fault()
        self.finished = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.finished.wait(self.every):
                if self.lost.run is None:
                    self._lose_a_node()
                elif self.frozen.run is None:
                    self._freeze_a_step()
                else:
                    return
        except BaseException as err:  # noqa: BLE001 - said in the lines, never lost in a thread
            self.error = err

    def _trained_on(self):
        """(run, {node: its working processes there}, its attempt, its last training step) for each run whose current
        attempt has logged a training step; a worker Ray started ahead and left idle (``ray::IDLE``) is not the
        run's."""
        runs: dict[Path, dict] = {}
        for node in list(self.cluster.nodes):
            for work, procs in node.run_processes().items():
                working = [p for p in procs if not _idle(p)]
                if working:
                    runs.setdefault(work, {})[node] = working
        for work, where in runs.items():
            steps = trained_steps(work)
            if steps:
                yield work, where, attempt_id(work), steps[-1]

    def _lose_a_node(self) -> None:
        for work, where, attempt, step in self._trained_on():
            node = max(where, key=lambda n: len(where[n]))  # the node that holds most of the run
            self.lost = Fault(work, attempt, step, time.time(), node.temp_dir.name, [p.pid for p in where[node]],
                              attempts_before=len(_attempts(work)[0]))
            self.cluster.lose(node)
            print(f"[ablation] rehearsal: the node {node.temp_dir.name} is lost (every process of it killed at once, "
                  f"as a machine that dies) while {work.name} trains on it after step {step}; a node takes its place",
                  flush=True)
            self.cluster.add()
            return

    def _freeze_a_step(self) -> None:
        for work, where, attempt, step in self._trained_on():
            if (work, attempt) == (self.lost.run, self.lost.attempt):
                continue  # the lost attempt's lines, before its next attempt starts anew
            if step >= run_steps(work):
                continue  # its last step: what is left (a save, a validation) may not need the workers it would freeze
            stopped, names = [], {}
            for proc in (p for procs in where.values() for p in procs):
                try:
                    names[proc.pid] = " ".join(proc.cmdline())[:100].strip()
                    proc.send_signal(signal.SIGSTOP)
                    stopped.append(proc.pid)
                except Exception:  # noqa: BLE001 - a process that just ended
                    continue
            nodes = ", ".join(n.temp_dir.name for n in where)
            self.frozen = Fault(work, attempt, step, time.time(), nodes, stopped, names,
                                attempts_before=len(_attempts(work)[0]))
            print(f"[ablation] rehearsal: {work.name}'s {len(stopped)} worker process(es) on {nodes} frozen after "
                  f"step {step} (SIGSTOP, as a stuck collective leaves them): its stall watch must stop the attempt",
                  flush=True)
            return

    def stop(self) -> None:
        self.finished.set()
        self.join(timeout=30)

    def lines(self) -> tuple[list[str], bool]:
        """One line per fault, held or NOT HELD, from the runs' own records; and whether every one held."""
        if self.error is not None:
            return [f"[ablation] rehearsal: the faults' watch failed ({type(self.error).__name__}: {self.error})  "
                    "NOT HELD"], False
        lines, held = [], True
        for what, fault, check in (("a node lost mid-step", self.lost, _after_loss),
                                   ("a hung step", self.frozen, _after_freeze)):
            if fault.run is None:
                lines.append(f"[ablation] rehearsal, {what}: no run logged a training step on a node while it was "
                             "armed, so it never happened  NOT HELD")
                held = False
                continue
            line, ok = check(fault)
            lines.append(f"[ablation] rehearsal, {what}: {line}{'' if ok else '  NOT HELD'}")
            held &= ok
        return lines, held


def _attempts(work: Path) -> tuple[list[int], str]:
    """The steps each attempt of the run resumed from, and the run's log."""
    log = (work / LOG).read_text(errors="replace") if (work / LOG).exists() else ""
    return [int(s) for s in re.findall(r"\[ablation\] attempt from step (\d+)", log)], log


def _later(fault: Fault, starts: list[int]) -> str:
    """The run's attempts after the fault's, or that there was none."""
    later = starts[fault.attempts_before:]
    return (f"resumed (attempts after it from steps {later}" + (f"; all of its attempts from steps {starts}"
            if fault.attempts_before > 1 else "") + ")") if later else \
        f"never resumed (its attempts, from steps {starts}, all came before)"


def _after_loss(fault: Fault) -> tuple[str, bool]:
    starts, _ = _attempts(fault.run)
    done = (fault.run / DONE).exists()
    ok = len(starts) > fault.attempts_before and done
    return (f"{fault.run.name} lost its node after step {fault.step}; its job failed and the run "
            f"{_later(fault, starts)}, {'done' if done else 'not done'}"), ok


def _alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running after :data:`GRACE_S` seconds (Ray ends a finished job's workers soon after)."""
    import psutil

    end = time.time() + GRACE_S
    while True:
        left = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    left.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not left or time.time() >= end:
            return left
        time.sleep(0.5)


def _after_freeze(fault: Fault) -> tuple[str, bool]:
    starts, log = _attempts(fault.run)
    if fault.attempts_before:  # the frozen attempt's part of the log: a stall of another attempt (its start) is not it
        marks = [m.start() for m in re.finditer(r"\[ablation\] attempt from step \d+", log)] + [len(log)]
        at = min(fault.attempts_before, len(marks) - 1)
        log = log[marks[at - 1]:marks[at]]
    stall = re.search(r"\[ablation\] attempt stalled: (nothing logged for \d+ s \(allowed \d+ s[^)]*\))", log)
    left = _alive(fault.pids)
    leftover = "; ".join(f"{pid} ({fault.names.get(pid, '?')})" for pid in left)
    done = (fault.run / DONE).exists()
    ok = bool(stall) and done and not left and len(starts) > fault.attempts_before
    waited = f"its watch stopped the attempt ({stall.group(1)})" if stall else "its watch never stopped the attempt"
    return (f"{fault.run.name} frozen after step {fault.step}: {waited}; {_later(fault, starts)}, "
            f"{'done' if done else 'not done'}; its {len(fault.pids)} frozen process(es) "
            f"{'ended with their job' if not left else 'still there: ' + leftover}"), ok
