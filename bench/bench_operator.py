"""The operator on a real control plane: pods bound per second against kube-scheduler.

Run: `.venv/bin/python -m bench.bench_operator [--nodes 500] [--pods 4000] [--gang 512]
[--rounds 3] [--baseline DIR] [--only kai-ray|gang|kube-scheduler] [--py-spy FILE]`
(needs the binaries of `e2e/build.sh`; it brings up its own control plane on
other ports than the e2e tests' and takes it down at the end).

1. **Throughput**: `--nodes` kwok nodes of 8 GPUs; `--pods` single-GPU pods
   created at once (16 client threads) for kai-ray, and the same pods for the
   default scheduler (kube-scheduler from the same build, its client rate limit
   lifted to 5,000 QPS), and with `--baseline` for the operator of another
   checkout (under the scheduler name `kai-ray-base`). Every scheduler runs for
   the whole run and watches every burst, as schedulers sharing a cluster do.
   The one under test is frozen (SIGSTOP) while its burst is created, then let
   go and timed to the last bind seen on a watch: the scheduler's own pace, not
   the client's. `--rounds` bursts each, every round in the other order; each
   burst and the medians are printed. Same control plane, same run.
2. **One gang**: one PodGroup of `--gang` single-GPU pods, timed from the first
   create to the last bind, and the spread between its first and last bind.
3. **A quiet cycle** in-process on the operator's own cache: 5,000 nodes and
   20,000 bound pods, nothing pending; the cycle's time and the process's peak RSS.

Prints figures; not a test. The machine's cores and memory are printed first.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config

from kai_ray.effects.kube import Informer, Kind, connect

REPO = Path(__file__).resolve().parents[1]
E2E = REPO / "e2e"
ENV = {
    "KAI_RAY_E2E_PORT_BASE": "28400",
    "KAI_RAY_E2E_RUN": "/tmp/kai-ray-bench",
    "KAI_RAY_E2E_ETCD_DATA": "/dev/shm/kai-ray-bench-etcd",
    "KAI_RAY_E2E_KUBE_SCHEDULER": "1",
    "KAI_RAY_E2E_KUBE_SCHEDULER_QPS": "5000",
    "KAI_RAY_E2E_KUBERAY": "0",
}
PODS = Kind("Pod", "v1", "pods")


def sh(*args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(
        args, check=True, capture_output=True, text=True, env={**os.environ, **(env or ENV)}
    ).stdout


@contextlib.contextmanager
def control_plane() -> Iterator[dict[str, str]]:
    sh(str(E2E / "build.sh"), "kubernetes", "etcd", "kwok")
    sh(str(E2E / "cluster.sh"), "up")
    try:
        exports = dict(
            line.removeprefix("export ").split("=", 1)
            for line in sh(str(E2E / "cluster.sh"), "env").splitlines()
            if line.startswith("export ")
        )
        yield exports
    finally:
        sh(str(E2E / "cluster.sh"), "down")


def make_nodes(core: client.CoreV1Api, count: int) -> None:
    sys.path.insert(0, str(REPO / "tests" / "e2e"))
    from nodes import GpuNodeSpec, node_manifest  # type: ignore[import-not-found]

    spec = GpuNodeSpec(count=count, prefix="bench", nodes_per_rack=8)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: core.create_node(node_manifest(i, spec)), range(count)))


def pod_body(name: str, scheduler: str, group: str | None = None) -> dict[str, Any]:
    annotations = {"kai-ray.io/pod-group": group} if group else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"kai-ray.io/queue": "bench", "bench": "true"},
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {
                        "requests": {"cpu": "100m", "nvidia.com/gpu": "1"},
                        "limits": {"nvidia.com/gpu": "1"},
                    },
                }
            ],
        },
    }


class BindWatch:
    """When each pod of a namespace was first seen bound (wall seconds)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.bound: dict[str, float] = {}
        self.stop = threading.Event()
        self.lock = threading.Lock()
        kind = Kind("Pod", "v1", f"namespaces/{namespace}/pods")
        self.informer = Informer(connect(), kind, self._listed, self._event, self.stop)
        self.informer.start()
        self.informer.synced.wait(30)

    def _seen(self, pod: dict[str, Any]) -> None:
        if (pod.get("spec") or {}).get("nodeName"):
            name = pod["metadata"]["name"]
            with self.lock:
                self.bound.setdefault(name, time.time())

    def _listed(self, kind: str, pods: list[dict[str, Any]]) -> None:
        for pod in pods:
            self._seen(pod)

    def _event(self, kind: str, event: str, pod: dict[str, Any]) -> None:
        self._seen(pod)

    def wait(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.bound) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stop.set()
        return len(self.bound) >= count


def timed_run(
    core: client.CoreV1Api,
    namespace: str,
    bodies: list[dict[str, Any]],
    timeout: float,
    scheduler_pid: int,
    spy: str | None = None,
) -> dict[str, float]:
    """Two figures per scheduler: with pods bound as they are created (creation
    paces both), and the scheduler's own throughput: it is frozen (SIGSTOP) while
    every pod is created, then let go (SIGCONT) and timed until the last bind."""
    core.create_namespace({"metadata": {"name": namespace}})
    wait_for(lambda: _has_default_sa(core, namespace), 30)
    watch = BindWatch(namespace)
    os.killpg(scheduler_pid, signal.SIGSTOP)
    try:
        start = time.time()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda body: core.create_namespaced_pod(namespace, body), bodies))
        created = time.time()
        time.sleep(2)  # let the watches settle, as a backlog would be
    finally:
        released = time.time()
        os.killpg(scheduler_pid, signal.SIGCONT)
    before = cpu_seconds(scheduler_pid)
    with profiled(scheduler_pid, spy):
        done = watch.wait(len(bodies), timeout)
    spent = {
        name: seconds - before.get(name, 0.0)
        for name, seconds in cpu_seconds(scheduler_pid).items()
    }
    times = sorted(watch.bound.values())
    last = times[-1] if times else float("nan")
    return {
        **{f"cpu_{name}_s": seconds for name, seconds in spent.items()},
        "pods": len(bodies),
        "bound": len(times),
        "all_bound": float(done),
        "create_s": created - start,
        "released_to_last_bind_s": last - released,
        "pods_per_s": len(times) / (last - released) if times else 0.0,
        "first_bind_after_release_s": (times[0] - released) if times else float("nan"),
    }


def cpu_seconds(scheduler_pid: int) -> dict[str, float]:
    """CPU seconds (user and system) spent so far by the scheduler under test and by
    the control plane's processes: who paid for a burst."""
    pids = {"scheduler": scheduler_pid}
    for name in ("kube-apiserver", "etcd", "kwok", "kube-controller-manager"):
        path = Path(ENV["KAI_RAY_E2E_RUN"]) / "pids" / f"{name}.pid"
        if path.exists():
            pids[name] = int(path.read_text())
    ticks = os.sysconf("SC_CLK_TCK")
    spent = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            spent[name] = (int(fields[11]) + int(fields[12])) / ticks
    return spent


def _has_default_sa(core: client.CoreV1Api, namespace: str) -> bool:
    try:
        core.read_namespaced_service_account("default", namespace)
    except client.exceptions.ApiException:
        return False
    return True


def wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not true after {timeout}s")
        time.sleep(0.2)


def delete_namespace(core: client.CoreV1Api, namespace: str) -> None:
    """Delete the namespace and wait until its pods are gone (the API server may be
    slow to answer while it deletes thousands: a timeout is asked again)."""
    core.delete_namespace(namespace)

    def gone() -> bool:
        try:
            return not core.list_namespaced_pod(namespace, limit=1).items
        except client.exceptions.ApiException:
            return False

    wait_for(gone, 600)


@contextlib.contextmanager
def operator(
    exports: dict[str, str],
    log: Path,
    code: Path = REPO,
    scheduler: str = "kai-ray",
    health_port: int = 28581,
) -> Iterator[int]:
    """`kai-ray operator` from the checkout (or from `code`, a worktree of a
    baseline), scheduling the pods that name `scheduler`."""
    env = {**os.environ, **exports, "PYTHONPATH": str(code)}
    args = [sys.executable, "-m", "kai_ray", "operator", "--no-webhook", "--no-leader-elect"]
    args += ["--health-port", str(health_port), "--metrics-port", "0"]
    if scheduler != "kai-ray":
        config_file = log.with_suffix(".config.yaml")
        config_file.write_text(
            "apiVersion: config.kai-ray.io/v1alpha1\nkind: SchedulerConfig\n"
            f"spec: {{schedulerName: {scheduler}}}\n"
        )
        args += ["--config", str(config_file)]
    with log.open("w") as out:
        proc = subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=code, start_new_session=True
        )
        try:
            wait_for(lambda: _ready(f"http://127.0.0.1:{health_port}/readyz"), 60)
            yield proc.pid
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextlib.contextmanager
def profiled(pid: int, out: str | None) -> Iterator[None]:
    """py-spy recording the operator (all threads, GIL-idle ones left out) while
    the block runs (from the release of a burst to its last bind); nothing when
    not asked for or py-spy is not installed."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if not out or spy is None:
        yield
        return
    args = [spy, "record", "--pid", str(pid), "--output", out, "--format", "raw", "--gil"]
    recorder = subprocess.Popen([*args, "--rate", "50"], stdout=subprocess.DEVNULL)
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.wait(60)


def _ready(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def live_figures(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {}
    with control_plane() as exports:
        kubectl = exports["KAI_RAY_E2E_KUBECTL"]
        env = {**ENV, "KUBECONFIG": exports["KUBECONFIG"]}
        sh(kubectl, "apply", "-f", str(REPO / "crds"), env=env)
        queue = f"apiVersion: scheduling.kai-ray.io/v1alpha1\nkind: Queue\nmetadata: {{name: bench}}\nspec: {{resources: {{gpu: {{quota: {args.nodes * 8}}}}}}}\n"  # noqa: E501
        subprocess.run(
            [kubectl, "apply", "-f", "-"],
            input=queue,
            text=True,
            check=True,
            env={**os.environ, **env},
            capture_output=True,
        )
        api = config.new_client_from_config(config_file=exports["KUBECONFIG"])
        api.configuration.connection_pool_maxsize = 32
        core = client.CoreV1Api(api)
        make_nodes(core, args.nodes)
        log = Path(tempfile.gettempdir()) / "kai-ray-bench-operator.log"
        os.environ["KUBECONFIG"] = exports["KUBECONFIG"]
        run = Path(ENV["KAI_RAY_E2E_RUN"])
        kube_scheduler = int((run / "pids" / "kube-scheduler.pid").read_text())
        with contextlib.ExitStack() as stack:
            # Every scheduler runs through every round (each watches every pod, as
            # schedulers sharing a cluster do); the one under test is frozen while
            # its burst is created.
            pids: dict[str, tuple[str, int]] = {}
            if args.only in ("all", "kai-ray", "gang"):
                pids["kai-ray"] = ("kai-ray", stack.enter_context(operator(exports, log)))
            if args.baseline:
                base = operator(
                    exports,
                    log.with_suffix(".baseline.log"),
                    Path(args.baseline),
                    scheduler="kai-ray-base",
                    health_port=28582,
                )
                pids["kai-ray baseline"] = ("kai-ray-base", stack.enter_context(base))
            if args.only in ("all", "kube-scheduler"):
                pids["kube-scheduler"] = ("default-scheduler", kube_scheduler)
            sides = [side for side in pids if args.only != "gang"]
            for round_ in range(args.rounds):
                # Each round in the other order, so none always goes first.
                for side in sides if round_ % 2 == 0 else sides[::-1]:
                    scheduler, pid = pids[side]
                    namespace = f"bench-{scheduler}-{round_}"
                    bodies = [pod_body(f"p{i}", scheduler) for i in range(args.pods)]
                    spy = args.py_spy if side == "kai-ray" and round_ == 0 else None
                    figures[f"{side} #{round_ + 1}"] = timed_run(
                        core, namespace, bodies, args.timeout, pid, spy
                    )
                    delete_namespace(core, namespace)
            for side in sides:
                runs = [figures[f"{side} #{r + 1}"] for r in range(args.rounds)]
                times = sorted(run["released_to_last_bind_s"] for run in runs)
                figures[f"{side} (median of {args.rounds})"] = {
                    "released_to_last_bind_s": times[len(times) // 2],
                    "pods_per_s": args.pods / times[len(times) // 2],
                    "fastest_s": times[0],
                    "slowest_s": times[-1],
                }
            if args.only in ("all", "gang"):
                mark = log.stat().st_size
                figures["gang"] = gang_run(core, api, args.gang, args.timeout)
                figures["gang"] |= cycles_that_bound(log, mark)
                delete_namespace(core, "bench-gang")
        print(f"operator log: {log}", file=sys.stderr)
    return figures


CYCLE_LINE = re.compile(r"\[cycle (\d+)\] (\d+) bound, (\d+) binding in the back")


def cycles_that_bound(log: Path, since: int) -> dict[str, float]:
    """From the operator's log after byte `since`: how many cycles bound pods (in
    the cycle or handed to the writers), and the most one cycle bound (the gang is
    bound within one cycle when it is 1)."""
    with log.open() as text:
        text.seek(since)
        lines = CYCLE_LINE.finditer(text.read())
        bound = [n for m in lines if (n := int(m.group(2)) + int(m.group(3)))]
    return {"cycles_binding": len(bound), "most_bound_in_one_cycle": max(bound, default=0)}


def gang_run(
    core: client.CoreV1Api, api: client.ApiClient, size: int, timeout: float
) -> dict[str, float]:
    namespace = "bench-gang"
    core.create_namespace({"metadata": {"name": namespace}})
    wait_for(lambda: _has_default_sa(core, namespace), 30)
    group = {
        "apiVersion": "scheduling.kai-ray.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "gang", "namespace": namespace},
        "spec": {"queue": "bench", "minMember": size},
    }
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "scheduling.kai-ray.io", "v1alpha1", namespace, "podgroups", group
    )
    watch = BindWatch(namespace)
    bodies = [pod_body(f"g{i}", "kai-ray", "gang") for i in range(size)]
    start = time.time()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda body: core.create_namespaced_pod(namespace, body), bodies))
    created = time.time()
    watch.wait(size, timeout)
    times = sorted(watch.bound.values())
    return {
        "pods": size,
        "bound": len(times),
        "create_s": created - start,
        "to_last_bind_s": (times[-1] - start) if times else float("nan"),
        "after_last_create_s": (times[-1] - created) if times else float("nan"),
        "bind_spread_s": (times[-1] - times[0]) if times else float("nan"),
    }


def quiet_cycle(nodes: int = 5000, pods: int = 20000) -> dict[str, float]:
    """A cycle with nothing to do, on the operator's cache with a full cluster."""
    from bench.bench_quiet import full_cache
    from kai_ray.decisions.cycle import run_cycle
    from kai_ray.decisions.totals import GroupTotals
    from kai_ray.values.config import SchedulerConfig

    cache = full_cache(nodes, pods)
    config_ = SchedulerConfig()
    usage = None
    totals = GroupTotals()  # kept from cycle to cycle, as the operator keeps it
    timings = []
    for cycle in range(6):
        started = time.perf_counter()
        snapshot = cache.snapshot()
        result = run_cycle(snapshot, config_, cycle, 1.0e9 + cycle, usage, totals=totals)
        usage = result.usage
        timings.append(time.perf_counter() - started)
        assert not result.plan.binds
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "nodes": nodes,
        "pods": pods,
        "first_cycle_s": timings[0],
        "quiet_cycle_ms": 1000 * min(timings[1:]),
        "peak_rss_mib": rss,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=4000)
    parser.add_argument("--gang", type=int, default=512)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--quiet-only", action="store_true")
    parser.add_argument(
        "--only",
        choices=("all", "kai-ray", "gang", "kube-scheduler"),
        default="all",
        help="run one live figure (and no quiet cycle) when looking into one",
    )
    parser.add_argument(
        "--py-spy",
        metavar="FILE",
        help="record the operator with py-spy (if installed) into FILE: collapsed stacks "
        "of the thread holding the GIL",
    )
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="also time the 4,000 pods with the operator of DIR (a git worktree), under "
        "the scheduler name kai-ray-base",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="bursts per scheduler, each round in the other order (the median is reported)",
    )
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, {platform.python_version()}, {platform.machine()}")
    if args.only == "all":
        print("quiet cycle:", quiet_cycle())
    if args.quiet_only or shutil.which("go") is None:
        return
    for name, row in live_figures(args).items():
        print(f"{name}: " + ", ".join(f"{k}={v:.2f}" for k, v in row.items()))


if __name__ == "__main__":
    main()
