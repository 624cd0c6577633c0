"""Resource fit, node scoring and GPU device choice, vectorised over nodes.

`room` is the one fit function: how many pods of a shape each node can still
take (resources, untouched devices for whole GPUs, device room for shares);
both placement backends call it, so they cannot disagree. `choose_node` scores
the nodes that fit: bin-pack takes the fullest (least share left after the
pod), spread the emptiest, lowest index on ties; a GPU share prefers a node
where a partly used device still has room, so shares pack before a fresh
device is opened. `choose_devices` picks the devices on that node: whole GPUs
take the lowest untouched devices (never a shared one), a share the fullest
partly used device that fits, else the lowest untouched one. The
`fragmentation` strategy scores by what a placement strands instead
(`stranding.py`), on the transaction's workload mix (`mix.py`). Pure: no I/O.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.placement.mix import mix_of
from kai_ray.decisions.placement.node_kept import (
    Slot,
    Versions,
    bring_up_to_date,
    kept_per_node,
    unworked,
)
from kai_ray.decisions.placement.shapes import PodShape
from kai_ray.decisions.placement.stranding import choose_least_stranding, device_for_share
from kai_ray.decisions.transaction import MemoKey, Transaction
from kai_ray.values.config import SchedulerConfigSpec
from kai_ray.values.resources import CORE, EPSILON, GPU, format_amount
from kai_ray.workloads.pod_fields import GPU_MEMORY_LABEL

Matrix = npt.NDArray[np.float64]
Counts = npt.NDArray[np.int64]
Indices = npt.NDArray[np.intp]
Stages = list[tuple[str, npt.NDArray[np.bool_]]]
#: Room reported for a node a shape asks nothing of (no resource caps it).
UNBOUNDED = 1 << 30
#: Score bonus that puts nodes with a partly used device that fits first, for shares.
PACKING_BONUS = 1e6
#: In `fragmentation`'s tie-break, the imbalance a pod adds (at most 1) counts this
#: many times bin-packing's score (a sum of a few shares): balance first, then packing.
BALANCE_FIRST = 100.0


def room(
    free: Matrix, devices: Matrix, whole_free: Counts, shape: PodShape, fraction: Matrix
) -> Counts:
    """Pods of `shape` each row can take; `fraction` is the shape's share on those rows."""
    count = np.full(len(free), UNBOUNDED, dtype=np.int64)
    if len(shape.columns):
        per_column = (free[:, shape.columns] + EPSILON) / shape.need[shape.columns]
        fits = np.floor(np.clip(per_column.min(axis=1), 0, UNBOUNDED))
        count = np.minimum(count, fits.astype(np.int64))
    if shape.whole_gpus:
        count = np.minimum(count, whole_free // shape.whole_gpus)
    if shape.shares_gpu:
        per_device = np.floor((np.maximum(devices, 0.0) + EPSILON) / fraction[:, None])
        count = np.minimum(count, per_device.sum(axis=1).astype(np.int64))
    return count


def room_on(tx: Transaction, shape: PodShape, nodes: Indices) -> Counts:
    """`room` on some nodes of the transaction's current state. On many nodes it is
    read from the room of every node for the shape, kept and worked out again only
    on the nodes whose free row or devices changed (`node_kept`, across cycles
    too): placing the pods of a large cycle one by one would otherwise work out every
    node's room for every pod (a third of a 50,000-node cycle)."""
    if len(nodes) < KEPT_FROM:
        return _room_of(tx, shape, nodes)
    inputs = (tx.snapshot.resource_names, shape.need, shape.columns, shape.fraction)
    kept = kept_per_node(tx, ROOMS, (shape.requests, shape.share), inputs, lambda: _Rooms.of(tx))

    def work_out(rows: Indices) -> None:
        kept.counts[rows] = _room_of(tx, shape, rows)

    bring_up_to_date(tx, kept, nodes, work_out)
    found: Counts = kept.counts[nodes]
    return found


#: From this many nodes a query reads the kept room of every node (`room_on`).
KEPT_FROM = 256


@dataclass
class _Rooms:
    """The room of every node for one shape, and which nodes it still holds for."""

    counts: Counts
    versions: Versions

    @classmethod
    def of(cls, tx: Transaction) -> _Rooms:
        return cls(np.zeros(len(tx.free), dtype=np.int64), unworked(tx))


#: Per shape (requests, share): `_Rooms`.
ROOMS: Slot[_Rooms] = MemoKey("room of every node")


def _room_of(tx: Transaction, shape: PodShape, nodes: Indices) -> Counts:
    return room(
        tx.free[nodes], tx.devices[nodes], tx.whole_free[nodes], shape, shape.fraction[nodes]
    )


def choose_node(
    tx: Transaction, shape: PodShape, nodes: Indices, config: SchedulerConfigSpec
) -> int | None:
    """The best node of `nodes` for one pod of `shape`, or None when none fits."""
    fit = nodes[room_on(tx, shape, nodes) > 0]
    if not fit.size:
        return None
    if config.placementStrategy == "fragmentation":
        mix = mix_of(tx, config.fragmentation).arrays(tx)
        if len(mix.probability):
            tie_break = functools.partial(_balance_then_packing, tx, shape)
            return choose_least_stranding(tx, shape, fit, mix, tie_break)
    score = _remaining_share(tx, shape, fit)
    spread = config.placementStrategy == "spread"
    if shape.shares_gpu:
        bonus = PACKING_BONUS * _has_partial_device(tx, shape, fit)
        score = score + bonus if spread else score - bonus
    best = np.argmax(score) if spread else np.argmin(score)
    return int(fit[best])


def _remaining_share(tx: Transaction, shape: PodShape, fit: Indices) -> Matrix:
    """Sum over the pod's resources of what would be left, as a share of allocatable."""
    columns = shape.columns
    if shape.shares_gpu:
        columns = np.union1d(columns, [tx.snapshot.column(GPU)]).astype(np.intp)
    allocatable = tx.snapshot.allocatable[np.ix_(fit, columns)]
    need = np.broadcast_to(shape.need[columns], allocatable.shape).copy()
    if shape.shares_gpu:
        need[:, np.searchsorted(columns, tx.snapshot.column(GPU))] += shape.fraction[fit]
    left = tx.free[np.ix_(fit, columns)] - need
    share: Matrix = np.sum(left / np.where(allocatable > 0, allocatable, 1.0), axis=1)
    return share


def _balance_then_packing(tx: Transaction, shape: PodShape, nodes: Indices) -> Matrix:
    """`fragmentation`'s tie-break, lowest first: the node whose use the pod makes
    most even (`imbalance_added`), then the fullest. A pod heavy on CPU goes where
    cores are left over beside the GPUs, one light on CPU where cores are short, so
    fewer nodes end with GPUs no pod can reach for want of cores (or cores no GPU pod
    can use). Measured on bench_fragmentation: docs/placement.md. A function of each
    node's rows alone: kept, and worked out again for the nodes that changed."""
    snapshot = tx.snapshot
    inputs = (snapshot.resource_names, snapshot.allocatable, shape.need, shape.fraction)
    build = lambda: _Packing.of(tx)  # noqa: E731
    kept = kept_per_node(tx, PACKING, (shape.requests, shape.share), inputs, build)

    def work_out(rows: Indices) -> None:
        balance = imbalance_added(tx, shape, rows)
        kept.values[rows] = BALANCE_FIRST * balance + _remaining_share(tx, shape, rows)

    bring_up_to_date(tx, kept, nodes, work_out)
    found: Matrix = kept.values[nodes]
    return found


@dataclass
class _Packing:
    """Per node of the snapshot: `_balance_then_packing` for one shape, and which
    nodes it still holds for."""

    values: Matrix
    versions: Versions

    @classmethod
    def of(cls, tx: Transaction) -> _Packing:
        return cls(np.zeros(len(tx.free)), unworked(tx))


#: Per shape (requests, share): the tie-break of `fragmentation` on every node.
PACKING: Slot[_Packing] = MemoKey("fragmentation tie-break")


def imbalance_added(tx: Transaction, shape: PodShape, nodes: Indices) -> Matrix:
    """Per node, how much the pod raises its imbalance: of CPU, memory and GPUs, those
    the pod asks for and the node has, the largest share left minus the smallest
    (0 when fewer than two), once the pod is on it against now. Negative when it
    evens the node out; alike on nodes alike in proportion, so packing decides
    between an empty node and a partly used one of the same balance."""
    snapshot = tx.snapshot
    columns = np.array([snapshot.column(name) for name in CORE], dtype=np.intp)  # always there
    asked = shape.need[columns] > 0
    asked[CORE.index(GPU)] |= shape.shares_gpu
    allocatable = snapshot.allocatable[np.ix_(nodes, columns)]
    has = (allocatable > 0) & asked
    if not np.any(has.sum(axis=1) >= 2):
        return np.zeros(len(nodes))
    free = tx.free[np.ix_(nodes, columns)]
    taken = np.broadcast_to(shape.need[columns], free.shape).copy()
    if shape.shares_gpu:
        taken[:, CORE.index(GPU)] += shape.fraction[nodes]
    added: Matrix = _imbalance(free - taken, allocatable, has) - _imbalance(free, allocatable, has)
    return added


def _imbalance(left: Matrix, allocatable: Matrix, has: npt.NDArray[np.bool_]) -> Matrix:
    share = left / np.where(has, allocatable, 1.0)
    most = np.where(has, share, -np.inf).max(axis=1, initial=-np.inf)
    least = np.where(has, share, np.inf).min(axis=1, initial=np.inf)
    spread: Matrix = np.where(has.sum(axis=1) >= 2, most - least, 0.0)
    return spread


def _has_partial_device(tx: Transaction, shape: PodShape, fit: Indices) -> Matrix:
    devices = tx.devices[fit]
    fraction = shape.fraction[fit][:, None]
    partial = (devices < 1.0 - EPSILON) & (devices >= fraction - EPSILON)
    has: Matrix = np.any(partial, axis=1).astype(np.float64)
    return has


def choose_devices(
    tx: Transaction, shape: PodShape, node: int, config: SchedulerConfigSpec
) -> tuple[int, ...]:
    devices = tx.devices[node]
    untouched = np.flatnonzero(devices >= 1.0 - EPSILON)
    if shape.whole_gpus:
        return tuple(int(d) for d in untouched[: shape.whole_gpus])
    if not shape.shares_gpu:
        return ()
    if config.placementStrategy == "fragmentation":
        mix = mix_of(tx, config.fragmentation).arrays(tx)
        if len(mix.probability):
            return (device_for_share(tx, shape, node, mix),)
    fraction = shape.fraction[node]
    if config.placementStrategy == "spread":
        # the device with the most room (an untouched one first): shares spread out
        roomy = np.flatnonzero(devices >= fraction - EPSILON)
        return (int(roomy[np.argmax(devices[roomy])]),)
    partial = np.flatnonzero((devices < 1.0 - EPSILON) & (devices >= fraction - EPSILON))
    if partial.size:
        return (int(partial[np.argmin(devices[partial])]),)
    return (int(untouched[0]),)


def resource_rejections(tx: Transaction, shape: PodShape, nodes: Indices) -> Counter[str]:
    """Why each of `nodes` (past the static filters) cannot take one more pod of `shape`."""
    reasons, stages = rejection_stages(tx, shape, nodes)
    counts: Counter[str] = Counter()
    failing = np.bincount(stages[stages >= 0], minlength=len(reasons) + 1)
    for reason, count in zip(reasons, failing[: len(reasons)], strict=True):
        counts[reason] += int(count)
    return counts


def rejection_stages(tx: Transaction, shape: PodShape, nodes: Indices) -> tuple[list[str], Counts]:
    """The shape's reasons for a node not to take a pod, in the order they are
    checked (too small in all, lacking free room, lacking devices), and per node of
    `nodes` the first it fails: -1 where the node can take one more pod of `shape`,
    `len(reasons)` where it fails none of them."""
    at = np.full(len(nodes), -1, dtype=np.int64)
    rejected = np.flatnonzero(room_on(tx, shape, nodes) < 1)
    stages = _stages(tx, shape, nodes[rejected])
    first = np.full(len(rejected), len(stages), dtype=np.int64)
    for index in reversed(range(len(stages))):
        first[stages[index][1]] = index
    at[rejected] = first
    return [reason for reason, _ in stages], at


def _stages(tx: Transaction, shape: PodShape, nodes: Indices) -> Stages:
    return (
        _capacity_stages(tx, shape, nodes)
        + _column_stages(tx, shape, nodes)
        + _device_stages(tx, shape, nodes)
    )


def _device_stages(tx: Transaction, shape: PodShape, nodes: Indices) -> Stages:
    if shape.whole_gpus:
        n = shape.whole_gpus
        few = tx.whole_free[nodes] < n
        return [
            (
                f"have fewer than {n} free GPU devices|has fewer than {n} free GPU devices",
                few,
            )
        ]
    if not shape.shares_gpu:
        return []
    fraction = shape.fraction[nodes]
    unknown: npt.NDArray[np.bool_] = ~np.isfinite(fraction)
    no_room: npt.NDArray[np.bool_] = np.all(tx.devices[nodes] < fraction[:, None] - EPSILON, axis=1)
    return [
        (f"do not publish {GPU_MEMORY_LABEL}|does not publish {GPU_MEMORY_LABEL}", unknown),
        (
            "have no GPU device with room for the share|has no GPU device with room for the share",
            no_room,
        ),
    ]


def _capacity_stages(tx: Transaction, shape: PodShape, nodes: Indices) -> Stages:
    """Nodes that have some of a resource but less in all than the pod asks for: no
    room freed there will ever do ("8 nodes have less than 16 nvidia.com/gpu in all").
    Nodes with none of it lack it free, as nodes that are full do."""
    stages = []
    for column in shape.columns:
        name, need = tx.snapshot.resource_names[column], shape.need[column]
        allocatable = tx.snapshot.allocatable[nodes, column]
        small = (allocatable > EPSILON) & (allocatable + EPSILON < need)
        amount = format_amount(name, float(need))
        stages.append(
            (f"have less than {amount} {name} in all|has less than {amount} {name} in all", small)
        )
    return stages


def _column_stages(tx: Transaction, shape: PodShape, nodes: Indices) -> Stages:
    stages = []
    for column in shape.columns:
        name = tx.snapshot.resource_names[column]
        lacking = tx.free[nodes, column] + EPSILON < shape.need[column]
        stages.append((f"lack free {name}|lacks free {name}", lacking))
    return stages
