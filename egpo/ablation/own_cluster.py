"""A Ray cluster of the caller's own on this machine, for the ablation's rehearsal (and the tests): ``ray start
--head`` on free ports with a temp dir of its own and Ray's token authentication (a token of its own), and nodes
that join it, each with a temp dir of its own (:func:`add_node`), so that one can be lost on its own
(:meth:`Cluster.kill`: every process of that node SIGKILLed at once, as a machine that dies). Stopped by its temp dirs
(every process of this cluster names its own, other clusters' do not), never with ``ray stop``, which ends every Ray
cluster on the machine."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PORT_OPTIONS = ("--port", "--dashboard-port", "--ray-client-server-port", "--node-manager-port",
                "--object-manager-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                "--metrics-export-port", "--runtime-env-agent-port")
NODE_PORT_OPTIONS = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                     "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port")
WORKER_PORTS = 200  # a node's worker processes' port range: --min-worker-port to that + 200
RUN_PATH_VARIABLE = "VERL_FILE_LOGGER_PATH"  # in each run's workers' environment: the run's attempt-metrics file


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def ephemeral_ports() -> tuple[int, int]:
    """The range the kernel hands out ports from for a bind to port 0 (and so every "free port" another program on
    this machine picks: torch's and verl's rendezvous ports among them)."""
    try:
        low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def worker_ports_clear_of(ports, rng=None) -> int:
    """The first port of a worker range, every port of it free now, outside the kernel's ephemeral range (a worker
    range inside it took the port verl had just picked for torch's rendezvous in another run on the machine:
    EADDRINUSE, seen 2026-11-29) and below Ray's default worker ports' end (10002-19999 start above 20000), holding
    none of the node's component ports (Ray refuses a node whose worker range does, seen 2026-11-27)."""
    import random

    rng = rng or random.Random()
    ephemeral_low, ephemeral_high = ephemeral_ports()
    spans = [(20000, ephemeral_low - 1), (ephemeral_high + 1, 65535)]
    spans = [(a, b - WORKER_PORTS) for a, b in spans if b - WORKER_PORTS > a]
    for _ in range(1000):
        a, b = rng.choice(spans)
        low = rng.randint(a, b)
        if any(low <= port <= low + WORKER_PORTS for port in ports):
            continue
        if all(_bindable(port) for port in range(low, low + WORKER_PORTS + 1)):
            return low
    raise RuntimeError("no range of free worker ports outside the kernel's ephemeral ports was found")


@dataclass(eq=False)  # a node is itself: hashable by identity
class Cluster:
    """A node of a cluster of this machine's (the head, or one that joined it)."""

    temp_dir: Path
    dashboard: str  # http://127.0.0.1:PORT, the address jobs are submitted to
    env: dict  # the environment of the cluster and its clients (its token authentication)
    gcs: str = ""  # 127.0.0.1:PORT, the address another node joins

    def processes(self):
        """This node's processes: those whose command line names its temp dir, and their descendants."""
        import psutil

        me = psutil.Process()
        spared = {me.pid, *(parent.pid for parent in me.parents())}
        roots = []
        for proc in psutil.process_iter(["cmdline"]):
            if proc.pid in spared:
                continue
            try:
                if any(str(self.temp_dir) in arg for arg in proc.info["cmdline"] or ()):
                    roots.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        found = {}
        for root in roots:
            try:
                for proc in (root, *root.children(recursive=True)):
                    if proc.pid not in spared:
                        found[proc.pid] = proc
            except psutil.NoSuchProcess:
                continue
        return list(found.values())

    def run_processes(self) -> dict[Path, list]:
        """The processes of this node that work for an ablation's run, by run directory: each run's workers carry its
        attempt-metrics path in their environment (egpo.ablation.attempt.run_command)."""
        import psutil

        runs: dict[Path, list] = {}
        for proc in self.processes():
            try:
                path = proc.environ().get(RUN_PATH_VARIABLE)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if path:
                runs.setdefault(Path(path).parent, []).append(proc)
        return runs

    def kill(self) -> None:
        """The node lost at once, as a machine that dies: every process of it SIGKILLed, none told first."""
        _signal_and_wait(self.processes(), "kill", timeout=15)

    def stop(self) -> None:
        alive = _signal_and_wait(self.processes(), "terminate", timeout=5)
        _signal_and_wait(alive, "kill", timeout=15)


def _signal_and_wait(procs, how: str, timeout: float) -> list:
    """``proc.terminate()`` or ``proc.kill()`` on each, then the ones still alive after ``timeout`` seconds."""
    import psutil

    for proc in procs:
        try:
            getattr(proc, how)()
        except psutil.NoSuchProcess:
            pass
    return psutil.wait_procs(procs, timeout=timeout)[1]


def _ray() -> str:
    return str(Path(sys.executable).with_name("ray"))


def start_cluster(num_cpus: int, num_gpus: int, resources: dict, token: str | None = None) -> Cluster:
    """A head node with the given logical resources and Ray's token authentication on (``token``, else one of its
    own)."""
    temp_dir = Path(tempfile.mkdtemp(prefix="egpo-ray-", dir="/tmp"))  # short: Ray's socket paths live below it
    ports = dict(zip(PORT_OPTIONS, free_ports(len(PORT_OPTIONS) + 1)))
    worker_low = worker_ports_clear_of(ports.values())
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token or secrets.token_hex(32),
           "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    cmd = [_ray(), "start", "--head", f"--temp-dir={temp_dir}", f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}",
           f"--resources={json.dumps(resources)}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
           *(f"{option}={port}" for option, port in ports.items()),
           f"--min-worker-port={worker_low}", f"--max-worker-port={worker_low + WORKER_PORTS}"]
    cluster = Cluster(temp_dir, f"http://127.0.0.1:{ports['--dashboard-port']}", env, f"127.0.0.1:{ports['--port']}")
    started = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=temp_dir)
    if started.returncode != 0:
        cluster.stop()
        raise RuntimeError(f"ray start failed:\n{started.stdout[-3000:]}\n{started.stderr[-3000:]}")
    wait_for_dashboard(cluster)
    return cluster


def add_node(head: Cluster, num_cpus: int, num_gpus: int, resources: dict, nodes: int = 2) -> Cluster:
    """Another node of ``head``'s cluster on this machine, with a temp dir of its own (its processes name it); returns
    it as a Cluster (the head's dashboard and environment) once the cluster counts ``nodes`` alive nodes."""
    temp_dir = Path(tempfile.mkdtemp(prefix="egpo-ray-node-", dir="/tmp"))
    ports = dict(zip(NODE_PORT_OPTIONS, free_ports(len(NODE_PORT_OPTIONS))))
    worker_low = worker_ports_clear_of(ports.values())
    cmd = [_ray(), "start", f"--address={head.gcs}", f"--temp-dir={temp_dir}", f"--num-cpus={num_cpus}",
           f"--num-gpus={num_gpus}", f"--resources={json.dumps(resources)}",
           *(f"{option}={port}" for option, port in ports.items()),
           f"--min-worker-port={worker_low}", f"--max-worker-port={worker_low + WORKER_PORTS}"]
    node = Cluster(temp_dir, head.dashboard, head.env, head.gcs)
    started = subprocess.run(cmd, env=head.env, capture_output=True, text=True, timeout=300, cwd=temp_dir)
    if started.returncode != 0:
        node.stop()
        raise RuntimeError(f"ray start (a node joining) failed:\n{started.stdout[-3000:]}\n{started.stderr[-3000:]}")
    wait_for_nodes(head, nodes)
    return node


def wait_for_nodes(cluster: Cluster, count: int, timeout: float = 120) -> None:
    code = ("import sys; from ray.util.state import list_nodes; "
            "print(sum(n.state == 'ALIVE' for n in list_nodes(address=sys.argv[1])))")
    _poll(cluster, code, lambda out: out.strip().splitlines()[-1:] == [str(count)], timeout,
          f"the cluster did not count {count} alive nodes")


def wait_for_dashboard(cluster: Cluster, timeout: float = 120) -> None:
    code = ("from ray.job_submission import JobSubmissionClient; import sys; "
            "JobSubmissionClient(sys.argv[1]).list_jobs()")
    _poll(cluster, code, lambda out: True, timeout, f"the dashboard at {cluster.dashboard} did not answer")


def wait_until_idle(cluster: Cluster, nodes: int, timeout: float = 180) -> None:
    """Until ``nodes`` nodes are alive and no placement group holds their resources: Ray frees a stopped job's
    placement groups after the job has ended, so a caller that starts right after another one stopped its jobs waits
    here, not on a GPU that is still held (its runs would then share one node, one after the other)."""
    code = ("import sys; from ray.util.state import list_nodes, list_placement_groups; "
            "held = [p.placement_group_id for p in list_placement_groups(address=sys.argv[1]) if p.state != 'REMOVED']; "
            "alive = sum(n.state == 'ALIVE' for n in list_nodes(address=sys.argv[1])); print(alive, len(held), held)")
    _poll(cluster, code, lambda out: out.split()[:2] == [str(nodes), "0"], timeout,
          f"the cluster did not come to {nodes} alive nodes with no placement group held (alive, held, their ids)")


def _poll(cluster: Cluster, code: str, ready, timeout: float, failure: str) -> None:
    """Runs ``code`` (given the dashboard's address) every 2 s until it succeeds with an output ``ready`` accepts."""
    end = time.time() + timeout
    while True:
        probe = subprocess.run([sys.executable, "-c", code, cluster.dashboard], env=cluster.env,
                               capture_output=True, text=True, timeout=120)
        if probe.returncode == 0 and ready(probe.stdout):
            return
        if time.time() > end:
            raise RuntimeError(f"{failure}:\n{probe.stdout[-1000:]}{probe.stderr[-2000:]}")
        time.sleep(2)
