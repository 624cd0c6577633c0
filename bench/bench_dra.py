"""DRA benchmark: one cycle with GPUs claimed through ResourceClaims against the
same workload through the `nvidia.com/gpu` extended resource, in the same run.

Run: `.venv/bin/python -m bench.bench_dra [--nodes 5000] [--gangs 12000]`.

The cluster is the hard case: `--nodes` nodes of 8 GPUs, every other node
fragmented by a running pod holding 3 of them, and a backlog larger than the free
GPUs (by default 8,000 one-pod gangs, two in three of 8 GPUs and one in three of
4: about 53,000 GPUs asked for, 32,500 free; a third of the gangs cannot be
placed), spread over four queues. The two sides are the same
pods, queues and nodes; only how GPUs are offered and asked for differs:
- **extended**: nodes offer `nvidia.com/gpu: 8`, pods request it;
- **DRA**: nodes offer no GPU resource; one ResourceSlice per node publishes 8
  devices of class `gpu.example.com` (mapped to `gpu` in `spec.dra`), and every
  pod has its own ResourceClaim (as the resource claim controller makes them from
  a template) for 8 or 4 devices with a CEL selector on the product name; the
  running pods' claims are allocated.

Printed per side: the snapshot build, the first cycle (for DRA it evaluates each
device's CEL context once), a second cycle on the same snapshot (the operator
keeps the inventory, and so those contexts, from cycle to cycle), and the pods
placed. The ratio DRA / extended is what DRA costs. Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import time
from typing import Any

from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.clock import SIM_EPOCH_S
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.dra import DraSettings
from tests.builders import make_node, make_pod, make_pod_group, make_queue

QUEUES = 4
DRIVER = CLASS = "gpu.example.com"
DEVICES = 8
HELD = 3
SELECTOR = f'device.attributes["{DRIVER}"].productName == "H100"'


def _queues(nodes: int) -> list[dict[str, Any]]:
    queues = [make_queue("root").build()]
    queues += [
        make_queue(f"team-{i}").parent("root").gpu(quota=nodes * 2).build() for i in range(QUEUES)
    ]
    return queues


def _node(i: int, dra: bool) -> dict[str, Any]:
    node = make_node(f"n{i}").cpu(128).memory("1Ti").allocatable(pods=110)
    if not dra:
        node = node.gpus(DEVICES)
    built: dict[str, Any] = node.in_domains(rack=f"r{i // 16}").build()
    return built


def _slice(i: int) -> dict[str, Any]:
    devices = [
        {
            "name": f"gpu-{d}",
            "attributes": {"productName": {"string": "H100"}, "index": {"int": d}},
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for d in range(DEVICES)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"n{i}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": f"n{i}",
            "pool": {"name": f"n{i}", "generation": 0, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _claim(name: str, count: int, node: int | None, uid: str) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpus",
                        "exactly": {
                            "deviceClassName": CLASS,
                            "count": count,
                            "selectors": [{"cel": {"expression": SELECTOR}}],
                        },
                    }
                ]
            }
        },
    }
    if node is not None:
        results = [
            {"request": "gpus", "driver": DRIVER, "pool": f"n{node}", "device": f"gpu-{d}"}
            for d in range(count)
        ]
        claim["status"] = {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": name, "uid": uid}],
        }
    return claim


def objects(node_count: int, gangs: int, dra: bool) -> ClusterObjects:
    pods: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []

    def add(name: str, gpus: int, queue: int, created: int, node: int | None) -> None:
        pod = make_pod(name).cpu(1).scheduler("kai-ray").group(name).created(created)
        if not dra:
            pod = pod.gpus(gpus)
        if node is not None:
            pod = pod.on(f"n{node}").phase("Running")
        built = pod.build()
        built["metadata"]["uid"] = f"uid-{name}"
        if dra:
            built["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": name}]
            claims.append(_claim(name, gpus, node, f"uid-{name}"))
        pods.append(built)
        group = make_pod_group(name).queue(f"team-{queue % QUEUES}").min_member(1)
        groups.append(group.created(created).build())

    for i in range(0, node_count, 2):
        add(f"run-{i}", HELD, i, 0, i)
    for i in range(gangs):
        add(f"p{i}", 4 if i % 3 == 2 else 8, i, 1 + i % 3600, None)
    return ClusterObjects(
        nodes=[_node(i, dra) for i in range(node_count)],
        pods=pods,
        pod_groups=groups,
        queues=_queues(node_count),
        device_classes=(
            [
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceClass",
                    "metadata": {"name": CLASS},
                    "spec": {
                        "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
                    },
                }
            ]
            if dra
            else []
        ),
        resource_slices=[_slice(i) for i in range(node_count)] if dra else [],
        resource_claims=claims,
        dra=DraSettings(deviceClasses={CLASS: "gpu"}),
    )


def side(name: str, objs: ClusterObjects, config: SchedulerConfig) -> dict[str, float]:
    began = time.perf_counter()
    snapshot = build_snapshot(objs)
    built = time.perf_counter() - began
    first, result = _timed(snapshot, config)
    second, again = _timed(snapshot, config)
    assert len(again.plan.binds) == len(result.plan.binds)
    gpus = snapshot.free[:, snapshot.column("gpu")].sum()
    print(
        f"{name:>8}: snapshot {built:6.2f} s | first cycle {first:6.2f} s | second cycle "
        f"{second:6.2f} s | {len(result.plan.binds)} of {len(snapshot.pending_pods)} pending "
        f"pods placed ({gpus:.0f} GPUs free before)"
    )
    return {"snapshot": built, "first": first, "second": second, "placed": len(result.plan.binds)}


def _timed(snapshot: Snapshot, config: SchedulerConfig) -> tuple[float, CycleResult]:
    began = time.perf_counter()
    result = run_cycle(snapshot, config, 1, SIM_EPOCH_S)
    return time.perf_counter() - began, result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5_000)
    parser.add_argument("--gangs", type=int, default=8_000)
    parser.add_argument("--strategy", default="binpack")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; {args.nodes} nodes x {DEVICES} GPUs, every other one holding "
        f"{HELD}; {args.gangs} waiting one-pod gangs of 8 or 4 GPUs; {args.strategy}"
    )
    config = SchedulerConfig.model_validate({"spec": {"placementStrategy": args.strategy}})
    extended = side("extended", objects(args.nodes, args.gangs, dra=False), config)
    dra = side("DRA", objects(args.nodes, args.gangs, dra=True), config)
    if dra["placed"] != extended["placed"]:
        print(f"NOTE: the sides placed {extended['placed']} and {dra['placed']} pods")
    for key in ("snapshot", "first", "second"):
        print(f"DRA / extended, {key}: {dra[key] / extended[key]:.2f}x")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: {rss:.0f} MiB")


if __name__ == "__main__":
    main()
