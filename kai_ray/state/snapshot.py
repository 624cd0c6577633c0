"""The cluster snapshot: one immutable value per scheduling cycle.

`build_snapshot` reads the plain Kubernetes objects once and lays the nodes out
as numpy arrays (one row per node, one column per resource), counts every
non-terminal bound pod against its node (pods of other schedulers too), tracks
GPU devices, and builds the topology trees, the queue tree and the pod groups.
Bad objects become `problems`, never exceptions. Nothing in the cycle reads the
cache again after this. Pure: no I/O; arrays are read-only.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from kai_ray.state.devices import NO_DEVICE, GpuDevices, account_node
from kai_ray.state.dra_view import EMPTY as EMPTY_DRA
from kai_ray.state.dra_view import (
    DraView,
    build_device_side,
    build_dra_view,
    claim_users,
    with_claims,
    with_devices,
)
from kai_ray.state.groups import PodGroupState, build_pod_groups
from kai_ray.state.heap import collector_paused
from kai_ray.state.memo import NodeAccount, SnapshotMemo
from kai_ray.state.nodes import NodeFacts, Taint, read_nodes
from kai_ray.state.pod_states import PodState, read_pods
from kai_ray.state.problems import object_ref, validation_problems
from kai_ray.state.queues import QueueTree, build_queue_tree
from kai_ray.state.topology import TopologyTree, topology_layout, topology_tree
from kai_ray.values.api import PodGroup, Topology
from kai_ray.values.dra import DraSettings
from kai_ray.values.errors import Problem
from kai_ray.values.names import SCHEDULER_NAME
from kai_ray.values.resources import CORE, GPU, Resources, canonical_name

#: The node resource that caps how many pods a node runs.
POD_COUNT = "pods"
Matrix = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class ClusterObjects:
    """What the cache (or the simulator) holds: plain Kubernetes objects."""

    nodes: Sequence[Mapping[str, Any]] = ()
    pods: Sequence[Mapping[str, Any]] = ()
    pod_groups: Sequence[Mapping[str, Any]] = ()
    queues: Sequence[Mapping[str, Any]] = ()
    topologies: Sequence[Mapping[str, Any]] = ()
    #: queue -> resource -> decayed usage; overrides what Queue.status.usage persisted.
    usage: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: DRA (resource.k8s.io/v1) objects.
    device_classes: Sequence[Mapping[str, Any]] = ()
    resource_slices: Sequence[Mapping[str, Any]] = ()
    resource_claims: Sequence[Mapping[str, Any]] = ()
    claim_templates: Sequence[Mapping[str, Any]] = ()
    #: How DRA devices count in queues (SchedulerConfig `spec.dra`).
    dra: DraSettings = field(default_factory=DraSettings)

    @property
    def has_dra(self) -> bool:
        return bool(
            self.device_classes
            or self.resource_slices
            or self.resource_claims
            or self.claim_templates
        )


@functools.lru_cache(maxsize=64)
def _columns(resource_names: tuple[str, ...]) -> dict[str, int]:
    """Each column's index by resource name (`Snapshot.vector` is called per pod)."""
    return {name: i for i, name in enumerate(resource_names)}


def vector_in(resource_names: tuple[str, ...], amounts: Mapping[str, float]) -> Matrix:
    """`amounts` as a vector in the columns `resource_names` (`Snapshot.vector`)."""
    columns = _columns(resource_names)
    row = np.zeros(len(columns), dtype=np.float64)
    for name, amount in amounts.items():
        column = columns.get(canonical_name(name))
        if column is None:
            raise KeyError(f"resource {name!r} is not a column of this snapshot")
        row[column] = amount
    return row


V = TypeVar("V")


@dataclass(frozen=True)
class Changed:
    """The keys whose entry (added, replaced or removed) differs between two
    published mappings, `since` and `until`, in the order of `until` (a removed
    key where it was); every other entry is the very same object in both."""

    since: Mapping[str, Any]
    until: Mapping[str, Any]
    keys: tuple[str, ...]


def changed_keys(
    before: Mapping[str, Any] | None, now: Mapping[str, Any], changed: Changed | None
) -> tuple[str, ...] | None:
    """The keys whose entry may differ between `before` (what a follower saw last)
    and `now`: none when they are the same mapping, `changed.keys` when it spans
    exactly the two; None when unknown (compare every entry)."""
    if before is None:
        return None
    if now is before:
        return ()
    if changed is not None and changed.since is before and changed.until is now:
        return changed.keys
    return None


def differences(
    before: Mapping[str, V] | None, now: Mapping[str, V], changed: Changed | None
) -> tuple[list[str], list[tuple[str, V]]]:
    """What a follower that saw `before` (None: nothing yet) looks at in `now`: the
    keys gone, and the entries added or replaced (not the very object it saw) in
    `now`'s order; only `changed`'s keys when it spans the two (`changed_keys`)."""
    seen: Mapping[str, V] = before or {}
    keys = changed_keys(before, now, changed)
    if keys is None:
        gone = list(seen.keys() - now.keys())
        return gone, [(k, v) for k, v in now.items() if seen.get(k) is not v]
    gone = [k for k in keys if k not in now]
    return gone, [(k, now[k]) for k in keys if k in now and seen.get(k) is not now[k]]


@dataclass(frozen=True)
class Snapshot:
    #: Column order of every matrix: cpu, memory, nvidia.com/gpu, then the rest sorted.
    resource_names: tuple[str, ...]
    node_names: tuple[str, ...]
    node_index: Mapping[str, int]
    #: [n_nodes, n_resources] float64; cpu in cores, memory in bytes, GPUs in devices.
    capacity: Matrix
    allocatable: Matrix
    #: Requests of every non-terminal pod bound to the node, whatever its scheduler
    #: (GPU shares as parts of a GPU; one `pods` per pod when nodes report that column).
    used: Matrix
    #: allocatable - used; negative where a node is overcommitted.
    free: Matrix
    ready: Flags
    unschedulable: Flags
    labels: tuple[Mapping[str, str], ...]
    taints: tuple[tuple[Taint, ...], ...]
    #: Per node: free fraction of each GPU device and which devices hold shares.
    gpu_devices: tuple[GpuDevices, ...]
    #: The same free fractions as one matrix, a row per node and a column per device
    #: (as many as the largest node has); NO_DEVICE where a node has fewer.
    gpu_free: Matrix
    #: Per node: memory of one GPU device in MiB (0 when the node does not say).
    gpu_memory_mib: Matrix
    topologies: Mapping[str, TopologyTree]
    queues: QueueTree
    pod_groups: Mapping[str, PodGroupState]
    #: Every readable pod by `namespace/name`, terminal ones included.
    pods: Mapping[str, PodState]
    #: This scheduler's pods still to place, oldest first.
    pending_pods: tuple[PodState, ...]
    problems: tuple[Problem, ...]
    #: The groups of `pod_groups` that are `waiting` (short of their minimum, with
    #: pending pods that can add to it), in `pod_groups` order. Derived from
    #: `pod_groups`: a copy that replaces those must replace these too. The cache
    #: keeps it from cycle to cycle, so reading it costs what it holds, not every group.
    waiting_groups: tuple[PodGroupState, ...]
    #: DRA devices and claims (`state/dra_view.py`); empty in a cluster without them.
    dra: DraView = EMPTY_DRA
    #: The keys of `pods` and of `pod_groups` whose entry differs from the snapshot
    #: before (the kept snapshot's; None when unknown): a follower of those mappings
    #: pays for what changed, not for every entry (`changed_keys`).
    pods_changed: Changed | None = None
    groups_changed: Changed | None = None

    def column(self, name: str) -> int:
        """The matrix column of a resource (`gpu` accepted for `nvidia.com/gpu`)."""
        return self.resource_names.index(canonical_name(name))

    def vector(self, amounts: Mapping[str, float]) -> Matrix:
        """A resource vector laid out in column order; unknown resources raise KeyError."""
        return vector_in(self.resource_names, amounts)

    @property
    def schedulable(self) -> Flags:
        """Nodes that may take new pods: ready and not cordoned (taints aside)."""
        return self.ready & ~self.unschedulable


def build_snapshot(objects: ClusterObjects, *, scheduler_name: str = SCHEDULER_NAME) -> Snapshot:
    """The snapshot of `objects`; `scheduler_name` says whose pods are pending here."""
    # The build allocates several objects per pod and keeps them: no reference cycles.
    with collector_paused():
        return _build(objects, scheduler_name)


def _build(objects: ClusterObjects, scheduler_name: str) -> Snapshot:
    # 1. Read every node and pod once; unreadable ones become problems.
    node_reading = read_nodes(objects.nodes)
    pod_reading = read_pods(objects.pods)
    problems = [*node_reading.problems, *pod_reading.problems]
    if not objects.has_dra:
        return assemble_snapshot(
            objects, node_reading.nodes, pod_reading.pods, problems, scheduler_name
        )
    view = dra_view_of(objects, node_reading.nodes, pod_reading.pods)
    nodes = [with_devices(node, view) for node in node_reading.nodes]
    pods = [with_claims(pod, view) for pod in pod_reading.pods]
    snapshot = assemble_snapshot(objects, nodes, pods, problems, scheduler_name)
    return with_dra(snapshot, view)


def with_dra(snapshot: Snapshot, view: DraView) -> Snapshot:
    """The snapshot with its DRA view, whose problems join the snapshot's."""
    return dataclasses.replace(snapshot, dra=view, problems=(*snapshot.problems, *view.problems))


def dra_view_of(
    objects: ClusterObjects, nodes: Sequence[NodeFacts], pods: Sequence[PodState]
) -> DraView:
    """The DRA view of `objects` (as `ClusterCache.dra_view` keeps it)."""
    devices = build_device_side(
        classes=objects.device_classes,
        slices=objects.resource_slices,
        node_labels={node.name: node.labels for node in nodes},
        settings=objects.dra,
    )
    return build_dra_view(
        devices,
        claims=objects.resource_claims,
        templates=objects.claim_templates,
        users=claim_users(pods),
        settings=objects.dra,
    )


def assemble_snapshot(
    objects: ClusterObjects,
    nodes: Sequence[NodeFacts],
    read: Sequence[PodState],
    problems: list[Problem],
    scheduler_name: str,
    memo: SnapshotMemo | None = None,
) -> Snapshot:
    """The snapshot from nodes and pods already read (by `build_snapshot`, or by a
    builder that keeps readings between cycles and hands the same `memo` to each
    build, so that what did not change is not worked out again)."""
    memo = memo or SnapshotMemo()
    memo.use_nodes(nodes)
    node_index = MappingProxyType({node.name: i for i, node in enumerate(nodes)})
    # 2. One column per resource any node offers or any pod asks for.
    if memo.offered is None:
        memo.offered = set().union(*(n.capacity for n in nodes), *(n.allocatable for n in nodes))
    names = resource_columns([memo.offered], [p.requests for p in read])
    capacity, allocatable = _node_matrices(memo, nodes, names)
    # 3. Bound pods onto their nodes: GPU pods onto devices, requests into used.
    accounts = _node_accounts(memo, nodes, allocatable, names, _counted_by_node(read, node_index))
    devices = tuple(memo.devices)
    settled = {pod.key: pod for account in accounts for pod in account.devices.pods}
    problems.extend(problem for account in accounts for problem in account.devices.problems)
    pods = [settled.get(pod.key, pod) for pod in read]
    used = _read_only(memo.used.copy())
    free = _read_only(allocatable - used)
    ready = _flags(n.ready for n in nodes)
    unschedulable = _flags(n.unschedulable for n in nodes)
    labels = tuple(n.labels for n in nodes)
    # 4. The trees and the groups.
    queues, queue_problems = build_queue_tree(objects.queues, objects.usage)
    topologies = _topologies(memo, objects.topologies, labels, problems)
    pod_groups, group_problems = build_pod_groups(
        objects.pod_groups,
        pods,
        queues,
        lambda key, obj: memo.pod_groups.get(key, obj, PodGroup.model_validate),
        memo.group_states,
        node_names=node_index,
        scheduler=scheduler_name,
    )
    memo.pod_groups.keep_only(set(pod_groups))
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
        gpu_devices=devices,
        gpu_free=_read_only(memo.device_free.copy()),
        gpu_memory_mib=_read_only(np.array([n.gpu_memory_mib for n in nodes], dtype=np.float64)),
        topologies=topologies,
        queues=queues,
        pod_groups=pod_groups,
        pods=MappingProxyType({pod.key: pod for pod in pods}),
        pending_pods=_pending(pods, scheduler_name),
        problems=tuple([*problems, *queue_problems, *group_problems]),
        waiting_groups=tuple(group for group in pod_groups.values() if group.waiting),
    )


def _node_matrices(
    memo: SnapshotMemo, nodes: Sequence[NodeFacts], names: tuple[str, ...]
) -> tuple[Matrix, Matrix]:
    """Capacity and allocatable laid out in `names` order, once per column set."""
    if names not in memo.matrices:
        capacity = _matrix([n.capacity for n in nodes], names)
        allocatable = _matrix([n.allocatable for n in nodes], names)
        memo.matrices[names] = (capacity, allocatable)
    return memo.matrices[names]


def _counted_by_node(
    pods: Sequence[PodState], node_index: Mapping[str, int]
) -> dict[int, list[PodState]]:
    """The counted pods of each node, in the order they were read."""
    by_node: dict[int, list[PodState]] = {}
    for pod in pods:
        if _counted(pod, node_index):
            by_node.setdefault(node_index[pod.node or ""], []).append(pod)
    return by_node


def _node_accounts(
    memo: SnapshotMemo,
    nodes: Sequence[NodeFacts],
    allocatable: Matrix,
    names: tuple[str, ...],
    by_node: Mapping[int, list[PodState]],
) -> list[NodeAccount]:
    """The accounts of the nodes holding pods, in node order: each node's devices and
    used row, worked out again only where its pods changed. The memo keeps every
    node's devices and its `used` and `device_free` rows up to date in place."""
    gpu_column = names.index(GPU)
    counts = np.floor(allocatable[:, gpu_column]).astype(np.int64)
    if memo.columns != names:
        memo.columns = names
        memo.used = np.zeros((len(nodes), len(names)), dtype=np.float64)
        memo.device_free = np.full(
            (len(nodes), max(int(counts.max(initial=0)), 1)), NO_DEVICE, dtype=np.float64
        )
        memo.accounts = [None] * len(nodes)
        memo.devices = [GpuDevices.untouched(int(count)) for count in counts]
        memo.busy = set(range(len(nodes)))
    for index in sorted(memo.busy.union(by_node)):
        pods = tuple(by_node.get(index, ()))
        account = memo.accounts[index]
        if account is None or account.pods != pods:
            gpu_pods = [pod for pod in pods if pod.uses_gpu]
            node = nodes[index]
            devices = account_node(int(counts[index]), node.gpu_memory_mib, gpu_pods)
            settled = {pod.key: pod for pod in devices.pods}
            row = _used_row([settled.get(pod.key, pod) for pod in pods], names)
            memo.accounts[index] = NodeAccount(pods, devices, row)
            memo.devices[index] = devices.devices
            memo.used[index] = row
            memo.device_free[index, : devices.devices.count] = devices.devices.free
    memo.busy = set(by_node)
    return [account for index in sorted(memo.busy) if (account := memo.accounts[index])]


def resource_columns(
    offered: Iterable[Iterable[str]], requested: Iterable[Iterable[str]]
) -> tuple[str, ...]:
    """cpu, memory, nvidia.com/gpu first (always present), then every other name sorted."""
    others: set[str] = set().union(*offered, *requested)
    return (*CORE, *sorted(others - set(CORE)))


def _matrix(rows: Sequence[Resources], names: Sequence[str]) -> Matrix:
    column = {name: i for i, name in enumerate(names)}
    matrix = np.zeros((len(rows), len(names)), dtype=np.float64)
    for row, amounts in enumerate(rows):
        for name, amount in amounts.items():
            matrix[row, column[name]] = amount
    return _read_only(matrix)


def _counted(pod: PodState, node_index: Mapping[str, int]) -> bool:
    """A pod holds node resources while it is bound to a node we know and not finished."""
    return pod.node is not None and pod.node in node_index and not pod.terminal


def _used_row(pods: Sequence[PodState], names: Sequence[str]) -> Matrix:
    """What one node's counted pods hold: requests, then GPU shares as parts of a GPU,
    then one `pods` each when nodes report that column (no pod requests it)."""
    column = {name: i for i, name in enumerate(names)}
    row = np.zeros(len(names), dtype=np.float64)
    for pod in pods:
        for name, amount in pod.requests.items():
            row[column[name]] += amount
    gpu = column[GPU]
    for pod in pods:
        row[gpu] += pod.gpu_fraction
    if POD_COUNT in column:
        row[column[POD_COUNT]] += len(pods)
    row.setflags(write=False)
    return row


def _topologies(
    memo: SnapshotMemo,
    objects: Sequence[Mapping[str, Any]],
    labels: Sequence[Mapping[str, str]],
    problems: list[Problem],
) -> Mapping[str, TopologyTree]:
    """Each valid Topology's tree over the nodes' labels: the one kept while its
    object and the labels are the same (the memo forgets them with other nodes)."""
    trees: dict[str, TopologyTree] = {}
    for obj in objects:
        ref = object_ref(obj, "Topology")
        try:
            topology = memo.topologies.get(ref.name, obj, Topology.model_validate)
        except ValidationError as err:
            problems.extend(validation_problems(ref, err))
            continue
        if topology.metadata.name in trees:
            problems.append(Problem(ref, "metadata.name", "listed twice; kept the first"))
            continue
        kept = memo.layouts.get(ref.name)
        if kept is None or kept[0] is not topology:
            kept = memo.layouts[ref.name] = (
                topology,
                topology_tree(topology_layout(topology, labels)),
            )
        trees[topology.metadata.name] = kept[1]
    # A tree not read now is not kept: its Topology may come back laid out otherwise.
    for name in [name for name in memo.layouts if name not in trees]:
        del memo.layouts[name]
    return MappingProxyType(trees)


def _pending(pods: Sequence[PodState], scheduler_name: str) -> tuple[PodState, ...]:
    waiting = [
        pod
        for pod in pods
        if pod.scheduler == scheduler_name
        and pod.node is None
        and not pod.terminal
        and not pod.held
    ]
    return tuple(sorted(waiting, key=lambda pod: (pod.creation_timestamp, pod.key)))


def _flags(values: Iterable[bool]) -> Flags:
    return _read_only(np.fromiter(values, dtype=np.bool_))


def _read_only(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    array.setflags(write=False)
    return array
