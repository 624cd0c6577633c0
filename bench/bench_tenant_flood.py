"""Denial of service by one tenant (issue 15): 10,000 pending pods in one namespace.

Run against the control plane of `e2e/cluster.sh` named by the `KAI_RAY_E2E_*`
variables (started if it is not up; left up):

    KAI_RAY_E2E_PORT_BASE=30400 KAI_RAY_E2E_RUN=/tmp/kai-ray-e2e-soak \\
    KAI_RAY_E2E_ETCD_DATA=/dev/shm/kai-ray-e2e-soak-etcd \\
        .venv/bin/python -m bench.bench_tenant_flood [--pods 10000] [--nodes 100]

`--nodes` kwok nodes of 8 GPUs; two teams under one department. The flooding
team's queue may hold 64 GPUs; it submits `--pods` pods at once (16 client
threads, through kai-ray's admission webhook), half asking for one GPU (all but
64 then wait for the queue's limit), half for 9 (which no node has): every
cycle meets them all. Once they are all seen pending, the other team submits a
Job of four one-GPU pods (a gang of four). Measured:

- cycles and seconds from the Job's creation to its last bind (target: within
  three cycles);
- the cycle's duration while the flood waits (mean and the largest seen), from
  the operator's metrics, with each step's mean (`kai_ray_cycle_step_duration_seconds`)
  in the same 30 s;
- the operator's resident memory, largest seen (target: under 1 GiB).

Prints the figures as JSON; not a test (creating 10,000 pods takes minutes).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config

from tests.builders import make_queue
from tests.e2e.nodes import GpuNodeSpec, create_gpu_nodes
from tests.e2e.operator_process import OperatorProcess, Operators
from tests.e2e.workloads import IMAGE, job

REPO = Path(__file__).resolve().parents[1]
E2E = REPO / "e2e"
POOL = "kai-ray.io/e2e-pool"


def sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def connect() -> tuple[client.ApiClient, Path, str]:
    sh(str(E2E / "cluster.sh"), "up")
    exports = dict(re.findall(r"^export (\w+)=(.*)$", sh(str(E2E / "cluster.sh"), "env"), re.M))
    kubeconfig = Path(exports["KUBECONFIG"])
    kubectl = exports["KAI_RAY_E2E_KUBECTL"]
    sh(kubectl, "--kubeconfig", str(kubeconfig), "apply", "--server-side", "--force-conflicts",
       "-f", str(REPO / "crds"))  # fmt: skip
    return config.new_client_from_config(config_file=str(kubeconfig)), kubeconfig, kubectl


def flood_pod(name: str, queue: str, gpus: int, tag: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"kai-ray.io/queue": queue}},
        "spec": {
            "schedulerName": "kai-ray",
            "nodeSelector": {POOL: tag},
            "containers": [
                {
                    "name": "c",
                    "image": IMAGE,
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def step_sums(text: str) -> dict[str, float]:
    """From a metrics page: seconds spent in each step of the cycle, added up, by
    `step:NAME`."""
    sums = {
        f"step:{step}": float(value)
        for step, value in re.findall(
            r'^kai_ray_cycle_step_duration_seconds_sum\{step="(\w+)"\} ([0-9.e+-]+)$', text, re.M
        )
    }
    return sums


class Sampler(threading.Thread):
    """The operator's RSS and cycle metrics, twice a second."""

    def __init__(self, replica: OperatorProcess) -> None:
        super().__init__(daemon=True)
        self.replica, self.stop = replica, threading.Event()
        port = replica.argv[replica.argv.index("--metrics-port") + 1]
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.peak_rss_mib = 0.0
        self.cycles: list[tuple[float, float, float]] = []  # (time, count, sum of seconds)
        #: (time, the sums of every step's seconds)
        self.sums: list[tuple[float, dict[str, float]]] = []
        self._text = ""

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.peak_rss_mib = max(self.peak_rss_mib, self.rss_mib())
            self.cycles.append((time.monotonic(), *self.cycle_metrics()))
            self.sums.append((time.monotonic(), step_sums(self._text)))

    def rss_mib(self) -> float:
        assert self.replica.process is not None
        status = Path(f"/proc/{self.replica.process.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        return int(match.group(1)) / 1024 if match else 0.0

    def cycle_metrics(self) -> tuple[float, float]:
        try:
            with urllib.request.urlopen(self.url, timeout=2) as answer:
                text = answer.read().decode()
        except OSError:
            return (self.cycles[-1][1], self.cycles[-1][2]) if self.cycles else (0.0, 0.0)
        self._text = text
        count = re.search(r"^kai_ray_cycle_duration_seconds_count ([0-9.e+]+)$", text, re.M)
        total = re.search(r"^kai_ray_cycle_duration_seconds_sum ([0-9.e+-]+)$", text, re.M)
        return (float(count.group(1)) if count else 0.0, float(total.group(1)) if total else 0.0)

    def cycle_count(self) -> float:
        return self.cycle_metrics()[0]


def create_all(core: client.CoreV1Api, namespace: str, bodies: list[dict[str, Any]]) -> float:
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda body: core.create_namespaced_pod(namespace, body), bodies))
    return time.monotonic() - started


def pending_count(core: client.CoreV1Api, namespace: str) -> int:
    pods = core.list_namespaced_pod(namespace, _preload_content=False)
    return sum(1 for p in json.loads(pods.data)["items"] if not p["spec"].get("nodeName"))


def run(args: argparse.Namespace) -> dict[str, Any]:
    api, kubeconfig, _ = connect()
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    custom = client.CustomObjectsApi(api)
    tag = f"flood-{os.getpid()}"
    dept, flood_q, other_q = f"{tag}-dept", f"{tag}-flood", f"{tag}-other"
    total = args.nodes * 8
    for queue in (
        make_queue(dept).gpu(quota=total).build(),
        make_queue(flood_q).parent(dept).gpu(quota=32, limit=64).build(),
        make_queue(other_q).parent(dept).gpu(quota=total - 32).build(),
    ):
        custom.create_cluster_custom_object("scheduling.kai-ray.io", "v1alpha1", "queues", queue)
    for namespace in (flood_q, other_q):
        core.create_namespace({"metadata": {"name": namespace}})
    spec = GpuNodeSpec(count=args.nodes, prefix=f"{tag}-n", zone_prefix=tag,
                       extra_labels={POOL: tag})  # fmt: skip
    create_gpu_nodes(core, spec)
    time.sleep(3)  # the namespaces' default ServiceAccounts
    fleet = Operators(kubeconfig, Path(os.environ.get("KAI_RAY_E2E_RUN", "/tmp/kai-ray-e2e")), api)
    replica = fleet.ensure_primary()
    sampler = Sampler(replica)
    sampler.start()
    try:
        bodies = [
            flood_pod(f"flood-{i}", flood_q, 1 if i % 2 == 0 else 9, tag) for i in range(args.pods)
        ]
        created_s = create_all(core, flood_q, bodies)
        deadline = time.monotonic() + 600
        while pending_count(core, flood_q) > args.pods - 64 and time.monotonic() < deadline:
            time.sleep(2)
        time.sleep(5)  # several cycles with the whole flood waiting
        flood_cycles = list(sampler.cycles)
        before = sampler.cycle_count()
        submitted = time.monotonic()
        other = job(f"{tag}-job", other_q, {POOL: tag}, parallelism=4, gpus=1, min_member=4)
        other["metadata"].pop("namespace", None)
        batch.create_namespaced_job(other_q, other)
        while time.monotonic() - submitted < 300:
            pods = core.list_namespaced_pod(other_q).items
            if len(pods) == 4 and all(p.spec.node_name for p in pods):
                break
            time.sleep(0.1)
        bound_s = time.monotonic() - submitted
        cycles_to_bind = sampler.cycle_count() - before
    finally:
        sampler.stop.set()
        fleet.stop_all()
    window = [c for c in flood_cycles if c[0] > flood_cycles[-1][0] - 30] if flood_cycles else []
    durations = [
        (b[2] - a[2]) / (b[1] - a[1]) for a, b in itertools.pairwise(window) if b[1] > a[1]
    ]
    # Each step's mean over the same window.
    sums = [s for t, s in sampler.sums if window and window[0][0] <= t <= window[-1][0]]
    cycles_in_window = window[-1][1] - window[0][1] if len(window) > 1 else 0.0
    steps = {
        key.removeprefix("step:"): round(
            (sums[-1][key] - sums[0].get(key, 0.0)) / cycles_in_window, 3
        )
        for key in (sums[-1] if sums and cycles_in_window else {})
        if key.startswith("step:")
    }
    return {
        "nodes": args.nodes,
        "flood_pods": args.pods,
        "flood_created_s": round(created_s, 1),
        "other_team_job_bound_s": round(bound_s, 2),
        "other_team_job_cycles": cycles_to_bind,
        "cycle_s_while_flooded_mean": round(sum(durations) / len(durations), 3)
        if durations
        else None,
        "cycle_s_while_flooded_max": round(max(durations), 3) if durations else None,
        "step_s_while_flooded_mean": steps,
        "operator_peak_rss_mib": round(sampler.peak_rss_mib, 1),
        "namespaces_left_for_cleanup": [flood_q, other_q],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=100)
    print(json.dumps(run(parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
