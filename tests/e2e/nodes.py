"""Fake GPU nodes for the e2e control plane.

kwok (started by ``e2e/cluster.sh``) manages every Node that carries the
annotation ``kwok.x-k8s.io/node: fake``: it marks it Ready, keeps its lease
fresh and turns pods bound to it Running. This module creates such nodes with
``nvidia.com/gpu`` capacity, GPU product labels and a zone/block/rack topology.

Topology: nodes are numbered 0..N-1 and filled rack by rack, racks block by
block, blocks zone by zone::

    rack  = i // nodes_per_rack
    block = rack // racks_per_block
    zone  = block // blocks_per_zone

Also usable by hand against a running cluster::

    eval "$(e2e/cluster.sh env)"
    .venv/bin/python tests/e2e/nodes.py create --count 8
    .venv/bin/python tests/e2e/nodes.py delete
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

GPU = "nvidia.com/gpu"
ZONE_LABEL = "topology.kubernetes.io/zone"
BLOCK_LABEL = "kai-ray.io/block"
RACK_LABEL = "kai-ray.io/rack"
HOSTNAME_LABEL = "kubernetes.io/hostname"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# every node made here carries this label, so they can be listed and removed
E2E_LABEL = "kai-ray.io/e2e-node"


@dataclass(frozen=True)
class GpuNodeSpec:
    """Shape of a group of fake GPU nodes."""

    count: int
    prefix: str = "gpu"
    gpus_per_node: int = 8
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    cpu: str = "128"
    memory: str = "1Ti"
    pods: str = "110"
    nodes_per_rack: int = 4
    racks_per_block: int = 2
    blocks_per_zone: int = 2
    zone_prefix: str = "zone"
    extra_labels: dict[str, str] = field(default_factory=dict)


def topology_of(index: int, spec: GpuNodeSpec) -> dict[str, str]:
    """Zone, block and rack labels of node number ``index``."""
    rack = index // spec.nodes_per_rack
    block = rack // spec.racks_per_block
    zone = block // spec.blocks_per_zone
    return {
        ZONE_LABEL: f"{spec.zone_prefix}-{zone}",
        BLOCK_LABEL: f"block-{block}",
        RACK_LABEL: f"rack-{rack}",
    }


def node_manifest(index: int, spec: GpuNodeSpec) -> dict[str, Any]:
    """The Node object (status included) of node number ``index``."""
    name = f"{spec.prefix}-{index}"
    resources = {
        "cpu": spec.cpu,
        "memory": spec.memory,
        "pods": spec.pods,
        GPU: str(spec.gpus_per_node),
    }
    labels = {
        HOSTNAME_LABEL: name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        E2E_LABEL: "true",
        GPU_PRODUCT_LABEL: spec.gpu_product,
        GPU_COUNT_LABEL: str(spec.gpus_per_node),
        "nvidia.com/gpu.present": "true",
        **topology_of(index, spec),
        **spec.extra_labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
        },
    }


def create_gpu_nodes(
    core: client.CoreV1Api, spec: GpuNodeSpec, *, start: int = 0, wait: bool = True
) -> list[str]:
    """Create ``spec.count`` fake GPU nodes numbered from ``start``; return their names.

    With ``wait`` (the default) this returns once kwok reports every node Ready.
    """
    names = []
    for i in range(start, start + spec.count):
        body = node_manifest(i, spec)
        core.create_node(body)
        names.append(body["metadata"]["name"])
    if wait:
        wait_nodes_ready(core, names)
    return names


def node_is_ready(node: client.V1Node) -> bool:
    conditions = (node.status and node.status.conditions) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def wait_nodes_ready(core: client.CoreV1Api, names: Iterable[str], timeout: float = 60) -> None:
    pending = set(names)
    deadline = time.monotonic() + timeout
    while pending:
        for name in sorted(pending):
            if node_is_ready(core.read_node(name)):
                pending.discard(name)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nodes not Ready after {timeout}s: {sorted(pending)}")
        time.sleep(0.3)


def delete_gpu_nodes(core: client.CoreV1Api, names: Iterable[str] | None = None) -> None:
    """Delete the given nodes, or every node made by this module."""
    if names is None:
        names = [n.metadata.name for n in core.list_node(label_selector=E2E_LABEL).items]
    for name in names:
        try:
            core.delete_node(name)
        except ApiException as e:
            if e.status != 404:
                raise


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    make = sub.add_parser("create", help="create fake GPU nodes")
    make.add_argument("--count", type=int, default=4)
    make.add_argument("--prefix", default="gpu")
    make.add_argument("--start", type=int, default=0)
    make.add_argument("--gpus", type=int, default=8)
    make.add_argument("--product", default="NVIDIA-H100-80GB-HBM3")
    make.add_argument("--nodes-per-rack", type=int, default=4)
    make.add_argument("--racks-per-block", type=int, default=2)
    make.add_argument("--blocks-per-zone", type=int, default=2)
    sub.add_parser("delete", help="delete every node made by this helper")
    args = parser.parse_args()
    config.load_kube_config()
    core = client.CoreV1Api()
    if args.cmd == "create":
        spec = GpuNodeSpec(
            count=args.count,
            prefix=args.prefix,
            gpus_per_node=args.gpus,
            gpu_product=args.product,
            nodes_per_rack=args.nodes_per_rack,
            racks_per_block=args.racks_per_block,
            blocks_per_zone=args.blocks_per_zone,
        )
        for name in create_gpu_nodes(core, spec, start=args.start):
            print(name)
    else:
        delete_gpu_nodes(core)


if __name__ == "__main__":
    _main()
