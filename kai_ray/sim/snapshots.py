"""The simulator's snapshot builder: `build_snapshot`, reading each object once.

`kai_ray.state.snapshot.build_snapshot` reads every node and pod from its dict
each cycle, as the operator must (its cache changes under it). The simulator
knows exactly when one of its objects changes, so `SnapshotBuilder` keeps what
was read: nodes are read again only after `nodes_changed()`, a pod only after
`pod_changed(key)`, and the node matrices are laid out once per set of resource
columns. Everything after the reading (GPU devices, used and free, topology,
queue and group trees) is the state layer's own code, step for step as in
`state.snapshot._build`; a test holds the two builders to the same reports.
Pure: no I/O; it must not decide anything the state layer decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from kai_ray.state.devices import account_devices
from kai_ray.state.groups import build_pod_groups
from kai_ray.state.nodes import NodeReading, read_nodes
from kai_ray.state.pod_states import PodState, read_pod
from kai_ray.state.queues import build_queue_tree
from kai_ray.state.snapshot import (
    ClusterObjects,
    Matrix,
    Snapshot,
    _counted,
    _cyclic_gc_paused,
    _flags,
    _matrix,
    _pending,
    _read_only,
    _topologies,
    _used,
    resource_columns,
)
from kai_ray.values.errors import Problem
from kai_ray.values.names import SCHEDULER_NAME
from kai_ray.values.resources import GPU
from kai_ray.workloads.pods import pod_key


class SnapshotBuilder:
    """Builds each cycle's `Snapshot`, re-reading only the objects said to have changed."""

    def __init__(self, scheduler_name: str = SCHEDULER_NAME) -> None:
        self.scheduler_name = scheduler_name
        self._nodes: NodeReading | None = None
        self._matrices: dict[tuple[str, ...], tuple[Matrix, Matrix]] = {}
        self._pods: dict[str, tuple[PodState | None, list[Problem]]] = {}

    def nodes_changed(self) -> None:
        self._nodes = None
        self._matrices.clear()

    def pod_changed(self, key: str) -> None:
        self._pods.pop(key, None)

    def build(self, objects: ClusterObjects) -> Snapshot:
        with _cyclic_gc_paused():
            nodes = self._node_reading(objects.nodes)
            pods, problems = self._pod_states(objects.pods)
            return self._assemble(objects, nodes, pods, [*nodes.problems, *problems])

    def _node_reading(self, objects: Sequence[Mapping[str, Any]]) -> NodeReading:
        if self._nodes is None:
            self._nodes = read_nodes(objects)
        return self._nodes

    def _pod_states(
        self, objects: Sequence[Mapping[str, Any]]
    ) -> tuple[list[PodState], list[Problem]]:
        states: list[PodState] = []
        problems: list[Problem] = []
        for obj in objects:
            key = pod_key(obj)
            cached = self._pods.get(key)
            if cached is None:
                found: list[Problem] = []
                cached = self._pods[key] = (read_pod(obj, found), found)
            if cached[0] is not None:
                states.append(cached[0])
            problems.extend(cached[1])
        if len(self._pods) > 2 * len(objects) + 64:
            live = {pod_key(obj) for obj in objects}
            self._pods = {k: v for k, v in self._pods.items() if k in live}
        return states, problems

    def _node_matrices(self, names: tuple[str, ...]) -> tuple[Matrix, Matrix]:
        """Capacity and allocatable laid out in `names` order, once per column set."""
        if names not in self._matrices:
            nodes = self._nodes.nodes if self._nodes is not None else []
            capacity = _matrix([n.capacity for n in nodes], names)
            allocatable = _matrix([n.allocatable for n in nodes], names)
            self._matrices[names] = (capacity, allocatable)
        return self._matrices[names]

    def _assemble(
        self,
        objects: ClusterObjects,
        reading: NodeReading,
        read: list[PodState],
        problems: list[Problem],
    ) -> Snapshot:
        nodes = reading.nodes
        node_index = MappingProxyType({node.name: i for i, node in enumerate(nodes)})
        names = resource_columns(
            [*(n.capacity for n in nodes), *(n.allocatable for n in nodes)],
            [p.requests for p in read],
        )
        capacity, allocatable = self._node_matrices(names)
        gpus = account_devices(
            [int(np.floor(count)) for count in allocatable[:, names.index(GPU)]],
            [n.gpu_memory_mib for n in nodes],
            node_index,
            [p for p in read if p.uses_gpu and _counted(p, node_index)],
        )
        problems.extend(gpus.problems)
        pods = [gpus.pods.get(pod.key, pod) for pod in read]
        used = _used(pods, node_index, names)
        free = _read_only(allocatable - used)
        ready = _flags(n.ready for n in nodes)
        unschedulable = _flags(n.unschedulable for n in nodes)
        labels = tuple(n.labels for n in nodes)
        queues, queue_problems = build_queue_tree(objects.queues, objects.usage)
        topologies = _topologies(objects.topologies, labels, free, ready & ~unschedulable, problems)
        pod_groups, group_problems = build_pod_groups(objects.pod_groups, pods, queues)
        return Snapshot(
            resource_names=names,
            node_names=tuple(n.name for n in nodes),
            node_index=node_index,
            capacity=capacity,
            allocatable=allocatable,
            used=used,
            free=free,
            ready=ready,
            unschedulable=unschedulable,
            labels=labels,
            taints=tuple(n.taints for n in nodes),
            gpu_devices=gpus.devices,
            gpu_memory_mib=_read_only(
                np.array([n.gpu_memory_mib for n in nodes], dtype=np.float64)
            ),
            topologies=topologies,
            queues=queues,
            pod_groups=pod_groups,
            pods=MappingProxyType({pod.key: pod for pod in pods}),
            pending_pods=_pending(pods, self.scheduler_name),
            problems=tuple([*problems, *queue_problems, *group_problems]),
        )
