"""The ablation's runs as Ray jobs on an existing cluster: submitted as many at once as the cluster places, waited
for, failed ones resubmitted from their last checkpoint, and only its own jobs stopped on Ctrl-C.

Each run is one job (Ray's job-submission API, through the dashboard's address) whose entrypoint is
``python -m egpo.ablation.attempt RUN_DIR`` (:mod:`egpo.ablation.attempt`): the run's ``python -m egpo.main``, whose
``ray.init`` joins the cluster (:data:`CLUSTER_OVERRIDES`) and places the recipe's workers there. Run directories
are on storage every node sees; ``job.json`` in each names its latest job (written before the job is submitted), and
every job carries its ablation and run in Ray's job metadata, so rerunning the ablation (with the dashboard's address
spelled any way) waits for a job an earlier invocation left running instead of starting the run twice.

On a shared or failing cluster: the runs at once never exceed what the cluster's alive nodes hold, recomputed before
each submission (a lost node lowers it); a job verl refused for lack of GPUs ("Total available GPUs") is queued again
after a pause without spending a retry; a failed run is resubmitted after a pause that doubles with each failure; and
after :data:`FAST_FAILURE_LIMIT` failures in a row that logged no step (a bad node, a start-up error every run
meets), no more jobs are submitted and the ablation ends naming the hosts and the last error.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Callable

from omegaconf import OmegaConf

from egpo.ablation.attempt import FAST_FAILURE_LIMIT, last_step, log_tail, stalled
from egpo.runs.state import DONE, FAILED, JOB

# a run joins the cluster: its resources are those `ray start` gave each node, not ray.init's
CLUSTER_OVERRIDES = ("++ray_kwargs.ray_init.address=auto", "++ray_kwargs.ray_init.num_cpus=null",
                     "++ray_kwargs.ray_init.num_gpus=null", "++ray_kwargs.ray_init.resources=null")
ACTIVE = ("PENDING", "RUNNING")
ENDED = ("SUCCEEDED", "FAILED", "STOPPED")
UNREACHABLE_FOR = 900  # seconds the dashboard may be unreachable before the ablation gives up waiting (jobs run on)
NO_GPUS = "Total available GPUs"  # verl's refusal when the cluster's free GPUs cannot place the run (its resource pool)
BACKOFF_POLLS = 6  # a failed run waits this many polls before it is resubmitted, doubled with each further failure
BACKOFF_MAX = 600.0
TRY_AGAIN_FOR = 300.0  # seconds of Ray's "try again later" (no job agent) before the ablation stops, naming the cause
AGENT_LOG = "dashboard_agent.log"  # where a node's job agent logs why it did not start


def accepts_jobs_without_a_token(address: str, timeout: float = 10.0) -> bool | None:
    """Whether the dashboard at ``address`` lists jobs to a request that carries no token (its jobs API then runs any
    command anyone who reaches it sends); None: no answer either way."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{address.rstrip('/')}/api/jobs/", timeout=timeout) as answer:
            return 200 <= answer.status < 300
    except urllib.error.HTTPError as err:
        return False if err.code in (401, 403) else None
    except (OSError, ValueError):
        return None


OPEN_CLUSTER = ("[ablation] the Ray cluster at {address} accepts jobs without a token: anyone who can reach its "
                "dashboard can run any command on its nodes. Start it with token authentication (docs/ablation.md, "
                "'On a Ray cluster': RAY_AUTH_MODE=token on every node and here)")


def connect(address: str):
    """Ray's job-submission client for the cluster's dashboard (``http://HEAD:8265``), with the fix for the two ways
    it fails at once; a cluster that takes jobs from anyone is said to be so, in one line."""
    from ray.job_submission import JobSubmissionClient

    if accepts_jobs_without_a_token(address):
        print(OPEN_CLUSTER.format(address=address), flush=True)
    try:
        return JobSubmissionClient(address)
    except Exception as err:  # noqa: BLE001 - Ray raises several types here; each is explained
        text = str(err)
        if "uthentication" in text or "Unauthorized" in text:
            raise SystemExit(
                f"[ablation] the Ray cluster at {address} uses token authentication: export RAY_AUTH_MODE=token (and "
                "RAY_AUTH_TOKEN, or the token in ~/.ray/auth_token, as on the cluster's nodes) and run again. Ray: "
                + text.splitlines()[0]) from None
        raise SystemExit(f"[ablation] cannot reach the Ray dashboard at {address} ({type(err).__name__}: "
                         f"{text.splitlines()[0] if text else ''}): --ray-address is the head node's dashboard, "
                         "http://HEAD:8265 by default (`ray start --head` prints it)") from None


def run_resources(config) -> tuple[dict[str, float], int]:
    """What one run asks of each of its nodes, and how many nodes: verl places ``trainer.n_gpus_per_node`` workers on
    each of ``trainer.nnodes`` nodes, one 'GPU' each; egpo's CPU backend's bundles also ask for a 'cpu' each; and the
    CPUs the recipe gives its own Ray (``ray_kwargs.ray_init.num_cpus``), where it says."""
    per_node = int(config.trainer.n_gpus_per_node)
    need = {"GPU": float(per_node)}
    if config.trainer.get("device", "cuda") == "cpu":
        need["cpu"] = float(per_node)
    cpus = OmegaConf.select(config, "ray_kwargs.ray_init.num_cpus", default=None)
    if cpus:
        need["CPU"] = float(cpus)
    return need, int(config.trainer.nnodes)


def nodes_resources(address: str) -> list[dict[str, float]]:
    """The total resources of each alive node of the cluster."""
    from ray.util.state import list_nodes

    return [dict(node.resources_total) for node in list_nodes(address=address, limit=10000)
            if node.state == "ALIVE"]


def capacity(nodes: list[dict[str, float]], need: dict[str, float], nnodes: int) -> int:
    """How many runs the cluster's nodes hold at once: each node holds ``min(its r / need r)`` runs' share of a
    node, and a run takes ``nnodes`` such shares."""
    shares = sum(min(math.floor(node.get(r, 0.0) / n + 1e-9) for r, n in need.items()) for node in nodes)
    return shares // nnodes


def default_max_parallel(address: str, config) -> int:
    need, nnodes = run_resources(config)
    nodes = nodes_resources(address)
    runs = capacity(nodes, need, nnodes)
    if runs < 1:
        held = "; ".join(", ".join(f"{r} {node.get(r, 0):g}" for r in need) for node in nodes) or "no alive node"
        device = ("trainer.device=cpu: `ray start --num-cpus=C --num-gpus=N --resources='{\"cpu\": N}'` on each node; "
                  if "cpu" in need else "")
        raise SystemExit(
            f"[ablation] the Ray cluster at {address} cannot place one run: each asks "
            f"{', '.join(f'{r} {n:g}' for r, n in need.items())} on each of trainer.nnodes={nnodes} node(s) "
            f"(trainer.n_gpus_per_node), and its nodes hold {held}. {device}or set trainer.n_gpus_per_node to what a "
            "node has")
    return runs


def live_capacity(address: str, config) -> Callable[[], int]:
    """The runs the cluster's alive nodes hold, asked anew at each call (a lost node lowers it)."""
    need, nnodes = run_resources(config)
    return lambda: capacity(nodes_resources(address), need, nnodes)


def runtime_env(user_json: str | None) -> dict:
    """The jobs' runtime environment: unbuffered output and this PYTHONPATH (the nodes see the same paths), then
    ``--runtime-env-json`` (its ``env_vars`` merged, its other fields as given)."""
    env = {"PYTHONUNBUFFERED": "1", **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH")
                                       else {})}
    user = json.loads(user_json) if user_json else {}
    if not isinstance(user, dict):
        raise SystemExit(f"[ablation] --runtime-env-json must be a JSON object (Ray's runtime_env), got {user_json!r}")
    return {**user, "env_vars": {**env, **user.get("env_vars", {})}}


class JobDispatch:
    """Submits prepared run directories as jobs, at most ``max_parallel`` at once (and never more than
    ``capacity()``, the runs the cluster's alive nodes hold, asked before each submission), and waits for all of
    them."""

    def __init__(self, client, address: str, max_parallel: int, retries: int, env: dict, python: str,
                 poll: float = 5.0, capacity: Callable[[], int] | None = None):
        self.client, self.address, self.max_parallel, self.retries = client, address, max_parallel, retries
        self.env, self.python, self.poll, self.capacity = env, python, poll, capacity
        self.active: dict[str, Path] = {}  # submission id -> run directory
        self.state: dict[str, str] = {}
        self.attempts: dict[Path, int] = {}
        self.failures: dict[Path, int] = {}  # failed attempts of each run, for its backoff
        self.not_before: dict[Path, float] = {}  # a queued run waits until then
        self.steps_at_submit: dict[Path, int] = {}
        self.fast_failures: list[tuple[str, str]] = []  # (run, host) of the failures in a row that logged no step
        self.held = max_parallel  # the last capacity the cluster answered
        self.try_again_since: float | None = None  # since when Ray has answered "try again later" to every submission
        self.try_again_for = TRY_AGAIN_FOR

    def status(self, sid: str) -> str:
        state = self.client.get_job_status(sid)
        return str(getattr(state, "value", state))

    def submit(self, work: Path) -> str:
        sid = f"egpo-{work.name}-{uuid.uuid4().hex[:8]}"
        # written first: an invocation killed during the submission leaves the id a rerun looks up
        (work / JOB).write_text(json.dumps({"address": self.address, "submission_id": sid, "submitted": None}) + "\n")
        self.client.submit_job(entrypoint=shlex.join([self.python, "-m", "egpo.ablation.attempt", str(work)]),
                               submission_id=sid, runtime_env=self.env,
                               metadata={"egpo_ablation": str(work.parent), "egpo_run": work.name})
        (work / JOB).write_text(json.dumps({"address": self.address, "submission_id": sid,
                                            "submitted": time.time()}) + "\n")
        self.active[sid] = work
        self.attempts[work] = self.attempts.get(work, 0) + 1
        self.steps_at_submit[work] = last_step(work)
        print(f"[ablation] {work.name}: submitted as job {sid}", flush=True)
        return sid

    def live_jobs(self) -> dict[tuple[str, str], str] | None:
        """This cluster's pending or running egpo jobs, by (ablation folder, run name), from the metadata every job
        carries (None: the cluster did not say)."""
        try:
            jobs = self.client.list_jobs()
        except Exception:  # noqa: BLE001 - job.json is looked up instead
            return None
        live = {}
        for job in jobs:
            metadata = getattr(job, "metadata", None) or {}
            state = str(getattr(job.status, "value", job.status))
            if state in ACTIVE and "egpo_run" in metadata and getattr(job, "submission_id", None):
                live[(metadata.get("egpo_ablation"), metadata["egpo_run"])] = job.submission_id
        return live

    def adopt(self, work: Path, live: dict | None) -> bool:
        """A job an earlier invocation submitted for this run and left pending or running: waited for, not
        started twice. Found by the job's metadata on this cluster, whatever address the earlier invocation spelled;
        where the cluster cannot list its jobs, by the id in ``job.json``."""
        sid = None
        if live is not None:
            sid = live.get((str(work.parent), work.name))
        elif (work / JOB).exists():
            sid = json.loads((work / JOB).read_text()).get("submission_id")
        if sid is None:
            return False
        try:
            state = self.status(sid)
        except Exception:  # noqa: BLE001 - a job the cluster no longer knows: the run is submitted again
            return False
        if state not in ACTIVE:
            return False
        self.active[sid] = work
        self.attempts[work] = 1
        self.steps_at_submit[work] = last_step(work)
        print(f"[ablation] {work.name}: job {sid} is still {state}, waiting for it", flush=True)
        return True

    def limit(self) -> int:
        """Jobs allowed at once now: ``max_parallel``, and no more than the cluster's alive nodes hold (asked anew;
        its last answer where it does not answer)."""
        if self.capacity is not None:
            try:
                held = int(self.capacity())
            except Exception:  # noqa: BLE001 - the state API is down for a moment: the last answer stands
                held = self.held
            if held < self.held:
                print(f"[ablation] the cluster now holds {held} run(s) at once (was {self.held}): no more jobs than "
                      "that", flush=True)
            self.held = held
        return max(0, min(self.max_parallel, self.held))

    def next_ready(self, queue: deque) -> Path | None:
        """The first queued run whose pause is over (taken out of the queue), or None."""
        now = time.time()
        for work in list(queue):
            if self.not_before.get(work, 0.0) <= now:
                queue.remove(work)
                return work
        return None

    def run(self, runs: list[Path]) -> list[str]:
        """Every run to its end; returns the names of those that failed every attempt."""
        live = self.live_jobs()
        queue = deque(work for work in runs if not (work / DONE).exists() and not self.adopt(work, live))
        for work in runs:
            if (work / DONE).exists():
                print(f"[ablation] {work.name}: done before, skipped", flush=True)
        failed: list[str] = []
        unreachable_since = None
        try:
            while queue or self.active:
                while queue and not self.halted() and len(self.active) < self.limit():
                    work = self.next_ready(queue)
                    if work is None:
                        break
                    try:
                        self.submit(work)
                        self.try_again_since = None
                    except Exception as err:  # noqa: BLE001 - Ray's errors here are many; each is reported whole
                        if "try again later" in str(err).lower():  # the job agent is not up yet (just after ray start)
                            self.try_again_since = self.try_again_since or time.time()
                            waited = time.time() - self.try_again_since
                            if waited > self.try_again_for:
                                raise SystemExit(no_job_agent(self.address, waited, str(err))) from None
                            print(f"[ablation] {work.name}: Ray asks to try again later ({err}); retrying "
                                  f"({waited:.0f} s of at most {self.try_again_for:.0f})", flush=True)
                            queue.appendleft(work)
                            self.not_before[work] = time.time() + self.poll * BACKOFF_POLLS
                            break
                        raise SystemExit(f"[ablation] {work.name}: Ray refused the job ({type(err).__name__}: {err}); "
                                         "the jobs already submitted run on: rerun the same command to wait for "
                                         "them and submit the rest") from None
                if self.halted() and not self.active:
                    break
                time.sleep(self.poll)
                try:
                    states = {sid: self.status(sid) for sid in list(self.active)}
                except Exception as err:  # noqa: BLE001 - a dashboard restart must not end a week of runs
                    unreachable_since = unreachable_since or time.time()
                    if time.time() - unreachable_since > UNREACHABLE_FOR:
                        raise SystemExit(f"[ablation] the Ray dashboard at {self.address} has not answered for "
                                         f"{UNREACHABLE_FOR} s ({err}); the jobs run on: rerun the same command to "
                                         "wait for them again") from None
                    continue
                unreachable_since = None
                for sid, state in states.items():
                    self.changed(sid, state, queue, failed)
        except KeyboardInterrupt:
            self.stop_all()
            raise SystemExit("[ablation] interrupted: the jobs it submitted were stopped; rerun the same command to "
                             "resume them from their last checkpoints") from None
        if self.halted():
            hosts = sorted({host for _, host in self.fast_failures if host})
            raise SystemExit(
                f"[ablation] {len(self.fast_failures)} attempts in a row failed before logging a step "
                f"({', '.join(name for name, _ in self.fast_failures)}) on "
                f"{', '.join(hosts) or 'hosts not recorded'}: no more jobs were submitted, so that one bad node or "
                f"one start-up error does not fail every run. {len(queue)} run(s) not started"
                f"{'; failed: ' + ', '.join(failed) if failed else ''}. Read the runs' log.txt, fix the node or the "
                "config, and rerun the same command: it resumes every run from its last checkpoint")
        return failed

    def halted(self) -> bool:
        return len(self.fast_failures) >= FAST_FAILURE_LIMIT

    def changed(self, sid: str, state: str, queue: deque, failed: list[str]) -> None:
        work = self.active[sid]
        if state == self.state.get(sid):
            return
        self.state[sid] = state
        if state in ACTIVE:
            print(f"[ablation] {work.name}: {state} (job {sid})", flush=True)
            return
        del self.active[sid]
        if state == "SUCCEEDED" and (work / DONE).exists():
            print(f"[ablation] {work.name}: done (job {sid})", flush=True)
            self.fast_failures.clear()
            return
        if state == "SUCCEEDED":
            failed.append(work.name)
            print(f"[ablation] {work.name}: job {sid} succeeded but {work / DONE} does not exist here: the ablation's "
                  "--out must be on storage every node mounts at the same path", flush=True)
            return
        message = ""
        try:
            # Ray's message ends with the job's last logs; the run's own log's tail follows below
            message = (self.client.get_job_info(sid).message or "").split(", last available logs")[0].splitlines()[0]
        except Exception:  # noqa: BLE001 - the log's tail below says what happened
            pass
        tail = log_tail(work)
        if state == "FAILED" and NO_GPUS in tail + message:
            # verl found the cluster's free GPUs too few (another tenant, a lost node, jobs still releasing theirs):
            # not the run's failure, so no retry is spent
            self.attempts[work] -= 1
            self.not_before[work] = time.time() + self.backoff(work)
            queue.append(work)
            print(f"[ablation] {work.name}: verl found too few free GPUs for it (job {sid}); queued again, without "
                  "spending a retry", flush=True)
            return
        if state == "FAILED":
            self.failures[work] = self.failures.get(work, 0) + 1
            if last_step(work) <= self.steps_at_submit.get(work, 0) and not stalled(work):
                # no step logged: a bad node or a start-up error every run meets. An attempt its watch stopped as
                # stalled ran (slowly) on a node that works: it is resumed, and counts towards no halt
                self.fast_failures.append((work.name, failed_host(work)))
            else:
                self.fast_failures.clear()
        again = state == "FAILED" and self.attempts[work] <= self.retries
        pause = self.backoff(work) if again else 0.0
        print(f"[ablation] {work.name}: {state} (job {sid}{'; ' + message if message else ''})"
              f"{f', resubmitting from its last checkpoint in {pause:.0f} s' if again else ''}; the end of "
              f"{work.name}/log.txt:\n" + tail, flush=True)
        if again:
            self.not_before[work] = time.time() + pause
            queue.appendleft(work)
        else:
            failed.append(work.name)

    def backoff(self, work: Path) -> float:
        """Seconds a run waits before it is submitted again: BACKOFF_POLLS polls, doubled with each of its failures."""
        return min(BACKOFF_MAX, self.poll * BACKOFF_POLLS * 2 ** max(0, self.failures.get(work, 1) - 1))

    def stop_all(self, wait: float = 60.0) -> None:
        """Stops the jobs this dispatch submitted or waits for, and no other."""
        for sid, work in self.active.items():
            try:
                self.client.stop_job(sid)
                print(f"[ablation] {work.name}: stopping job {sid}", flush=True)
            except Exception as err:  # noqa: BLE001 - reported; the others are stopped all the same
                print(f"[ablation] {work.name}: could not stop job {sid}: {err}", flush=True)
        end = time.time() + wait
        while self.active and time.time() < end:
            for sid in list(self.active):
                try:
                    if self.status(sid) in ENDED:
                        print(f"[ablation] {self.active.pop(sid).name}: job {sid} stopped", flush=True)
                except Exception:  # noqa: BLE001
                    self.active.pop(sid)
            time.sleep(1)


def no_job_agent(address: str, waited: float, answer: str) -> str:
    """The ablation's last words when the cluster never took a job: Ray's answer, and the cause its job agent logged
    where this machine can read it."""
    cause = agent_log_cause(address)
    said = (f" Ray's job agent logged: {cause}" if cause else
            f" No cause could be read from here: look at {AGENT_LOG} in the logs folder of the head's Ray session "
            "(/tmp/ray/session_latest/logs by default).")
    return (f"[ablation] the Ray cluster at {address} answered '{answer}' to every job for {waited:.0f} s: its job "
            f"agent is not running.{said} A port taken by another Ray cluster on the same machine is the usual cause: "
            "stop that cluster, or restart this one with ports of its own (ray start --head --dashboard-agent-listen-"
            "port=... --dashboard-agent-grpc-port=...), then rerun the same command; nothing was lost.")


AGENT_TROUBLE = ("error", "exception", "address already in use", "failed", "cannot", "could not")


def agent_log_cause(address: str, tmp: str | None = None) -> str | None:
    """The last line of trouble in the head's job-agent log: through Ray's log API, else in this machine's Ray
    sessions (the ablation often runs on the head), newest first; None where neither has one."""
    lines: list[str] = []
    where = ""
    try:
        from ray.util.state import get_log, list_nodes

        head = next(n for n in list_nodes(address=address, limit=1000) if getattr(n, "is_head_node", False))
        lines = "".join(get_log(address=address, node_id=head.node_id, filename=AGENT_LOG, tail=400,
                                timeout=10)).splitlines()
        where = f"{AGENT_LOG} on the head"
    except Exception:  # noqa: BLE001 - the log API goes through the very agent that may be down
        root = Path(tmp or os.environ.get("RAY_TMPDIR") or "/tmp") / "ray"
        logs = sorted(root.glob(f"session_*/logs/{AGENT_LOG}"), key=lambda p: p.stat().st_mtime, reverse=True)
        for log in logs[:3]:
            lines = log.read_text(errors="replace").splitlines()[-400:]
            if any(word in line.lower() for line in lines for word in AGENT_TROUBLE):
                where = str(log)
                break
        else:
            return None
    trouble = [line.strip() for line in lines if any(word in line.lower() for word in AGENT_TROUBLE)]
    return f"{trouble[-1][:400]} ({where})" if trouble else None


def failed_host(work: Path) -> str:
    """Where the run's last failed attempt ran (``failed.json``): the nodes it placed its GPU workers on, or, where it
    failed before placing them, the host of its driver (the head, on a cluster) said as such; or ''."""
    try:
        failed = json.loads((work / FAILED).read_text())
    except (OSError, ValueError):
        return ""
    if failed.get("nodes"):
        return " + ".join(failed["nodes"])
    return f"driver {failed['host']}, before any GPU worker was placed" if failed.get("host") else ""
