"""Fragmentation-aware scoring: what a placement strands, for the pods to expect.

For one class of pods (`mix.py`) a node's free resources are *stranded* when
that class cannot use them:
- when no pod of the class fits on the node (its filters refuse the node, or
  any resource it asks for is short, or no device has room), everything the
  node has free is stranded for it: GPUs behind exhausted CPU or memory, CPU
  and memory behind taken GPUs;
- when one fits, the GPU devices too small for it are: partly used devices
  for whole-GPU pods, devices with less room than its share for shares.
The node's expected stranded vector weighs each class by its probability in the
mix: S = u * free + v on the GPU column, with u the probability of the classes
that do not fit and v their expected stranded GPU where they do (FGD's
fragmentation measure, "Beware of Fragmentation", ATC 2023, extended from GPUs
to every resource).

A placement is scored by how much it raises S on its node, GPUs in devices and
every other resource as a share of the cluster's, counted at `OTHER_WEIGHT` of
a GPU share (0: measured, CPU and memory count only through the GPUs they make
unusable; docs/placement.md); the lowest score wins. A share is scored on each
device it could take and goes to the best one. No weight is negative and the
GPU one is positive, so a placement that strands strictly more of every
resource never scores better. Ties go to, in order: for pods without GPUs, the
node with the fewest free GPUs (a node without GPUs first); the caller's
tie-break (`fit.py`: the node the pod evens out most, then the fullest); the
node listed first. A node's score depends only on that node, the
pod's shape, the mix and the weights, so scores and class fits are kept
(`_Scores`, `_Known`; across cycles too, `node_kept.py`) and worked out again
only for nodes whose free row or devices changed. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.placement.mix import MixArrays
from kai_ray.decisions.placement.node_kept import (
    Slot,
    Versions,
    bring_up_to_date,
    kept_per_node,
    unworked,
)
from kai_ray.decisions.placement.shapes import PodShape
from kai_ray.decisions.transaction import MemoKey, Transaction
from kai_ray.state.snapshot import POD_COUNT
from kai_ray.values.resources import EPSILON, GPU

Matrix = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]
Indices = npt.NDArray[np.intp]
#: Stranded CPU, memory or another resource, as a share of the cluster's, weighs this
#: much against the same share of the cluster's GPUs (chosen on bench_fragmentation).
OTHER_WEIGHT = 0.0
#: Scores closer than this are a tie (scores are in GPU devices).
TIE = 1e-9


@dataclass(frozen=True)
class NodeState:
    """Free resources and devices of some nodes (rows), as placement sees them."""

    free: Matrix
    devices: Matrix
    whole_free: npt.NDArray[np.int64]
    #: Snapshot index of each row.
    nodes: Indices


def expected_stranded(state: NodeState, mix: MixArrays, gpu: int) -> Matrix:
    """(rows, resources): the expected stranded amount of each resource on each row."""
    fits, partial = _fits_and_partial(state, mix)
    unusable, stranded_gpu = _expectation(mix, fits, partial)
    stranded: Matrix = unusable[..., None] * np.maximum(state.free, 0.0)
    stranded[..., gpu] += stranded_gpu
    return stranded


def _expectation(mix: MixArrays, fits: Flags, partial: Matrix) -> tuple[Matrix, Matrix]:
    """Over the classes (the first axis): the probability of not fitting, and the
    expected stranded GPU where the class fits."""
    probability = mix.probability.reshape((-1,) + (1,) * (fits.ndim - 1))
    unusable: Matrix = np.sum(probability * ~fits, axis=0)
    stranded_gpu: Matrix = np.sum(probability * np.where(fits, partial, 0.0), axis=0)
    return unusable, stranded_gpu


def _fits_and_partial(state: NodeState, mix: MixArrays) -> tuple[Flags, Matrix]:
    """(classes, rows): does one pod of the class fit; the GPU it would find too small."""
    fraction = mix.fraction[:, state.nodes]
    largest = state.devices.max(axis=1, initial=0.0)
    share_fits = largest[None, :] + EPSILON >= fraction
    whole_fits = state.whole_free[None, :] >= mix.whole[:, None]
    fits = _static_and_resources(state.free, mix, state.nodes)
    fits &= np.where(mix.shares[:, None], share_fits, whole_fits)
    devices = np.maximum(state.devices, 0.0)[None, :, :]
    limit = _limit(mix, fraction)[:, :, None]
    too_small = (devices > EPSILON) & (devices + EPSILON < limit)
    partial = np.sum(devices * too_small, axis=2)
    return fits, partial


def _static_and_resources(free: Matrix, mix: MixArrays, nodes: Indices) -> Flags:
    """(classes, rows): the class's filters allow the node and every resource it asks for
    is there (as `fit.room` checks them; devices aside)."""
    short = np.any(free[None, :, :] + EPSILON < mix.asked[:, None, :], axis=2)
    allowed: Flags = mix.allowed[:, nodes] & ~short
    return allowed


def _limit(mix: MixArrays, fraction: Matrix) -> Matrix:
    """(classes, rows): a device with less room than this is too small for the class
    (a whole device for whole-GPU pods, the share for shares, none for the others)."""
    whole = np.where(mix.whole > 0, 1.0, 0.0)[:, None]
    limit: Matrix = np.where(mix.shares[:, None], fraction, whole)
    return limit


@dataclass(frozen=True)
class Choice:
    """The score of one pod on each candidate node, and the device a share would take."""

    score: Matrix
    #: Per node: the device a share goes to (-1 for other pods).
    device: npt.NDArray[np.intp]


@dataclass
class _Scores:
    """Per node of the snapshot: one shape's score and device under one mix, and the
    node versions they were worked out at (`node_kept`)."""

    score: Matrix
    device: npt.NDArray[np.intp]
    versions: Versions
    #: (score, device) by what a node's score is a function of (`_state_key`): nodes
    #: alike in shape and use score alike, so a burst onto a fleet of one node type
    #: works each state out once.
    by_state: dict[tuple[object, ...], tuple[float, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, tx: Transaction) -> _Scores:
        size = len(tx.free)
        return cls(np.zeros(size), np.full(size, -1, dtype=np.intp), unworked(tx))


#: Per shape (requests, share): its scores, kept while the mix, the weights and the
#: shape are equal (`node_kept.kept_per_node`: across cycles too).
SCORES: Slot[_Scores] = MemoKey("stranding scores")
#: `_Scores.by_state` starts afresh past this many node states.
STATES_AT_MOST = 4096


def score_nodes(tx: Transaction, shape: PodShape, nodes: Indices, mix: MixArrays) -> Choice:
    """How much one pod of `shape` raises the expected stranded amount on each of `nodes`
    (all of which must fit it), on its best device for a share. A node's scores depend
    only on that node, the shape, the mix and the weights: they are kept and worked out
    again only for nodes whose free row or devices changed (exact, as the class fits
    are)."""
    inputs = (*_mix_inputs(tx, mix), mix.probability, resource_weights(tx), *_shape_inputs(shape))
    kept = kept_per_node(tx, SCORES, (shape.requests, shape.share), inputs, lambda: _Scores.of(tx))
    bring_up_to_date(tx, kept, nodes, lambda rows: _rescore(tx, shape, rows, mix, kept))
    return Choice(kept.score[nodes], kept.device[nodes])


def _mix_inputs(tx: Transaction, mix: MixArrays) -> tuple[object, ...]:
    """What class fits are worked out from besides a node's rows."""
    return (mix.keys, tx.snapshot.resource_names, mix.need, mix.allowed, mix.fraction)


def _shape_inputs(shape: PodShape) -> tuple[object, ...]:
    return (shape.requests, shape.share, shape.need, shape.fraction)


#: Up to this many stale nodes are scored through `_Scores.by_state`; more (a first
#: call, a new mix) at once in arrays, where a key per node would cost more.
FEW = 8


def _rescore(
    tx: Transaction, shape: PodShape, stale: Indices, mix: MixArrays, kept: _Scores
) -> None:
    """`kept`'s score and device for each of `stale` worked out again."""
    if len(stale) > FEW:
        kept.score[stale], kept.device[stale] = _score_now(tx, shape, stale, mix)
        return
    if len(kept.by_state) > STATES_AT_MOST:
        kept.by_state.clear()
    keys = [_state_key(tx, shape, mix, int(node)) for node in stale]
    missing = [i for i, key in enumerate(keys) if key not in kept.by_state]
    if missing:
        score, device = _score_now(tx, shape, stale[missing], mix)
        for j, i in enumerate(missing):
            kept.by_state[keys[i]] = (float(score[j]), int(device[j]))
    for node, key in zip(stale, keys, strict=True):
        kept.score[node], kept.device[node] = kept.by_state[key]


def _state_key(tx: Transaction, shape: PodShape, mix: MixArrays, node: int) -> tuple[object, ...]:
    """All a node's score and device depend on besides the shape, the mix and the
    cycle (`_score_now` reads nothing else of the node): its free row, devices and
    whole free devices, and the mix's and the shape's columns for it."""
    return (
        tx.free[node].tobytes(),
        tx.devices[node].tobytes(),
        int(tx.whole_free[node]),
        mix.allowed[:, node].tobytes(),
        mix.fraction[:, node].tobytes(),
        shape.fraction[node].tobytes(),
    )


def _score_now(
    tx: Transaction, shape: PodShape, nodes: Indices, mix: MixArrays
) -> tuple[Matrix, npt.NDArray[np.intp]]:
    """Each node's score and device for a share (-1 for other pods), worked out now."""
    gpu = tx.snapshot.column(GPU)
    before = NodeState(tx.free[nodes], tx.devices[nodes], tx.whole_free[nodes], nodes)
    weights = resource_weights(tx)
    fits, partial = _known_fits_and_partial(tx, before, mix)
    unusable, stranded_gpu = _expectation(mix, fits, partial)
    base = unusable * (np.maximum(before.free, 0.0) @ weights) + stranded_gpu * weights[gpu]
    if shape.shares_gpu:
        return _best_device(before, shape, mix, (gpu, weights), (base, partial))
    free = before.free - shape.need
    fits = _known_fits_after_whole(tx, before, shape, mix)
    unusable, stranded_gpu = _expectation(mix, fits, partial)
    score = unusable * (np.maximum(free, 0.0) @ weights) + stranded_gpu * weights[gpu] - base
    return score, np.full(len(nodes), -1, dtype=np.intp)


def _fits_after_whole(state: NodeState, free: Matrix, shape: PodShape, mix: MixArrays) -> Flags:
    """(classes, rows): which classes still fit once a pod without a share is placed.
    It takes untouched devices only, so no device becomes too small for anyone: the
    stranded GPU where a class fits is what it was."""
    whole_free = state.whole_free - shape.whole_gpus
    largest = state.devices.max(axis=1, initial=0.0)
    emptied = np.flatnonzero(whole_free <= 0) if shape.whole_gpus else ()
    if len(emptied):
        devices = state.devices[emptied]
        partly = np.where(devices < 1.0 - EPSILON, devices, 0.0)
        largest[emptied] = partly.max(axis=1, initial=0.0)
    share_fits = largest[None, :] + EPSILON >= mix.fraction[:, state.nodes]
    whole_fits = whole_free[None, :] >= mix.whole[:, None]
    fits = _static_and_resources(free, mix, state.nodes)
    fits &= np.where(mix.shares[:, None], share_fits, whole_fits)
    return fits


@dataclass
class _Known:
    """Per node of the snapshot: the class fits and stranded GPU last worked out, and
    the node versions they were worked out at (`node_kept`)."""

    fits: Flags
    partial: Matrix
    versions: Versions

    @classmethod
    def of(cls, tx: Transaction, classes: int) -> _Known:
        nodes = len(tx.free)
        fits = np.zeros((classes, nodes), dtype=np.bool_)
        return cls(fits, np.zeros((classes, nodes), dtype=np.float64), unworked(tx))


#: The class fits before a pod, kept while the mix's classes are the same.
KNOWN: Slot[_Known] = MemoKey("stranding per node")
#: Per shape (requests, share) without a GPU share: the class fits once a pod is placed.
AFTER: Slot[_Known] = MemoKey("stranding per node after a pod")


def _known_fits_and_partial(
    tx: Transaction, state: NodeState, mix: MixArrays
) -> tuple[Flags, Matrix]:
    """`_fits_and_partial`, worked out again only for rows whose free resources or
    devices changed since (exact: nothing else they depend on changes while the mix's
    classes are the same)."""
    build = lambda: _Known.of(tx, len(mix.keys))  # noqa: E731
    known = kept_per_node(tx, KNOWN, None, _mix_inputs(tx, mix), build)

    def work_out(rows: Indices) -> None:
        changed = NodeState(tx.free[rows], tx.devices[rows], tx.whole_free[rows], rows)
        known.fits[:, rows], known.partial[:, rows] = _fits_and_partial(changed, mix)

    bring_up_to_date(tx, known, state.nodes, work_out)
    return known.fits[:, state.nodes], known.partial[:, state.nodes]


def _known_fits_after_whole(
    tx: Transaction, state: NodeState, shape: PodShape, mix: MixArrays
) -> Flags:
    """`_fits_after_whole` for the rows of `state` (all of the transaction's rows as
    they are), kept per shape as `_known_fits_and_partial` keeps the fits before."""
    build = lambda: _Known.of(tx, len(mix.keys))  # noqa: E731
    inputs = (*_mix_inputs(tx, mix), *_shape_inputs(shape))
    known = kept_per_node(tx, AFTER, (shape.requests, shape.share), inputs, build)

    def work_out(rows: Indices) -> None:
        changed = NodeState(tx.free[rows], tx.devices[rows], tx.whole_free[rows], rows)
        known.fits[:, rows] = _fits_after_whole(changed, changed.free - shape.need, shape, mix)

    bring_up_to_date(tx, known, state.nodes, work_out)
    fits: Flags = known.fits[:, state.nodes]
    return fits


def _best_device(
    state: NodeState,
    shape: PodShape,
    mix: MixArrays,
    columns: tuple[int, Matrix],
    before: tuple[Matrix, Matrix],
) -> tuple[Matrix, npt.NDArray[np.intp]]:
    """A share tried on every device of every row that could take it: (classes, rows,
    candidates) arrays of what changes, the rest per row; each row's best device and its
    score. Devices with the same room give the same result, so only the first of each is
    tried. `columns` is the GPU column and the weights, `before` the rows' score and
    stranded GPU per class before."""
    gpu, weights = columns
    base, partial = before
    fraction = shape.fraction[state.nodes]
    free = state.free - shape.need
    free[:, gpu] -= fraction
    candidate, largest_other = _candidates(state.devices, fraction)
    devices = np.take_along_axis(state.devices, candidate, axis=1)
    after = devices - fraction[:, None]
    class_fraction = mix.fraction[:, state.nodes][:, :, None]
    share_fits = np.maximum(largest_other, after)[None] + EPSILON >= class_fraction
    whole_free = state.whole_free[:, None] - (devices >= 1.0 - EPSILON)
    whole_fits = whole_free[None] >= mix.whole[:, None, None]
    fits = _static_and_resources(free, mix, state.nodes)[:, :, None]
    fits = fits & np.where(mix.shares[:, None, None], share_fits, whole_fits)
    limit = _limit(mix, mix.fraction[:, state.nodes])[:, :, None]
    partial_after = partial[:, :, None] - _small(devices, limit) + _small(after, limit)
    unusable, stranded_gpu = _expectation(mix, fits, partial_after)
    others = np.maximum(free, 0.0) @ weights
    score = unusable * others[:, None] + stranded_gpu * weights[gpu] - base[:, None]
    score = np.where(devices + EPSILON >= fraction[:, None], score, np.inf)
    best = _best_of(score, devices)
    rows = np.arange(len(state.nodes))
    return score[rows, best], candidate[rows, best]


def _candidates(devices: Matrix, fraction: Matrix) -> tuple[npt.NDArray[np.intp], Matrix]:
    """Per row, the devices worth trying (the first of each room that fits the share, in
    index order, padded with unusable ones), and for each the most room on any other."""
    width = devices.shape[1]
    earlier = np.tril(np.ones((width, width), dtype=np.bool_), k=-1)
    repeated = np.any((devices[:, :, None] == devices[:, None, :]) & earlier, axis=2)
    worth = ~repeated & (devices + EPSILON >= fraction[:, None])
    count = max(int(worth.sum(axis=1).max(initial=0)), 1)
    candidate = np.argsort(~worth, axis=1, kind="stable")[:, :count]
    other = np.take_along_axis(_largest_other(devices), candidate, axis=1)
    return candidate.astype(np.intp), other


def _largest_other(devices: Matrix) -> Matrix:
    """(rows, devices): the most room on any other device of the row (-1 when none)."""
    if devices.shape[1] < 2:
        return np.full_like(devices, -1.0)
    order = np.sort(devices, axis=1)
    other = np.repeat(order[:, -1:], devices.shape[1], axis=1)
    other[np.arange(len(devices)), np.argmax(devices, axis=1)] = order[:, -2]
    return other


def _small(devices: Matrix, limit: Matrix) -> Matrix:
    """(classes, rows, devices): each device's room where it is too small for the class."""
    room = np.maximum(devices, 0.0)[None]
    small: Matrix = np.where((room > EPSILON) & (room + EPSILON < limit), room, 0.0)
    return small


def _best_of(score: Matrix, devices: Matrix) -> npt.NDArray[np.intp]:
    """Per row, the lowest score; on a tie the fullest device, then the lowest index."""
    lowest = score.min(axis=1, keepdims=True)
    tied = score <= lowest + TIE
    best: npt.NDArray[np.intp] = np.argmin(np.where(tied, devices, np.inf), axis=1)
    return best


#: Per cycle: each resource's weight, in GPU devices per unit.
WEIGHTS = MemoKey[Matrix]("stranding weights")


def resource_weights(tx: Transaction) -> Matrix:
    """GPUs count as themselves; another resource's share of the cluster counts at
    `OTHER_WEIGHT` of the same share of its GPUs. The pod-count column does not count."""

    def build() -> Matrix:
        snapshot = tx.snapshot
        capacity = np.sum(snapshot.allocatable[snapshot.schedulable], axis=0)
        gpu = snapshot.column(GPU)
        gpus = capacity[gpu] if capacity[gpu] > 0 else 1.0
        weights: Matrix = np.zeros(len(capacity), dtype=np.float64)
        np.divide(OTHER_WEIGHT * gpus, capacity, out=weights, where=capacity > 0)
        weights[gpu] = 1.0
        if POD_COUNT in snapshot.resource_names:
            weights[snapshot.column(POD_COUNT)] = 0.0
        return weights

    return tx.memo.get(WEIGHTS, None, build)


def choose_least_stranding(
    tx: Transaction,
    shape: PodShape,
    fit: Indices,
    mix: MixArrays,
    packing: Callable[[Indices], Matrix],
) -> int:
    """The node of `fit` whose placement strands least (ties as the module says;
    `packing` scores the tied nodes, lowest first)."""
    choice = score_nodes(tx, shape, fit, mix)
    keep = choice.score <= choice.score.min() + TIE
    if not shape.shares_gpu and not shape.whole_gpus:
        free_gpus = tx.free[fit, tx.snapshot.column(GPU)]
        keep &= free_gpus <= free_gpus[keep].min() + TIE
    tied = fit[keep]
    return int(tied[np.argmin(packing(tied))])


def device_for_share(tx: Transaction, shape: PodShape, node: int, mix: MixArrays) -> int:
    """The device of `node` a share strands least on (kept from the node's choice)."""
    choice = score_nodes(tx, shape, np.array([node], dtype=np.intp), mix)
    return int(choice.device[0])
